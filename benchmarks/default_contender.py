"""One contender of `fedveil bench default`, in its own process (so the parent times it
from its launch and watches its process tree's memory: harness.run_contender).

    python -m fedveil.benchmarks.default_contender SPEC.json RESULT.json

SPEC: {"role": "ours" | "bare", "overrides": {config key: value}}; RESULT: the role's
per-round times since launch, test accuracies and hyper-parameters
(bench_default.contender).
"""

from __future__ import annotations

import sys

from fedveil.benchmarks.bench_default import contender
from fedveil.benchmarks.harness import contender_main

if __name__ == "__main__":
    sys.exit(contender_main(contender, sys.argv[1:]))
