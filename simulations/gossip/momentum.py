"""Quasi-global momentum for gossip (QG-DSGDm: Lin, Karimireddy, Stich, Jaggi, ICML 2021).

Contract. Each client keeps a momentum buffer u_i (model units, starting at 0) and the
model it held after its last training round, a_i (starting at the initial model), and
moves both only in the rounds it trains. In such a round, with Delta_i its local
training's update and beta = gossip.momentum:
  x_i^{1/2}   = x_i + Delta_i + beta u_i          (heavy ball on the quasi-global buffer)
  x^{new}     = W x^{1/2}                          (the round's mixing, unchanged)
  u_i        <- beta u_i + (1 - beta) (x_i^{new} - a_i),   a_i <- x_i^{new}
The buffer follows the client's model's whole displacement since it last trained: its
own step and what mixing brought from its neighbours, so under heterogeneous data it
tracks the network's direction rather than the client's own gradient (the paper's
point). With every client awake each round this is the paper's update (one round is
one iteration; its separate buffer weight mu is tied to beta here: one knob). With
gossip.active = K of n, a client trains every n / K rounds on average, and the
displacement since its last training spans those rounds.

Why it matters for randomized gossip: mixing is doubly stochastic and never moves the
average model, so only the trained clients' steps move it. With a common update
Delta the average moves v = (K / n) (Delta + beta u) a round and u -> (n / K) v, so
v -> (K / n) Delta / (1 - beta): the momentum multiplies the average's progress by
1 / (1 - beta) (docs/how-to/gossip-training.md). beta = 0 (the default) builds
no buffer: the run is bit for bit plain gossip.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


class QuasiGlobalMomentum:
    """The clients' momentum buffers and anchors (clients x d) and a round's two steps."""

    def __init__(self, beta: float, start: torch.Tensor) -> None:
        if not (0.0 < beta < 1.0):  # written so NaN fails
            raise ValueError(f"gossip.momentum = {beta}: must be in (0, 1) to build buffers")
        self.beta = beta
        self.u = torch.zeros_like(start)
        self.anchor = start.clone()  # each client's model after it last trained

    def push(self, half: torch.Tensor, rows: Sequence[int]) -> torch.Tensor:
        """`half` (every client's model after local training) with beta u_i added to
        the rows of the clients that trained."""
        if not rows:
            return half
        ids = torch.tensor(rows, dtype=torch.int64)
        out = half.clone()
        out[ids] += self.beta * self.u[ids]
        return out

    def update(self, after: torch.Tensor, rows: Sequence[int]) -> None:
        """Fold each trained client's displacement since it last trained into its buffer."""
        if not rows:
            return
        ids = torch.tensor(rows, dtype=torch.int64)
        moved = after[ids] - self.anchor[ids]
        self.u[ids] = self.beta * self.u[ids] + (1.0 - self.beta) * moved
        self.anchor[ids] = after[ids]
