"""Shamir secret sharing of 256-bit secrets over GF(p), p = 2^256 + 297 (prime).

One field element holds a whole 32-byte secret, so a share is a single 33-byte value and a
client's sharing is (t - 1) * (holders) multiplications of Python ints: microseconds, not the
milliseconds of byte-chunked sharing. Share x-coordinates are 1 + the holder's index in the
sorted cohort, so they are distinct, non-zero and public.

Reconstruction uses Lagrange interpolation at 0 with one batched inversion. When the caller
can check a candidate (seed commitment, public key) and the plain reconstruction fails,
`robust_reconstruct` falls back to Berlekamp–Welch decoding, which corrects up to
⌊(m - t) / 2⌋ wrong shares out of m and names the holders that sent them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache

from . import randomness

PRIME = 2**256 + 297
SECRET_BYTES = 32
SHARE_BYTES = 33


def secret_to_int(secret: bytes) -> int:
    if len(secret) != SECRET_BYTES:
        raise ValueError(f"secrets are {SECRET_BYTES} bytes, got {len(secret)}")
    return int.from_bytes(secret, "big")


def int_to_secret(value: int) -> bytes | None:
    """The 32-byte secret, or None if `value` cannot be one (a corrupted reconstruction)."""
    if not 0 <= value < 2 ** (8 * SECRET_BYTES):
        return None
    return value.to_bytes(SECRET_BYTES, "big")


def encode_share(value: int) -> bytes:
    return value.to_bytes(SHARE_BYTES, "big")


def decode_share(raw: bytes) -> int | None:
    """The field element, or None if `raw` is not a canonical share encoding."""
    if len(raw) != SHARE_BYTES:
        return None
    value = int.from_bytes(raw, "big")
    return value if value < PRIME else None


def split(secret: int, threshold: int, xs: Sequence[int]) -> list[int]:
    """Shares of `secret` at the points `xs` (degree threshold - 1 random polynomial)."""
    if not 0 <= secret < PRIME:
        raise ValueError("secret is not a field element")
    if threshold < 1 or threshold > len(xs):
        raise ValueError(f"threshold {threshold} must be in [1, {len(xs)}]")
    coefficients = [secret] + [randomness.random_below(PRIME) for _ in range(threshold - 1)]
    return [_evaluate(coefficients, x) for x in xs]


def _evaluate(coefficients: Sequence[int], x: int) -> int:
    # x is small (a cohort position), so Horner without intermediate reductions grows the
    # accumulator by only log2(x) bits per step; one final reduction is much cheaper.
    acc = 0
    for c in reversed(coefficients):
        acc = acc * x + c
    return acc % PRIME


@lru_cache(maxsize=4096)
def _lagrange_at_zero(xs: tuple[int, ...]) -> tuple[int, ...]:
    """λ_j = Π_{m≠j} x_m / (x_m - x_j); cached because many secrets share a holder set."""
    # The x are small integers: multiply exactly and reduce once per product.
    numerator = 1
    for x in xs:
        numerator *= x
    numerator %= PRIME
    denominators = []
    for j, xj in enumerate(xs):
        d = xj
        for m, xm in enumerate(xs):
            if m != j:
                d *= xm - xj
        denominators.append(d % PRIME)
    inverses = _batch_inverse(denominators)
    return tuple(numerator * inv % PRIME for inv in inverses)


def _batch_inverse(values: Sequence[int]) -> list[int]:
    """Montgomery's trick: one modular inversion for the whole list."""
    prefix = [1]
    for v in values:
        prefix.append(prefix[-1] * v % PRIME)
    inv = pow(prefix[-1], -1, PRIME)
    out = [0] * len(values)
    for i in range(len(values) - 1, -1, -1):
        out[i] = inv * prefix[i] % PRIME
        inv = inv * values[i] % PRIME
    return out


def reconstruct(points: Sequence[tuple[int, int]], threshold: int) -> int:
    """Secret from the first `threshold` points (x distinct, non-zero)."""
    if len(points) < threshold:
        raise ValueError(f"need {threshold} shares, got {len(points)}")
    chosen = points[:threshold]
    xs = tuple(x for x, _ in chosen)
    if len(set(xs)) != len(xs) or 0 in xs:
        raise ValueError("share x-coordinates must be distinct and non-zero")
    coefficients = _lagrange_at_zero(xs)
    return sum(c * y for c, (_, y) in zip(coefficients, chosen, strict=True)) % PRIME


def robust_reconstruct(
    points: Sequence[tuple[int, int]], threshold: int, is_valid: Callable[[int], bool]
) -> tuple[int, frozenset[int]] | None:
    """(secret, x-coordinates of wrong shares) accepted by `is_valid`, or None.

    Fast path: the first `threshold` shares. Otherwise Berlekamp–Welch for growing error counts.
    """
    if len(points) < threshold:
        return None
    candidate = reconstruct(points, threshold)
    if is_valid(candidate):
        return candidate, frozenset()
    for errors in range(1, (len(points) - threshold) // 2 + 1):
        polynomial = _berlekamp_welch(points, threshold, errors)
        if polynomial is None or not is_valid(polynomial[0]):
            continue
        wrong = frozenset(x for x, y in points if _evaluate(polynomial, x) != y)
        if len(wrong) <= errors:
            return polynomial[0], wrong
    return None


def _berlekamp_welch(
    points: Sequence[tuple[int, int]], threshold: int, errors: int
) -> list[int] | None:
    """Coefficients of the degree < threshold polynomial agreeing with all but `errors` points.

    Unknowns: Q (degree < threshold + errors) and monic E (degree errors) with
    Q(x_i) = y_i · E(x_i) for all i; then P = Q / E.
    """
    q_len = threshold + errors
    rows = []
    for x, y in points:
        powers = [1]
        for _ in range(q_len):
            powers.append(powers[-1] * x % PRIME)
        row = powers[:q_len] + [(-y * p) % PRIME for p in powers[:errors]]
        row.append(y * powers[errors] % PRIME)
        rows.append(row)
    solution = _solve_mod_prime(rows, q_len + errors)
    if solution is None:
        return None
    q = solution[:q_len]
    e = [*solution[q_len:], 1]
    quotient, remainder = _divide(q, e)
    if any(remainder):
        return None
    return quotient


def _solve_mod_prime(rows: list[list[int]], unknowns: int) -> list[int] | None:
    """One solution of the augmented system (free variables set to 0), or None."""
    pivot_cols: list[int] = []
    r = 0
    for col in range(unknowns):
        pivot = next((i for i in range(r, len(rows)) if rows[i][col]), None)
        if pivot is None:
            continue
        rows[r], rows[pivot] = rows[pivot], rows[r]
        inv = pow(rows[r][col], -1, PRIME)
        rows[r] = [v * inv % PRIME for v in rows[r]]
        for i in range(len(rows)):
            if i != r and rows[i][col]:
                factor = rows[i][col]
                rows[i] = [(a - factor * b) % PRIME for a, b in zip(rows[i], rows[r], strict=True)]
        pivot_cols.append(col)
        r += 1
    if any(row[-1] for row in rows[r:]):
        return None
    solution = [0] * unknowns
    for i, col in enumerate(pivot_cols):
        solution[col] = rows[i][-1]
    return solution


def _divide(numerator: list[int], monic_divisor: list[int]) -> tuple[list[int], list[int]]:
    """Polynomial long division (coefficients lowest degree first, divisor monic)."""
    remainder = list(numerator)
    degree = len(monic_divisor) - 1
    if len(remainder) <= degree:
        return [0], remainder
    quotient = [0] * (len(remainder) - degree)
    for i in range(len(quotient) - 1, -1, -1):
        coefficient = remainder[i + degree]
        quotient[i] = coefficient
        if coefficient:
            for j, d in enumerate(monic_divisor):
                remainder[i + j] = (remainder[i + j] - coefficient * d) % PRIME
    return quotient, remainder[:degree]
