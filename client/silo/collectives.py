"""The two collectives a silo can sum with, both on a torch.distributed process group.

* `all_reduce`: the backend's own (gloo on CPU, NCCL on GPU), a single call.
* `ring_all_reduce`: reduce-scatter then all-gather over point-to-point send/recv: the
  same sum, with every chunk a silo receives visible to the caller (`received`), which is
  what lets a test check that no received partial sum is unmasked. gloo's `all_reduce`
  hides its internal chunks.

Both sum signed integer tensors in place and raise (RuntimeError / DistBackendError)
when a peer dies or the group's timeout passes; the group is then unusable.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.distributed import ProcessGroup

REDUCE_SCATTER = "reduce_scatter"
ALL_GATHER = "all_gather"


@dataclass
class Received:
    """Chunks a silo received, in order: (attempt, phase, step, chunk index, a copy of the
    chunk). `attempt` is set by the caller before each collective."""

    chunks: list[tuple[int, str, int, int, torch.Tensor]] = field(default_factory=list)
    attempt: int = 0


def all_reduce(group: ProcessGroup, tensor: torch.Tensor) -> None:
    group.allreduce([tensor]).wait()


def ring_all_reduce(
    group: ProcessGroup, tensor: torch.Tensor, received: Received | None = None
) -> None:
    """Ring all-reduce of a 1-D contiguous tensor in place (bandwidth-optimal: each silo
    sends 2 (N - 1) / N of the vector). Chunk i ends, after reduce-scatter, complete at rank
    (i - 1) mod N; the all-gather then passes the complete chunks around."""
    rank, size = group.rank(), group.size()
    if size == 1:
        return
    chunks = list(torch.tensor_split(tensor, size))
    right, left = (rank + 1) % size, (rank - 1) % size
    for step in range(size - 1):
        send_index, recv_index = (rank - step) % size, (rank - step - 1) % size
        incoming = torch.empty_like(chunks[recv_index])
        sent = group.send([chunks[send_index]], right, step)
        group.recv([incoming], left, step).wait()
        sent.wait()
        if received is not None:
            received.chunks.append(
                (received.attempt, REDUCE_SCATTER, step, recv_index, incoming.clone())
            )
        chunks[recv_index].add_(incoming)
    for step in range(size - 1):
        send_index, recv_index = (rank + 1 - step) % size, (rank - step) % size
        incoming = torch.empty_like(chunks[recv_index])
        sent = group.send([chunks[send_index]], right, size + step)
        group.recv([incoming], left, size + step).wait()
        sent.wait()
        if received is not None:
            received.chunks.append(
                (received.attempt, ALL_GATHER, step, recv_index, incoming.clone())
            )
        chunks[recv_index].copy_(incoming)


def bytes_sent(kind: str, tensor: torch.Tensor, size: int) -> int:
    """Payload bytes one silo sends in one sum: ring (both collectives, gloo's all_reduce
    included, which runs a ring for large vectors) 2 (N - 1) / N of the vector."""
    del kind  # same for both: gloo's large-message all_reduce is a ring
    if size <= 1:
        return 0
    return int(2 * (size - 1) * tensor.numel() * tensor.element_size() // size)
