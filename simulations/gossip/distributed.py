"""Gossip as separate processes exchanging models over torch.distributed (gloo send/recv).

Contract. `run_gossip_processes(cfg, world, out_dir)` starts `world` processes on this
machine (rendezvous: a file store in `out_dir`, so no port is raced for). Rank r owns
a contiguous block of clients; each round it trains its clients through its own
in-process transport (the same ClientRuntime path and seeds as `fedveil simulate`),
sends each peer rank, in one message, the rows of its clients that have a neighbour
there, receives theirs, and mixes its own rows with `mix_rows`: the arithmetic and
the order of the single-process engine, so the result equals an in-process run with
the same seed within floating-point tolerance (vmap units may group clients
differently: ~1e-7 relative). At the end the consensus model is an all_reduce of the
rows' sum (float64) over n. Each rank writes its rows, and rank 0 the consensus, to
`out_dir/rank<r>.pt`.

gloo on CPU has no TLS: the models travel in the clear between the processes, which is
what gossip shows every neighbour anyway (simulations/gossip/gossip_privacy.py).
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from fedveil.config import RunConfig
from fedveil.flat_model import FlatModel
from fedveil.server.engine.requests import training_config
from fedveil.server.engine.rounds import initial_model
from fedveil.simulations.gossip.engine import gossip_graph, local_training
from fedveil.simulations.gossip.mixing import mix_rows

TIMEOUT = datetime.timedelta(seconds=120)  # a dead peer fails the run, never hangs it


def owner_of(cid: int, n: int, world: int) -> int:
    """The rank that runs client `cid`: contiguous, near-equal blocks."""
    return cid * world // n


def run_gossip_processes(cfg: RunConfig, world: int, out_dir: str | Path) -> list[Path]:
    """Run cfg.server.rounds gossip rounds in `world` processes; the files they wrote."""
    if cfg.gossip.active:
        raise ValueError(
            f"gossip.active = {cfg.gossip.active}: the multi-process run wakes every client "
            "each round; randomized gossip runs in process (fedveil simulate)"
        )
    if cfg.gossip.momentum:
        raise ValueError(
            f"gossip.momentum = {cfg.gossip.momentum}: the multi-process run mixes plain "
            "models (D-PSGD); quasi-global momentum runs in process (fedveil simulate)"
        )
    if not 2 <= world <= cfg.data.num_clients:
        raise ValueError(f"world = {world}: need 2 <= world <= data.num_clients")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    store = out / "rendezvous"
    store.unlink(missing_ok=True)
    mp.start_processes(
        _rank_main, args=(world, str(store), cfg, str(out)), nprocs=world, start_method="spawn"
    )
    return [out / f"rank{r}.pt" for r in range(world)]


def _rank_main(rank: int, world: int, store: str, cfg: RunConfig, out: str) -> None:
    torch.set_num_threads(1)  # one core per rank: the ranks share the machine
    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=world, timeout=TIMEOUT
    )
    try:
        result = _run_rank(rank, world, cfg)
        torch.save(result, Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def _lookup(table: dict[int, torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
    def fetch(ids: torch.Tensor) -> torch.Tensor:
        return torch.stack([table[int(i)] for i in ids])

    return fetch


def _run_rank(rank: int, world: int, cfg: RunConfig) -> dict[str, Any]:
    from fedveil.simulations.inprocess import InProcessTransport
    from fedveil.tasks import make_task

    task = make_task(cfg)
    n = task.num_clients
    mixing = gossip_graph(cfg, n)
    mine = [c for c in range(n) if owner_of(c, n, world) == rank]
    # What goes to, and comes from, each peer: the clients with a neighbour across.
    send = {
        p: sorted({i for i in mine for j in mixing.graph[i] if owner_of(j, n, world) == p})
        for p in range(world)
        if p != rank
    }
    recv = {
        p: sorted({j for i in mine for j in mixing.graph[i] if owner_of(j, n, world) == p})
        for p in range(world)
        if p != rank
    }
    start = FlatModel(initial_model(task, cfg.seed)).get().detach()
    rows = start.unsqueeze(0).repeat(len(mine), 1)
    where = {c: k for k, c in enumerate(mine)}
    config = training_config(cfg, None)
    failures: list[str] = []
    sent_bytes = 0
    with InProcessTransport(
        task, "cpu", workers=1, unit_size=cfg.simulation.vmap_clients, run_config=cfg
    ) as transport:
        for round_num in range(1, cfg.server.rounds + 1):
            half, _, _ = local_training(transport, config, round_num, mine, rows, failures)
            table = {c: half[where[c]] for c in mine}
            ops, inbox = [], {}
            for p, ids in send.items():
                if ids:
                    ops.append(
                        dist.P2POp(dist.isend, half[[where[i] for i in ids]].contiguous(), p)
                    )
                    sent_bytes += len(ids) * half.shape[1] * half.element_size()
            for p, ids in recv.items():
                if ids:
                    inbox[p] = torch.empty(len(ids), half.shape[1], dtype=half.dtype)
                    ops.append(dist.P2POp(dist.irecv, inbox[p], p))
            if ops:
                for req in dist.batch_isend_irecv(ops):
                    req.wait()
            for p, buf in inbox.items():
                table.update({j: buf[k] for k, j in enumerate(recv[p])})

            rows = mix_rows(torch.tensor(mine), _lookup(table), mixing)
    total = rows.to(torch.float64).sum(dim=0)
    dist.all_reduce(total)
    return {
        "clients": mine,
        "rows": rows,
        "consensus": (total / n).to(torch.float32),
        "bytes_sent": sent_bytes,
        "failures": failures,
    }
