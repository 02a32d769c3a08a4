"""One gossip mixing step over stacked models, and the consensus measures.

Contract: `mix(x, mixing)` returns W x for the stacked models x (clients x d),
computed slot by slot (`Mixing`'s fixed order) in float32 with float64 weights
rounded once: a process holding only some rows computes the same bits for them
with `mix_rows`. `consensus_distance(x)` is the mean L2 distance of the rows to
their average; `average(x)` the consensus model (what an exact all-reduce gives).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from fedveil.simulations.gossip.topology import Mixing


def mix(x: torch.Tensor, mixing: Mixing) -> torch.Tensor:
    """W x for every row of x (clients x d)."""
    rows = torch.arange(mixing.n)
    return mix_rows(rows, lambda ids: x[ids], mixing)


def mix_rows(
    rows: torch.Tensor, lookup: Callable[[torch.Tensor], torch.Tensor], mixing: Mixing
) -> torch.Tensor:
    """W x for `rows` only; `lookup(ids)` gives the current models of clients `ids`
    (a tensor of client ids, len(ids) x d): the rows and their neighbours."""
    sw = mixing.self_weight[rows].to(torch.float32).unsqueeze(1)
    out = lookup(rows) * sw
    for k in range(mixing.index.shape[1]):
        w = mixing.weight[rows, k].to(torch.float32).unsqueeze(1)
        out.add_(lookup(mixing.index[rows, k]) * w)
    return out


def average(x: torch.Tensor) -> torch.Tensor:
    """The consensus model: the mean of the rows (float64 sum, float32 result)."""
    return x.to(torch.float64).mean(dim=0).to(torch.float32)


def consensus_distance(x: torch.Tensor) -> float:
    """Mean L2 distance of the clients' models to their average."""
    return float((x - average(x)).norm(dim=1).mean())
