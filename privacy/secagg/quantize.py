"""Fixed-point encoding of float vectors into Z_(2^b) so that secure sums never wrap.

`Quantizer(clip_range=r, levels=L, max_clients=n, max_weight=W)`:

* clip each coordinate to [-r, r] and map it to [0, L - 1] with stochastic rounding
  (unbiased; each summand's error is below one step 2r / (L - 1));
* the modulus width is the smallest b with n · max(L - 1, W) < 2^b, so the sum of up to n
  clients — values and extra coordinates alike — is the exact integer sum; a config that
  needs b > 62 is rejected.

Weights travel masked in the same vector: `encode_weighted(x, w)` scales x by w / W before
quantizing and appends two extra coordinates [w, 1]; the server's unmasked sum therefore
carries Σ w_i and the number of contributors, and `decode_weighted_mean` returns
Σ w_i x_i / Σ w_i. `pack` / `unpack` append or strip arbitrary extra integer coordinates.

Under DP the update's L2 norm must stay <= the clip C after rounding too (rounding alone can
add up to one step per coordinate). `encode_weighted(..., l2_bound=C)` bounds the dequantized
first part of `values` (the model update) with certainty, by conditional rounding: pre-clip
to the largest norm from which rounding stays under C with probability >= 1 - ROUNDING_BETA
(Kairouz et al. 2021, Thm 2: the margin is a few steps, not the worst case sqrt(d) steps),
round, measure the rounded norm while each chunk is in cache, and round again in the rare
case it exceeds C. Nothing above C is ever returned.

The rounding randomness is an AES-CTR keystream under a fresh OS-random key (pass `seed` only
for reproducible tests and benchmarks). It does not depend on the values, so it can be drawn
ahead (`draw_rounding`, e.g. by a silo while it trains) and spent on one vector by
`quantize_masked_into`, which also adds the pairwise masks in the same sweep: the same
integers as `quantize` for the same draw. `decode_weighted_mean_into` is
`decode_weighted_mean` written into a caller's array, chunk by chunk, bit for bit.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from . import randomness
from .crypto import Keystream
from .session import MAX_BITS

WEIGHT_COORDINATES = 2  # [weight, count]
# Coordinates per pass: the float work buffers (128 KiB each) stay in the CPU cache.
_CHUNK = 1 << 14
# Coordinates per chunk of the silo's sweeps (quantize_masked_into, decode_weighted_mean_into):
# one float64 buffer of 512 KiB and streams in and out, within a 1 MiB L2; measured faster
# than 2^14 or 2^15 on the development machine (fewer numpy calls).
_SWEEP_CHUNK = 1 << 16
_local = threading.local()
# Conditional rounding: the pre-clip leaves room for rounding with probability >= 1 - beta;
# a draw above the bound is redone, at most this many times in all.
ROUNDING_BETA = 1e-6
ROUNDING_TRIES = 20


def _buffers() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """This thread's work buffers: units (float64), noise words (uint32), noise (float64)."""
    buffers = getattr(_local, "buffers", None)
    if buffers is None:
        buffers = _local.buffers = (
            np.empty(_CHUNK, np.float64),
            np.empty(_CHUNK, np.uint32),
            np.empty(_CHUNK, np.float64),
        )
    return buffers


def _sweep_buffer() -> np.ndarray:
    """This thread's float64 buffer for the sweeps (its pages touched once)."""
    buffer = getattr(_local, "sweep", None)
    if buffer is None:
        buffer = _local.sweep = np.zeros(_SWEEP_CHUNK, np.float64)
    return buffer


def _signed_when_narrow(array: np.ndarray, bits: int) -> np.ndarray:
    """A uint32 array whose values are below 2^bits <= 2^31 viewed as int32: the same numbers,
    and numpy's float64 <-> int32 conversions are vectorised where uint32's are not."""
    return array.view(np.int32) if array.dtype == np.uint32 and bits <= 31 else array


@dataclass(frozen=True)
class Quantizer:
    clip_range: float
    levels: int
    max_clients: int
    max_weight: int = 1

    def __post_init__(self) -> None:
        if not self.clip_range > 0 or not np.isfinite(self.clip_range):
            raise ValueError(f"clip_range must be a positive finite float, got {self.clip_range}")
        if self.levels < 2:
            raise ValueError(f"levels must be >= 2, got {self.levels}")
        if self.max_clients < 1 or self.max_weight < 1:
            raise ValueError("max_clients and max_weight must be >= 1")
        if self.bits > MAX_BITS:
            raise ValueError(
                f"{self.max_clients} clients x max(levels-1={self.levels - 1}, "
                f"max_weight={self.max_weight}) needs {self.bits} bits > {MAX_BITS}; "
                "lower levels, max_weight or the cohort size"
            )

    @property
    def bits(self) -> int:
        """Modulus width b: the largest possible sum, n · max(L - 1, W), is below 2^b."""
        return (self.max_clients * max(self.levels - 1, self.max_weight)).bit_length()

    @property
    def dtype(self) -> type[np.unsignedinteger]:
        return np.uint32 if self.bits <= 32 else np.uint64

    @property
    def step(self) -> float:
        return 2.0 * self.clip_range / (self.levels - 1)

    def quantize(
        self,
        values: np.ndarray | Sequence[np.ndarray],
        seed: bytes | None = None,
        *,
        extra: int = 0,
        scale: float = 1.0,
        l2_bound: float | None = None,
    ) -> np.ndarray:
        """Clip x · scale to [-r, r], map to [0, L-1] with stochastic rounding.

        `values` is an array or a sequence of arrays, quantized as if concatenated (any real
        dtype; no float64 copy is made). Returns a `dtype` vector with `extra` trailing zero
        coordinates for the caller to fill. NaN is refused (ValueError); ±inf clip to ±r.

        `l2_bound` (None: no bound): the dequantized first array of `values`, divided by
        `scale`, has L2 norm <= l2_bound with certainty (conditional rounding; see the module
        docstring). Its values must then be finite.
        """
        parts = (
            [np.asarray(values).ravel()]
            if isinstance(values, np.ndarray)
            else [np.asarray(v).ravel() for v in values]
        )
        size = sum(p.size for p in parts)
        out = np.empty(size + extra, dtype=self.dtype)
        out[size:] = 0
        # 32 random bits per coordinate; float64 sums near L then resolve the rounding
        # probability to about L · 2^-52 (2^-30 at Flower's default of 2^22 levels).
        stream = Keystream(seed if seed is not None else randomness.random_bytes(32))
        units_per_value = scale / self.step
        if l2_bound is None:
            self._fill(parts, out, stream, [units_per_value] * len(parts), measure=False)
        else:
            self._fill_bounded(parts, out, stream, units_per_value, l2_bound * scale)
        return out

    def _fill(
        self,
        parts: list[np.ndarray],
        out: np.ndarray,
        stream: Keystream,
        units_per_value: list[float],
        *,
        measure: bool,
    ) -> float:
        """Quantize `parts` into `out`; with `measure`, return the squared L2 norm of the
        first part's dequantized values in steps (computed while each chunk is in cache)."""
        squares = 0.0
        start = 0
        for index, part in enumerate(parts):
            for begin in range(0, part.size, _CHUNK):
                chunk = part[begin : begin + _CHUNK]
                n = chunk.size
                target = out[start : start + n]
                try:
                    # NaN raises FloatingPointError at the latest in the cast to integers.
                    with np.errstate(invalid="raise"):
                        squares += self._quantize_chunk(
                            chunk, target, stream, units_per_value[index], measure and index == 0
                        )
                except FloatingPointError:
                    raise ValueError(
                        f"values: NaN among coordinates {start}..{start + n - 1}"
                    ) from None
                start += n
        return squares

    def _fill_bounded(
        self,
        parts: list[np.ndarray],
        out: np.ndarray,
        stream: Keystream,
        units_per_value: float,
        bound: float,
    ) -> None:
        """Conditional rounding: the first part's dequantized norm <= `bound` (in values)."""
        if not (math.isfinite(bound) and bound > 0):
            raise ValueError(
                f"l2_bound x scale = {bound!r}: must be a finite number > 0 (dp.clip > 0, "
                "weight > 0)"
            )
        dim = parts[0].size
        target = bound / self.step  # in steps
        room = rounding_room(target, dim)
        if room is None:
            raise ValueError(
                f"dp.clip = {bound:g} cannot hold after rounding {dim} coordinates onto a "
                f"grid of step {self.step:.3g} = 2 · secagg.clip_range ({self.clip_range:g}) / "
                f"(secagg.levels ({self.levels}) - 1): rounding alone adds a norm of about "
                f"{math.sqrt(dim) / 2 * self.step:.3g}. Raise secagg.levels, lower "
                "secagg.clip_range, or raise dp.clip."
            )
        # First try: assume the caller clipped to the bound (the client runtime does) and
        # shrink by room / bound, a factor 1 - O(1/bound) that costs no input-norm pass.
        # Only if the rounded norm is over the bound is the input's norm measured, and the
        # model part pre-clipped to `room` from it.
        norm = target
        # A hair under the bound, so the float error of dequantizing cannot cross it.
        limit = (target * (1 - 1e-12)) ** 2
        for attempt in range(ROUNDING_TRIES):
            shrink = room / norm
            scales = [units_per_value * shrink] + [units_per_value] * (len(parts) - 1)
            if self._fill(parts, out, stream, scales, measure=True) <= limit:
                return
            if attempt == 0:
                norm = math.sqrt(_sum_squares(parts[0])) * abs(units_per_value)  # in steps
                if not math.isfinite(norm):
                    raise ValueError("values: Inf in the update; an l2_bound needs finite values")
                norm = max(norm, target)
        raise RuntimeError(
            f"conditional rounding exceeded the L2 bound {bound:g} {ROUNDING_TRIES} times "
            f"(probability < {ROUNDING_BETA}^{ROUNDING_TRIES} for a sound margin)"
        )

    def _quantize_chunk(
        self,
        chunk: np.ndarray,
        target: np.ndarray,
        stream: Keystream,
        units_per_value: float,
        measure: bool = False,
    ) -> float:
        """Quantize one chunk into `target`, drawing its rounding randomness from `stream`."""
        n = chunk.size
        _, noise, fraction = _buffers()
        stream.fill(noise[:n])
        self._offsets(noise[:n], fraction[:n])
        return self._round_chunk(chunk, fraction[:n], target, units_per_value, measure)

    def _offsets(self, words: np.ndarray, out: np.ndarray) -> None:
        """out = (L-1)/2 + U with U = words / 2^32 uniform in [0, 1), exactly (< 2^53)."""
        half_range = self.clip_range / self.step
        np.add(words, half_range * 2.0**32, out=out, dtype=np.float64)
        out *= 2.0**-32

    def _round_chunk(
        self,
        chunk: np.ndarray,
        offsets: np.ndarray,
        target: np.ndarray,
        units_per_value: float,
        measure: bool = False,
    ) -> float:
        """target = floor(clip(x · units_per_value + offsets, 0, L-1)): four passes over
        buffers that stay in cache. With `measure`, three more give the chunk's squared
        dequantized norm in steps."""
        n = chunk.size
        # y = x · w/W in steps, shifted by (L-1)/2 (inside `offsets`): y ∈ [0, L-1] exactly
        # when |x · w/W| <= r.
        units = (_buffers()[0] if n <= _CHUNK else _sweep_buffer())[:n]
        np.multiply(chunk, units_per_value, out=units, dtype=np.float64)
        units += offsets
        # floor(y + U) rounds up with probability frac(y): unbiased. Clipping y + U (not y)
        # to [0, L-1] gives the same integer as clipping y first, in one pass: below 0 both
        # give 0, at or above L-1 both give L-1. y + U >= 0, so the cast (truncation) is the
        # floor.
        np.clip(units, 0.0, float(self.levels - 1), out=units)
        if not measure:
            np.copyto(target, units, casting="unsafe")
            return 0.0
        np.floor(units, out=units)  # the integers the cast below stores, exactly
        np.copyto(target, units, casting="unsafe")
        units -= (self.levels - 1) / 2.0  # the grid's zero (exact below 2^53)
        return float(np.square(units, out=units).sum())

    def draw_rounding(self, size: int, seed: bytes | None = None) -> np.ndarray:
        """The stochastic-rounding randomness of `size` coordinates, drawn ahead of the values
        they will round: float64 offsets (L-1)/2 + U_i, U_i the i-th 32-bit word of an AES-CTR
        keystream under a fresh OS-random key (`seed` only for tests: then they are the
        offsets `quantize(values, seed)` draws). Independent of the values, so a silo draws
        them while it trains; each draw rounds one vector only (`quantize_masked_into`)."""
        if not size >= 0:
            raise ValueError(f"size = {size}: must be >= 0")
        stream = Keystream(seed if seed is not None else randomness.random_bytes(32))
        out = np.empty(size, np.float64)
        noise = _buffers()[1]
        for begin in range(0, size, _CHUNK):
            n = min(_CHUNK, size - begin)
            stream.fill(noise[:n])
            self._offsets(noise[:n], out[begin : begin + n])
        return out

    def quantize_masked_into(
        self,
        values: np.ndarray,
        offsets: np.ndarray,
        addend: np.ndarray,
        out: np.ndarray,
        *,
        scale: float = 1.0,
    ) -> None:
        """out = (quantize(values · scale) + addend) mod 2^b, the rounding randomness taken
        from `offsets` (`draw_rounding`; the same integers `quantize` gives from the same
        draw), in one sweep of cache-sized chunks: multiply, add the offsets, clip, cast into
        `out`, add `addend` (the pairwise masks, < 2^b), reduce. `values` is 1-D (any real
        dtype); `offsets`, `addend` and `out` have its length; `out` is unsigned, at least as
        wide as `dtype` (a view of the wire buffer). NaN is refused (ValueError); ±inf clip."""
        size = values.size
        for name, array in (("offsets", offsets), ("addend", addend), ("out", out)):
            if array.shape != (size,):
                raise ValueError(f"{name}: shape {array.shape}, the values have ({size},)")
        if out.dtype.kind != "u" or out.dtype.itemsize < np.dtype(self.dtype).itemsize:
            raise ValueError(f"out: dtype {out.dtype}, needs unsigned of at least {self.dtype}")
        reduce = self.bits < out.dtype.itemsize * 8
        if addend.dtype == out.dtype:
            # int32 add wraps mod 2^32 as uint32's does; the AND then leaves the same bits
            out, addend = (
                _signed_when_narrow(out, self.bits),
                _signed_when_narrow(addend, self.bits),
            )
        modulus = out.dtype.type((1 << self.bits) - 1)
        units_per_value = scale / self.step
        for begin in range(0, size, _SWEEP_CHUNK):
            end = min(begin + _SWEEP_CHUNK, size)
            target = out[begin:end]
            try:
                with np.errstate(invalid="raise"):
                    self._round_chunk(
                        values[begin:end], offsets[begin:end], target, units_per_value
                    )
            except FloatingPointError:
                raise ValueError(f"values: NaN among coordinates {begin}..{end - 1}") from None
            np.add(target, addend[begin:end], out=target)  # wraps mod 2^32 or 2^64
            if reduce:
                np.bitwise_and(target, modulus, out=target)

    def dequantize_sum(self, total: np.ndarray, count: int) -> np.ndarray:
        """Σ clip(x_i) (approximately) from the integer sum of `count` quantized vectors."""
        # In place on one float64 array (same arithmetic as astype, *, -: same bits).
        out = np.multiply(total, self.step, dtype=np.float64)
        out -= count * self.clip_range
        return out

    def sum_error_bound(self, count: int) -> float:
        """Worst-case absolute error per coordinate of `dequantize_sum` (clipping aside)."""
        return count * self.step

    def encode_weighted(
        self,
        values: np.ndarray | Sequence[np.ndarray],
        weight: int,
        seed: bytes | None = None,
        *,
        l2_bound: float | None = None,
    ) -> np.ndarray:
        """quantize(x · w / W) followed by the extra coordinates [w, 1] (`values` as in
        `quantize`). `l2_bound` (central DP: the clip C; None: no bound) bounds the update
        the server decodes from the first array of `values`, dequantized · W / w, in L2
        norm with certainty; later arrays (loss, indicators) are not bounded."""
        if not 0 <= weight <= self.max_weight:
            raise ValueError(f"weight {weight} outside [0, max_weight={self.max_weight}]")
        out = self.quantize(
            values,
            seed,
            extra=WEIGHT_COORDINATES,
            scale=weight / self.max_weight,
            l2_bound=l2_bound,
        )
        out[-WEIGHT_COORDINATES:] = (weight, 1)
        return out

    def decode_weighted_mean(self, total: np.ndarray) -> tuple[np.ndarray, int, int]:
        """(Σ w_i x_i / Σ w_i, Σ w_i, contributors) from the unmasked sum."""
        body, (weight_sum, count) = unpack(total, WEIGHT_COORDINATES)
        if weight_sum == 0:
            raise ValueError("the total weight is zero")
        weighted = self.dequantize_sum(body, count)
        weighted *= self.max_weight / weight_sum
        return weighted, weight_sum, count

    def decode_weighted_mean_into(self, total: np.ndarray, out: np.ndarray) -> tuple[int, int]:
        """`decode_weighted_mean(total)`'s mean written into `out` (float32 or float64, the
        body's length), bit for bit the same values cast to out's dtype, in cache-sized
        chunks with no full-size temporary; returns (Σ w_i, contributors)."""
        body, (weight_sum, count) = unpack(total, WEIGHT_COORDINATES)
        if weight_sum == 0:
            raise ValueError("the total weight is zero")
        if out.shape != body.shape:
            raise ValueError(f"out: shape {out.shape}, the sum's body has {body.shape}")
        factor = self.max_weight / weight_sum
        offset = count * self.clip_range
        body = _signed_when_narrow(body, self.bits)
        work = _sweep_buffer()
        for begin in range(0, body.size, _SWEEP_CHUNK):
            end = min(begin + _SWEEP_CHUNK, body.size)
            units = work[: end - begin]
            # the arithmetic of dequantize_sum and decode_weighted_mean, in the same order
            np.multiply(body[begin:end], self.step, out=units, dtype=np.float64)
            units -= offset
            units *= factor
            np.copyto(out[begin:end], units, casting="same_kind")
        return weight_sum, count


def rounding_room(target: float, dim: int, beta: float = ROUNDING_BETA) -> float | None:
    """The largest L2 norm (in steps) from which stochastic rounding of `dim` coordinates
    stays within `target` steps with probability >= 1 - beta, or None if none does.

    Rounding x to x + e (E e = 0, e_i in an interval of length 1) gives, with probability
    >= 1 - beta, ||x + e||^2 <= ||x||^2 + d/4 + t (||x|| + sqrt(d)/2), t = sqrt(2 ln(1/beta))
    (Kairouz et al. 2021, Thm 2); always ||x + e|| < ||x|| + sqrt(d). The larger of the two
    rooms is taken; the caller still checks every draw.
    """
    tail = math.sqrt(2 * math.log(1 / beta))
    root_d = math.sqrt(dim)
    constant = dim / 4 + tail * root_d / 2 - target**2
    probable = (-tail + math.sqrt(tail * tail - 4 * constant)) / 2 if constant <= 0 else -math.inf
    room = max(probable, target - root_d)
    return room if room >= 0 else None


def _sum_squares(values: np.ndarray) -> float:
    """Σ x_i^2 in float64, through the cached work buffer (no float64 copy of `values`)."""
    work = _buffers()[0]
    total = 0.0
    for begin in range(0, values.size, _CHUNK):
        chunk = values[begin : begin + _CHUNK]
        buf = work[: chunk.size]
        np.copyto(buf, chunk, casting="unsafe")
        total += float(np.dot(buf, buf))
    return total


def pack(values: np.ndarray, extras: Sequence[int]) -> np.ndarray:
    """Append extra integer coordinates (e.g. a weight) to a quantized vector."""
    limit = np.iinfo(values.dtype).max
    for extra in extras:
        if not 0 <= int(extra) <= limit:
            raise ValueError(f"extra coordinate {extra} does not fit {values.dtype}")
    return np.concatenate([values.ravel(), np.asarray(extras, dtype=values.dtype)])


def unpack(vector: np.ndarray, n_extras: int) -> tuple[np.ndarray, list[int]]:
    """Split a (summed) vector into its body and its `n_extras` trailing coordinates."""
    if not 0 <= n_extras <= vector.size:
        raise ValueError(f"cannot take {n_extras} extras from {vector.size} coordinates")
    cut = vector.size - n_extras
    return vector[:cut], [int(v) for v in vector[cut:]]
