"""End-to-end correctness: random cohorts, graphs, thresholds and dropouts at every stage."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from secagg_helpers import identity_keys, make_session, plain_sum, random_inputs

from fedveil.privacy.secagg import (
    DropoutPattern,
    Quantizer,
    SecAggAborted,
    SessionConfig,
    Stage,
    ThreatMode,
    ThreatModel,
    run_in_memory,
)


def expected_survivors(session: SessionConfig, dropouts: DropoutPattern) -> frozenset[int] | None:
    """Reference model of when an honest round completes and with which U3 (None: abort)."""
    t = session.threshold
    ids = frozenset(session.client_ids)
    nbr = {c: session.graph.neighbours(c) for c in ids}
    drop = {s: dropouts.by_stage.get(s, frozenset()) for s in Stage}

    def prune(alive: frozenset[int]) -> frozenset[int] | None:
        current = set(alive)
        while True:
            weak = {c for c in current if len(nbr[c] & current) + 1 < t}
            if not weak:
                break
            current -= weak
        return frozenset(current) if len(current) >= t else None

    u1 = prune(ids - drop[Stage.ADVERTISE])
    u2 = None if u1 is None else prune(u1 - drop[Stage.SHARE_KEYS])
    if u2 is None:
        return None
    u3 = u2 - drop[Stage.MASKED_INPUT]
    if len(u3) < t:
        return None
    masked_dropped = {j for j in u2 - u3 if nbr[j] & u3}

    def recoverable(responders: frozenset[int]) -> bool:
        seeds = all((i in responders) + len(nbr[i] & responders) >= t for i in u3)
        keys = all(len(nbr[j] & responders) >= t for j in masked_dropped)
        return seeds and keys

    if not recoverable(u3):
        return None
    if session.malicious:
        u4 = u3 - drop[Stage.CONSISTENCY]
        if not recoverable(u4):
            return None
        # A signer with fewer than t co-signatures in its neighbourhood refuses to unmask.
        refusing = {c for c in u4 if len(nbr[c] & u4) + 1 < t}
        u5 = u4 - refusing - drop[Stage.UNMASK]
    else:
        u5 = u3 - drop[Stage.CONSISTENCY] - drop[Stage.UNMASK]
    return u3 if recoverable(u5) else None


@st.composite
def rounds(draw: st.DrawFn, malicious: bool) -> tuple[SessionConfig, DropoutPattern, bool, int]:
    n = draw(st.integers(3, 12 if malicious else 30))
    harary_degrees = list(range(2, n - 1, 2))
    k = draw(st.sampled_from([n - 1, *harary_degrees]))
    low = (k + 1) // 2 + 1 if malicious else 2
    t = draw(st.integers(min(low, k), k))
    mode = ThreatMode.MALICIOUS if malicious else ThreatMode.SEMI_HONEST
    session = make_session(
        n,
        dimension=draw(st.integers(1, 40)),
        bits=draw(st.integers(1, 62)),
        neighbors=k,
        threshold=t,
        mode=mode,
        first_id=draw(st.integers(0, 2**64 - 64)),
    )
    rate = draw(st.sampled_from([0.0, 0.04, 0.08, 0.15]))
    by_stage = {}
    for stage in Stage:
        limit = math.ceil(rate * n)
        by_stage[stage] = frozenset(
            draw(
                st.sets(st.sampled_from(session.client_ids), min_size=min(1, limit), max_size=limit)
            )
        )
    persist = draw(st.booleans())
    return session, DropoutPattern(by_stage), persist, draw(st.integers(0, 2**32))


def _check_round(
    session: SessionConfig, dropouts: DropoutPattern, persist: bool, seed: int
) -> None:
    inputs = random_inputs(session, seed)
    expected = expected_survivors(session, dropouts)
    keys = identity_keys(session) if session.malicious else None
    dropped = len(frozenset().union(*dropouts.by_stage.values()))
    event("aborts" if expected is None else f"completes ({'some' if dropped else 'no'} dropouts)")
    if expected is None:
        with pytest.raises(SecAggAborted):
            run_in_memory(
                session, inputs, dropouts=dropouts, identity_keys=keys, persist_state=persist
            )
        return
    report = run_in_memory(
        session, inputs, dropouts=dropouts, identity_keys=keys, persist_state=persist
    )
    result = report.result
    assert result.survivors == expected
    assert result.total.dtype == np.dtype(session.dtype)
    assert (
        result.total.astype(np.uint64).tolist()
        == plain_sum(inputs, expected, session.modulus_bits).tolist()
    )
    assert not report.server_rejections


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rounds(malicious=False))
def test_semi_honest_sum_is_exact(case: tuple[SessionConfig, DropoutPattern, bool, int]) -> None:
    _check_round(*case)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rounds(malicious=True))
def test_malicious_mode_sum_is_exact(case: tuple[SessionConfig, DropoutPattern, bool, int]) -> None:
    _check_round(*case)


def test_dropouts_at_every_stage_with_parameter_finder_session() -> None:
    ids = list(range(1, 121))
    session = SessionConfig.create(
        ids,
        dimension=300,
        modulus_bits=24,
        run_id=b"test-run",
        round=1,
        threat=ThreatModel(0.05, 0.1),
        session_id=b"r" * 16,
    )
    assert not session.graph.complete
    dropouts = DropoutPattern.random(ids, 0.1, seed=3, stages=list(Stage))
    inputs = random_inputs(session, 1)
    report = run_in_memory(session, inputs, dropouts=dropouts)
    assert report.result.survivors == expected_survivors(session, dropouts)
    assert (
        report.result.total.astype(np.uint64).tolist()
        == plain_sum(inputs, report.result.survivors, 24).tolist()
    )


def test_abort_when_fewer_than_t_survive() -> None:
    session = make_session(8, threshold=5)
    inputs = random_inputs(session, 0)
    ids = session.client_ids
    with pytest.raises(SecAggAborted, match="masked_input"):
        run_in_memory(session, inputs, dropouts=DropoutPattern.of(masked_input=ids[:4]))
    with pytest.raises(SecAggAborted, match="shares"):
        run_in_memory(session, inputs, dropouts=DropoutPattern.of(unmask=ids[:4]))
    with pytest.raises(SecAggAborted, match="advertise"):
        run_in_memory(session, inputs, dropouts=DropoutPattern.of(advertise=ids[:4]))
    # Exactly t left at the end is enough.
    report = run_in_memory(session, inputs, dropouts=DropoutPattern.of(unmask=ids[:3]))
    assert report.result.survivors == frozenset(ids)


def test_quantized_weighted_average_after_unmasking() -> None:
    n, dim = 10, 50
    quantizer = Quantizer(clip_range=1.0, levels=2**16, max_clients=n, max_weight=100)
    session = make_session(n, dimension=dim + 2, bits=quantizer.bits)
    rng = np.random.default_rng(7)
    xs = {cid: rng.uniform(-1, 1, dim) for cid in session.client_ids}
    weights = {cid: int(rng.integers(1, 101)) for cid in session.client_ids}
    inputs = {cid: quantizer.encode_weighted(xs[cid], weights[cid]) for cid in session.client_ids}
    dropped = session.client_ids[:2]
    report = run_in_memory(session, inputs, dropouts=DropoutPattern.of(masked_input=dropped))
    mean, weight_sum, count = quantizer.decode_weighted_mean(report.result.total)
    survivors = sorted(report.result.survivors)
    expected = sum(weights[c] * xs[c] for c in survivors) / sum(weights[c] for c in survivors)
    assert count == len(survivors) == n - 2
    assert weight_sum == sum(weights[c] for c in survivors)
    bound = quantizer.sum_error_bound(count) * quantizer.max_weight / weight_sum
    assert np.all(np.abs(mean - expected) <= bound)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(3, 12),
    dim=st.integers(1, 30),
    levels=st.sampled_from([2, 255, 2**12, 2**20]),
    clip=st.floats(0.1, 50.0),
    seed=st.integers(0, 2**32 - 1),
    drop=st.integers(0, 2),
)
def test_dequantized_protocol_sum_is_within_the_quantization_bound(
    n: int, dim: int, levels: int, clip: float, seed: int, drop: int
) -> None:
    drop = min(drop, n - 2)  # at least two survivors: a threshold below 2 is never allowed
    quantizer = Quantizer(clip_range=clip, levels=levels, max_clients=n)
    threshold = max(2, min(n - 1, n - drop))
    session = make_session(n, dimension=dim, bits=quantizer.bits, threshold=threshold)
    rng = np.random.default_rng(seed)
    xs = {cid: rng.uniform(-1.5 * clip, 1.5 * clip, dim) for cid in session.client_ids}
    inputs = {cid: quantizer.quantize(x) for cid, x in xs.items()}
    dropped = session.client_ids[:drop]
    report = run_in_memory(session, inputs, dropouts=DropoutPattern.of(masked_input=dropped))
    survivors = report.result.survivors
    assert len(survivors) == n - drop
    estimate = quantizer.dequantize_sum(report.result.total, len(survivors))
    exact = sum(np.clip(xs[c], -clip, clip) for c in survivors)
    assert np.all(np.abs(estimate - exact) <= quantizer.sum_error_bound(len(survivors)) + 1e-9)
