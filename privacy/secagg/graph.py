"""Neighbour graph: complete for small cohorts, a randomly permuted Harary graph otherwise.

H(k, n) puts the clients on a ring and links each to the k/2 nearest on either side. The ring
order is a permutation every party derives from the session's graph seed (AES-256-CTR
keystream, one 64-bit sort key per client), so the server and all clients agree on the graph
without extra messages and nobody but the seed's chooser can steer who neighbours whom.
"""

from __future__ import annotations

import numpy as np

from .crypto import derive_key, keystream


def ring_permutation(count: int, graph_seed: bytes, session_id: bytes) -> np.ndarray:
    """Ring position → index into the sorted cohort: a uniform permutation fixed by the seed."""
    key = derive_key(graph_seed, salt=session_id, info=b"graph-permutation")
    sort_keys = keystream(key, count, np.uint64)
    # A stable sort breaks the (2^-64-likely) ties by id order, so every party agrees.
    return np.argsort(sort_keys, kind="stable")


class NeighbourGraph:
    """Who shares secrets and masks with whom. Lookups are O(log n) after an O(n log n)
    vectorised setup, so a client never builds per-cohort Python dicts."""

    def __init__(
        self, client_ids: np.ndarray, degree: int, graph_seed: bytes, session_id: bytes
    ) -> None:
        self._ids = client_ids
        self.degree = degree
        self.complete = degree == len(client_ids) - 1
        if not self.complete:
            self._ring = ring_permutation(len(client_ids), graph_seed, session_id)
            self._position = np.empty_like(self._ring)
            self._position[self._ring] = np.arange(len(self._ring))

    def neighbours(self, client_id: int) -> frozenset[int]:
        """The k neighbours of `client_id` (itself excluded)."""
        index = int(np.searchsorted(self._ids, np.uint64(client_id)))
        if self.complete:
            return frozenset(self._ids.tolist()) - {client_id}
        n, half = len(self._ring), self.degree // 2
        offsets = np.concatenate([np.arange(-half, 0), np.arange(1, half + 1)])
        ring_slots = (int(self._position[index]) + offsets) % n
        return frozenset(self._ids[self._ring[ring_slots]].tolist())

    def holders(self, client_id: int) -> frozenset[int]:
        """The parties holding a share of `client_id`'s secrets: its neighbours and itself."""
        return self.neighbours(client_id) | {client_id}
