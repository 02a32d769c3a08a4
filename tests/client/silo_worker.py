"""One silo process for tests/client/test_silo_processes.py: a secure sum of a known update.

argv: rank world port secret_hex out_dir collective [die]. The update of rank r is
`silo_update(r)`; the silo records its encoded vector, the sum, the members and every
chunk the ring delivered, in out_dir/silo-<rank>.npz. With `die`, the silo stops for good
right after the ring delivered its first chunk (mid-collective), for the test to kill it.
"""

from __future__ import annotations

import sys
import time
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from fedveil.client.silo import SecureAllReduce, SiloSettings
from fedveil.client.silo.collectives import Received
from fedveil.privacy.secagg import Quantizer
from fedveil.privacy.secagg.identity_keys import DerivedIdentities

DIM = 4096
TIMEOUT_S = 8.0


def silo_update(rank: int) -> np.ndarray:
    """Inside the quantiser's clip range [-1, 1], so quantisation is the only error."""
    update = np.random.default_rng(1000 + rank).normal(0, 0.3, DIM)
    return np.clip(update, -0.99, 0.99).astype(np.float32)


def quantizer(world: int) -> Quantizer:
    return Quantizer(clip_range=1.0, levels=2**16, max_clients=world, max_weight=1)


class _StopAfterFirst(list):
    """The ring's received-chunk list of a silo that hangs once its first chunk arrived."""

    def __init__(self, flag: Path) -> None:
        super().__init__()
        self.flag = flag

    def append(self, item: object) -> None:
        super().append(item)
        self.flag.write_text("in collective")
        time.sleep(3600)


def main() -> None:
    rank, world, port = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    secret, out, collective = bytes.fromhex(sys.argv[4]), Path(sys.argv[5]), sys.argv[6]
    die = len(sys.argv) > 7 and sys.argv[7] == "die"
    ids = DerivedIdentities(secret)
    store = dist.TCPStore(
        "127.0.0.1",
        port,
        world,
        rank == 0,
        timeout=timedelta(seconds=60),
        wait_for_workers=False,
    )
    settings = SiloSettings(
        run_id="test-run",
        silo=rank,
        world=world,
        identity=ids.private_key(rank),
        roster=ids.roster,
        timeout_s=TIMEOUT_S,
        join_window_s=60.0,
        collective=collective,
        min_silos=world - 1,
    )
    silo = SecureAllReduce(store, settings)
    received = Received()
    if die:
        received.chunks = _StopAfterFirst(out / f"silo-{rank}.dying")
    silo.received = received
    q = quantizer(world)
    encoded = q.encode_weighted(silo_update(rank), 1)
    result = silo.sum(1, encoded, q.bits)
    plain = np.zeros(0, np.float32)
    if not result.aborted:  # the plain all-reduce of the float updates, same group shape
        group = dist.ProcessGroupGloo(
            dist.PrefixStore("plain/", store), rank, world, timedelta(seconds=TIMEOUT_S)
        )
        tensor = torch.from_numpy(silo_update(rank).copy())
        group.allreduce([tensor]).wait()
        plain = tensor.numpy()
    chunks = received.chunks
    np.savez(
        out / f"silo-{rank}.npz",
        encoded=encoded,
        total=result.total,
        plain=plain,
        members=np.array(result.members),
        attempt=np.array(result.attempt),
        aborted=np.array(len(result.aborted)),
        attempts=np.array([c[0] for c in chunks]),
        phases=np.array([c[1] for c in chunks]),
        indices=np.array([c[3] for c in chunks]),
        **{f"chunk{i}": c[4].numpy() for i, c in enumerate(chunks)},
    )
    store.set(f"exit/{rank}", b"1")
    if rank == 0:  # the store lives in this process: leave once every member is done
        store.wait([f"exit/{m}" for m in result.members], timedelta(seconds=60))


if __name__ == "__main__":
    main()
