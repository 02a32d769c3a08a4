"""Compute benchmark: fedveil secure aggregation vs Flower 1.41's SecAgg+ building blocks.

Both sides do the same round in one process, with no transport: n clients, a d-dimensional
float update and an integer weight each, k neighbours + the client itself holding shares,
threshold t, and a fraction `dropout` of the clients vanishing after sharing keys (before
sending their masked input), so the server has to rebuild their mask keys and strip their
pairwise masks: the expensive recovery path. Quantization uses Flower's workflow defaults
(clip 8.0, 2^22 levels, max weight 1000) on both sides and is timed as a client stage.

* `bench_protocol` runs `run_in_memory` (every message through its wire encoding) and
  reports median per-client and total server compute (CPU seconds) per stage, the client's PRG lower
  bound (time to expand the keystream bytes its masks need), bytes each way per client, and
  the round's primitive floor (`secagg_floor.py`: its crypto calls x their hot-loop cost), from
  which `compute_ratio_ceiling` is the compute_ratio our round would have at that floor.
* `bench_flower_secaggplus_compute` (`flower_secaggplus_compute.py`) replays exactly what
  `secaggplus_mod` (client) and `SecAggPlusWorkflow` (server) compute, stage by stage, calling
  Flower's own functions (P-384 keys as PEM, Fernet, pycryptodome Shamir over 16-byte chunks,
  NumPy MT masks).

Run: `python -m fedveil.benchmarks.bench_secagg --n 100 --dim 100000 --dropout 0.1`.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import time
from collections import defaultdict
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedveil.benchmarks.secagg_floor import (
    PrimitiveLog,
    client_floor_s,
    instrumented_primitives,
    primitive_floor,
)
from fedveil.benchmarks.secagg_workload import (
    CLIP_RANGE,
    CLOCK,
    LEVELS,
    MAX_WEIGHT,
    _expected_mean,
    _median,
    client_update,
    dropped_clients,
    graph_parameters,
)
from fedveil.privacy.secagg import (
    DropoutPattern,
    Quantizer,
    SessionConfig,
    Stage,
    run_in_memory,
)
from fedveil.privacy.secagg.crypto import KeystreamBuffer
from fedveil.privacy.secagg.in_memory import RoundReport
from fedveil.privacy.secagg.masking import MaskApplier
from fedveil.privacy.secagg.params import ThreatMode
from fedveil.privacy.secagg.server import AggregateResult


def bench_protocol(
    n: int,
    dim: int,
    dropout: float,
    neighbors: int | None = None,
    threshold: int | None = None,
    seed: int = 0,
    threat: ThreatMode = ThreatMode.SEMI_HONEST,
    instrument: bool = False,
) -> dict[str, Any]:
    """Compute cost of one fedveil round; see the module docstring. `threat` MALICIOUS adds
    the signed advertisements and the consistency round (identity keys made untimed).
    `instrument` times every primitive call in the round and adds "breakdown" (the wrappers
    cost ~1 us a call, taken out again; the other figures of such a run include it)."""
    started = time.perf_counter()
    ids = list(range(1, n + 1))
    k, t = graph_parameters(n, dropout, neighbors, threshold, threat)
    quantizer = Quantizer(CLIP_RANGE, LEVELS, max_clients=n, max_weight=MAX_WEIGHT)
    session = bench_session(ids, dim, k, t, quantizer.bits, threat, seed)
    identity_keys = (
        {cid: Ed25519PrivateKey.generate() for cid in ids}
        if threat is ThreatMode.MALICIOUS
        else None
    )
    dropped = dropped_clients(ids, dropout, seed)
    inputs = TimedInputs(quantizer, dim, seed, session.dimension)
    # `inputs.encoded` makes each vector for its client's call only, as the engine's clients do.
    log: PrimitiveLog | None
    with instrumented_primitives() if instrument else contextlib.nullcontext() as log:
        report = run_in_memory(
            session,
            inputs.encoded,
            dropouts=DropoutPattern({Stage.MASKED_INPUT: dropped}),
            identity_keys=identity_keys,
            overwrite_inputs=True,
            clock=CLOCK,  # CPU time, like every other figure here (the peer's included)
        )
    times = StageTimes(report, inputs.quantize_seconds)
    prg, masking = _prg_and_masking_seconds(session, k)
    floor = primitive_floor(session, dropped)
    excl_quantize = times.total - sum(inputs.quantize_seconds.values())
    per_client = _per_client_floor(session, report, times, inputs.quantize_seconds, floor)
    extra = {} if log is None else {"breakdown": _breakdown(log, floor, excl_quantize)}
    return {
        **extra,
        "protocol": "fedveil",
        "threat": threat.value,
        "n": n,
        "dim": dim,
        "dropout": dropout,
        "neighbors": k,
        "threshold": t,
        "modulus_bits": session.modulus_bits,
        "survivors": len(report.result.survivors),
        "client_stage_median_s": times.client_stage,
        "client_total_median_s": _median(times.per_client.values()),
        "server_stage_s": dict(report.server_seconds),
        "server_total_s": times.server,
        "total_compute_s": times.total,
        "total_compute_excl_quantize_s": excl_quantize,
        "primitive_floor_s": floor["total_s"],
        "primitive_floor": floor["by_primitive"],
        "over_primitive_floor": excl_quantize / floor["total_s"],
        **per_client,
        "prg_lower_bound_s": prg,
        "masking_s": masking,
        "masking_over_prg": masking / prg,
        "masked_input_stage_over_prg": times.client_stage["masked_input"] / prg,
        **_traffic(report, ids, dropped),
        **inputs.checks(report.result, session.modulus_mask),
        "wall_s": time.perf_counter() - started,
    }


def bench_session(
    ids: list[int], dim: int, k: int, t: int, bits: int, threat: ThreatMode, seed: int
) -> SessionConfig:
    """The benchmark round's session: `dim` values plus the quantizer's two extras."""
    return SessionConfig(
        session_id=hashlib.sha256(b"bench%d" % seed).digest()[:16],
        client_ids=tuple(ids),
        modulus_bits=bits,
        dimension=dim + 2,
        neighbors=k,
        threshold=t,
        threat_mode=threat,
        graph_seed=os.urandom(32),
        run_id=b"bench",
        round=seed,
    )


class TimedInputs:
    """The clients' quantized inputs, made on demand; times each quantization and keeps
    the plain sum of the vectors to check the protocol's sum against."""

    def __init__(self, quantizer: Quantizer, dim: int, seed: int, dimension: int) -> None:
        self.quantizer, self.dim, self.seed = quantizer, dim, seed
        self.quantize_seconds: dict[int, float] = {}
        self.running = np.zeros(dimension, dtype=np.uint64)

    def encoded(self, cid: int) -> np.ndarray:
        x, weight = client_update(cid, self.dim, self.seed)
        t0 = CLOCK()
        vector = self.quantizer.encode_weighted(x, weight)
        self.quantize_seconds[cid] = CLOCK() - t0
        np.add(self.running, vector, out=self.running)
        return vector

    def checks(self, result: AggregateResult, modulus_mask: int) -> dict[str, bool]:
        """The sum is exact (mod the modulus) and decodes to the survivors' clipped mean."""
        exact = set(self.quantize_seconds) == set(result.survivors) and np.array_equal(
            self.running & np.uint64(modulus_mask), result.total.astype(np.uint64)
        )
        mean, _, _ = self.quantizer.decode_weighted_mean(result.total)
        expected = _expected_mean(set(result.survivors), self.dim, self.seed)
        return {
            "sum_exact": bool(exact),
            "mean_close": bool(np.allclose(mean, expected, atol=1e-3)),
        }


class StageTimes:
    """A round report's CPU seconds: median per client by stage (quantization as its own
    stage), each client's total, the server's total and everything together."""

    def __init__(self, report: RoundReport, quantize_seconds: dict[int, float]) -> None:
        self.client_stage = {
            stage: _median(times.values())
            for stage, times in report.client_seconds.items()
            if times
        }
        self.client_stage["quantize"] = _median(quantize_seconds.values())
        self.per_client: dict[int, float] = defaultdict(float)
        for times in (*report.client_seconds.values(), quantize_seconds):
            for cid, seconds in times.items():
                self.per_client[cid] += seconds
        self.server = sum(report.server_seconds.values())
        self.total = sum(self.per_client.values()) + self.server


def _per_client_floor(
    session: SessionConfig,
    report: RoundReport,
    times: StageTimes,
    quantize_seconds: dict[int, float],
    floor: dict[str, Any],
) -> dict[str, float]:
    """Each surviving client's compute without quantization over its own primitive floor
    (secagg_floor.client_floor_s: its crypto calls x their hot cost); the median, and the
    median client's seconds both ways. Quantization is not a primitive: it is left out of
    both sides (the "with quantization" figure adds it to the compute only)."""
    graph = session.graph
    ratios, spent, floors, with_q = [], [], [], []
    for cid in report.result.survivors:
        own = client_floor_s(floor["costs"], len(graph.neighbours(cid)))
        compute = times.per_client[cid] - quantize_seconds.get(cid, 0.0)
        ratios.append(compute / own)
        with_q.append(times.per_client[cid] / own)
        spent.append(compute)
        floors.append(own)
    return {
        "per_client_floor_ratio": _median(ratios),
        "per_client_floor_ratio_with_quantize": _median(with_q),
        "client_excl_quantize_median_s": _median(spent),
        "client_floor_median_s": _median(floors),
    }


def _traffic(report: RoundReport, ids: list[int], dropped: frozenset[int]) -> dict[str, Any]:
    """Bytes per surviving client (median), in all and by stage."""
    up = {cid: sum(s.get(cid, 0) for s in report.bytes_up.values()) for cid in ids}
    down = {cid: sum(s.get(cid, 0) for s in report.bytes_down.values()) for cid in ids}
    return {
        "bytes_up_per_client_median": _median(v for c, v in up.items() if c not in dropped),
        "bytes_down_per_client_median": _median(v for c, v in down.items() if c not in dropped),
        "bytes_up_stage_median": {s: _median(v.values()) for s, v in report.bytes_up.items() if v},
        "bytes_down_stage_median": {
            s: _median(v.values()) for s, v in report.bytes_down.items() if v
        },
    }


def _breakdown(log: PrimitiveLog, floor: dict[str, Any], round_s: float) -> dict[str, Any]:
    """Where an instrumented round's compute (quantization aside) went: its primitives as
    called in the round, everything else, and the floor the same calls cost in a tight loop."""
    round_s -= sum(log.calls.values()) * log.overhead_s
    in_situ = log.in_situ_s()
    return {
        "round_excl_quantize_s": round_s,
        "primitives_in_situ_s": in_situ,
        # Message checks, graph lookups, bookkeeping, the server's running sum: Python.
        "protocol_logic_s": round_s - in_situ,
        "primitive_floor_s": floor["total_s"],
        "wrapper_overhead_us": log.overhead_s * 1e6,
        "by_primitive": {
            name: {
                "calls": log.calls[name],
                "in_situ_us": log.in_situ_s(name) / log.calls[name] * 1e6 if log.calls[name] else 0,
                "hot_us": row["us"],
            }
            for name, row in floor["by_primitive"].items()
        },
    }


def _prg_and_masking_seconds(
    session: SessionConfig, peers: int, repeats: int = 5
) -> tuple[float, float]:
    """Client lower bound (expand 1 + peers keystreams) and the full masking (expand + add)."""
    keys = [os.urandom(32) for _ in range(peers + 1)]
    buffer = KeystreamBuffer(session.dimension, session.dtype)
    vector = np.zeros(session.dimension, dtype=session.dtype)
    applier = MaskApplier(session.dimension, session.dtype, session.modulus_bits)
    prg_times, mask_times = [], []
    for _ in range(repeats):
        t0 = CLOCK()
        for key in keys:
            buffer.fill(key)
        prg_times.append(CLOCK() - t0)
        t0 = CLOCK()
        masked = vector.copy()
        for i, key in enumerate(keys):
            (applier.add if i % 2 == 0 else applier.subtract)(masked, key)
        applier.reduce(masked)
        mask_times.append(CLOCK() - t0)
    # Medians, like the per-client stage times they are compared with.
    return _median(prg_times), _median(mask_times)


def bench_flower_secaggplus_compute(
    n: int,
    dim: int,
    dropout: float,
    neighbors: int | None = None,
    threshold: int | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Flower 1.41 SecAgg+ compute on the same inputs, client and server side
    (`flower_secaggplus_compute`: Flower's own functions, stage by stage)."""
    from fedveil.benchmarks.flower_secaggplus_compute import flower_round_compute

    return flower_round_compute(n, dim, dropout, neighbors, threshold, seed)


def compare(
    n: int,
    dim: int,
    dropout: float,
    neighbors: int | None = None,
    threshold: int | None = None,
    seed: int = 0,
    flower: bool = True,
    repeats: int = 1,
    breakdown: bool = False,
) -> dict[str, Any]:
    """Both benchmarks, interleaved `repeats` times after a small warm-up round each; each
    side keeps its cheapest run, which filters out interference from other processes on a
    shared machine. `breakdown`: one more, instrumented, round of ours (see bench_protocol)."""
    ours_runs, their_runs = [], []
    # One small untimed round per side first: one-off costs (lazy imports, first-call
    # caches, engine calibration) are not part of a round's compute.
    bench_protocol(min(n, 10), min(dim, 1000), dropout, seed=seed)
    if flower:
        bench_flower_secaggplus_compute(min(n, 10), min(dim, 1000), dropout, seed=seed)
    for _ in range(repeats):
        ours_runs.append(bench_protocol(n, dim, dropout, neighbors, threshold, seed))
        if flower:
            their_runs.append(
                bench_flower_secaggplus_compute(n, dim, dropout, neighbors, threshold, seed)
            )
    ours = min(ours_runs, key=lambda r: r["total_compute_s"])
    out: dict[str, Any] = {"fedveil": ours, "repeats": repeats}
    if breakdown:
        instrumented = bench_protocol(n, dim, dropout, neighbors, threshold, seed, instrument=True)
        out["breakdown"] = instrumented["breakdown"]
    if flower:
        theirs = min(their_runs, key=lambda r: r["total_compute_s"])
        out["flower"] = theirs
        # Headline: all CPU spent in the round, every client plus the server.
        out["compute_ratio"] = theirs["total_compute_s"] / ours["total_compute_s"]
        out["compute_ratio_excl_quantize"] = (
            theirs["total_compute_excl_quantize_s"] / ours["total_compute_excl_quantize_s"]
        )
        # Clients run in parallel on their own devices: one client + the server.
        out["critical_path_ratio"] = (
            theirs["client_total_median_s"] + theirs["server_total_s"]
        ) / (ours["client_total_median_s"] + ours["server_total_s"])
        # The compute_ratio we would have if our round cost only its primitives (plus our
        # quantization): no implementation of this protocol can reach a higher one.
        ours_quantize = ours["total_compute_s"] - ours["total_compute_excl_quantize_s"]
        out["compute_ratio_ceiling"] = theirs["total_compute_s"] / (
            ours["primitive_floor_s"] + ours_quantize
        )
        out["client_ratio"] = theirs["client_total_median_s"] / ours["client_total_median_s"]
        out["server_ratio"] = theirs["server_total_s"] / ours["server_total_s"]
    return out


def compare_threats(
    n: int, dim: int, dropout: float, seed: int = 0, repeats: int = 1
) -> dict[str, Any]:
    """Our semi-honest and malicious-server modes on the same graph (the malicious mode's
    k and t, so only signatures and the consistency round differ); cheapest of `repeats`."""
    k, t = graph_parameters(n, dropout, None, None, ThreatMode.MALICIOUS)
    bench_protocol(min(n, 10), min(dim, 1000), dropout, seed=seed)  # warm-up, untimed
    runs: dict[str, list[dict[str, Any]]] = {"semi_honest": [], "malicious": []}
    for _ in range(repeats):
        for mode in (ThreatMode.SEMI_HONEST, ThreatMode.MALICIOUS):
            runs[mode.value].append(bench_protocol(n, dim, dropout, k, t, seed, mode))
    best = {m: min(r, key=lambda x: x["total_compute_s"]) for m, r in runs.items()}
    semi, mal = best["semi_honest"], best["malicious"]
    return {
        **best,
        "repeats": repeats,
        "malicious_over_semi_honest": mal["total_compute_s"] / semi["total_compute_s"],
        "malicious_extra_per_client_s": mal["client_total_median_s"]
        - semi["client_total_median_s"],
        "malicious_extra_server_s": mal["server_total_s"] - semi["server_total_s"],
    }


def _print_threats(out: dict[str, Any]) -> None:
    semi, mal = out["semi_honest"], out["malicious"]
    print(
        f"n={semi['n']} d={semi['dim']} dropout={semi['dropout']} k={semi['neighbors']} "
        f"t={semi['threshold']} (malicious-mode parameters on both), "
        f"cheapest of {out['repeats']}"
    )
    print(f"{'':28}{'semi-honest':>14}{'malicious':>14}")
    for label, key in (
        ("per client (median)", "client_total_median_s"),
        ("server", "server_total_s"),
        ("all clients + server", "total_compute_s"),
    ):
        print(f"{label:28}{semi[key] * 1e3:11.1f} ms{mal[key] * 1e3:11.1f} ms")
    for label, key in (("bytes up per client", "bytes_up_per_client_median"),):
        print(f"{label:28}{semi[key] / 1e3:11.1f} KB{mal[key] / 1e3:11.1f} KB")
    print(f"malicious / semi-honest compute: {out['malicious_over_semi_honest']:.2f}x")
    for name, r in (("semi-honest", semi), ("malicious", mal)):
        if not (r["sum_exact"] and r["mean_close"]):
            print(f"WARNING: {name} sum check failed")


def _print_table(out: dict[str, Any]) -> None:
    ours, theirs = out["fedveil"], out.get("flower")
    print(
        f"n={ours['n']} d={ours['dim']} dropout={ours['dropout']} k={ours['neighbors']} "
        f"t={ours['threshold']} b={ours['modulus_bits']} survivors={ours['survivors']}"
    )
    header = f"{'':28}{'fedveil':>14}" + (f"{'flower':>14}{'ratio':>10}" if theirs else "")
    print(header)
    _print_compute_rows(ours, theirs)
    _print_ours_notes(ours, theirs)
    if theirs:
        _print_ratios(out)
    if "breakdown" in out:
        _print_breakdown(out["breakdown"])
    print(
        "times are process CPU seconds; "
        f"wall: fedveil {ours['wall_s']:.1f}s"
        + (f", flower {theirs['wall_s']:.1f}s" if theirs else "")
    )


# Our client stage -> Flower's that does the same work.
_CLIENT_STAGES = {
    "advertise": "setup",
    "share_keys": "share_keys",
    "quantize": "quantize",
    "masked_input": "masked_input",
    "unmask": "unmask",
}


def _row(label: str, a: float, b: float | None = None) -> None:
    line = f"{label:28}{a * 1e3:>12.2f}ms"
    if b is not None:
        line += f"{b * 1e3:>12.2f}ms{(b / a if a else float('nan')):>9.1f}x"
    print(line)


def _print_compute_rows(ours: dict[str, Any], theirs: dict[str, Any] | None) -> None:
    """Per client stage (medians), per server stage, and the totals, side by side."""
    for ours_stage, flower_stage in _CLIENT_STAGES.items():
        a = ours["client_stage_median_s"].get(ours_stage, 0.0)
        b = theirs["client_stage_median_s"].get(flower_stage, 0.0) if theirs else None
        _row(f"client {ours_stage} (median)", a, b)
    _row(
        "client total (median)",
        ours["client_total_median_s"],
        theirs["client_total_median_s"] if theirs else None,
    )
    for stage, a in ours["server_stage_s"].items():
        # Flower's server work of the first stage is its graph setup.
        flower_stage = "setup" if stage == "advertise" else stage
        b = theirs["server_stage_s"].get(flower_stage, 0.0) if theirs else None
        _row(f"server {stage}", a, b)
    _row("server total", ours["server_total_s"], theirs["server_total_s"] if theirs else None)
    _row(
        "all compute (clients+server)",
        ours["total_compute_s"],
        theirs["total_compute_s"] if theirs else None,
    )


def _print_ours_notes(ours: dict[str, Any], theirs: dict[str, Any] | None) -> None:
    """Our masking against its PRG bytes, our round against its primitive floor, bytes."""
    print(
        f"client PRG lower bound {ours['prg_lower_bound_s'] * 1e3:.2f} ms; masking "
        f"{ours['masking_s'] * 1e3:.2f} ms ({ours['masking_over_prg']:.2f}x PRG); whole "
        f"masked-input stage {ours['masked_input_stage_over_prg']:.2f}x PRG"
    )
    print(
        f"primitive floor (crypto calls x their hot cost, quantization aside) "
        f"{ours['primitive_floor_s'] * 1e3:.1f} ms; our round without quantization "
        f"{ours['total_compute_excl_quantize_s'] * 1e3:.1f} ms, "
        f"{ours['over_primitive_floor']:.2f}x the floor"
    )
    print(
        f"bytes per client: up {ours['bytes_up_per_client_median']:,.0f}, down "
        f"{ours['bytes_down_per_client_median']:,.0f}; sum exact={ours['sum_exact']} "
        f"mean ok={ours['mean_close']}"
        + (f"; flower mean ok={theirs['mean_close']}" if theirs else "")
    )


def _print_ratios(out: dict[str, Any]) -> None:
    print(
        f"compute_ratio (flower/fedveil, CPU of all clients + server) = "
        f"{out['compute_ratio']:.1f}x; without quantization "
        f"{out['compute_ratio_excl_quantize']:.1f}x; round critical path (median client + "
        f"server) {out['critical_path_ratio']:.1f}x"
    )
    print(
        f"compute_ratio ceiling (our round at its primitive floor + our quantization) = "
        f"{out['compute_ratio_ceiling']:.1f}x"
    )


def _print_breakdown(b: dict[str, Any]) -> None:
    print(
        f"instrumented round without quantization {b['round_excl_quantize_s'] * 1e3:.1f} ms = "
        f"primitives in situ {b['primitives_in_situ_s'] * 1e3:.1f} ms + protocol logic "
        f"{b['protocol_logic_s'] * 1e3:.1f} ms; the same calls in a tight loop "
        f"{b['primitive_floor_s'] * 1e3:.1f} ms (clock wrapper {b['wrapper_overhead_us']:.2f} "
        "us a call, taken out)"
    )
    for name, row in b["by_primitive"].items():
        print(
            f"  {name:20}{row['calls']:>7} calls  in situ {row['in_situ_us']:8.2f} us  "
            f"tight loop {row['hot_us']:8.2f} us"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--dim", type=int, default=100_000)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--neighbors", type=int, default=None)
    parser.add_argument("--threshold", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-flower", action="store_true", help="skip the Flower baseline")
    parser.add_argument("--repeats", type=int, default=1, help="keep each side's cheapest run")
    parser.add_argument("--json", action="store_true", help="print the raw results as JSON")
    parser.add_argument(
        "--breakdown",
        action="store_true",
        help="one more round of ours with every primitive call timed: primitives in situ, "
        "protocol logic, and the primitive floor",
    )
    parser.add_argument(
        "--threats",
        action="store_true",
        help="compare our semi-honest and malicious-server modes instead (no Flower)",
    )
    args = parser.parse_args(argv)
    if args.threats:
        out = compare_threats(args.n, args.dim, args.dropout, args.seed, args.repeats)
        if args.json:
            print(json.dumps(out, indent=2, sort_keys=True))
        else:
            _print_threats(out)
        return
    out = compare(
        args.n,
        args.dim,
        args.dropout,
        args.neighbors,
        args.threshold,
        args.seed,
        flower=not args.no_flower,
        repeats=args.repeats,
        breakdown=args.breakdown,
    )
    if args.json:
        print(json.dumps(out, indent=2, sort_keys=True))
    else:
        _print_table(out)


if __name__ == "__main__":
    main()
