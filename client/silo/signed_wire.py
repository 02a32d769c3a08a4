"""The integer ring on the wire: masked Z_(2^b) vectors as signed tensors that never overflow.

fedveil's masked vectors are uint32 (b <= 32) or uint64 (b <= 62). gloo's SUM refuses
uint32/uint64 but sums int32/int64; signed overflow is undefined behaviour in C++, so no
partial sum may wrap. Each masked coordinate lies in [0, 2^b), a sum of N of them below
2^(b + ceil(log2 N)): with b + ceil(log2 N) <= 31 the sum fits int32, with <= 63 int64.
The sum is reduced modulo 2^b afterwards, where the masks cancel.

Contract: `wire_dtype(bits, world)` is int32 or int64, or ValueError naming the width;
`to_wire` is a view (no copy) when the widths match; `from_wire` returns the sum in
[0, 2^b) as the unsigned dtype the secure-aggregation code uses (reduced in place, a view
of the wire buffer, when the widths match).
"""

from __future__ import annotations

import numpy as np
import torch


def headroom_bits(world: int) -> int:
    """ceil(log2 world): the bits a sum of `world` values needs above one value's."""
    if world < 1:
        raise ValueError(f"world = {world}: must be >= 1")
    return (world - 1).bit_length()


def wire_dtype(bits: int, world: int) -> torch.dtype:
    """The narrowest signed dtype whose sum of `world` values in [0, 2^bits) cannot wrap."""
    need = bits + headroom_bits(world)
    if need <= 31:
        return torch.int32
    if need <= 63:
        return torch.int64
    raise ValueError(
        f"modulus bits {bits} + ceil(log2 {world} silos) = {need} > 63: a signed 64-bit "
        "sum could overflow; lower the quantization levels or the number of silos"
    )


def wire_buffer(dimension: int, bits: int, world: int) -> torch.Tensor:
    """An uninitialised signed tensor of `dimension` values to fill with `mask_into`."""
    return torch.empty(dimension, dtype=wire_dtype(bits, world))


def mask_into(vector: np.ndarray, masks: np.ndarray, bits: int, out: np.ndarray) -> None:
    """out = (vector + masks) mod 2^bits, written into the signed wire buffer `out` (a
    slice of `wire_buffer(...).numpy()`): one pass, no temporary when the widths match."""
    if out.dtype.itemsize == vector.dtype.itemsize:
        unsigned = out.view(vector.dtype)
        np.add(vector, masks, out=unsigned)
        if bits < unsigned.dtype.itemsize * 8:
            np.bitwise_and(unsigned, unsigned.dtype.type((1 << bits) - 1), out=unsigned)
        return
    # uint32 update on an int64 wire: wrap at 2^32 (2^bits divides it), then widen
    total = np.add(vector, masks)
    np.bitwise_and(total, total.dtype.type((1 << bits) - 1), out=total)
    out[:] = total


def to_wire(vector: np.ndarray, bits: int, world: int) -> torch.Tensor:
    """`vector` (uint32/uint64, every value < 2^bits) as the signed tensor to all-reduce
    (a view, no copy, when the widths match)."""
    dtype = wire_dtype(bits, world)
    signed = np.int32 if dtype == torch.int32 else np.int64
    if vector.dtype.itemsize == np.dtype(signed).itemsize:
        return torch.from_numpy(vector.view(signed))
    return torch.from_numpy(vector.astype(signed))


def from_wire(total: torch.Tensor, bits: int) -> np.ndarray:
    """The all-reduced sum, reduced modulo 2^bits, as uint32 (bits <= 32) or uint64: in
    place, a view of `total`'s memory, when the widths match (a CPU tensor; one pass),
    else a new array."""
    array = total.detach().cpu().numpy()
    unsigned = np.uint32 if bits <= 32 else np.uint64
    if array.dtype.itemsize == np.dtype(unsigned).itemsize:
        out = array.view(unsigned)
        np.bitwise_and(out, unsigned((1 << bits) - 1), out=out)
        return out
    # int64 wire, bits <= 32: the low 32 bits of the two's complement are the sum mod 2^32
    return np.bitwise_and(array.view(np.uint64), np.uint64((1 << bits) - 1)).astype(unsigned)
