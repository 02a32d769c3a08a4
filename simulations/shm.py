"""Growable shared-memory byte arenas, and arrays packed into them.

An arena is a Linux memfd mapped by the server process and by one or more
worker processes. Forked workers inherit the descriptor; spawned workers open
it through /proc/<pid>/fd. Only ever grown (ftruncate), never shrunk, so a
reader whose mapping is older than the writer's growth simply maps again.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

ALIGN = 64  # cache-line aligned slots: no false sharing between arrays


def _round_up(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


class Arena:
    """A shared byte buffer; `owner` (pid, fd) names it for other processes."""

    def __init__(self, fd: int, owner: tuple[int, int]) -> None:
        self.fd = fd
        self.owner = owner
        self._map: mmap.mmap | None = None
        self._bytes: np.ndarray | None = None
        self._mapped = 0

    @classmethod
    def create(cls, name: str, size: int = 1 << 20) -> Arena:
        if not hasattr(os, "memfd_create"):
            raise OSError("shared-memory workers need Linux (os.memfd_create)")
        fd = os.memfd_create(name, 0)
        os.ftruncate(fd, max(size, ALIGN))
        return cls(fd, (os.getpid(), fd))

    @classmethod
    def attach(cls, owner: tuple[int, int], inherited: bool) -> Arena:
        """The arena `owner` made: by its descriptor when inherited (fork), else via /proc."""
        pid, fd = owner
        if inherited:
            return cls(fd, owner)
        return cls(os.open(f"/proc/{pid}/fd/{fd}", os.O_RDWR), owner)

    def size(self) -> int:
        return os.fstat(self.fd).st_size

    def grow(self, size: int) -> None:
        """Make the arena at least `size` bytes (writer side; doubles to amortise)."""
        current = self.size()
        if size > current:
            os.ftruncate(self.fd, max(size, 2 * current))

    def bytes(self, need: int) -> np.ndarray:
        """A uint8 array over the mapping, remapped when it covers fewer than `need` bytes."""
        if self._bytes is None or self._mapped < need:
            size = self.size()
            if size < need:
                raise ValueError(f"arena holds {size} bytes, {need} needed")
            # The old mapping stays alive for as long as arrays still view it.
            self._map = mmap.mmap(self.fd, size)
            self._bytes = np.frombuffer(self._map, dtype=np.uint8)
            self._mapped = size
        return self._bytes

    def close(self) -> None:
        self._bytes, self._map = None, None
        with contextlib.suppress(OSError):
            os.close(self.fd)


@dataclass(frozen=True)
class ArrayRef:
    """Where one packed array lives in an arena, and what it was."""

    offset: int
    nbytes: int
    dtype: str
    shape: tuple[int, ...]
    is_torch: bool


def _raw_bytes(value: Any) -> tuple[np.ndarray, str, tuple[int, ...], bool]:
    """The array's bytes as a flat uint8 numpy view (no copy when already contiguous)."""
    if isinstance(value, torch.Tensor):
        t = value.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous()
        raw = t.reshape(-1).view(torch.uint8).numpy() if t.numel() else np.empty(0, np.uint8)
        return raw, str(t.dtype).removeprefix("torch."), tuple(t.shape), True
    a = np.ascontiguousarray(value)
    if a.dtype.hasobject:
        raise TypeError(f"array of dtype {a.dtype} cannot be shared")
    raw = a.reshape(-1).view(np.uint8) if a.size else np.empty(0, np.uint8)
    return raw, a.dtype.str, tuple(a.shape), False


# Copies go through numpy (a plain memcpy on the calling thread): torch would split
# them over its intra-op threads, which only contend with the workers for the cores.
class Packer:
    """Appends arrays to an arena, growing it as needed."""

    def __init__(self, arena: Arena, start: int = 0) -> None:
        self.arena = arena
        self.offset = start

    def put(self, value: Any) -> ArrayRef:
        raw, dtype, shape, is_torch = _raw_bytes(value)
        n = int(raw.size)
        end = self.offset + n
        self.arena.grow(end)
        self.arena.bytes(end)[self.offset : end] = raw
        ref = ArrayRef(self.offset, n, dtype, shape, is_torch)
        self.offset = _round_up(end)
        return ref


def take(arena: Arena, ref: ArrayRef) -> torch.Tensor | np.ndarray:
    """A private copy of a packed array (the arena is reused once the copy is made)."""
    raw = arena.bytes(ref.offset + ref.nbytes)[ref.offset : ref.offset + ref.nbytes].copy()
    if ref.is_torch:
        dtype = getattr(torch, ref.dtype)
        if not ref.nbytes:
            return torch.empty(ref.shape, dtype=dtype)
        return torch.from_numpy(raw).view(dtype).reshape(ref.shape)
    return raw.view(np.dtype(ref.dtype)).reshape(ref.shape)
