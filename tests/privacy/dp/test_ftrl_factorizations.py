"""DP-FTRL factorisations: B C = A, and each sensitivity against brute force over patterns."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from fedveil.privacy.dp.ftrl import (
    BandedFactorization,
    BltFactorization,
    IdentityFactorization,
    ParticipationSchema,
    TreeFactorization,
    factorization_from_dict,
)
from fedveil.privacy.dp.ftrl.optimize import (
    banded_factorization,
    blt_factorization,
    sqrt_coefficients,
)


def _patterns(rounds: int, schema: ParticipationSchema):
    """Every allowed participation pattern (non-empty), as 0-based round tuples."""
    b = schema.separation(rounds)
    for size in range(1, schema.max_participations + 1):
        for combo in itertools.combinations(range(rounds), size):
            if all(j - i >= b for i, j in itertools.pairwise(combo)):
                yield combo


def _brute_sensitivity(encoder: np.ndarray, rounds: int, schema: ParticipationSchema) -> float:
    best = 0.0
    for pattern in _patterns(rounds, schema):
        best = max(best, float(np.linalg.norm(encoder[:, list(pattern)].sum(axis=1))))
    return best


def _factorizations(rounds: int, schema: ParticipationSchema):
    band = min(schema.separation(rounds), rounds)
    return [
        IdentityFactorization(rounds),
        TreeFactorization(rounds),
        BandedFactorization(rounds, tuple(sqrt_coefficients(band))),
        BltFactorization(rounds, (0.3, 0.2), (0.9, 0.5)),
    ]


@pytest.mark.parametrize("rounds", [1, 7, 8, 13])
def test_decoder_times_encoder_is_the_prefix_sum_matrix(rounds: int) -> None:
    schema = ParticipationSchema(3, 2)
    for f in _factorizations(rounds, schema):
        product = f.decoder() @ f.encoder()
        np.testing.assert_allclose(product, np.tril(np.ones((rounds, rounds))), atol=1e-9)
        # Lower-triangular: round t's noise depends on rounds <= t (adaptive inputs).
        assert np.allclose(f.encoder(), np.tril(f.encoder())), f.kind


@pytest.mark.parametrize(
    ("rounds", "schema"),
    [
        (12, ParticipationSchema()),
        (12, ParticipationSchema(3, 3)),
        (13, ParticipationSchema(4, 4)),
        (9, ParticipationSchema(2, 5)),
    ],
)
def test_sensitivity_against_brute_force(rounds: int, schema: ParticipationSchema) -> None:
    k, b = schema.effective_participations(rounds), schema.separation(rounds)
    for f in _factorizations(rounds, schema):
        exact = _brute_sensitivity(f.encoder(), rounds, schema)
        claimed = f.sensitivity(schema)
        if f.kind == "tree" and not schema.single:
            # A sound upper bound (the DP relaxes separation across a node's halves).
            assert claimed >= exact - 1e-9
            assert claimed <= 1.25 * exact
        elif f.kind == "banded" and (k - 1) * b + f.band > rounds:
            # The formula sqrt(k) x max column norm: a bound when the last column is cut.
            assert exact - 1e-9 <= claimed <= exact * 1.1
        else:
            assert claimed == pytest.approx(exact, rel=1e-9), f.kind


@pytest.mark.parametrize("rounds", [1, 2, 7, 8, 100, 1024])
def test_tree_single_participation_is_its_depth(rounds: int) -> None:
    tree = TreeFactorization(rounds)
    depth = math.ceil(math.log2(rounds + 1))  # dp-accounting's tree depth
    assert tree.sensitivity(ParticipationSchema()) == pytest.approx(math.sqrt(depth))
    assert np.max(np.sum(tree.encoder(), axis=0)) == depth


def test_banded_refuses_a_band_wider_than_the_separation() -> None:
    f = BandedFactorization(20, tuple(sqrt_coefficients(5)))
    with pytest.raises(ValueError, match="band=5 > min_separation=4"):
        f.sensitivity(ParticipationSchema(4, 3))
    assert f.sensitivity(ParticipationSchema(5, 3)) == pytest.approx(
        math.sqrt(3) * np.linalg.norm(sqrt_coefficients(5))
    )


def test_blt_sensitivity_is_not_a_column_norm_under_several_participations() -> None:
    f = BltFactorization(30, (0.5,), (0.95,))
    schema = ParticipationSchema(5, 4)
    column = np.linalg.norm(f.encoder()[:, 0])
    # Overlapping columns: the sum's norm exceeds sqrt(k) x the column norm.
    assert f.sensitivity(schema) > math.sqrt(4) * column * 1.05


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        ({"kind": "banded", "rounds": 10, "coefficients": [float("nan"), 0.5]}, "coefficient 0"),
        ({"kind": "banded", "rounds": 10, "coefficients": [1.0, float("inf")]}, "coefficient 1"),
        ({"kind": "blt", "rounds": 10, "omega": [0.7, 0.6], "theta": [0.5, 0.5]}, "sum\\(omega\\)"),
        ({"kind": "blt", "rounds": 10, "omega": [0.1], "theta": [1.0]}, "theta value 1.0"),
        ({"kind": "tree", "rounds": 10.0}, "rounds=10.0"),
        ({"kind": "tree"}, "rounds=None"),
        ({"kind": "honaker", "rounds": 3}, "kind='honaker'"),
    ],
)
def test_recorded_factorizations_fail_closed(bad: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        factorization_from_dict(bad)


def test_round_trip_through_the_ledger_dict() -> None:
    schema = ParticipationSchema(3, 2)
    for f in _factorizations(11, schema):
        again = factorization_from_dict(f.to_dict())
        assert again == f
        assert again.sensitivity(schema) == f.sensitivity(schema)


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ({"min_separation": float("nan"), "max_participations": 2}, "min_separation=nan"),
        ({"min_separation": 3.0, "max_participations": 2}, "min_separation=3.0"),
        ({"min_separation": 3, "max_participations": True}, "max_participations=True"),
        ({"min_separation": 3}, "max_participations is missing"),
        ({"min_separation": 3, "max_participations": 2, "x": 1}, "unknown fields"),
        ("several", "participation='several'"),
        ({"min_separation": 0, "max_participations": 2}, "min_separation=0"),
    ],
)
def test_schema_fails_closed(value: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ParticipationSchema.from_config(value)


def test_optimised_banded_beats_its_closed_form_start_and_identity() -> None:
    rounds, schema = 60, ParticipationSchema(6, 10)
    found = banded_factorization(rounds, schema)
    start = BandedFactorization(rounds, tuple(sqrt_coefficients(6)))
    ident = IdentityFactorization(rounds)

    def error(f) -> float:
        return f.prefix_noise_rmse() * f.sensitivity(schema)

    assert found.band == 6
    assert error(found) <= error(start) + 1e-9
    assert error(found) < error(ident) / 1.5


def test_optimised_blt_is_valid_and_beats_identity() -> None:
    rounds, schema = 60, ParticipationSchema(6, 10)
    found = blt_factorization(rounds, schema, buffers=2, iterations=30)
    c = found.coefficients()
    assert np.all(c >= 0) and np.all(np.diff(c) <= 1e-12)
    ident = IdentityFactorization(rounds)
    assert found.prefix_noise_std() * found.sensitivity(schema) < (
        ident.prefix_noise_std() * ident.sensitivity(schema) / 1.5
    )
