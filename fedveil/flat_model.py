"""A model's floating-point state as one flat vector.

The model's parameters and float buffers become views into a single
contiguous tensor, so reading or loading the whole model is one copy, and a
client update is one vector: what clipping, quantization and masking work on.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from safetensors.torch import load_file, save_file
from torch import nn


@dataclass(frozen=True)
class Entry:
    name: str
    shape: tuple[int, ...]
    offset: int
    numel: int


class FlatModel:
    """Binds a module's float tensors to slices of one flat float32 vector."""

    def __init__(self, module: nn.Module, device: torch.device | str = "cpu") -> None:
        self.module = module.to(device)
        self.device = torch.device(device)
        entries: list[Entry] = []
        tensors: list[torch.Tensor] = []
        offset = 0
        for name, tensor in self._float_state():
            entries.append(Entry(name, tuple(tensor.shape), offset, tensor.numel()))
            tensors.append(tensor)
            offset += tensor.numel()
        self.entries = entries
        self.flat = torch.empty(offset, dtype=torch.float32, device=self.device)
        with torch.no_grad():
            for entry, tensor in zip(entries, tensors, strict=True):
                view = self.flat[entry.offset : entry.offset + entry.numel].view(entry.shape)
                view.copy_(tensor)
                tensor.data = view

    def _float_state(self) -> Iterator[tuple[str, torch.Tensor]]:
        seen: set[int] = set()
        for name, p in self.module.named_parameters():
            if id(p) not in seen:
                seen.add(id(p))
                yield name, p
        for name, b in self.module.named_buffers():
            if b.is_floating_point() and id(b) not in seen:
                seen.add(id(b))
                yield name, b

    @property
    def size(self) -> int:
        return int(self.flat.numel())

    def get(self) -> torch.Tensor:
        """A copy of the current state."""
        return self.flat.detach().clone()

    def set(self, vector: torch.Tensor) -> None:
        if vector.shape != self.flat.shape:
            raise ValueError(
                f"model vector has {vector.numel()} values; this model has {self.size}"
            )
        with torch.no_grad():
            self.flat.copy_(vector)

    def named_tensors(self, vector: torch.Tensor) -> dict[str, torch.Tensor]:
        """Split a flat vector into named tensors (for saving)."""
        return {
            e.name: vector[e.offset : e.offset + e.numel].reshape(e.shape).contiguous()
            for e in self.entries
        }

    def vector_from(self, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
        missing = [e.name for e in self.entries if e.name not in tensors]
        if missing:
            raise ValueError(f"model file lacks tensor {missing[0]!r}")
        out = torch.empty(self.size, dtype=torch.float32)
        for e in self.entries:
            t = tensors[e.name]
            if tuple(t.shape) != e.shape:
                raise ValueError(
                    f"tensor {e.name!r} has shape {tuple(t.shape)}, expected {e.shape}"
                )
            out[e.offset : e.offset + e.numel] = t.reshape(-1).float()
        return out

    def save(self, vector: torch.Tensor, path: str, metadata: dict[str, str] | None = None) -> None:
        save_file(self.named_tensors(vector.detach().cpu()), path, metadata=metadata)

    def load(self, path: str) -> torch.Tensor:
        return self.vector_from(load_file(path))
