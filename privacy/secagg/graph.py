"""Neighbour graph: complete for small cohorts, a randomly permuted Harary graph otherwise.

H(k, n) puts the clients on a ring and links each to the k/2 nearest on either side. The ring
order is a permutation every party derives from the session's graph seed (AES-256-CTR
keystream, one 64-bit sort key per client), so the server and all clients agree on the graph
without extra messages and nobody but the seed's chooser can steer who neighbours whom.
"""

from __future__ import annotations

import numpy as np

from .crypto import derive_key, keystream


def ring_order(client_ids: np.ndarray, graph_seed: bytes, session_id: bytes) -> np.ndarray:
    """The cohort in ring order: a uniformly random permutation fixed by the seed."""
    key = derive_key(graph_seed, salt=session_id, info=b"graph-permutation")
    sort_keys = keystream(key, len(client_ids), np.uint64)
    # A stable sort breaks the (2^-64-likely) ties by id order, so every party agrees.
    return client_ids[np.argsort(sort_keys, kind="stable")]


class NeighbourGraph:
    """Who shares secrets and masks with whom, as positions in the sorted cohort."""

    def __init__(
        self, client_ids: np.ndarray, degree: int, graph_seed: bytes, session_id: bytes
    ) -> None:
        self._ids = client_ids
        self._index = {int(cid): i for i, cid in enumerate(client_ids.tolist())}
        self.degree = degree
        self.complete = degree == len(client_ids) - 1
        if self.complete:
            self._ring: np.ndarray | None = None
            self._ring_pos: dict[int, int] = {}
        else:
            self._ring = ring_order(client_ids, graph_seed, session_id)
            self._ring_pos = {int(cid): p for p, cid in enumerate(self._ring.tolist())}

    def neighbours(self, client_id: int) -> frozenset[int]:
        """The k neighbours of `client_id` (itself excluded)."""
        if self.complete:
            return frozenset(self._index) - {client_id}
        assert self._ring is not None
        n = len(self._ring)
        pos = self._ring_pos[client_id]
        half = self.degree // 2
        offsets = [o for o in range(-half, half + 1) if o]
        return frozenset(int(self._ring[(pos + o) % n]) for o in offsets)

    def holders(self, client_id: int) -> frozenset[int]:
        """The parties holding a share of `client_id`'s secrets: its neighbours and itself."""
        return self.neighbours(client_id) | {client_id}
