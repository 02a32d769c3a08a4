"""N silos in one process, one thread each, on a loopback TCP store: `fedveil simulate
--aggregation allreduce` and tests. Every silo runs the same code as a silo process
(its own store client, its own gloo process group); only the processes are shared.
The silos' identities are derived from one OS-random secret (DerivedIdentities)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import TypeVar

import torch.distributed as dist

from fedveil.privacy.secagg.identity_keys import DerivedIdentities

from .allreduce import SecureAllReduce, SiloSettings

T = TypeVar("T")


def host_store(world: int, timeout_s: float) -> dist.TCPStore:
    """A loopback store on a free port (the port is `store.port`)."""
    return dist.TCPStore(
        "127.0.0.1",
        0,
        world + 1,
        True,
        timeout=timedelta(seconds=timeout_s),
        wait_for_workers=False,
    )


def run_silos(
    world: int,
    body: Callable[[SecureAllReduce], T],
    *,
    run_id: str,
    timeout_s: float = 30.0,
    identities: DerivedIdentities | None = None,
    **settings: object,
) -> list[T]:
    """body(silo's SecureAllReduce) in `world` threads; the results in silo order.
    The first exception of any silo is raised after all threads end."""
    identities = identities or DerivedIdentities()
    server = host_store(world, timeout_s)
    results: dict[int, T] = {}
    errors: dict[int, BaseException] = {}

    def one(silo: int) -> None:
        try:
            store = dist.TCPStore(
                "127.0.0.1", server.port, world + 1, False, timeout=timedelta(seconds=timeout_s)
            )
            cfg = SiloSettings(
                run_id=run_id,
                silo=silo,
                world=world,
                identity=identities.private_key(silo),
                roster=identities.roster,
                timeout_s=timeout_s,
                **settings,  # type: ignore[arg-type]
            )
            results[silo] = body(SecureAllReduce(store, cfg))
        except BaseException as exc:  # reported to the caller below
            errors[silo] = exc

    threads = [threading.Thread(target=one, args=(s,), name=f"silo-{s}") for s in range(world)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        silo = min(errors)
        raise RuntimeError(f"silo {silo}: {errors[silo]}") from errors[silo]
    return [results[s] for s in range(world)]
