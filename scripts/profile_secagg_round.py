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
    .venv/bin/python scripts/profile_secagg_round.py glue --reps 200  # one client's
        # messages of a steady round through the Flower ClientApp, as Ray carries them

`glue` replays one client's requests of a steady round (plain: the train request; secure:
masked input with the next round's advertise rider, then unmask with its share-keys
rider), captured from an in-process run, through the ClientApp handler the way Flower's
simulation delivers them: (app, message, context) pickled by cloudpickle and unpickled,
the reply and context pickled back. It prints the CPU of one client-round, plain and
secure, and their difference: the client's share of the secure round's overhead, Ray's
serialization of the app and the node state included (its transport costs are not).

`stages` sums the cumulative CPU of the handler's and the channel's parts over the steady
rounds (round 1 and the last excluded, as the benchmark does) per round.
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import json
import os
import pickle
import pstats
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from flwr.app import Context, Message, Metadata, RecordDict
from ray import cloudpickle

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
from fedveil.client import runtime as client_runtime
from fedveil.client.flower_client_app import make_client_app, save_state
from fedveil.protocol.envelope import Envelope
from fedveil.protocol.flower_codec import message_type, to_content

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


def _captured(w: Workload, secagg: bool, k: int, t: int, client: int) -> tuple[dict, list]:
    """`client`'s state before round 2 and its round-2 requests, from an in-process run."""
    cls = client_runtime.ClientRuntime
    original = cls.handle
    start: dict[str, Any] = {}
    requests: list[Envelope] = []

    def handle(self: Any, client_id: int, msg: Envelope, state: dict[str, Any]) -> Envelope:
        if client_id == client and msg.round == 2:
            if not requests:
                start.update(copy.deepcopy(state))
            requests.append(msg)
        return original(self, client_id, msg, state)

    cls.handle = handle  # type: ignore[method-assign]  # a profiling script's probe
    try:
        run_ours(w, secagg, k, t, 3, "inprocess")
    finally:
        cls.handle = original  # type: ignore[method-assign]
    return start, requests


def _delivered(env: Envelope, node_id: int) -> Message:
    return Message(
        content=to_content(env),
        metadata=Metadata(
            run_id=1,
            message_id=f"m{env.kind}",
            src_node_id=0,
            dst_node_id=node_id,
            reply_to_message_id="",
            group_id="",
            created_at=time.time(),
            ttl=600.0,
            message_type=message_type(env.kind),
        ),
    )


def glue(args: argparse.Namespace) -> dict[str, Any]:
    """CPU of one client's steady round through the ClientApp, as Ray carries it."""
    w, k, t = workload(args)
    client = min(set(range(w.clients)) - w.dropped)
    app = make_client_app(DroppingRuntimeFactory(w, True))

    def load_app() -> Any:  # a closure, as Flower's own `_load_app`
        return app

    out: dict[str, Any] = {}
    for secagg in (False, True):
        state, requests = _captured(w, secagg, k, t, client)
        messages = [_delivered(env, 7) for env in requests]
        samples = []
        for _ in range(args.reps):
            context = Context(1, 7, {"partition-id": client}, RecordDict(), {})
            save_state(context, copy.deepcopy(state))
            started = time.process_time()
            for message in messages:
                fn, msg, cid, ctx = pickle.loads(
                    cloudpickle.dumps((load_app, message, str(client), context))
                )
                reply = fn()(msg, ctx)
                if reply.has_error():
                    raise RuntimeError(f"{msg.metadata.message_type}: {reply.error}")
                cid, reply, context = pickle.loads(cloudpickle.dumps((cid, reply, ctx)))
            samples.append(time.process_time() - started)
        out["secure" if secagg else "plain"] = {
            "messages": len(messages),
            "median_ms": round(statistics.median(samples) * 1000, 3),
            "min_ms": round(min(samples) * 1000, 3),
        }
    out["overhead_median_ms"] = round(out["secure"]["median_ms"] - out["plain"]["median_ms"], 3)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=["cpu", "stages", "cprofile", "flower", "glue"])
    p.add_argument("--out", default="/tmp/secagg-profile")
    p.add_argument("--clients", type=int, default=100)
    p.add_argument("--dim", type=int, default=100_000)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--top", type=int, default=40)
    p.add_argument("--sort", default="tottime")
    p.add_argument("--reps", type=int, default=200, help="glue: replays of the round")
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
        elif args.what == "glue":
            print(json.dumps(glue(args), indent=1))
        else:
            _profile(args).sort_stats(args.sort).print_stats(args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
