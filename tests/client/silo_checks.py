"""What the silo tests check received chunks against: every unmasked partial sum."""

from __future__ import annotations

from itertools import combinations

import numpy as np
import torch


def chunk_of(vector: np.ndarray, index: int, parts: int) -> np.ndarray:
    """Chunk `index` of `vector` as the ring splits it (torch.tensor_split)."""
    return torch.tensor_split(torch.from_numpy(vector), parts)[index].numpy()


def unmasked_partial_sums(
    encoded: dict[int, np.ndarray], index: int, parts: int, bits: int
) -> list[tuple[tuple[int, ...], np.ndarray]]:
    """(subset, Σ chunk mod 2^bits) for every non-empty proper subset of the silos."""
    silos = sorted(encoded)
    out = []
    for size in range(1, len(silos)):
        for subset in combinations(silos, size):
            total = sum(chunk_of(encoded[s], index, parts).astype(np.int64) for s in subset)
            out.append((subset, np.asarray(total) % (1 << bits)))
    return out


def leaked_partial_sums(
    chunks: list[tuple[int, np.ndarray]], encoded: dict[int, np.ndarray], bits: int
) -> list[tuple[int, tuple[int, ...]]]:
    """(chunk index, subset) for each received chunk equal to an unmasked partial sum."""
    parts = len(encoded)
    leaks = []
    for index, chunk in chunks:
        received = chunk.astype(np.int64) % (1 << bits)
        for subset, partial in unmasked_partial_sums(encoded, index, parts, bits):
            if np.array_equal(received, partial):
                leaks.append((index, subset))
    return leaks
