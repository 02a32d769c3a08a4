"""Example-level accounting of clients' local DP-SGD (Opacus), per client.

Each client's own data is protected at (epsilon_k, delta) for the steps it
took over the rounds it joined. The server knows who joined which round and,
in simulation, each client's dataset size, so it can account every client
without trusting a reported number: q_k = batch / n_k and 1/q_k noised steps
per local epoch (Opacus' Poisson loader).
"""

from __future__ import annotations

import math

import numpy as np

from fedveil.privacy.dp import PrivacyEvent, compute_epsilon


class ClientDpSgdAccountant:
    def __init__(
        self, noise_multiplier: float, batch_size: int, epochs: int, sizes: np.ndarray, delta: float
    ) -> None:
        self.z, self.batch, self.epochs, self.delta = noise_multiplier, batch_size, epochs, delta
        self.sizes = sizes
        self.joined: dict[int, int] = {}
        self.worst = 0.0

    def rate(self, cid: int) -> float:
        return min(1.0, self.batch / max(1, int(self.sizes[cid])))

    def record_round(self, participants: list[int]) -> float:
        """Count one more round for each participant; the largest epsilon among them."""
        for cid in participants:
            self.joined[cid] = self.joined.get(cid, 0) + 1
        for cid in participants:
            self.worst = max(self.worst, self.epsilon(cid))
        return self.worst

    def epsilon(self, cid: int) -> float:
        rounds = self.joined.get(cid, 0)
        if rounds == 0:
            return 0.0
        q = self.rate(cid)
        steps = rounds * self.epochs * math.ceil(1 / q)
        # RDP: tens of ms per query, and a valid upper bound for Poisson DP-SGD.
        return compute_epsilon([PrivacyEvent(self.z, q, steps)], self.delta, "rdp")
