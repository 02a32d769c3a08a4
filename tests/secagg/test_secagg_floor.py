"""The benchmark's primitive floor counts exactly the primitive calls a real round makes."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest
from secagg_helpers import make_session, random_inputs

from fedveil.privacy.secagg import DropoutPattern, Stage, crypto, run_in_memory, shamir
from fedveil.privacy.secagg.masking import MaskApplier
from fedveil.simulations.secagg_floor import primitive_counts, primitive_floor


def _count_calls(monkeypatch: pytest.MonkeyPatch, calls: Counter[str]) -> None:
    """Wrap each primitive so a call is counted and then made for real."""

    def count(name: str, owner: Any, attribute: str) -> None:
        original = getattr(owner, attribute)

        def counted(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return original(*args, **kwargs)

        monkeypatch.setattr(owner, attribute, counted)

    count("x25519_keygen", crypto.KeyPair, "__init__")
    count("x25519_agree", crypto.KeyPair, "agree")
    for derivation in ("pairwise_mask_key", "self_mask_key", "share_channel_keys"):
        count("hkdf", crypto, derivation)
    count("seal", crypto, "seal")
    count("open", crypto, "open_sealed")
    count("shamir_split", shamir, "split")
    count("shamir_reconstruct", shamir, "reconstruct")
    for method in ("add", "subtract", "fresh"):
        count("mask_stream", MaskApplier, method)


@pytest.mark.parametrize(("n", "neighbors", "threshold"), [(12, 6, 4), (7, None, 4)])
def test_counts_match_the_calls_of_a_real_round(
    monkeypatch: pytest.MonkeyPatch, n: int, neighbors: int | None, threshold: int
) -> None:
    session = make_session(n, dimension=32, neighbors=neighbors, threshold=threshold)
    dropped = frozenset({session.client_ids[2], session.client_ids[5]})
    calls: Counter[str] = Counter()
    _count_calls(monkeypatch, calls)
    report = run_in_memory(
        session,
        random_inputs(session, 3),
        dropouts=DropoutPattern({Stage.MASKED_INPUT: dropped}),
    )
    assert report.result.survivors == frozenset(session.client_ids) - dropped
    expected = primitive_counts(session, dropped)
    assert expected.pop("vector_add") == n - len(dropped)
    assert dict(calls) == expected


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
