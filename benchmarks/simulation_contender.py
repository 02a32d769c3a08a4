"""One contender of `fedveil bench simulation`, in its own process (so the parent reads
its start-up, end-to-end time and its process tree's peak memory: harness.run_contender).

    python -m fedveil.benchmarks.simulation_contender SPEC.json RESULT.json

SPEC: {"role": "bare" | "ours_1" | "ours" | "flower", "workload": Workload.to_dict(),
"workers": our worker processes (0: one per core)}; RESULT: per-round wall and CPU
times, when the first round started, and the role's own figures
(bench_simulation.contender).
"""

from __future__ import annotations

import sys

from fedveil.benchmarks.bench_simulation import contender
from fedveil.benchmarks.harness import contender_main

if __name__ == "__main__":
    sys.exit(contender_main(contender, sys.argv[1:]))
