"""Where a secure round's CPU goes beyond a plain round's: `fedveil bench secagg`'s workload
over the in-process transport (every client and the server in this process), by function.

The in-process transport runs the same client handler (`client.secagg_stages.handle_secagg`),
channel (`server.engine.secagg_channel`) and protocol parties as a Flower deployment, without
Flower's message path: its secure-minus-plain CPU is the work our protocol adds to a round,
which under Flower is spread over the Ray workers (clients) and the driver (server).

    .venv/bin/python scripts/profile_secagg_round.py cpu --runs 3     # CPU per round, both
    .venv/bin/python scripts/profile_secagg_round.py stages           # secure round by stage
    .venv/bin/python scripts/profile_secagg_round.py cprofile --top 40  # secure round, by function
    .venv/bin/python scripts/profile_secagg_round.py flower --out /tmp/prof  # over Flower:
        # cProfile of the Ray workers' message thread and of the ServerApp's thread, plain
        # and secure runs; prints each side's top functions per round

`stages` sums the cumulative CPU of the handler's and the channel's parts over the steady
rounds (round 1 and the last excluded, as the benchmark does) per round.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import statistics
import sys
from pathlib import Path
from typing import Any

from fedveil.benchmarks import bench_secagg_round
from fedveil.benchmarks.bench_secagg_round import (
    DroppingRuntime,
    DroppingRuntimeFactory,
    _torch_threads,
    drop_kinds,
    run_ours,
    steady_cpu,
)
from fedveil.benchmarks.secagg_round_workload import Workload, graph_parameters

# (label, file suffix, function name): the parts of a secure round whose cumulative CPU
# `stages` reports. Client side first, then the server's.
PARTS: list[tuple[str, str, str]] = [
    ("client: handle_secagg (all stages)", "client/secagg_stages.py", "handle_secagg"),
    ("client:   decode request", "privacy/secagg/messages.py", "decode_message"),
    ("client:   restore session", "privacy/secagg/client.py", "from_state"),
    ("client:   save session", "privacy/secagg/client.py", "to_state"),
    ("client:   train (local step)", "client/runtime.py", "_train"),
    ("client:   quantize", "client/secagg_stages.py", "encode_update"),
    ("client:   respond (protocol)", "privacy/secagg/client.py", "respond"),
    ("client:     share keys", "privacy/secagg/client.py", "share_keys"),
    ("client:     masked input", "privacy/secagg/client.py", "masked_input"),
    ("client:     unmask", "privacy/secagg/client.py", "unmask"),
    ("client:   wrap reply", "protocol/secagg_frame.py", "wrap"),
    ("server: receive (each reply)", "server/engine/secagg_channel.py", "_receive"),
    ("server: finalize (unmask, sum)", "privacy/secagg/server.py", "finalize"),
    ("server: the channel's stages", "server/engine/secagg_channel.py", "_run_stages"),
    ("server: strip self masks", "privacy/secagg/server.py", "_strip_self_masks"),
    ("server: strip dropped masks", "privacy/secagg/server.py", "_strip_dropped_masks"),
]


def workload(args: argparse.Namespace) -> tuple[Workload, int, int]:
    w = Workload(clients=args.clients, dim=args.dim, dropout=args.dropout)
    k, t = graph_parameters(w, None, None)
    return w, k, t


def cpu(args: argparse.Namespace) -> dict[str, Any]:
    """Process CPU per steady round, plain and secure, alternating runs."""
    w, k, t = workload(args)
    plain: list[float] = []
    secure: list[float] = []
    for _ in range(args.runs):
        for flag, out in ((False, plain), (True, secure)):
            run = run_ours(w, flag, k, t, args.rounds, "inprocess")
            out.append(steady_cpu([run]) or float("nan"))
    p, s = statistics.median(plain), statistics.median(secure)
    return {"plain_cpu_s": plain, "secure_cpu_s": secure, "overhead_cpu_s": s - p}


def _profile(args: argparse.Namespace) -> pstats.Stats:
    w, k, t = workload(args)
    prof = cProfile.Profile()
    prof.enable()
    run_ours(w, True, k, t, args.rounds, "inprocess")
    prof.disable()
    return pstats.Stats(prof)


def stages(args: argparse.Namespace) -> dict[str, Any]:
    stats = _profile(args)
    per_round = args.rounds  # round 1 (fresh keys, no rider) is included; see the docstring
    found: dict[str, float] = {}
    for (filename, _line, name), (_cc, _nc, _tt, ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        for label, suffix, fn in PARTS:
            if name == fn and filename.endswith(suffix):
                found[label] = found.get(label, 0.0) + ct / per_round
    return {label: round(found.get(label, 0.0) * 1000, 1) for label, _s, _f in PARTS}


class ProfiledRuntime(DroppingRuntime):
    """The benchmark's client runtime, profiling the thread its worker handles messages on
    (from the first message on: Flower's codec and state handling around `handle` too)."""

    def __init__(self, factory: ProfiledFactory) -> None:
        w = factory.workload
        super().__init__(w.task(), w.dropped, drop_kinds(w, factory.secagg))
        self.path = (
            Path(factory.out)
            / f"worker-{'secure' if factory.secagg else 'plain'}-{os.getpid()}.prof"
        )
        self.calls = 0
        self.prof = cProfile.Profile()
        self.prof.enable()

    def handle(self, client_id: int, msg: Any, state: dict[str, Any]) -> Any:
        reply = super().handle(client_id, msg, state)
        self.calls += 1
        if self.calls % 25 == 0:  # workers are killed at the end: dump as we go
            self.prof.disable()
            self.prof.dump_stats(self.path)
            self.prof.enable()
        return reply


class ProfiledFactory(DroppingRuntimeFactory):
    def __init__(self, workload: Workload, secagg: bool, out: str) -> None:
        super().__init__(workload, secagg)
        self.out = out

    def __call__(self) -> ProfiledRuntime:  # type: ignore[override]
        return ProfiledRuntime(self)


def flower(args: argparse.Namespace) -> None:
    """Both runs over Flower, profiled; prints the top functions by own time per round."""
    w, k, t = workload(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for secagg in (False, True):
        label = "secure" if secagg else "plain"
        driver = cProfile.Profile()
        counting = bench_secagg_round.CountingTransport

        class ProfiledCounting(counting):  # type: ignore[misc, valid-type]
            profiler = driver

            def __init__(self, *a: Any, **kw: Any) -> None:
                super().__init__(*a, **kw)
                self.profiler.enable()  # built in the ServerApp's thread: profile that thread

        # A profiling script: swap the benchmark's factories for profiled ones.
        bench_secagg_round.CountingTransport = ProfiledCounting  # type: ignore[misc]
        bench_secagg_round.DroppingRuntimeFactory = (  # type: ignore[misc]
            lambda wl, sa: ProfiledFactory(wl, sa, str(out))
        )
        try:
            run = run_ours(w, secagg, k, t, args.rounds, "flower")
        finally:
            driver.disable()
            bench_secagg_round.CountingTransport = counting  # type: ignore[misc]
            bench_secagg_round.DroppingRuntimeFactory = DroppingRuntimeFactory  # type: ignore[misc]
        driver.dump_stats(out / f"driver-{label}.prof")
        print(f"{label}: round_s {[round(x, 3) for x in run['round_s']]}")
    for side in ("driver", "worker"):
        for label in ("plain", "secure"):
            files = sorted(str(p) for p in out.glob(f"{side}-{label}*.prof"))
            if not files:
                continue
            print(f"\n==== {side} {label}: {len(files)} file(s), cumulative, all rounds")
            pstats.Stats(*files).sort_stats(args.sort).print_stats(args.top)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=["cpu", "stages", "cprofile", "flower"])
    p.add_argument("--out", default="/tmp/secagg-profile")
    p.add_argument("--clients", type=int, default=100)
    p.add_argument("--dim", type=int, default=100_000)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--top", type=int, default=40)
    p.add_argument("--sort", default="tottime")
    args = p.parse_args(argv)
    with _torch_threads(1):
        if args.what == "cpu":
            print(json.dumps(cpu(args), indent=1))
        elif args.what == "stages":
            print("ms of CPU per secure round (all rounds of one run, cumulative):")
            for label, ms in stages(args).items():
                print(f"  {label:40s} {ms:8.1f}")
        elif args.what == "flower":
            flower(args)
        else:
            _profile(args).sort_stats(args.sort).print_stats(args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
