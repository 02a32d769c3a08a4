"""Where silos meet: torch.distributed's TCP store, from a `tcp://host:port` address or
torchrun's environment (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE). Rank 0 hosts the
store. The store is unauthenticated: nothing read from it is trusted without a signature
(adverts.py), and it carries no secret."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from urllib.parse import urlparse

import torch.distributed as dist


@dataclass(frozen=True)
class Rendezvous:
    host: str
    port: int
    rank: int
    world: int


def parse_address(address: str, rank: int, world: int) -> Rendezvous:
    """`tcp://host:port` with the silo's rank and the world size; ValueError naming it."""
    parsed = urlparse(address)
    if parsed.scheme != "tcp" or not parsed.hostname or parsed.port is None:
        raise ValueError(f"--rendezvous {address!r}: expected tcp://host:port")
    if not 2 <= world <= 1024:
        raise ValueError(f"--world {world}: must be in [2, 1024]")
    if not 0 <= rank < world:
        raise ValueError(f"--rank {rank}: must be in [0, {world})")
    return Rendezvous(parsed.hostname, parsed.port, rank, world)


def from_environment(env: Mapping[str, str] = os.environ) -> Rendezvous:
    """torchrun's variables; ValueError naming the one missing or malformed."""
    values: dict[str, str] = {}
    for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
        if not env.get(name):
            raise ValueError(f"{name}: not set (run under torchrun, or pass --rendezvous)")
        values[name] = env[name]
    try:
        port, rank, world = (int(values[n]) for n in ("MASTER_PORT", "RANK", "WORLD_SIZE"))
    except ValueError:
        raise ValueError(f"MASTER_PORT/RANK/WORLD_SIZE: not integers: {values}") from None
    return parse_address(f"tcp://{values['MASTER_ADDR']}:{port}", rank, world)


def connect(rdv: Rendezvous, timeout_s: float) -> dist.TCPStore:
    """The run's store: rank 0 hosts it, the others connect (waiting up to timeout_s)."""
    return dist.TCPStore(
        rdv.host,
        rdv.port,
        rdv.world,
        rdv.rank == 0,
        timeout=timedelta(seconds=timeout_s),
        wait_for_workers=False,
    )
