"""Field codecs for the wire format: small values in a config dict, big vectors in an arrays dict.

Each codec turns a Python value into a transport value and back, and on the way back checks
type, range and length, raising `SecAggProtocolError("<message>.<field>: <check>")`. `bool` is
never accepted where an int is expected, and numpy scalars are not accepted for ints (the
transport carries plain Python values).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

import numpy as np

from .errors import SecAggProtocolError

WireValue = Union[int, float, str, bytes, bool, list[int], list[bytes]]  # noqa: UP007
Config = dict[str, WireValue]
Arrays = dict[str, np.ndarray]

UINT64_MAX = 2**64 - 1
MAX_LIST = 1 << 22


def fail(path: str, check: str) -> SecAggProtocolError:
    return SecAggProtocolError(f"{path}: {check}")


@dataclass(frozen=True)
class Int:
    lo: int = 0
    hi: int = UINT64_MAX
    in_arrays = False

    def encode(self, value: Any) -> WireValue:
        return int(value)

    def decode(self, path: str, raw: object) -> int:
        if type(raw) is not int:
            raise fail(path, f"expected int, got {type(raw).__name__}")
        if not self.lo <= raw <= self.hi:
            raise fail(path, f"value {raw} outside [{self.lo}, {self.hi}]")
        return raw


@dataclass(frozen=True)
class Str:
    choices: tuple[str, ...]
    in_arrays = False

    def encode(self, value: Any) -> WireValue:
        return str(value.value if hasattr(value, "value") else value)

    def decode(self, path: str, raw: object) -> str:
        if type(raw) is not str:
            raise fail(path, f"expected str, got {type(raw).__name__}")
        if raw not in self.choices:
            raise fail(path, f"value {raw[:40]!r} not one of {list(self.choices)}")
        return raw


@dataclass(frozen=True)
class Bytes:
    min_len: int = 0
    max_len: int = 1 << 24
    in_arrays = False

    def encode(self, value: Any) -> WireValue:
        return bytes(value)

    def decode(self, path: str, raw: object) -> bytes:
        if type(raw) is not bytes:
            raise fail(path, f"expected bytes, got {type(raw).__name__}")
        if not self.min_len <= len(raw) <= self.max_len:
            expected = (
                f"{self.min_len}"
                if self.min_len == self.max_len
                else f"[{self.min_len}, {self.max_len}]"
            )
            raise fail(path, f"length {len(raw)} not in {expected}")
        return raw


@dataclass(frozen=True)
class IntList:
    lo: int = 0
    hi: int = UINT64_MAX
    unique: bool = True
    max_len: int = MAX_LIST
    in_arrays = False

    def encode(self, value: Any) -> WireValue:
        return [int(v) for v in value]

    def decode(self, path: str, raw: object) -> tuple[int, ...]:
        if type(raw) is not list:
            raise fail(path, f"expected list[int], got {type(raw).__name__}")
        if len(raw) > self.max_len:
            raise fail(path, f"{len(raw)} items exceed the limit {self.max_len}")
        for i, item in enumerate(raw):
            if type(item) is not int:
                raise fail(f"{path}[{i}]", f"expected int, got {type(item).__name__}")
            if not self.lo <= item <= self.hi:
                raise fail(f"{path}[{i}]", f"value {item} outside [{self.lo}, {self.hi}]")
        if self.unique and len(set(raw)) != len(raw):
            raise fail(path, "duplicate entries")
        return tuple(raw)


@dataclass(frozen=True)
class BytesList:
    min_len: int = 0
    max_len: int = 1 << 16
    max_items: int = MAX_LIST
    in_arrays = False

    def encode(self, value: Any) -> WireValue:
        return [bytes(v) for v in value]

    def decode(self, path: str, raw: object) -> tuple[bytes, ...]:
        if type(raw) is not list:
            raise fail(path, f"expected list[bytes], got {type(raw).__name__}")
        if len(raw) > self.max_items:
            raise fail(path, f"{len(raw)} items exceed the limit {self.max_items}")
        item = Bytes(self.min_len, self.max_len)
        return tuple(item.decode(f"{path}[{i}]", v) for i, v in enumerate(raw))


@dataclass(frozen=True)
class Vector:
    """A 1-D unsigned-integer array (uint32 or uint64) carried in the arrays dict."""

    dtypes: tuple[str, ...] = ("uint32", "uint64")
    max_len: int = 1 << 34
    in_arrays = True

    def encode(self, value: Any) -> np.ndarray:
        return value

    def decode(self, path: str, raw: object) -> np.ndarray:
        if not isinstance(raw, np.ndarray):
            raise fail(path, f"expected numpy.ndarray, got {type(raw).__name__}")
        if raw.dtype.name not in self.dtypes:
            raise fail(path, f"dtype {raw.dtype.name} not one of {list(self.dtypes)}")
        if raw.ndim != 1 or not 0 < raw.shape[0] <= self.max_len:
            raise fail(path, f"shape {raw.shape} is not a non-empty vector")
        # Native byte order and contiguity let the server add vectors without copies.
        return np.ascontiguousarray(raw, dtype=raw.dtype.newbyteorder("="))


def encode_members(members: frozenset[int] | set[int], order: np.ndarray) -> bytes:
    """Subset of the cohort as a bitmap over its sorted order (bit i = order[i], LSB first)."""
    wanted = np.fromiter(members, dtype=np.uint64, count=len(members))
    bits = np.isin(order, wanted).astype(np.uint8)
    return np.packbits(bits, bitorder="little").tobytes()


def decode_members(path: str, bitmap: bytes, order: np.ndarray) -> frozenset[int]:
    """Inverse of `encode_members`; rejects wrong lengths and bits past the cohort."""
    n = len(order)
    if len(bitmap) != (n + 7) // 8:
        raise fail(path, f"bitmap length {len(bitmap)} != {(n + 7) // 8} for n={n}")
    bits = np.unpackbits(np.frombuffer(bitmap, dtype=np.uint8), bitorder="little")
    if bits[n:].any():
        raise fail(path, "bits set beyond the cohort size")
    return frozenset(order[bits[:n].astype(bool)].tolist())


def wire_size(config: Config, arrays: Arrays) -> int:
    """Payload bytes of an encoded message: raw bytes and strings, 8 per number, array data."""
    total = 0
    for key, value in config.items():
        total += len(key)
        if isinstance(value, (bytes, str)):
            total += len(value)
        elif isinstance(value, list):
            total += sum(len(v) if isinstance(v, bytes) else 8 for v in value)
        else:
            total += 8
    return total + sum(len(k) + a.nbytes for k, a in arrays.items())
