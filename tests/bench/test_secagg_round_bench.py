"""`fedveil bench secagg` at tiny sizes: correct aggregates, byte counts, the JSON contract.

Nothing here asserts a timing or a ratio's size: the targets live in the benchmark's output.
"""

from __future__ import annotations

import argparse
import json
import math

import numpy as np
import pytest

from fedveil.benchmarks import bench_secagg, bench_secagg_round
from fedveil.benchmarks.bench_secagg_round import (
    DroppingRuntime,
    Workload,
    bench,
    expected_contributors,
    graph_parameters,
    main,
    reference_mean,
    run_ours,
)
from fedveil.cli import bench as bench_cli
from fedveil.cli.main import build_parser
from fedveil.cli.main import main as cli_main
from fedveil.protocol.envelope import Envelope
from fedveil.protocol.piggyback import attach, split_reply

TINY = Workload(clients=6, dim=1000, dropout=0.17, seed=3)
KEYS = {"ratio", "compute_ratio", "round", "checks", "compute", "neighbors", "threshold"}


def test_workload_has_d_parameters_and_drops_the_compute_benchmarks_clients():
    assert TINY.num_params == 1000
    assert sum(p.numel() for p in TINY.model().parameters()) == 1000
    compute_choice = bench_secagg.dropped_clients(list(range(1, 7)), 0.17, 3)
    assert TINY.dropped == {c - 1 for c in compute_choice} and len(TINY.dropped) == 1
    assert all(1 <= TINY.client_size(c) <= TINY.examples for c in range(6))


def test_graph_parameters_follow_the_threat_model_and_reject_what_flower_cannot_mirror():
    assert graph_parameters(Workload(100, 1000, 0.1), None, None) == (16, 6)
    assert graph_parameters(TINY, None, None) == (5, 2)  # complete graph: k = n - 1
    with pytest.raises(ValueError, match="even"):
        graph_parameters(Workload(100, 1000, 0.1), 15, 6)


def test_dropping_runtime_raises_only_for_chosen_clients_and_kinds():

    runtime = DroppingRuntime(TINY.task(), frozenset({2}), frozenset({"secagg.masked_input"}))
    with pytest.raises(bench_secagg_round.ClientDropped):
        runtime.handle(2, Envelope("secagg.masked_input", 1), {})
    assert runtime.handle(2, Envelope("hello", 1), {}).config["client_id"] == 2
    assert runtime.handle(1, Envelope("hello", 1), {}).config["client_id"] == 1


def test_a_dropping_client_still_answers_the_next_rounds_rider():
    runtime = DroppingRuntime(TINY.task(), frozenset({2}), frozenset({"secagg.masked_input"}))
    rider = Envelope("hello", 2)
    reply = runtime.handle(2, attach(Envelope("secagg.masked_input", 1), rider), {})
    mine, theirs = split_reply(reply, rider)
    assert isinstance(mine, str) and "drops at secagg.masked_input" in mine
    assert isinstance(theirs, Envelope) and theirs.config["client_id"] == 2


@pytest.mark.procs
def test_inprocess_bench_aggregates_correctly_and_counts_bytes():
    out = bench(TINY, rounds=2, transport="inprocess", floor=True)
    assert set(out) >= KEYS
    check = out["checks"]["fedveil"]
    assert check["contributors_as_planned"] and check["plain_ok"] and check["secagg_ok"]
    # Quantized, so not bit-equal to the plain mean, but within the rounding bound.
    assert 0 < check["secagg_max_abs_err"] <= check["secagg_error_bound"]
    r = out["round"]["fedveil"]
    # The masked upload carries the whole update, like the plain one, plus keys and shares.
    assert r["bytes_up_per_client"] > r["plain_bytes_up_per_client"] > 4 * TINY.num_params
    assert r["bytes_down_per_client"] > r["plain_bytes_down_per_client"] > 4 * TINY.num_params
    assert r["floor_round_s"] is not None and out["ratio"] is None  # no peer, no ratio
    assert r["secagg_round_cpu_s"] is not None  # in-process: every client runs here
    assert out["compute"]["fedveil"]["sum_exact"] and out["compute_ratio"] is None
    assert out["masking_over_prg"] > 0


@pytest.mark.procs
def test_floor_rounds_give_the_plain_aggregate():
    k, t = graph_parameters(TINY, None, None)
    plain = run_ours(TINY, False, k, t, 2, "inprocess")
    floor = run_ours(TINY, False, k, t, 2, "inprocess", floor=True)
    np.testing.assert_array_equal(plain["_mean"], floor["_mean"])
    assert set(floor["exchange_s"]) == {"hello", "train"} and set(plain["exchange_s"]) == {"train"}


@pytest.mark.procs
def test_our_rounds_are_the_products_lifecycle(tmp_path):
    # The secure rounds timed are the run lifecycle's (`fedveil simulate`, the ServerApp):
    # its run directory, its records (secure-aggregation fields included), its model.
    k, t = graph_parameters(TINY, None, None)
    secure = run_ours(TINY, True, k, t, 2, "inprocess", run_dir=tmp_path)
    assert {"metrics.jsonl", "model.safetensors", "summary.json"} <= {
        p.name for p in tmp_path.iterdir()
    }
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    metrics = [json.loads(line) for line in lines]
    assert [m["round"] for m in metrics] == [1, 2]
    assert secure["round_s"] == [m["duration_s"] for m in metrics]
    assert all(m["secagg_neighbors"] == k and m["secagg_threshold"] == t for m in metrics)
    assert secure["survivors"] == [m["cohort_aggregated"] for m in metrics]
    assert secure["survivors"][0] == TINY.clients - len(TINY.dropped)


@pytest.mark.procs
def test_compute_part_reports_each_stage_of_both_protocols():
    pytest.importorskip("flwr")
    out = bench_secagg.compare(n=6, dim=200, dropout=0.17, seed=3)
    theirs = out["flower"]
    assert theirs["mean_close"] and out["fedveil"]["sum_exact"]
    assert set(theirs["client_stage_median_s"]) == {
        "setup",
        "share_keys",
        "quantize",
        "masked_input",
        "unmask",
    }
    assert set(theirs["server_stage_s"]) == {
        "setup",
        "share_keys",
        "masked_input",
        "unmask",
        "finalize",
    }
    assert theirs["survivors"] == 5 and theirs["neighbors"] == 5
    assert theirs["total_compute_s"] > theirs["total_compute_excl_quantize_s"] > 0
    table = bench_secagg_round._capture(bench_secagg._print_table, out)
    assert "client quantize (median)" in table and "compute_ratio (flower/fedveil" in table
    assert "flower mean ok=True" in table


@pytest.mark.procs
def test_clients_failing_at_unmask_still_count_in_the_secure_sum():
    w = Workload(clients=6, dim=1000, dropout=0.17, drop_stage="unmask", seed=3)
    k, t = graph_parameters(w, None, None)
    secure = run_ours(w, True, k, t, 2, "inprocess")
    assert secure["_contributors"] == 6 == len(expected_contributors(w, True))
    bound = bench_secagg_round.quantized_mean_bound(w, range(6))
    assert np.max(np.abs(secure["_mean"] - reference_mean(w, range(6)))) <= bound


def test_fedveil_bench_secagg_parses_the_flags_and_rejects_bad_ones(capsys):
    flags = "--clients 6 --dim 1000 --dropout 0.2 --peer flower --rounds 2 --json"
    # `fedveil bench secagg` hands the flags to the benchmark, which owns them.
    cli_args = build_parser().parse_args(["bench", "secagg", *flags.split(" ")])
    assert (cli_args.benchmark, cli_args.flags) == ("secagg", flags.split(" "))
    assert cli_args.func is bench_cli.cmd_bench
    parser = argparse.ArgumentParser()
    bench_secagg_round.add_secagg_arguments(parser)
    args = parser.parse_args(flags.split(" "))
    assert (args.clients, args.dim, args.peer, args.rounds) == (6, 1000, "flower", 2)
    assert args.json is True
    # The --drop-stage choices are the stages the benchmark can drop clients at.
    (drop_stage,) = [a for a in parser._actions if a.dest == "drop_stage"]
    assert tuple(drop_stage.choices) == tuple(bench_secagg_round.DROP_STAGES)
    assert cli_main(["bench", "secagg", "--clients", "6", "--rounds", "1"]) == 2
    assert "--rounds 1" in capsys.readouterr().err
    assert main(["--clients", "6", "--rounds", "1", "--transport", "inprocess"]) == 2
    assert "--rounds 1" in capsys.readouterr().err


@pytest.mark.procs
def test_content_size_follows_wire_size_rules():
    flwr = pytest.importorskip("flwr.app")
    from fedveil.benchmarks.flower_secaggplus_peer import content_size

    content = flwr.RecordDict(
        {
            "c": flwr.ConfigRecord({"ab": b"xyz", "n": 5, "l": [b"12", b"3"]}),
            "a": flwr.ArrayRecord({"w": flwr.Array(np.zeros(10, dtype=np.float32))}),
        }
    )
    assert content_size(content) == (2 + 3) + (1 + 8) + (1 + 3) + (1 + 40)
    # Legacy Parameters arrive as .npy bytes without dtype or shape.
    from flwr.common import ndarrays_to_parameters
    from flwr.compat.common.recorddict_compat import parameters_to_arrayrecord

    legacy = parameters_to_arrayrecord(ndarrays_to_parameters([np.zeros((3, 4))]), True)
    assert content_size(flwr.RecordDict({"p": legacy})) == 1 + 3 * 4 * 8


@pytest.mark.flower
@pytest.mark.slow
def test_command_with_flower_peer_end_to_end(capsys):
    argv = "--clients 6 --dim 1000 --dropout 0.17 --seed 3 --peer flower --rounds 2 --json"
    assert main(argv.split()) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(out) >= KEYS and out["peer"] == "flower"
    assert (out["neighbors"], out["threshold"], out["dropped"]) == (5, 2, 1)
    for fw in ("fedveil", "flower"):
        check = out["checks"][fw]
        assert check["contributors_as_planned"], fw
        assert check["plain_ok"] and check["secagg_ok"], (fw, check)
        r = out["round"][fw]
        assert r["bytes_up_per_client"] > 4 * 1000 and r["bytes_down_per_client"] > 4 * 1000
        assert r["plain_round_s"] > 0 and r["secagg_round_s"] > 0
    # Our rounds' CPU over Flower: the process tree (the driver and the Ray workers that run
    # the ClientApps) holds more than the driver alone. CPU is counted in 10 ms ticks and a
    # round of this size is a few ticks, so the medians may read 0: compare every round's.
    ours = out["round"]["fedveil"]
    for mode in ("plain", "secagg"):
        assert ours[f"{mode}_round_cpu_s"] >= ours[f"{mode}_round_driver_cpu_s"] >= 0, ours
        runs = out["rounds_detail"][f"fedveil_{mode}"]
        tree = sum(sum(run["round_cpu_s"]) for run in runs)
        driver = sum(sum(run["round_driver_cpu_s"]) for run in runs)
        assert tree > driver > 0, (mode, tree, driver)
    # The headline numbers are what the parts say they are.
    over = {fw: out["round"][fw]["overhead_s"] for fw in ("fedveil", "flower")}
    if over["fedveil"] > 0:
        assert math.isclose(out["ratio"], over["flower"] / over["fedveil"])
    assert math.isclose(out["compute_ratio"], out["compute"]["compute_ratio"])
    # SecAgg+ uploads int64 masked values: twice our uint32 ones, so more bytes up.
    assert (
        out["round"]["flower"]["bytes_up_per_client"]
        > out["round"]["fedveil"]["bytes_up_per_client"]
    )
