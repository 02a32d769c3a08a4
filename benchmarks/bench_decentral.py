"""`fedveil bench decentral`: aggregation without a coordinator, measured side by side.

Two parts, one command (--part all, the default; or --part allreduce | gossip): the
secure all-reduce (this file) and gossip training against FedAvg
(benchmarks/bench_gossip.py). The JSON carries the issue's four keys at the top
(secure_overhead_ratio, vs_coordinator_ratio, gossip_updates_ratio,
gossip_accuracy_gap; None for a part not run), bytes_per_node of every contender
(allreduce_plain/secure/coordinator per silo, gossip_fedavg/gossip_ring/
gossip_exponential per client), and each part's figures under secure_allreduce and
gossip.

SECURE ALL-REDUCE

Four silo processes (ranks 0-3) and one coordinator process (rank 4) on loopback, one
run, the contenders interleaved in every repeat, the same update of d float32 values:

* plain:        gloo all_reduce of the float32 update among the 4 silos (no protection);
* secure:       client/silo's secure all-reduce as a silo round runs it (the whole vector
                as one piece): one fused sweep (quantise, add the pairwise masks, reduce
                mod 2^b, into the signed int32 wire), gloo all_reduce, commit, reduce the
                sum mod 2^b in place, decode the mean;
* secure_pipelined: the same in 8 pieces (piece i+1 quantised and masked while piece i
                is summed), which pays only where each silo has a spare core;
* coordinator:  fedveil's secure-aggregation round (SecAggClient / SecAggServer, the same
                4 silos as clients, the coordinator as server) with its messages moved as
                bytes over gloo send/recv; the key stages (advertise, share keys) run before
                the span, as the engine pipelines them; the span is masked input, unmask and
                the sum sent back to every silo.

The span runs from a silo's update being ready (all silos released by a barrier) to the
decoded mean being available at every silo (the slowest silo; the median over repeats).
What does not depend on the update runs before the span (`prepare`), as a silo does
while it trains, and is reported apart (`cpu_s_per_silo_before_span`): the key
agreement, the masks (they depend only on the keys and the round), the stochastic-
rounding randomness (AES-CTR under a fresh OS-random key, drawn for the attempt) and the
wire and mean buffers (touched, so their page faults stay out of the span). Per-silo CPU
of each step in the span (process CPU, gloo's threads included) and the bytes each silo
sends are reported per contender.

`python -m fedveil.benchmarks.bench_decentral --silos 4 --dim 1000000 --repeats 5 --json`
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from fedveil.benchmarks.bench_gossip import add_gossip_arguments, print_table
from fedveil.benchmarks.bench_gossip import run as run_gossip
from fedveil.benchmarks.harness import command_main
from fedveil.ops.procs import await_reported_port, report_port

# ----------------------------------------------------------------------------------------
# Secure all-reduce vs plain all-reduce vs the coordinator-based secure round
# ----------------------------------------------------------------------------------------

CONTENDERS = ("plain", "secure", "secure_pipelined", "coordinator")
LEVELS = 2**16
CLIP_RANGE = 1.0
TIMEOUT_S = 120.0


def _cpu() -> float:
    """This process's CPU time: gloo's own threads included (a silo process runs nothing
    else)."""
    return time.process_time()


def _send_obj(group: Any, obj: Any, dst: int, tag: int) -> int:
    import torch

    payload = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    size = torch.tensor([len(payload)], dtype=torch.int64)
    data = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    group.send([size], dst, tag).wait()
    group.send([data], dst, tag + 1).wait()
    return len(payload)


def _recv_obj(group: Any, src: int, tag: int) -> Any:
    import torch

    size = torch.zeros(1, dtype=torch.int64)
    group.recv([size], src, tag).wait()
    data = torch.empty(int(size.item()), dtype=torch.uint8)
    group.recv([data], src, tag + 1).wait()
    return pickle.loads(data.numpy().tobytes())  # the bench's own processes only


def _update(rank: int, dim: int) -> Any:
    import numpy as np

    rng = np.random.default_rng(rank)
    return np.clip(rng.normal(0, 0.2, dim), -0.99, 0.99).astype(np.float32)


def _silo(rank: int, silos: int, port: int, dim: int, repeats: int, secret: bytes) -> dict:
    import numpy as np
    import torch
    import torch.distributed as dist

    from fedveil.client.silo import SecureAllReduce, SiloSettings
    from fedveil.client.silo.collectives import bytes_sent
    from fedveil.client.silo.round import weighted_encoder
    from fedveil.privacy.secagg import Quantizer, SecAggClient
    from fedveil.privacy.secagg.identity_keys import DerivedIdentities
    from fedveil.privacy.secagg.messages import SERVER_MESSAGES, AdvertiseRequest, Stage

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, silos + 1, False, timeout=timedelta(seconds=TIMEOUT_S))
    timeout = timedelta(seconds=TIMEOUT_S)
    silo_group = dist.ProcessGroupGloo(dist.PrefixStore("silos/", store), rank, silos, timeout)
    all_group = dist.ProcessGroupGloo(dist.PrefixStore("all/", store), rank, silos + 1, timeout)
    ids = DerivedIdentities(secret)
    settings = SiloSettings(
        run_id="bench", silo=rank, world=silos, identity=ids.private_key(rank),
        roster=ids.roster, timeout_s=TIMEOUT_S, min_silos=silos,
    )  # fmt: skip
    # the default (the whole vector as one piece), and the vector in 8 pipelined pieces
    # (quantise and mask piece i+1 while piece i is summed)
    secures = {
        "secure": SecureAllReduce(store, settings),
        "secure_pipelined": SecureAllReduce(
            store, dataclasses.replace(settings, run_id="bench-8", pipeline_pieces=8)
        ),
    }
    q = Quantizer(CLIP_RANGE, LEVELS, silos, 1)
    update = _update(rank, dim)
    out: dict[str, list] = {k: [] for k in CONTENDERS}
    for rep in range(repeats + 1):  # repeat 0 warms up (first groups, page faults): not counted
        # plain all-reduce of the float update
        tensor = torch.from_numpy(update.copy())
        silo_group.barrier().wait()
        t0, c0 = time.perf_counter(), _cpu()
        silo_group.allreduce([tensor]).wait()
        out["plain"].append(
            {"start": t0, "end": time.perf_counter(), "cpu": {"collective": _cpu() - c0},
             "bytes": bytes_sent("all_reduce", tensor, silos)}
        )  # fmt: skip
        for name, secure in secures.items():
            # Before the span, what does not depend on the update (a silo does it while it
            # trains): keys, masks, the rounding randomness, the wire and mean buffers.
            c_before = _cpu()
            prepared = secure.prepare(rep + 1, 0, dim + 2, q.bits, rounding=q)
            mean = np.empty(dim, np.float32)
            mean[:] = 0.0  # touched: its page faults stay out of the span
            before = _cpu() - c_before
            silo_group.barrier().wait()
            t0, c0 = time.perf_counter(), _cpu()
            total, steps = secure.reduce(prepared, weighted_encoder(q, update, 1))
            t1, c1 = time.perf_counter(), _cpu()
            _, count = q.decode_weighted_mean_into(total, mean)
            end, c2 = time.perf_counter(), _cpu()
            assert count == silos
            wire = torch.empty(dim + 2, dtype=torch.int32)
            pre = prepared.seconds
            out[name].append(
                {"start": t0, "end": end,
                 "cpu_before_span": {"keys": pre["keys_cpu"], "masks": pre["masks_cpu"],
                                     "rounding": pre["rounding_cpu"],
                                     "buffers": pre["buffers_cpu"], "total": before},
                 "cpu": {"encode_mask": steps["encode_mask_send_cpu"],
                         "collective": (c1 - c0) - steps["encode_mask_send_cpu"]
                         - steps["commit_cpu"] - steps["decode_cpu"],
                         "commit": steps["commit_cpu"],
                         "decode": steps["decode_cpu"] + (c2 - c1), "total": c2 - c0},
                 "wall": {"encode_mask": steps["encode_mask_send_wall"],
                          "collective_wait": steps["collective_wait_wall"],
                          "commit": steps["commit_wall"],
                          "decode": steps["decode_wall"] + end - t1},
                 "bytes": bytes_sent("all_reduce", wire, silos), "mean": mean[:4].tolist()}
            )  # fmt: skip
        # coordinator-based secure round: this silo is client `rank`, the coordinator rank 4
        client = None
        record: dict[str, Any] = {"cpu": {}, "bytes": 0, "bytes_before": 0}
        while True:
            message = _recv_obj(all_group, silos, 0)
            if message[0] == "sum":
                record["end"] = time.perf_counter()
                break
            stage, config, arrays = message
            request = SERVER_MESSAGES[Stage(stage)].from_wire(config, arrays)
            if isinstance(request, AdvertiseRequest):
                client = SecAggClient(rank, request.session)
            assert client is not None
            c0 = _cpu()
            vector = None
            if stage == Stage.MASKED_INPUT.value:
                record["start"] = time.perf_counter()
                vector = q.encode_weighted(update, 1)
                record["cpu"]["quantisation"] = _cpu() - c0
            c1 = _cpu()
            reply = client.respond(request, vector)
            record["cpu"][stage] = _cpu() - c1
            sent = _send_obj(all_group, reply.to_wire(), silos, 2)
            in_span = stage in (Stage.MASKED_INPUT.value, Stage.UNMASK.value)
            record["bytes" if in_span else "bytes_before"] += sent
        out["coordinator"].append(record)
    store.set(f"exit/{rank}", b"1")
    return out


def _coordinator(silos: int, port_file: Path, dim: int, repeats: int) -> dict:
    import torch
    import torch.distributed as dist

    from fedveil.privacy.secagg import Quantizer, SecAggServer, SessionConfig, ThreatModel
    from fedveil.privacy.secagg.messages import CLIENT_MESSAGES, Stage

    torch.set_num_threads(1)
    # The store on a port the kernel gives it, told to the parent, which starts the silos.
    store = dist.TCPStore(
        "127.0.0.1", 0, silos + 1, True, timeout=timedelta(seconds=TIMEOUT_S),
        wait_for_workers=False,
    )  # fmt: skip
    report_port(port_file, store.port)
    timeout = timedelta(seconds=TIMEOUT_S)
    group = dist.ProcessGroupGloo(dist.PrefixStore("all/", store), silos, silos + 1, timeout)
    q = Quantizer(CLIP_RANGE, LEVELS, silos, 1)
    rounds = []
    for rep in range(repeats + 1):  # repeat 0 warms up
        session = SessionConfig.create(
            range(silos), dimension=dim + 2, modulus_bits=q.bits, run_id=b"bench" * 3 + b"x",
            round=rep + 1, threat=ThreatModel(adversarial_rate=0.0, dropout_rate=0.0),
        )  # fmt: skip
        server = SecAggServer(session, clock=time.thread_time)
        requests = server.next_requests()
        start = None
        while requests:
            stage = next(iter(requests.values())).STAGE
            if stage is Stage.MASKED_INPUT:
                start = time.perf_counter()
            for cid, request in requests.items():
                config, arrays = request.to_wire()
                _send_obj(group, (stage.value, config, arrays), cid, 0)
            for cid in requests:
                config, arrays = _recv_obj(group, cid, 2)
                server.receive(cid, CLIENT_MESSAGES[stage].from_wire(config, arrays))
            requests = server.next_requests()
        result = server.finalize()
        for cid in range(silos):
            _send_obj(group, ("sum", result.total), cid, 0)
        rounds.append(
            {"start": start, "end": time.perf_counter(), "server_cpu": dict(server.stage_seconds)}
        )
    store.wait([f"exit/{r}" for r in range(silos)], timeout)
    return {"coordinator": rounds}


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def _summarise(silos: list[dict], coordinator: dict, repeats: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in CONTENDERS:
        spans = []
        counted = range(1, repeats + 1)  # repeat 0 was the warm-up
        for rep in counted:
            runs = [s[name][rep] for s in silos]
            start = min(r["start"] for r in runs)
            if name == "coordinator":
                start = coordinator["coordinator"][rep]["start"]
            spans.append(max(r["end"] for r in runs) - start)
        kept = [r for s in silos for r in s[name][1:]]
        steps = sorted({k for r in kept for k in r["cpu"]})
        cpu = {step: _median([r["cpu"][step] for r in kept if step in r["cpu"]]) for step in steps}
        before = sorted({k for r in kept for k in r.get("cpu_before_span", {})})
        out[name] = {
            "span_s": _median(spans),
            "spans_s": spans,
            "cpu_s_per_silo": cpu,
            # what does not depend on the update, done before the span (secure contenders)
            "cpu_s_per_silo_before_span": {
                k: _median([r["cpu_before_span"][k] for r in kept]) for k in before
            },
            "wall_s_per_silo": {
                step: _median([r["wall"][step] for r in kept])
                for step in sorted({k for r in kept for k in r.get("wall", {})})
            },
            "bytes_per_silo": int(_median([r["bytes"] for r in kept])),
        }
    server = coordinator["coordinator"][1:]
    stages = sorted({k for r in server for k in r["server_cpu"]})
    out["coordinator"]["server_cpu_s"] = {
        k: _median([r["server_cpu"].get(k, 0.0) for r in server]) for k in stages
    }
    out["coordinator"]["bytes_per_silo_key_stages"] = int(
        _median([r["bytes_before"] for s in silos for r in s["coordinator"][1:]])
    )
    return out


def run_secure_allreduce(silos: int, dim: int, repeats: int) -> dict[str, Any]:
    """The three contenders in one run; returns the figures and the ratios."""
    secret = os.urandom(32).hex()
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": root}
    with tempfile.TemporaryDirectory() as tmp:
        procs: list[subprocess.Popen[bytes]] = []

        def start(rank: int, *args: str) -> subprocess.Popen[bytes]:
            argv = [sys.executable, "-m", "fedveil.benchmarks.bench_decentral"]
            argv += ["--worker", str(rank), "--silos", str(silos), "--dim", str(dim)]
            argv += ["--repeats", str(repeats), "--worker-out", f"{tmp}/{rank}.json", *args]
            procs.append(subprocess.Popen(argv, env=env, cwd=root))
            return procs[-1]

        try:
            # The coordinator hosts the store, on a port it binds itself and reports.
            port_file = Path(tmp) / "store.port"
            coordinator = start(silos, "--port-file", str(port_file))
            port = await_reported_port(port_file, coordinator, TIMEOUT_S)
            if port is None:
                raise RuntimeError(
                    f"the bench coordinator did not report its store's port "
                    f"(exit {coordinator.poll()})"
                )
            for rank in range(silos):
                start(rank, "--port", str(port), "--secret", secret)
            for p in procs:
                if p.wait(timeout=1800) != 0:
                    raise RuntimeError(f"a bench worker exited with {p.returncode}")
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        results = [json.loads(Path(f"{tmp}/{r}.json").read_text()) for r in range(silos + 1)]
    figures = _summarise(results[:silos], results[silos], repeats)
    plain, secure, coord = (figures[k]["span_s"] for k in ("plain", "secure", "coordinator"))
    return {
        "silos": silos,
        "dim": dim,
        "repeats": repeats,
        "cpus": os.cpu_count(),
        "contenders": figures,
        "secure_overhead_ratio": secure / plain,
        "secure_pipelined_overhead_ratio": figures["secure_pipelined"]["span_s"] / plain,
        "vs_coordinator_ratio": coord / secure,
        "bytes_per_node": {k: figures[k]["bytes_per_silo"] for k in figures},
        "targets": {"secure_overhead_ratio": "<= 1.5", "vs_coordinator_ratio": ">= 1"},
    }


def _print(result: dict[str, Any]) -> None:
    print(
        f"secure all-reduce, {result['silos']} silos, d = {result['dim']}, "
        f"{result['repeats']} repeats, {result['cpus']} CPUs (medians; span = update ready -> "
        "decoded mean at every silo; keys, masks, rounding randomness before it)"
    )
    for name, f in result["contenders"].items():
        cpu = ", ".join(f"{k} {v * 1e3:.1f}" for k, v in f["cpu_s_per_silo"].items())
        wall = ", ".join(f"{k} {v * 1e3:.1f}" for k, v in f["wall_s_per_silo"].items())
        print(
            f"  {name:16} span {f['span_s'] * 1e3:8.1f} ms   sent/silo "
            f"{f['bytes_per_silo'] / 1e6:6.2f} MB   CPU/silo ms: {cpu}"
        )
        if wall:
            print(f"  {'':16} wall/silo ms: {wall}")
        before = ", ".join(f"{k} {v * 1e3:.1f}" for k, v in f["cpu_s_per_silo_before_span"].items())
        if before:
            print(f"  {'':16} CPU/silo before the span ms: {before}")
    server = result["contenders"]["coordinator"]["server_cpu_s"]
    print(
        "  coordinator server CPU ms: " + ", ".join(f"{k} {v * 1e3:.1f}" for k, v in server.items())
    )
    print(
        f"secure_overhead_ratio {result['secure_overhead_ratio']:.2f} (target <= 1.5), "
        f"vs_coordinator_ratio {result['vs_coordinator_ratio']:.2f} (target >= 1)"
    )


DECENTRAL_SUMMARY = (
    "`fedveil bench decentral`: aggregation without a coordinator, two parts in one command. "
    "allreduce: N silo processes and a coordinator on loopback, in one run: plain gloo "
    "all-reduce, the secure all-reduce (masked quantised updates) and fedveil's "
    "coordinator-based secure round; span from update ready to the sum at every silo, CPU "
    "per step and bytes per silo; secure_overhead_ratio (secure / plain, target <= 1.5) and "
    "vs_coordinator_ratio (coordinator / secure, target >= 1). gossip: FedAvg (20 clients a "
    "round) and randomized gossip on a ring and an exponential graph (20 clients awake a "
    "round), each at its learning rate tuned on a validation half of the test set, with "
    "the same budget of client updates: updates to the target accuracy, final accuracy on "
    "the test half, bytes per node, client spread, spectral gaps; gossip_updates_ratio "
    "(target <= 1.5) and gossip_accuracy_gap (points, target <= 2). --json: one JSON object "
    "with the four keys and bytes_per_node of every contender, the last line of stdout."
)


PARTS = ("all", "allreduce", "gossip")


def add_decentral_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of `fedveil bench decentral`: the part to run, the all-reduce's, the
    gossip half's (benchmarks/bench_gossip.py)."""
    p.add_argument(
        "--part",
        choices=PARTS,
        default="all",
        help="allreduce: the secure all-reduce only; gossip: gossip vs FedAvg only [all]",
    )
    p.add_argument("--silos", type=int, default=4, help="allreduce: silo processes [4]")
    p.add_argument(
        "--dim", type=int, default=1_000_000, help="allreduce: update dimension d [1000000]"
    )
    p.add_argument("--repeats", type=int, default=5, help="allreduce: interleaved repeats [5]")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    add_gossip_arguments(p.add_argument_group("gossip (--part gossip or all)"))


def cmd_bench_decentral(args: argparse.Namespace) -> int:
    if not 3 <= args.silos <= 16:  # the coordinator's secure round needs 3 clients
        raise ValueError(f"--silos {args.silos}: must be in [3, 16]")
    if not 1 <= args.dim <= 50_000_000 or not 1 <= args.repeats <= 100:
        raise ValueError("--dim must be in [1, 5e7] and --repeats in [1, 100]")
    result: dict[str, Any] = {"part": args.part, "secure_allreduce": None, "gossip": None}
    bytes_per_node: dict[str, Any] = {}
    if args.part in ("all", "allreduce"):
        ar = result["secure_allreduce"] = run_secure_allreduce(args.silos, args.dim, args.repeats)
        bytes_per_node.update({f"allreduce_{k}": v for k, v in ar["bytes_per_node"].items()})
        if not args.json:
            _print(ar)
    if args.part in ("all", "gossip"):
        gossip = result["gossip"] = run_gossip(args)
        bytes_per_node.update({f"gossip_{k}": v for k, v in gossip["bytes_per_node"].items()})
        print_table(gossip)
    ar, gossip = result["secure_allreduce"], result["gossip"]
    # The four keys, at the top whichever part ran (None: that part did not run).
    result.update(
        secure_overhead_ratio=None if ar is None else ar["secure_overhead_ratio"],
        vs_coordinator_ratio=None if ar is None else ar["vs_coordinator_ratio"],
        gossip_updates_ratio=None if gossip is None else gossip["gossip_updates_ratio"],
        gossip_accuracy_gap=None if gossip is None else gossip["gossip_accuracy_gap"],
        bytes_per_node=bytes_per_node,
    )
    if args.json:
        print(json.dumps(result, sort_keys=True))
    return 0


def _add_all_arguments(p: argparse.ArgumentParser) -> None:
    add_decentral_arguments(p)
    # A contender process of this benchmark (the parent starts one per silo and one for
    # the coordinator): hidden, not for users.
    p.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--port-file", help=argparse.SUPPRESS)
    p.add_argument("--secret", help=argparse.SUPPRESS)
    p.add_argument("--worker-out", help=argparse.SUPPRESS)


def _run(args: argparse.Namespace) -> int:
    if args.worker is None:
        return cmd_bench_decentral(args)
    if args.worker == args.silos:
        result = _coordinator(args.silos, Path(args.port_file), args.dim, args.repeats)
    else:
        secret = bytes.fromhex(args.secret)
        result = _silo(args.worker, args.silos, args.port, args.dim, args.repeats, secret)
    Path(args.worker_out).write_text(json.dumps(result))
    return 0


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """`fedveil bench decentral` and `python -m fedveil.benchmarks.bench_decentral`."""
    return command_main(
        argv,
        prog=prog or "python -m fedveil.benchmarks.bench_decentral",
        description=DECENTRAL_SUMMARY,
        add_arguments=_add_all_arguments,
        run=_run,
    )


if __name__ == "__main__":
    sys.exit(main())
