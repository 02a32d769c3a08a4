"""Who takes part in an attempt: survivors agree on the members through the store.

Attempt 0 waits for all `world` silos. After an abort (a dead silo hangs the collective
until the group's timeout; the group is then unusable), every survivor joins the next
attempt: it takes a ticket from a counter in the store, and the silo holding ticket 1
closes the list once all expected silos joined or `window_s` passed. A silo that arrives
after the close is left out of that attempt (it learns so, and does not apply its round).
Ranks in the new group follow silo ids, so they are the same at every member.

The store belongs to rank 0's process (or torchrun's): if it dies, no rerun is possible
and survivors fail the round when their store calls time out.
"""

from __future__ import annotations

import time
from datetime import timedelta

from torch.distributed import Store

CLOSED = "closed"


class SiloExcluded(RuntimeError):
    """This silo joined an attempt after its member list was closed."""


def join(
    store: Store, prefix: str, silo: int, expected: int, window_s: float, timeout_s: float
) -> tuple[int, ...]:
    """The sorted silo ids of the attempt under `prefix`; SiloExcluded if too late."""
    ticket = store.add(prefix + "tickets", 1)
    store.set(prefix + f"member/{ticket}", str(silo))
    if ticket == 1:
        deadline = time.monotonic() + window_s
        while store.add(prefix + "tickets", 0) < expected and time.monotonic() < deadline:
            time.sleep(0.01)
        store.set(prefix + CLOSED, str(store.add(prefix + "tickets", 0)))
    store.wait([prefix + CLOSED], timedelta(seconds=window_s + timeout_s))
    count = int(store.get(prefix + CLOSED))
    if ticket > count:
        raise SiloExcluded(f"silo {silo} joined after the member list closed ({count} silos)")
    names = [prefix + f"member/{i}" for i in range(1, count + 1)]
    store.wait(names, timedelta(seconds=timeout_s))
    return tuple(sorted(int(store.get(name)) for name in names))


def commit(
    store: Store, prefix: str, silo: int, members: tuple[int, ...], timeout_s: float
) -> None:
    """Mark this silo's collective done and wait until every member's is: a silo applies
    a sum only if all members received it (else the attempt aborts everywhere and reruns).
    Raises RuntimeError (the store's timeout) when a member never commits."""
    store.set(prefix + f"done/{silo}", b"1")
    store.wait([prefix + f"done/{m}" for m in members], timedelta(seconds=timeout_s))
