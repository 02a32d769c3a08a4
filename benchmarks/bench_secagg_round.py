"""`fedveil bench secagg`: secure aggregation, protocol compute and whole rounds, ours vs Flower.

One invocation measures, side by side on the same inputs:

* protocol compute per client and on the server (`bench_secagg.compare`: fedveil's protocol and
  a replay of Flower 1.41's SecAgg+ building blocks, no transport);
* whole rounds over Flower's simulation transport (Ray), each framework with and without secure
  aggregation: fedveil's ServerApp (`run_on_flower`, `secagg.enabled` true / false) and, with
  `--peer flower`, Flower's legacy compat path (`DefaultWorkflow` + `FedAvg`, with and without
  `SecAggPlusWorkflow`, clients wrapped in `secaggplus_mod`). The overhead of secure
  aggregation is the secure round minus the plain round of the same framework; `ratio` is
  Flower's overhead over ours.

The workload is the same on both sides: N clients, a single linear layer with ~D parameters,
a handful of random examples per client and one local SGD step (training is negligible), all
clients sampled every round, the same neighbour count k and threshold t, the same
quantization (clip 8, 2^22 levels, max weight = the largest client), and the same clients
(a fraction P, chosen like the compute benchmark's) raising at the same protocol stage
(default: masked input, after they shared their keys, so the server must recover their
masks). In plain rounds those clients raise on their training request. (The compute part
always drops its clients at masked input, the expensive recovery path.)

Per-round time is the median of the steady rounds (rounds 2..R of every repeat; round 1 and
start-up excluded). Bytes are payload bytes per surviving client per round (array data, raw
bytes and strings, 8 per number, key names), counted on the messages each server sends and
receives. Run: `python -m fedveil.benchmarks.bench_secagg_round --clients 100 --dim 100000
--dropout 0.1 --peer flower`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import sys
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedveil.benchmarks import bench_secagg, run_directory
from fedveil.benchmarks.harness import command_main
from fedveil.benchmarks.memwatch import ProcessPeak
from fedveil.benchmarks.procstats import sample_tree
from fedveil.benchmarks.secagg_round_workload import (
    ADVERSARIAL_RATE,
    AT_MOST,
    CLASSES,
    CLIP_RANGE,
    DROP_MARKER,
    DROP_STAGES,
    LEVELS,
    LR,
    TARGETS,
    ClientDropped,
    Traffic,
    Workload,
    graph_parameters,
    median,
    payload_size,
    steady_rounds,
)
from fedveil.client.runtime import ClientRuntime, client_generator
from fedveil.client.training import LocalTraining, train_local
from fedveil.config import RunConfig, config_from_dict
from fedveil.flat_model import FlatModel
from fedveil.protocol.envelope import Envelope
from fedveil.protocol.kinds import Kind
from fedveil.protocol.piggyback import detach, join_replies
from fedveil.server.engine.aggregation import Aggregate, NoUpdates, UpdateChannel
from fedveil.server.engine.lifecycle import RunLifecycle
from fedveil.server.engine.rounds import RoundEngine, initial_model
from fedveil.server.engine.runstore import RunStore
from fedveil.server.engine.transport import ClientFailure, ReplySink, RoundReporter, Transport
from fedveil.server.engine.unmask_gate import Aborted
from fedveil.tasks import Task

# -- our side -------------------------------------------------------------------------------


def report_of(part: object, round_num: int) -> Mapping[str, Any]:
    """What a wrapped transport or channel adds to the round's record (RoundReporter):
    the wrappers below pass it through, so the engine records the rounds it would
    record without them."""
    return part.round_report(round_num) if isinstance(part, RoundReporter) else {}


class DroppingRuntime(ClientRuntime):
    """fedveil's client runtime, except that the chosen clients raise at the chosen kinds."""

    def __init__(self, task: Task, dropped: frozenset[int], kinds: frozenset[str]) -> None:
        super().__init__(task, "cpu")
        self.dropped, self.kinds = dropped, kinds

    def handle_one(self, client_id: int, msg: Envelope, state: dict[str, Any]) -> Envelope:
        # Per message, not per exchange: a client dropping at this round's masked input
        # still answers the next round's key stage riding with it (as Flower's would,
        # which gets that stage in a message of its own).
        if client_id in self.dropped and msg.kind in self.kinds:
            raise ClientDropped(f"{DROP_MARKER} client {client_id} drops at {msg.kind}")
        return super().handle_one(client_id, msg, state)


class DroppingTransport:
    """In-process: the chosen clients fail at the chosen kinds, as a client that raises would."""

    def __init__(self, base: Transport, dropped: frozenset[int], kinds: frozenset[str]) -> None:
        self.base, self.dropped, self.kinds = base, dropped, kinds

    def client_ids(self) -> Sequence[int]:
        return self.base.client_ids()

    def exchange(
        self,
        requests: Mapping[int, Envelope],
        timeout_s: float | None,
        on_reply: ReplySink | None = None,
    ) -> dict[int, Envelope | ClientFailure]:
        failing = {c for c, m in requests.items() if c in self.dropped and m.kind in self.kinds}
        sent = {c: m for c, m in requests.items() if c not in failing}
        # A failing client still answers a rider (the next round's key stage), as
        # DroppingRuntime's does.
        riders = {c: detach(requests[c])[1] for c in failing}
        sent.update({c: r for c, r in riders.items() if r is not None})
        rider_replies: dict[int, Envelope | ClientFailure] = {}

        def forward(cid: int, reply: Envelope | ClientFailure) -> None:
            if cid in failing:
                rider_replies[cid] = reply  # joined with the drop below
            elif on_reply is not None:
                on_reply(cid, reply)

        out = self.base.exchange(sent, timeout_s, on_reply=None if on_reply is None else forward)
        for c in failing:
            reason = f"{DROP_MARKER} client {c} drops at {requests[c].kind}"
            rider_reply = rider_replies.get(c, out.get(c))
            if riders[c] is None:
                out[c] = ClientFailure(c, reason)
            elif isinstance(rider_reply, Envelope):
                out[c] = join_replies(reason, rider_reply, requests[c])
            else:
                out[c] = ClientFailure(c, reason)
        return out

    def close(self) -> None:
        self.base.close()

    def round_report(self, round_num: int) -> Mapping[str, Any]:
        return report_of(self.base, round_num)


def drop_kinds(w: Workload, secagg: bool) -> frozenset[str]:
    return frozenset({DROP_STAGES[w.drop_stage][0] if secagg else Kind.TRAIN.value})


class DroppingRuntimeFactory:
    """Picklable: builds the workload's task and a DroppingRuntime inside each Ray worker."""

    def __init__(self, workload: Workload, secagg: bool) -> None:
        self.workload, self.secagg = workload, secagg

    def __call__(self) -> ClientRuntime:
        w = self.workload
        return DroppingRuntime(w.task(), w.dropped, drop_kinds(w, self.secagg))


class CountingTransport:
    """Counts payload bytes each way per client and round; notes failed clients."""

    def __init__(self, inner: Transport, counter: Traffic) -> None:
        self.inner, self.counter = inner, counter

    def client_ids(self) -> Sequence[int]:
        return self.inner.client_ids()

    def exchange(
        self,
        requests: Mapping[int, Envelope],
        timeout_s: float | None,
        on_reply: ReplySink | None = None,
    ) -> dict[int, Envelope | ClientFailure]:
        c = self.counter
        for cid, env in requests.items():
            c.add(c.down, env.round, cid, payload_size(env.config, env.arrays))

        def count(cid: int, reply: Envelope | ClientFailure) -> None:
            rnd = requests[cid].round
            if isinstance(reply, ClientFailure):
                c.failed[rnd].add(cid)
            else:
                c.add(c.up, rnd, cid, payload_size(reply.config, reply.arrays))

        def count_and_forward(cid: int, reply: Envelope | ClientFailure) -> None:
            count(cid, reply)
            assert on_reply is not None
            on_reply(cid, reply)

        started = time.perf_counter()
        replies = self.inner.exchange(
            requests, timeout_s, on_reply=None if on_reply is None else count_and_forward
        )
        if requests:
            first = next(iter(requests.values()))
            c.timed(first.round, first.kind, time.perf_counter() - started)
        for cid, reply in replies.items():
            count(cid, reply)
        return replies

    def close(self) -> None:
        self.inner.close()

    def round_report(self, round_num: int) -> Mapping[str, Any]:
        return report_of(self.inner, round_num)


class RecordingChannel:
    """Passes the collection through; keeps round 1's aggregate for the correctness check."""

    def __init__(self, inner: UpdateChannel) -> None:
        self.inner = inner
        self.first: Aggregate | None = None

    def collect(
        self,
        transport: Transport,
        requests: dict[int, Envelope],
        model_size: int,
        timeout_s: float | None,
        upcoming: list[int] | None = None,
    ) -> Aggregate | Aborted | NoUpdates | None:
        outcome = self.inner.collect(transport, requests, model_size, timeout_s, upcoming)
        # Only a real sum is checked: an aborted round or one with no update is not.
        if self.first is None and isinstance(outcome, Aggregate):
            self.first = outcome
        return outcome

    def round_report(self, round_num: int) -> Mapping[str, Any]:
        return report_of(self.inner, round_num)


class ExtraExchangesChannel:
    """The plain channel after `extra` empty exchanges (hello) with the cohort: what a
    secure round would cost if its protocol stages beyond the training exchange cost nothing
    but the transport: the floor of its secure-aggregation overhead."""

    def __init__(self, inner: UpdateChannel, extra: int) -> None:
        self.inner, self.extra = inner, extra

    def collect(
        self,
        transport: Transport,
        requests: dict[int, Envelope],
        model_size: int,
        timeout_s: float | None,
        upcoming: list[int] | None = None,
    ) -> Aggregate | None:
        rnd = next(iter(requests.values())).round
        for _ in range(self.extra):
            transport.exchange({cid: Envelope(Kind.HELLO, rnd) for cid in requests}, timeout_s)
        return self.inner.collect(transport, requests, model_size, timeout_s, upcoming)

    def round_report(self, round_num: int) -> Mapping[str, Any]:
        return report_of(self.inner, round_num)


# Exchanges a steady semi-honest round of ours adds to the training exchange: unmask (the
# next round's key stages ride on masked input and unmask). SecAgg+ adds three.
EXTRA_EXCHANGES = 1


def run_config(w: Workload, secagg: bool, k: int, t: int, rounds: int, transport: str) -> RunConfig:
    return config_from_dict(
        {
            "seed": w.seed,
            "transport": transport,
            "device": "cpu",
            "data": {"num_clients": w.clients},
            # One SGD step over a client's few examples: training cost is negligible.
            "client": {"local_epochs": 1, "batch_size": w.examples, "lr": LR, "momentum": 0.0},
            "server": {"rounds": rounds, "per_round": w.clients, "min_clients": 1},
            "eval": {"central_every": 0, "federated_every": 0},
            "secagg": {
                "enabled": secagg,
                "adversarial_rate": ADVERSARIAL_RATE,
                "dropout_rate": w.dropout,
                "neighbors": k,
                "threshold": t,
                "clip_range": CLIP_RANGE,
                "levels": LEVELS,
                "max_weight": w.examples,
            },
        }
    )


def run_ours(
    w: Workload,
    secagg: bool,
    k: int,
    t: int,
    rounds: int,
    transport: str = "flower",
    *,
    floor: bool = False,
    run_dir: Path | None = None,
) -> dict[str, Any]:
    """R rounds of fedveil's run lifecycle (the one `fedveil simulate` and the deployed
    ServerApp run: privacy pipeline, round engine, run directory, model), with or without
    secure aggregation (or, with `floor`, plain rounds padded with the secure round's extra
    exchanges, left empty). The run directory is `run_dir` (None: a temporary folder)."""
    cfg = run_config(w, secagg, k, t, rounds, transport)
    task = w.task()
    counter = Traffic()
    with run_directory(run_dir) as out:
        run = RunLifecycle(cfg, task, RunStore(out))
        inner = ExtraExchangesChannel(run.channel, EXTRA_EXCHANGES) if floor else run.channel
        channel = run.channel = RecordingChannel(inner)
        started = time.perf_counter()
        with ProcessPeak() as peak:
            engine, cpu_marks = _run_rounds(run, w, secagg, transport, counter)
        wall = time.perf_counter() - started
        run.finish(engine, engine.summary(wall), model_metadata={"task": task.name})
    durations = [r.duration_s for r in engine.history]
    first = channel.first
    return {
        "framework": "fedveil",
        "secagg": secagg,
        "transport": transport,
        "round_s": durations,
        "round_cpu_s": list(np.diff([m[0] for m in cpu_marks])),
        # over Flower: the driver process alone (ServerApp, SuperLink, Ray submissions)
        "round_driver_cpu_s": list(np.diff([m[1] for m in cpu_marks])),
        "wall_s": wall,
        # This process over the run: the server (in-process: with one client at a time).
        "peak_rss_mb": peak.peak_mb,
        "survivors": [r.cohort_aggregated for r in engine.history],
        "applied": [r.applied for r in engine.history],
        **counter.per_client(steady_rounds(rounds)),
        "exchange_s": counter.exchanges(steady_rounds(rounds)),
        "outside_exchanges_s": counter.outside(durations),
        # Round 1's mean update, float64 (dropped before the JSON is written).
        "_mean": None if first is None else first.mean.double().numpy(),
        "_contributors": 0 if first is None else len(first.contributors),
    }


def _run_rounds(
    run: RunLifecycle, w: Workload, secagg: bool, transport: str, counter: Traffic
) -> tuple[RoundEngine, list[tuple[float, float]]]:
    """The run's rounds over `transport`, every exchange counted; the engine, and the CPU
    time at the engine's start and at each round's end: in-process, this process's (every
    client runs here); over Flower, this process tree's (the driver with Flower's SuperLink
    and the Ray workers running the ClientApps). Either is the round's whole compute, less
    sensitive to a busy machine than its wall time."""

    def clock() -> tuple[float, float]:
        if transport == "inprocess":
            return (time.process_time(),) * 2
        tree = sample_tree(os.getpid())
        return tree.cpu_s, tree.root_cpu_s

    cpu_marks = [clock()]

    def build(base: Transport) -> RoundEngine:
        def mark(_record: Any) -> None:
            cpu_marks.append(clock())

        cpu_marks[0] = clock()
        return run.engine(CountingTransport(base, counter), on_round=mark, resume=False)

    if transport == "inprocess":
        from fedveil.simulations.inprocess import InProcessTransport

        base = DroppingTransport(InProcessTransport(run.task), w.dropped, drop_kinds(w, secagg))
        engine = build(base)
        cpu_marks[0] = clock()
        try:
            engine.run()
        finally:
            base.close()
        return engine, cpu_marks
    from fedveil.simulations.flower_runner import run_on_flower

    factory = DroppingRuntimeFactory(w, secagg)
    return run_on_flower(run.cfg, w.clients, build, runtime_factory=factory)["engine"], cpu_marks


# -- the benchmark ------------------------------------------------------------------------


def _steady(values: Sequence[float]) -> Sequence[float]:
    return values[1 : len(values) - 1 if len(values) > 2 else len(values)]


def steady(runs: Sequence[dict[str, Any]], key: str = "round_s") -> float | None:
    """Median of the steady rounds (see steady_rounds) of every run."""
    return median([s for run in runs for s in _steady(run[key])])


def steady_cpu(runs: Sequence[dict[str, Any]], key: str = "round_cpu_s") -> float | None:
    """Median CPU seconds of the steady rounds (see _run_rounds for whose)."""
    return median([s for run in runs if run.get(key) for s in _steady(run[key])])


def expected_contributors(w: Workload, secagg: bool) -> list[int]:
    """Who is in round 1's sum: a client failing at unmask has already sent its masked input."""
    if secagg and w.drop_stage == "unmask":
        return list(range(w.clients))
    return sorted(set(range(w.clients)) - w.dropped)


def reference_mean(w: Workload, contributors: Sequence[int]) -> np.ndarray:
    """Round 1's weighted mean update, computed here in float64 from the clients' own steps."""
    task = w.task()
    model = FlatModel(task.model_fn(), "cpu")
    start = FlatModel(initial_model(task, w.seed)).get()
    hp = LocalTraining(local_epochs=1, batch_size=w.examples, lr=LR)
    total, weight = np.zeros(model.size), 0
    for cid in contributors:
        data = task.client_data(cid)
        result = train_local(
            model, start, data.x, data.y, hp, task.loss_fn, client_generator(w.seed, 1, cid)
        )
        total += result.num_examples * result.delta.double().numpy()
        weight += result.num_examples
    return total / weight


def quantized_mean_bound(w: Workload, contributors: Sequence[int]) -> float:
    """Largest error of a quantized weighted mean, ours or SecAgg+'s: each contributor's
    x·w_i/W is rounded to within one step 2r/(L-1), and the sum is scaled by W/Σw_i. (SecAgg+
    also rounds w_i/W to 1/L: relative 1e-6 of values far below 1, inside the slack.)"""
    step = 2 * CLIP_RANGE / (LEVELS - 1)
    weight = sum(w.client_size(c) for c in contributors)
    return len(contributors) * step * w.examples / weight + 1e-6


# float32 sums of float32 updates against the float64 reference.
PLAIN_TOLERANCE = 1e-5


def check_aggregates(
    w: Workload,
    plain: dict[str, Any],
    secure: dict[str, Any],
    reference: np.ndarray,
    reference_secagg: np.ndarray | None = None,
) -> dict[str, Any]:
    """Round 1 of both runs of one framework against the reference mean (the secure run's
    own reference when its contributors differ: clients failing at unmask)."""
    bound = quantized_mean_bound(w, expected_contributors(w, True))
    plain_diff = _max_diff(plain["_mean"], reference)
    secure_diff = _max_diff(
        secure["_mean"], reference if reference_secagg is None else reference_secagg
    )
    return {
        "contributors_as_planned": plain["_contributors"] == len(expected_contributors(w, False))
        and secure["_contributors"] == len(expected_contributors(w, True)),
        "plain_max_abs_err": plain_diff,
        "secagg_max_abs_err": secure_diff,
        "secagg_error_bound": bound,
        "plain_ok": plain_diff <= PLAIN_TOLERANCE,
        "secagg_ok": secure_diff <= bound,
    }


def _max_diff(a: np.ndarray | None, b: np.ndarray) -> float:
    if a is None or a.shape != b.shape:
        return math.inf
    return float(np.max(np.abs(a - b)))


def _without_private(run: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in run.items() if not k.startswith("_")}


def bench(
    w: Workload,
    *,
    neighbors: int | None = None,
    threshold: int | None = None,
    rounds: int = 3,
    repeat: int = 1,
    peer: str | None = None,
    transport: str = "flower",
    compute: bool = True,
    floor: bool = False,
) -> dict[str, Any]:
    """Everything `fedveil bench secagg` reports, as one JSON-able dict."""
    check_arguments(w, rounds=rounds, repeat=repeat, peer=peer, transport=transport)
    k, t = graph_parameters(w, neighbors, threshold)
    load_before = os.getloadavg()
    started = time.perf_counter()
    out: dict[str, Any] = {
        "clients": w.clients,
        "dim": w.num_params,
        "dropout": w.dropout,
        "dropped": len(w.dropped),
        "drop_stage": w.drop_stage,
        "neighbors": k,
        "threshold": t,
        "rounds": rounds,
        "repeat": repeat,
        "transport": transport,
        "peer": peer,
        "workload": asdict(w),
    }
    if compute:
        # The protocol alone, no transport (CPU seconds; see bench_secagg).
        out["compute"] = bench_secagg.compare(
            w.clients,
            w.num_params,
            w.dropout,
            k,
            t,
            w.seed,
            flower=peer == "flower",
            repeats=repeat,
        )
    runs = run_rounds(w, k, t, rounds, repeat=repeat, peer=peer, transport=transport, floor=floor)
    out["checks"] = round_one_checks(w, runs)
    out["rounds_detail"] = {name: [_without_private(r) for r in rs] for name, rs in runs.items()}
    out["round"] = round_summary(runs, floor=floor)
    out.update(headline(out))
    out["load_avg"] = {"before": list(load_before), "after": list(os.getloadavg())}
    out["wall_s"] = time.perf_counter() - started
    return out


def check_arguments(
    w: Workload, *, rounds: int, repeat: int, peer: str | None, transport: str
) -> None:
    """Refuse a workload or flags the benchmark cannot measure, naming the flag."""
    if rounds < 2:
        raise ValueError(f"--rounds {rounds}: need >= 2 (round 1 is excluded as warm-up)")
    if repeat < 1:
        raise ValueError(f"--repeat {repeat}: must be >= 1")
    if w.clients < 2:
        raise ValueError(f"--clients {w.clients}: secure aggregation needs >= 2 clients")
    if not 0 <= w.dropout <= 0.5:
        raise ValueError(f"--dropout {w.dropout}: must be in [0, 0.5]")
    if w.examples < 1 or w.dim < 2 * CLASSES:
        raise ValueError(f"--examples {w.examples}, --dim {w.dim}: need >= 1 and >= {2 * CLASSES}")
    if w.drop_stage not in DROP_STAGES:
        raise ValueError(f"--drop-stage {w.drop_stage!r}: one of {', '.join(DROP_STAGES)}")
    if peer is not None and transport != "flower":
        raise ValueError("--peer flower compares rounds over Flower's transport: drop --transport")


def run_rounds(
    w: Workload,
    k: int,
    t: int,
    rounds: int,
    *,
    repeat: int,
    peer: str | None,
    transport: str,
    floor: bool,
) -> dict[str, list[dict[str, Any]]]:
    """Every configuration's runs, by name (`fedveil_plain`, `flower_secagg`, ...)."""
    runs: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for _ in range(repeat):
        # Interleaved, so that a change of machine load hits every configuration alike.
        # The secure run first: in-process, the plain run's n replies leave freed heap
        # that glibc keeps (workers.keep_freed_memory), and the secure run's peak RSS
        # would start from it.
        runs["fedveil_secagg"].append(run_ours(w, True, k, t, rounds, transport))
        runs["fedveil_plain"].append(run_ours(w, False, k, t, rounds, transport))
        if floor:
            runs["fedveil_floor"].append(run_ours(w, False, k, t, rounds, transport, floor=True))
        if peer == "flower":
            from fedveil.benchmarks.flower_secaggplus_peer import run_flower

            runs["flower_plain"].append(run_flower(w, False, k, t, rounds))
            runs["flower_secagg"].append(run_flower(w, True, k, t, rounds))
    return runs


def round_one_checks(w: Workload, runs: Mapping[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Round 1 of every framework's first plain and secure run, against the same reference."""
    reference = reference_mean(w, expected_contributors(w, False))
    reference_sa = (
        reference_mean(w, expected_contributors(w, True)) if w.drop_stage == "unmask" else None
    )
    return {
        fw: check_aggregates(
            w, runs[f"{fw}_plain"][0], runs[f"{fw}_secagg"][0], reference, reference_sa
        )
        for fw in ("fedveil", "flower")
        if f"{fw}_plain" in runs
    }


def round_summary(runs: Mapping[str, list[dict[str, Any]]], *, floor: bool) -> dict[str, Any]:
    """Per framework: steady round times, overhead, bytes and where the time goes."""
    summary = {
        fw: framework_summary(runs[f"{fw}_plain"], runs[f"{fw}_secagg"])
        for fw in ("fedveil", "flower")
        if f"{fw}_plain" in runs
    }
    if floor:
        floor_s = steady(runs["fedveil_floor"])
        plain_s = summary["fedveil"]["plain_round_s"]
        summary["fedveil"]["floor_round_s"] = floor_s
        summary["fedveil"]["floor_round_cpu_s"] = steady_cpu(runs["fedveil_floor"])
        summary["fedveil"]["transport_floor_s"] = (
            None if floor_s is None or plain_s is None else floor_s - plain_s
        )
    return summary


def framework_summary(
    plain_runs: Sequence[dict[str, Any]], secure_runs: Sequence[dict[str, Any]]
) -> dict[str, Any]:
    """One framework's plain and secure runs, side by side."""
    plain, secure = steady(plain_runs), steady(secure_runs)
    last, last_plain = secure_runs[-1], plain_runs[-1]
    return {
        "plain_round_s": plain,
        "secagg_round_s": secure,
        "plain_round_cpu_s": steady_cpu(plain_runs),
        "plain_peak_rss_mb": _most(r.get("peak_rss_mb") for r in plain_runs),
        "secagg_peak_rss_mb": _most(r.get("peak_rss_mb") for r in secure_runs),
        # The first secure run's: the first of ours in this process (later ones start
        # from the heap an earlier plain run left).
        "first_secagg_peak_rss_mb": secure_runs[0].get("peak_rss_mb"),
        "secagg_round_cpu_s": steady_cpu(secure_runs),
        "overhead_s": None if plain is None or secure is None else secure - plain,
        "overhead_cpu_s": _minus(steady_cpu(secure_runs), steady_cpu(plain_runs)),
        "plain_round_driver_cpu_s": steady_cpu(plain_runs, "round_driver_cpu_s"),
        "secagg_round_driver_cpu_s": steady_cpu(secure_runs, "round_driver_cpu_s"),
        "bytes_up_per_client": last["bytes_up_per_client"],
        "bytes_down_per_client": last["bytes_down_per_client"],
        "plain_bytes_up_per_client": last_plain["bytes_up_per_client"],
        "plain_bytes_down_per_client": last_plain["bytes_down_per_client"],
        # Where the secure round's time goes (last run): each exchange, and the rest.
        "secagg_exchange_s": last["exchange_s"],
        "plain_exchange_s": last_plain["exchange_s"],
        "secagg_outside_exchanges_s": steady(secure_runs, "outside_exchanges_s"),
        "plain_outside_exchanges_s": steady(plain_runs, "outside_exchanges_s"),
    }


def _minus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def _most(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def headline(out: Mapping[str, Any]) -> dict[str, Any]:
    """The ratios, their ceilings and the targets, from the round summary and compute part."""
    summary = out["round"]
    ours_over = summary["fedveil"]["overhead_s"]
    theirs_over = summary.get("flower", {}).get("overhead_s")
    floor_over = summary["fedveil"].get("transport_floor_s")
    compute = out.get("compute", {})
    head: dict[str, Any] = {
        # An overhead at or below zero is noise swamping the difference: no meaningful ratio.
        "ratio": _over(theirs_over, ours_over),
        # The best `ratio` any protocol of ours could reach over this transport.
        "ratio_ceiling": _over(theirs_over, floor_over),
        "compute_ratio": compute.get("compute_ratio"),
        # The best `compute_ratio` our protocol could reach: our round at its primitive floor.
        "compute_ratio_ceiling": compute.get("compute_ratio_ceiling"),
    }
    # Our server process's peak over a secure run (over Flower: the ServerApp's process;
    # in-process: the server and the one client running at a time).
    head["server_peak_rss_mb"] = summary["fedveil"]["first_secagg_peak_rss_mb"]
    if compute:
        head["masking_over_prg"] = compute["fedveil"]["masking_over_prg"]
        # The median surviving client's compute (quantization aside) over its primitive floor.
        head["per_client_floor_ratio"] = compute["fedveil"]["per_client_floor_ratio"]
    head["targets"] = {
        name: {"target": goal, "met": None if head.get(name) is None else _meets(name, head, goal)}
        for name, goal in TARGETS.items()
    }
    return head


def _over(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator, or None when either is missing or the denominator <= 0."""
    if numerator is None or not denominator or denominator <= 0:
        return None
    return numerator / denominator


def _meets(name: str, out: Mapping[str, Any], goal: float) -> bool:
    value = float(out[name])
    # Written so that a NaN meets no target.
    return value <= goal if name in AT_MOST else value >= goal


# -- report -------------------------------------------------------------------------------


def _fmt_s(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.3f} s"


def _fmt_b(v: float | None) -> str:
    return "n/a" if v is None else f"{v:,.0f}"


def format_report(out: dict[str, Any]) -> str:
    lines = [
        f"secure aggregation benchmark: N={out['clients']} D={out['dim']} "
        f"dropout={out['dropout']} ({out['dropped']} clients fail at {out['drop_stage']}) "
        f"k={out['neighbors']} t={out['threshold']} rounds={out['rounds']} "
        f"repeat={out['repeat']}",
    ]
    if "compute" in out:
        lines.append("")
        lines.append("protocol compute (no transport, CPU time):")
        buf = _capture(bench_secagg._print_table, out["compute"])
        lines.extend("  " + line for line in buf.splitlines())
    lines.append("")
    transport = "Flower's simulation transport" if out["transport"] == "flower" else "in-process"
    lines.append(f"whole rounds over {transport} (median of steady rounds):")
    header = f"  {'':12}{'plain':>12}{'secagg':>12}{'overhead':>12}{'up B/client':>14}"
    lines.append(header + f"{'down B/client':>15}")
    for fw, s in out["round"].items():
        lines.append(
            f"  {fw:12}{_fmt_s(s['plain_round_s']):>12}{_fmt_s(s['secagg_round_s']):>12}"
            f"{_fmt_s(s['overhead_s']):>12}{_fmt_b(s['bytes_up_per_client']):>14}"
            f"{_fmt_b(s['bytes_down_per_client']):>15}"
        )
        lines.append(
            f"  {'  (plain)':12}{'':36}{_fmt_b(s['plain_bytes_up_per_client']):>14}"
            f"{_fmt_b(s['plain_bytes_down_per_client']):>15}"
        )
    for fw, s in out["round"].items():
        for mode in ("plain", "secagg"):
            parts = s[f"{mode}_exchange_s"]
            shown = ", ".join(f"{k} {v:.2f}" for k, v in parts.items() if v is not None)
            rest = _fmt_s(s[f"{mode}_outside_exchanges_s"])
            lines.append(f"  {fw} {mode} exchanges (s): {shown}; outside exchanges {rest}")
    f = out["round"]["fedveil"]
    if f["secagg_round_cpu_s"] is not None:
        lines.append(
            f"  fedveil round CPU (all clients + server; over Flower: the driver and the Ray "
            f"workers): plain {_fmt_s(f['plain_round_cpu_s'])}, secagg "
            f"{_fmt_s(f['secagg_round_cpu_s'])}, overhead {_fmt_s(f['overhead_cpu_s'])}; "
            f"the driver alone: plain {_fmt_s(f['plain_round_driver_cpu_s'])}, secagg "
            f"{_fmt_s(f['secagg_round_driver_cpu_s'])}"
        )
    if "floor_round_s" in f:
        lines.append(
            f"  fedveil plain + {EXTRA_EXCHANGES} empty exchanges: {_fmt_s(f['floor_round_s'])} "
            f"(transport floor of the overhead {_fmt_s(f['transport_floor_s'])}; best ratio "
            f"it allows: {_short(out['ratio_ceiling'])})"
        )
    for fw, c in out["checks"].items():
        lines.append(f"  check {fw}: " + ", ".join(f"{k}={_short(v)}" for k, v in c.items()))
    lines.append("")
    for name, target in out["targets"].items():
        value = out.get(name)
        shown = "n/a" if value is None else f"{value:.2f}"
        met = {None: "not measured", True: "met", False: "MISSED"}[target["met"]]
        cmp = "<=" if name in AT_MOST else ">="
        ceiling = out.get(f"{name}_ceiling")
        limit = "" if ceiling is None else f"; ceiling {ceiling:.1f}"
        lines.append(f"{name} = {shown} (target {cmp} {target['target']:g}: {met}{limit})")
    load = out["load_avg"]
    lines.append(
        f"load average before {load['before'][0]:.2f}, after {load['after'][0]:.2f}; "
        f"benchmark wall {out['wall_s']:.0f} s"
    )
    return "\n".join(lines)


def _short(v: Any) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)


def _capture(fn: Any, *args: Any) -> str:
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        fn(*args)
    return buf.getvalue()


# -- command line -------------------------------------------------------------------------


SECAGG_SUMMARY = (
    "`fedveil bench secagg`: secure aggregation, protocol compute and whole rounds, ours vs Flower."
)


def add_secagg_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of `fedveil bench secagg`."""
    p.add_argument("--clients", type=int, default=100, help="clients, all sampled [100]")
    p.add_argument("--dim", type=int, default=100_000, help="model parameters [100000]")
    p.add_argument("--dropout", type=float, default=0.1, help="fraction that fails [0.1]")
    p.add_argument("--neighbors", type=int, help="neighbours k [from the threat model]")
    p.add_argument("--threshold", type=int, help="Shamir threshold t [from the threat model]")
    p.add_argument("--peer", choices=["flower"], help="also run Flower's SecAgg+")
    p.add_argument(
        "--rounds", type=int, default=4, help="rounds per run; the first and last excluded [4]"
    )
    p.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="runs per round configuration, interleaved, and compute runs per side (each side "
        "keeps its cheapest) [1]",
    )
    p.add_argument(
        "--drop-stage",
        choices=list(DROP_STAGES),
        default="masked_input",
        help="stage at which the failing clients raise [masked_input]",
    )
    p.add_argument(
        "--transport",
        choices=["flower", "inprocess"],
        default="flower",
        help="where our rounds run [flower]; inprocess has no peer",
    )
    p.add_argument("--examples", type=int, default=8, help="most examples per client [8]")
    p.add_argument("--no-compute", action="store_true", help="skip the protocol compute part")
    p.add_argument(
        "--floor",
        action="store_true",
        help="also run plain rounds with 1 extra empty exchange: the transport's share of "
        "our steady secure round's overhead, and the best ratio it allows",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print a JSON summary as the last line")


def cmd_bench_secagg(args: argparse.Namespace) -> int:
    w = Workload(
        clients=args.clients,
        dim=args.dim,
        dropout=args.dropout,
        drop_stage=args.drop_stage,
        examples=args.examples,
        seed=args.seed,
    )
    with _quiet_dropouts(), _torch_threads(1):
        out = bench(
            w,
            neighbors=args.neighbors,
            threshold=args.threshold,
            rounds=args.rounds,
            repeat=args.repeat,
            peer=args.peer,
            transport=args.transport,
            compute=not args.no_compute,
            floor=args.floor,
        )
    print(format_report(out), file=sys.stderr if args.json else sys.stdout)
    if args.json:
        sys.stdout.flush()
        print(json.dumps(out, sort_keys=True, default=_jsonable))
    return 0


def _jsonable(value: Any) -> Any:
    if isinstance(value, (np.integer, np.floating)):
        return value.item()
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


@contextlib.contextmanager
def _torch_threads(count: int) -> Iterator[None]:
    """The workload's tensors are tiny: on a loaded machine torch's thread pool only adds
    milliseconds of synchronisation per op (Ray's workers already run single-threaded)."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class _DropFilter(logging.Filter):
    """Drops log records of the benchmark's deliberate failures. Flower's Ray backend first
    logs a generic line without the exception; a real failure still shows the two records
    that follow it (the exception and its traceback), which carry no marker."""

    GENERIC = "An exception was raised when processing a message by"

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        return DROP_MARKER not in text and not text.startswith(self.GENERIC)


@contextlib.contextmanager
def _quiet_dropouts() -> Iterator[None]:
    """Flower logs every client exception with its traceback; ours are on purpose."""
    filt = _DropFilter()
    names = ("flwr", "fedveil.client", "fedveil.server", "fedveil.secagg")
    loggers = [logging.getLogger(name) for name in names]
    for logger in loggers:
        logger.addFilter(filt)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(filt)


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """`fedveil bench ...` and `python -m fedveil.benchmarks.bench_secagg_round`."""
    return command_main(
        argv,
        prog=prog or "python -m fedveil.benchmarks.bench_secagg_round",
        description=SECAGG_SUMMARY,
        add_arguments=add_secagg_arguments,
        run=cmd_bench_secagg,
    )


if __name__ == "__main__":
    sys.exit(main())
