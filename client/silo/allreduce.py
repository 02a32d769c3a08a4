"""Secure all-reduce among silos: masked quantised updates summed by torch.distributed.

One round, per silo (no coordinator; every silo runs the same code):

1. join the attempt (membership.join): who takes part, ranks by silo id;
2. a fresh process group on the rendezvous store (gloo on CPU, NCCL on GPU);
3. signed X25519 adverts, pairwise mask keys (adverts.py) and the mask total (masks.py);
4. add the masks to the integer update, send it as a signed tensor (signed_wire.py),
   all-reduce (collectives.py), reduce modulo 2^b: the masks cancel, the sum is exact;
5. commit (membership.commit): the sum counts only if every member received it.

If any step after joining fails (a dead silo, a timeout), the attempt aborts with nothing
returned, and the survivors rerun the round under a new attempt number: new members, new
group, new key pairs, new digest, so new masks. The aborted attempt's masked values are
never added to the rerun's (different groups, different store prefixes); a sum of values
masked under two attempts would not cancel anyway, and nothing of an attempt is reused.

Steps 1-3 do not depend on the update: `prepare` may run while the silo trains and
`reduce` is the span from update ready to sum available.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from .adverts import Attempt, exchange_mask_keys
from .collectives import Received, all_reduce, ring_all_reduce
from .masks import apply_masks, mask_total
from .membership import commit, join
from .signed_wire import from_wire, to_wire

BACKENDS = ("gloo", "nccl")
COLLECTIVES = ("all_reduce", "ring")


class SiloRoundFailed(RuntimeError):
    """No attempt of the round produced a sum: nothing may be applied."""


@dataclass(frozen=True)
class SiloSettings:
    """One silo's part of the run; every silo of the run holds the same values except
    `silo` and `identity`. `min_silos`: the fewest members a sum may have (under
    distributed DP the fewest whose noise shares reach the calibrated noise)."""

    run_id: str
    silo: int
    world: int
    identity: Ed25519PrivateKey = field(repr=False)
    roster: Mapping[int, bytes] = field(repr=False)
    timeout_s: float = 30.0
    join_window_s: float = 300.0
    backend: str = "gloo"
    collective: str = "all_reduce"
    min_silos: int = 2
    max_attempts: int = 3

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"backend = {self.backend!r}: one of {BACKENDS}")
        if self.collective not in COLLECTIVES:
            raise ValueError(f"collective = {self.collective!r}: one of {COLLECTIVES}")
        if not self.world >= 2:
            raise ValueError(f"world = {self.world}: a secure sum needs at least 2 silos")
        if not 0 <= self.silo < self.world:
            raise ValueError(f"silo = {self.silo}: must be in [0, {self.world})")
        if not 2 <= self.min_silos <= self.world:
            raise ValueError(f"min_silos = {self.min_silos}: must be in [2, world={self.world}]")
        for name in ("timeout_s", "join_window_s"):
            value = getattr(self, name)
            if not (value > 0 and value < float("inf")):
                raise ValueError(f"{name} = {value!r}: must be a finite number > 0")
        if not 1 <= self.max_attempts <= 100:
            raise ValueError(f"max_attempts = {self.max_attempts}: must be in [1, 100]")


@dataclass
class Prepared:
    """An attempt ready for the update: its group and this silo's mask total."""

    attempt: Attempt
    group: dist.ProcessGroup
    masks: np.ndarray
    bits: int
    cpu_s: dict[str, float]


@dataclass
class SecureSum:
    total: np.ndarray  # the sum modulo 2^b of the members' vectors
    members: tuple[int, ...]
    attempt: int
    aborted: list[str]  # why each earlier attempt of the round aborted
    cpu_s: dict[str, float]


def _cpu() -> float:
    return time.thread_time()


class SecureAllReduce:
    """A silo's side of the secure sum; `store` is the run's rendezvous store."""

    def __init__(self, store: dist.Store, settings: SiloSettings) -> None:
        self.store = store
        self.settings = settings
        self.members: tuple[int, ...] = tuple(range(settings.world))
        self.received: Received | None = None  # set to record what the ring receives

    def prepare(self, round_num: int, attempt_num: int, dimension: int, bits: int) -> Prepared:
        s = self.settings
        cpu: dict[str, float] = {}
        start = _cpu()
        prefix = Attempt(s.run_id, round_num, attempt_num, ()).prefix
        window = s.join_window_s if attempt_num == 0 else s.timeout_s
        members = join(self.store, prefix, s.silo, len(self.members), window, s.timeout_s)
        if len(members) < s.min_silos:
            raise SiloRoundFailed(
                f"round {round_num}: {len(members)} silos joined attempt {attempt_num}, "
                f"fewer than min_silos = {s.min_silos}"
            )
        attempt = Attempt(s.run_id, round_num, attempt_num, members)
        group = self._group(attempt)
        cpu["join"] = _cpu() - start
        start = _cpu()
        keys = exchange_mask_keys(self.store, attempt, s.silo, s.identity, s.roster, s.timeout_s)
        cpu["keys"] = _cpu() - start
        start = _cpu()
        dtype = np.uint32 if bits <= 32 else np.uint64
        masks = mask_total(s.silo, keys, dimension, dtype, bits)
        cpu["masks"] = _cpu() - start
        return Prepared(attempt, group, masks, bits, cpu)

    def _group(self, attempt: Attempt) -> dist.ProcessGroup:
        s = self.settings
        store = dist.PrefixStore(attempt.prefix + "pg/", self.store)
        rank, size = attempt.members.index(s.silo), len(attempt.members)
        timeout = timedelta(seconds=s.timeout_s)
        if s.backend == "nccl":
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            return dist.ProcessGroupNCCL(store, rank, size, options)
        return dist.ProcessGroupGloo(store, rank, size, timeout)

    def reduce(self, prepared: Prepared, vector: np.ndarray) -> tuple[np.ndarray, dict[str, float]]:
        """The span: mask, all-reduce, commit. Raises RuntimeError when the attempt fails."""
        s, attempt, bits = self.settings, prepared.attempt, prepared.bits
        cpu: dict[str, float] = {}
        start = _cpu()
        wire = to_wire(apply_masks(vector, prepared.masks, bits), bits, len(attempt.members))
        cpu["mask_add"] = _cpu() - start
        start = _cpu()
        if s.backend == "nccl":
            wire = wire.cuda()
        if self.received is not None:
            self.received.attempt = attempt.attempt
        collective: Callable[[dist.ProcessGroup, torch.Tensor], None] = (
            all_reduce
            if s.collective == "all_reduce"
            else lambda group, t: ring_all_reduce(group, t, self.received)
        )
        collective(prepared.group, wire)
        commit(self.store, attempt.prefix, s.silo, attempt.members, s.timeout_s)
        total = from_wire(wire, bits)
        cpu["collective"] = _cpu() - start
        return total, cpu

    def sum(self, round_num: int, vector: np.ndarray, bits: int) -> SecureSum:
        """The round's secure sum, rerun among survivors after an aborted attempt."""
        s = self.settings
        aborted: list[str] = []
        for attempt_num in range(s.max_attempts):
            prepared = self.prepare(round_num, attempt_num, vector.shape[0], bits)
            try:
                total, cpu = self.reduce(prepared, vector)
            except RuntimeError as exc:  # DistBackendError, DistStoreError, timeouts
                # The group is unusable; its masked values stay with it. The next attempt
                # expects the members of this one (the dead silo will not join).
                self.members = prepared.attempt.members
                aborted.append(f"attempt {attempt_num}: {type(exc).__name__}: {exc}"[:500])
                continue
            self.members = prepared.attempt.members
            return SecureSum(
                total, prepared.attempt.members, attempt_num, aborted, {**prepared.cpu_s, **cpu}
            )
        raise SiloRoundFailed(
            f"round {round_num}: no sum after {s.max_attempts} attempts: " + "; ".join(aborted)
        )
