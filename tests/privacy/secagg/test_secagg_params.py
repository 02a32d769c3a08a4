"""Parameter finder: reference values, threat-model limits and override validation."""

from __future__ import annotations

import pytest

from fedveil.privacy.secagg import ThreatMode, ThreatModel, find_parameters
from fedveil.privacy.secagg.params import _harary_range, min_safe_threshold


@pytest.mark.parametrize(
    ("n", "gamma", "delta", "k_ref", "t_ref"),
    [
        (1000, 0.05, 0.10, 36, 19),
        (1000, 0.05, 0.30, 66, 23),
        (1_000_000, 0.05, 0.10, 50, 25),
    ],
)
def test_reference_values(n: int, gamma: float, delta: float, k_ref: int, t_ref: int) -> None:
    params = find_parameters(n, ThreatModel(gamma, delta))
    assert abs(params.neighbors - k_ref) <= 2
    assert abs(params.threshold - t_ref) <= 2
    assert not params.complete


@pytest.mark.parametrize(
    ("gamma", "delta", "mode"),
    [
        (0.5, 0.45, ThreatMode.SEMI_HONEST),
        (0.3, 0.65, ThreatMode.SEMI_HONEST),
        (0.1, 0.41, ThreatMode.MALICIOUS),
        (0.5, 0.25, ThreatMode.MALICIOUS),
    ],
)
def test_infeasible_threat_models_are_rejected(gamma: float, delta: float, mode: str) -> None:
    with pytest.raises(ValueError, match="infeasible threat model"):
        ThreatModel(gamma, delta, mode)


def test_limits_are_inclusive() -> None:
    ThreatModel(0.3, 0.6, ThreatMode.SEMI_HONEST)
    ThreatModel(0.1, 0.4, ThreatMode.MALICIOUS)


def test_malicious_threshold_exceeds_half_the_holders_plus_corrupt() -> None:
    semi = find_parameters(1000, ThreatModel(0.05, 0.1))
    mal = find_parameters(1000, ThreatModel(0.05, 0.1, ThreatMode.MALICIOUS))
    assert mal.threshold > semi.threshold
    corrupt_bound = semi.threshold - 1  # t1 for k=36
    assert 2 * mal.threshold > mal.neighbors + 1 + corrupt_bound


def test_small_cohorts_use_the_complete_graph() -> None:
    params = find_parameters(20, ThreatModel(0.05, 0.1))
    assert params.complete and params.neighbors == 19
    assert 2 <= params.threshold <= params.max_threshold <= 19
    mal = find_parameters(20, ThreatModel(0.05, 0.1, ThreatMode.MALICIOUS))
    assert 2 * mal.threshold > 20 + 1


def test_overrides_are_validated() -> None:
    threat = ThreatModel(0.05, 0.1)
    ok = find_parameters(1000, threat, neighbors=40)
    assert ok.neighbors == 40 and ok.min_threshold <= ok.threshold <= ok.max_threshold
    assert find_parameters(1000, threat, neighbors=40, threshold=ok.max_threshold).threshold
    with pytest.raises(ValueError, match="not admissible"):
        find_parameters(1000, threat, neighbors=40, threshold=ok.min_threshold - 1)
    with pytest.raises(ValueError, match="even number"):
        find_parameters(1000, threat, neighbors=37)
    with pytest.raises(ValueError, match="even number"):
        find_parameters(1000, threat, neighbors=999 - 1 + 2)
    with pytest.raises(ValueError, match="no secure and reliable threshold"):
        find_parameters(1000, threat, neighbors=4)
    with pytest.raises(ValueError, match="at least 3 clients"):
        find_parameters(2, threat)


def test_threshold_only_override_picks_a_degree_that_admits_it() -> None:
    params = find_parameters(1000, ThreatModel(0.05, 0.1), threshold=30)
    assert params.threshold == 30 and params.min_threshold <= 30 <= params.max_threshold


def test_larger_degree_never_needed_for_zero_adversaries_and_dropouts() -> None:
    params = find_parameters(500, ThreatModel(0.0, 0.0))
    assert params.threshold == 2
    assert _harary_range(500, params.neighbors, ThreatModel(0.0, 0.0)) is not None


@pytest.mark.parametrize(
    "threat",
    [
        ThreatModel(0.05, 0.1),
        ThreatModel(0.3, 0.1),
        ThreatModel(0.05, 0.3),
        ThreatModel(0.05, 0.1, ThreatMode.MALICIOUS),
        ThreatModel(0.2, 0.3, ThreatMode.MALICIOUS),
    ],
)
def test_the_clients_floor_never_refuses_what_the_finder_picks(threat: ThreatModel) -> None:
    """A client checks each session against min_safe_threshold (session_floor.py): every
    degree and threshold the server's finder picks meets it, and the finder's own lower
    bound is that floor (so one below it is refused by both)."""
    for n in (3, 5, 10, 33, 64, 200, 1000):
        try:
            params = find_parameters(n, threat)
        except ValueError:
            continue
        floor = min_safe_threshold(n, params.neighbors, threat)
        assert floor == params.min_threshold <= params.threshold, (n, params)
