"""The benchmark's primitive floor counts exactly the primitive calls a real round makes."""

from __future__ import annotations

import time

import pytest
from secagg_helpers import make_session, random_inputs

from fedveil.benchmarks import bench_secagg
from fedveil.benchmarks.secagg_floor import (
    instrumented_primitives,
    primitive_counts,
    primitive_floor,
)
from fedveil.privacy.secagg import DropoutPattern, Stage, crypto, run_in_memory, shamir
from fedveil.privacy.secagg.masking import MaskApplier


@pytest.mark.parametrize(("n", "neighbors", "threshold"), [(12, 6, 4), (7, None, 4)])
def test_counts_match_the_calls_of_a_real_round(
    n: int, neighbors: int | None, threshold: int
) -> None:
    session = make_session(n, dimension=32, neighbors=neighbors, threshold=threshold)
    dropped = frozenset({session.client_ids[2], session.client_ids[5]})
    originals = (crypto.KeyPair.agree, crypto.seal, shamir.split, MaskApplier.add)
    with instrumented_primitives() as log:
        report = run_in_memory(
            session,
            random_inputs(session, 3),
            dropouts=DropoutPattern({Stage.MASKED_INPUT: dropped}),
        )
    assert report.result.survivors == frozenset(session.client_ids) - dropped
    expected = primitive_counts(session, dropped)
    assert expected.pop("vector_add") == n - len(dropped)
    assert dict(log.calls) == expected
    assert all(log.seconds[name] > 0 for name in expected)
    # Leaving the block puts every primitive back.
    assert (crypto.KeyPair.agree, crypto.seal, shamir.split, MaskApplier.add) == originals


def test_floor_is_counts_times_costs_and_below_a_measured_round() -> None:
    session = make_session(10, dimension=20_000, neighbors=4, threshold=3)
    dropped = frozenset({session.client_ids[0]})
    floor = primitive_floor(session, dropped)
    rows = floor["by_primitive"]
    assert set(rows) == set(primitive_counts(session, dropped))
    assert all(
        row["us"] > 0 and row["s"] == pytest.approx(row["calls"] * row["us"] / 1e6)
        for row in rows.values()
    )
    assert floor["total_s"] == pytest.approx(sum(row["s"] for row in rows.values()))
    # A lower bound: the primitives alone cost less than the round that calls them.
    report = run_in_memory(
        session,
        random_inputs(session, 4),
        dropouts=DropoutPattern({Stage.MASKED_INPUT: dropped}),
        clock=time.process_time,
    )
    measured = sum(report.server_seconds.values()) + sum(
        seconds for stage in report.client_seconds.values() for seconds in stage.values()
    )
    assert floor["total_s"] < measured


def test_instrumented_bench_round_splits_into_primitives_and_logic() -> None:
    out = bench_secagg.bench_protocol(n=10, dim=2_000, dropout=0.2, seed=1, instrument=True)
    assert out["sum_exact"] and out["mean_close"]
    split = out["breakdown"]
    assert split["primitives_in_situ_s"] > 0 and split["wrapper_overhead_us"] > 0
    assert split["protocol_logic_s"] == pytest.approx(
        split["round_excl_quantize_s"] - split["primitives_in_situ_s"]
    )
    counted = {name: row["calls"] for name, row in split["by_primitive"].items()}
    expected = {name: row["calls"] for name, row in out["primitive_floor"].items()}
    expected["vector_add"] = 0  # numpy's add in the server is not wrapped
    assert counted == expected
