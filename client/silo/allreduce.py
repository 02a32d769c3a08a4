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

Steps 1-3 do not depend on the update, nor do the stochastic-rounding randomness of the
quantiser (drawn from a fresh OS-random key per attempt) and the wire buffer: `prepare`
does all of them and may run while the silo trains. `reduce` is the span from update ready
to sum available: one fused sweep (quantise, add the masks, reduce mod 2^b, into the signed
wire buffer), the collective, commit, and the reduction of the sum mod 2^b in place.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedveil.privacy.secagg import Quantizer

from .adverts import Attempt, exchange_mask_keys
from .attempt_membership import SiloExcluded, commit, join
from .collectives import Received, ring_all_reduce
from .masks import mask_total
from .signed_wire import from_wire, mask_into, wire_buffer

BACKENDS = ("gloo", "nccl")
COLLECTIVES = ("all_reduce", "ring")


MIN_PIECE = 1 << 16  # coordinates: smaller pieces pay gloo's per-call latency

# (lo, hi, rounding offsets [lo, hi) or None, masks [lo, hi), signed wire slice [lo, hi))
EncodeMasked = Callable[[int, int, "np.ndarray | None", np.ndarray, np.ndarray], None]


@dataclass(frozen=True)
class Encoder:
    """A vector of `dimension` coordinates in Z_(2^b), encoded and masked piece by piece:
    `encode_masked(lo, hi, offsets, masks, out)` writes (coordinates [lo, hi) + masks) mod
    2^b into `out`, the signed wire slice; called once per piece, in order. `rounding`: the
    quantiser whose stochastic-rounding randomness `prepare` draws ahead (`offsets`, from
    `Quantizer.draw_rounding`), or None for a vector encoded already (`offsets` None)."""

    dimension: int
    encode_masked: EncodeMasked
    rounding: Quantizer | None = None

    @classmethod
    def of(cls, vector: np.ndarray, bits: int) -> Encoder:
        """An encoded vector (unsigned, < 2^bits): only the masks are added."""

        def encode_masked(
            lo: int, hi: int, offsets: np.ndarray | None, masks: np.ndarray, out: np.ndarray
        ) -> None:
            del offsets
            mask_into(vector[lo:hi], masks, bits, out)

        return cls(int(vector.shape[0]), encode_masked)


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
    pipeline_pieces: int = 1

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
        if not 1 <= self.pipeline_pieces <= 1024:
            raise ValueError(f"pipeline_pieces = {self.pipeline_pieces}: must be in [1, 1024]")
        if not 1 <= self.max_attempts <= 100:
            raise ValueError(f"max_attempts = {self.max_attempts}: must be in [1, 100]")


@dataclass
class Prepared:
    """An attempt ready for the update: its group, this silo's mask total, the rounding
    randomness (None: the vector comes encoded) and the wire buffer (touched, so that no
    page fault falls in the span)."""

    attempt: Attempt
    group: dist.ProcessGroup
    masks: np.ndarray
    bits: int
    seconds: dict[str, float]
    offsets: np.ndarray | None
    wire: torch.Tensor
    spent: bool = False  # masks and rounding offsets mask and round one vector only


@dataclass
class SecureSum:
    total: np.ndarray  # the sum modulo 2^b of the members' vectors
    members: tuple[int, ...]
    attempt: int
    aborted: list[str]  # why each earlier attempt of the round aborted
    seconds: dict[str, float]


def _cpu() -> float:
    return time.thread_time()


class _Steps:
    """Records `<step>_cpu` and `<step>_wall` seconds since the previous lap."""

    def __init__(self, into: dict[str, float]) -> None:
        self.into = into
        self.cpu, self.wall = _cpu(), time.perf_counter()

    def lap(self, step: str) -> None:
        cpu, wall = _cpu(), time.perf_counter()
        self.into[f"{step}_cpu"], self.into[f"{step}_wall"] = cpu - self.cpu, wall - self.wall
        self.cpu, self.wall = cpu, wall


class SecureAllReduce:
    """A silo's side of the secure sum; `store` is the run's rendezvous store."""

    def __init__(self, store: dist.Store, settings: SiloSettings) -> None:
        self.store = store
        self.settings = settings
        self.members: tuple[int, ...] = tuple(range(settings.world))
        self.received: Received | None = None  # set to record what the ring receives
        self._ahead: ThreadPoolExecutor | None = None

    def prepare_ahead(
        self, round_num: int, dimension: int, bits: int, rounding: Quantizer | None = None
    ) -> Future[Prepared]:
        """Attempt 0's `prepare` on this silo's background thread, so that the caller trains
        meanwhile; pass the future to `sum`. Its failure is the attempt's (`sum` reruns)."""
        if self._ahead is None:
            self._ahead = ThreadPoolExecutor(1, thread_name_prefix=f"silo-{self.settings.silo}")
        return self._ahead.submit(self.prepare, round_num, 0, dimension, bits, rounding)

    def prepare(
        self,
        round_num: int,
        attempt_num: int,
        dimension: int,
        bits: int,
        rounding: Quantizer | None = None,
    ) -> Prepared:
        """Join, group, keys, masks, the rounding randomness of `rounding` (a fresh key per
        attempt) and the wire buffer of an attempt: nothing that depends on the update
        (`seconds`: `<step>_cpu`/`_wall` s of join, keys, masks, rounding, buffers)."""
        s = self.settings
        times: dict[str, float] = {}
        clock = _Steps(times)
        prefix = Attempt(s.run_id, round_num, attempt_num, ()).prefix
        window = s.join_window_s if attempt_num == 0 else s.timeout_s
        members = join(self.store, prefix, s.silo, len(self.members), window, s.timeout_s)
        if len(members) < s.min_silos:
            raise SiloRoundFailed(
                f"round {round_num}: {len(members)} silos joined attempt {attempt_num}, "
                f"fewer than min_silos = {s.min_silos}"
            )
        self.members = members  # the next attempt, if any, expects these
        attempt = Attempt(s.run_id, round_num, attempt_num, members)
        group = self._group(attempt)
        clock.lap("join")
        keys = exchange_mask_keys(self.store, attempt, s.silo, s.identity, s.roster, s.timeout_s)
        clock.lap("keys")
        dtype = np.uint32 if bits <= 32 else np.uint64
        masks = mask_total(s.silo, keys, dimension, dtype, bits)
        clock.lap("masks")
        offsets = None if rounding is None else rounding.draw_rounding(dimension)
        clock.lap("rounding")
        wire = torch.zeros(dimension, dtype=wire_buffer(0, bits, len(members)).dtype)
        clock.lap("buffers")
        return Prepared(attempt, group, masks, bits, times, offsets, wire)

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

    def reduce(
        self, prepared: Prepared, source: np.ndarray | Encoder
    ) -> tuple[np.ndarray, dict[str, float]]:
        """The span: encode and mask (one fused sweep per piece), all-reduce, commit, reduce
        the sum mod 2^b. Raises RuntimeError when the attempt fails. `source`: the encoded
        vector, or an `Encoder` producing it piece by piece: then with `all_reduce` and
        `pipeline_pieces` > 1 the pieces are pipelined (piece i+1 is encoded and masked
        while the collective of piece i runs). Returns the sum (a view of the attempt's wire
        buffer) and the seconds of each step: `<step>_cpu` (this thread's CPU; gloo's own
        threads are not in it) and `<step>_wall`."""
        s, attempt, bits = self.settings, prepared.attempt, prepared.bits
        encoder = source if isinstance(source, Encoder) else Encoder.of(source, bits)
        if encoder.dimension != prepared.masks.size:
            raise ValueError(
                f"encoded dimension {encoder.dimension} != the attempt's {prepared.masks.size}"
            )
        if (encoder.rounding is None) != (prepared.offsets is None):
            raise ValueError("the encoder's rounding and the attempt's prepared one differ")
        if prepared.spent:
            # two vectors under the same masks would reveal their difference
            raise ValueError(f"attempt {attempt.attempt}: its masks are used once, already were")
        prepared.spent = True
        times: dict[str, float] = {}
        if self.received is not None:
            self.received.attempt = attempt.attempt
        # One wire buffer; each piece is masked straight into its slice and summed there.
        wire = prepared.wire
        host = wire.numpy()
        device = torch.empty_like(wire, device="cuda") if s.backend == "nccl" else wire
        works: list[dist.Work] = []
        clock = _Steps(times)
        offsets = prepared.offsets
        for lo, hi in self._pieces(encoder.dimension):
            rounding = None if offsets is None else offsets[lo:hi]
            encoder.encode_masked(lo, hi, rounding, prepared.masks[lo:hi], host[lo:hi])
            target = device[lo:hi]
            if device is not wire:
                target.copy_(wire[lo:hi])
            if s.collective == "all_reduce":  # asynchronous: the next piece overlaps it
                works.append(prepared.group.allreduce([target]))
            else:
                ring_all_reduce(prepared.group, target, self.received)
        clock.lap("encode_mask_send")
        for work in works:
            work.wait()
        clock.lap("collective_wait")
        commit(self.store, attempt.prefix, s.silo, attempt.members, s.timeout_s)
        clock.lap("commit")
        total = from_wire(device, bits)
        clock.lap("decode")
        return total, times

    def _pieces(self, dimension: int) -> list[tuple[int, int]]:
        """Pipeline pieces: `pipeline_pieces` of at least MIN_PIECE coordinates (one for the
        ring, whose chunks a caller may inspect)."""
        count = 1
        if self.settings.collective == "all_reduce":
            count = max(1, min(self.settings.pipeline_pieces, dimension // MIN_PIECE))
        bounds = np.linspace(0, dimension, count + 1).astype(int)
        return [(int(a), int(b)) for a, b in itertools.pairwise(bounds)]

    def sum(
        self,
        round_num: int,
        source: np.ndarray | Encoder,
        bits: int,
        ahead: Future[Prepared] | None = None,
    ) -> SecureSum:
        """The round's secure sum, rerun among survivors after an aborted attempt (the
        encoder runs again: fresh rounding, fresh masks). `ahead`: attempt 0 prepared
        while the silo trained (`prepare_ahead` of this round, dimension, bits, rounding)."""
        s = self.settings
        encoder = source if isinstance(source, Encoder) else Encoder.of(source, bits)
        aborted: list[str] = []
        for attempt_num in range(s.max_attempts):
            try:
                if attempt_num == 0 and ahead is not None:
                    prepared = ahead.result()
                    _check_ahead(prepared, round_num, encoder, bits)
                else:
                    prepared = self.prepare(
                        round_num, attempt_num, encoder.dimension, bits, encoder.rounding
                    )
                total, times = self.reduce(prepared, encoder)
            except (SiloExcluded, SiloRoundFailed):
                raise
            except RuntimeError as exc:  # DistBackendError, DistStoreError, timeouts
                # A silo died or stalled after joining: the group (if made) is unusable and
                # its masked values stay with it; the survivors rerun with new keys.
                aborted.append(f"attempt {attempt_num}: {type(exc).__name__}: {exc}"[:500])
                continue
            return SecureSum(
                total, prepared.attempt.members, attempt_num, aborted, {**prepared.seconds, **times}
            )
        raise SiloRoundFailed(
            f"round {round_num}: no sum after {s.max_attempts} attempts: " + "; ".join(aborted)
        )


def _check_ahead(prepared: Prepared, round_num: int, encoder: Encoder, bits: int) -> None:
    """An attempt prepared ahead must be this round's, for this encoder (else ValueError)."""
    if prepared.attempt.round != round_num or prepared.attempt.attempt != 0:
        raise ValueError(
            f"prepared ahead for round {prepared.attempt.round} attempt "
            f"{prepared.attempt.attempt}, used in round {round_num} attempt 0"
        )
    if prepared.masks.size != encoder.dimension or prepared.bits != bits:
        raise ValueError(
            f"prepared ahead for {prepared.masks.size} coordinates of {prepared.bits} bits, "
            f"the update has {encoder.dimension} of {bits}"
        )
    if (encoder.rounding is None) != (prepared.offsets is None):
        raise ValueError("prepared ahead with a different rounding than the encoder's")
