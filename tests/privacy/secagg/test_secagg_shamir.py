"""Shamir sharing over GF(2^256 + 297): correctness, error correction, speed."""

from __future__ import annotations

import random
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedveil.privacy.secagg import shamir


def _is_probable_prime(n: int) -> bool:
    if n % 2 == 0:
        return False
    d, s = n - 1, 0
    while d % 2 == 0:
        d, s = d // 2, s + 1
    for a in (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71):
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def test_field_is_prime_and_holds_every_256_bit_secret() -> None:
    assert _is_probable_prime(shamir.PRIME)
    assert shamir.PRIME > 2**256


@settings(max_examples=30, deadline=None)
@given(
    secret=st.binary(min_size=32, max_size=32),
    holders=st.integers(2, 40),
    data=st.data(),
)
def test_any_t_shares_reconstruct(secret: bytes, holders: int, data: st.DataObject) -> None:
    t = data.draw(st.integers(1, holders))
    xs = data.draw(
        st.lists(st.integers(1, 10_000), min_size=holders, max_size=holders, unique=True)
    )
    shares = shamir.split(shamir.secret_to_int(secret), t, xs)
    subset = data.draw(st.permutations(list(zip(xs, shares, strict=True))))[:t]
    assert shamir.int_to_secret(shamir.reconstruct(subset, t)) == secret


def test_fewer_than_t_shares_do_not_determine_the_secret() -> None:
    """Any t-1 shares are consistent with every secret: each guess extends to a polynomial."""
    xs = [1, 2, 3, 4, 5]
    points = list(zip(xs, shamir.split(1234, 5, xs), strict=True))[:4]
    for guess in (0, 1, 1234, shamir.PRIME - 1):
        # The degree-4 polynomial through (0, guess) and the 4 shares exists and is unique;
        # its value at the 5th point is some field element, so no guess is ruled out.
        implied_fifth = _interpolate_at([(0, guess), *points], 5)
        rebuilt = shamir.reconstruct([*points, (5, implied_fifth)], 5)
        assert rebuilt == guess
    with pytest.raises(ValueError):
        shamir.reconstruct(points, 5)


def _interpolate_at(points: list[tuple[int, int]], x: int) -> int:
    p = shamir.PRIME
    total = 0
    for j, (xj, yj) in enumerate(points):
        num, den = 1, 1
        for m, (xm, _) in enumerate(points):
            if m != j:
                num = num * (x - xm) % p
                den = den * (xj - xm) % p
        total += yj * num * pow(den, -1, p)
    return total % p


@pytest.mark.parametrize("wrong", [1, 2, 3])
def test_robust_reconstruct_corrects_wrong_shares_and_names_them(wrong: int) -> None:
    secret = shamir.secret_to_int(bytes(range(32)))
    xs = list(range(1, 15))
    t = 6
    points = list(zip(xs, shamir.split(secret, t, xs), strict=True))
    rng = random.Random(wrong)
    bad = set(rng.sample(xs[:t], wrong))  # corrupt the fast-path shares on purpose
    tampered = [(x, (y + 1) % shamir.PRIME) if x in bad else (x, y) for x, y in points]
    found = shamir.robust_reconstruct(tampered, t, lambda v: v == secret)
    assert found is not None
    assert found[0] == secret and found[1] == frozenset(bad)


def test_robust_reconstruct_gives_up_beyond_the_decoding_radius() -> None:
    xs = list(range(1, 9))
    t = 6
    points = list(zip(xs, shamir.split(42, t, xs), strict=True))
    tampered = [(x, y + 1) if x <= 2 else (x, y) for x, y in points]
    assert shamir.robust_reconstruct(tampered, t, lambda v: v == 42) is None


def test_share_encoding_rejects_non_field_elements() -> None:
    assert shamir.decode_share(shamir.encode_share(shamir.PRIME - 1)) == shamir.PRIME - 1
    assert shamir.decode_share(shamir.PRIME.to_bytes(33, "big")) is None
    assert shamir.decode_share(b"\x00" * 32) is None
    assert shamir.int_to_secret(2**256) is None


def test_sharing_and_reconstruction_are_cheap_at_n_1000() -> None:
    """1000 clients, k=36, t=19: every client shares two secrets, the server rebuilds 1000."""
    t, holders = 19, 37
    xs = list(range(1, holders + 1))
    # CPU time, not wall time: the claim is the work done, whatever else runs (CI load).
    started = time.process_time()
    all_points = []
    for owner in range(1000):
        shares = shamir.split(owner, t, xs)
        shamir.split(owner + 1, t, xs)
        all_points.append(list(zip(xs, shares, strict=True))[owner % 10 : owner % 10 + t])
    for owner, points in enumerate(all_points):
        assert shamir.reconstruct(points, t) == owner
    assert time.process_time() - started < 6.0
