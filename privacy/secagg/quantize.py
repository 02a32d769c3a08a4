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

The rounding randomness is an AES-CTR keystream under a fresh OS-random key (pass `seed` only
for reproducible tests and benchmarks).
"""

from __future__ import annotations

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
_local = threading.local()


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
    ) -> np.ndarray:
        """Clip x · scale to [-r, r], map to [0, L-1] with stochastic rounding.

        `values` is an array or a sequence of arrays, quantized as if concatenated (any real
        dtype; no float64 copy is made). Returns a `dtype` vector with `extra` trailing zero
        coordinates for the caller to fill. NaN is refused (ValueError); ±inf clip to ±r.
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
        start = 0
        for part in parts:
            for begin in range(0, part.size, _CHUNK):
                chunk = part[begin : begin + _CHUNK]
                n = chunk.size
                target = out[start : start + n]
                try:
                    # NaN raises FloatingPointError at the latest in the cast to integers.
                    with np.errstate(invalid="raise"):
                        self._quantize_chunk(chunk, target, stream, units_per_value)
                except FloatingPointError:
                    raise ValueError(
                        f"values: NaN among coordinates {start}..{start + n - 1}"
                    ) from None
                start += n
        return out

    def _quantize_chunk(
        self, chunk: np.ndarray, target: np.ndarray, stream: Keystream, units_per_value: float
    ) -> None:
        """Quantize one chunk into `target`: seven passes over buffers that stay in cache."""
        n = chunk.size
        work, noise, fraction = _buffers()
        half_range = self.clip_range / self.step
        # U = noise / 2^32 is uniform in [0, 1); the shift by (L-1)/2 rides along with it.
        stream.fill(noise[:n])
        np.add(noise[:n], half_range * 2.0**32, out=fraction[:n], dtype=np.float64)
        fraction[:n] *= 2.0**-32
        # y = x · w/W in steps, shifted by (L-1)/2: y ∈ [0, L-1] exactly when |x · w/W| <= r.
        units = work[:n]
        np.multiply(chunk, units_per_value, out=units, dtype=np.float64)
        units += fraction[:n]
        # floor(y + U) rounds up with probability frac(y): unbiased. Clipping y + U (not y)
        # to [0, L-1] gives the same integer as clipping y first, in one pass: below 0 both
        # give 0, at or above L-1 both give L-1. y + U >= 0, so the cast (truncation) is the
        # floor.
        np.clip(units, 0.0, float(self.levels - 1), out=units)
        np.copyto(target, units, casting="unsafe")

    def dequantize_sum(self, total: np.ndarray, count: int) -> np.ndarray:
        """Σ clip(x_i) (approximately) from the integer sum of `count` quantized vectors."""
        return total.astype(np.float64) * self.step - count * self.clip_range

    def sum_error_bound(self, count: int) -> float:
        """Worst-case absolute error per coordinate of `dequantize_sum` (clipping aside)."""
        return count * self.step

    def encode_weighted(
        self, values: np.ndarray | Sequence[np.ndarray], weight: int, seed: bytes | None = None
    ) -> np.ndarray:
        """quantize(x · w / W) followed by the extra coordinates [w, 1] (`values` as in
        `quantize`)."""
        if not 0 <= weight <= self.max_weight:
            raise ValueError(f"weight {weight} outside [0, max_weight={self.max_weight}]")
        out = self.quantize(values, seed, extra=WEIGHT_COORDINATES, scale=weight / self.max_weight)
        out[-WEIGHT_COORDINATES:] = (weight, 1)
        return out

    def decode_weighted_mean(self, total: np.ndarray) -> tuple[np.ndarray, int, int]:
        """(Σ w_i x_i / Σ w_i, Σ w_i, contributors) from the unmasked sum."""
        body, (weight_sum, count) = unpack(total, WEIGHT_COORDINATES)
        if weight_sum == 0:
            raise ValueError("the total weight is zero")
        weighted = self.dequantize_sum(body, count) * (self.max_weight / weight_sum)
        return weighted, weight_sum, count


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
