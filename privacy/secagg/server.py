"""SecAggServer: the aggregator's side of a round, one method per stage.

Driving a round (the transport sends each request and feeds every reply to `receive`):

    server = SecAggServer(session, identity_public_keys=...)   # keys: malicious mode only
    requests = server.advertise_requests()      # {client_id: AdvertiseRequest}
    ... server.receive(cid, AdvertiseKeys) ...
    requests = server.share_keys_requests()     # closes "advertise": U1
    ... server.receive(cid, ShareKeys) ...
    requests = server.masked_input_requests()   # closes "share_keys": U2
    ... server.receive(cid, MaskedInput) ...
    requests = server.consistency_requests()    # malicious only; closes "masked_input": U3
    ... server.receive(cid, ConsistencySignature) ...
    requests = server.unmask_requests()         # closes the previous stage
    ... server.receive(cid, UnmaskShares) ...
    result = server.finalize()                  # sum mod 2^b over U3, and U3

(`next_requests()` picks the right method.) A client that sends nothing valid in a stage is
dropped from then on. `receive` raises `SecAggProtocolError` naming the client and the
failed check for every rejected message (wrong session or stage, duplicate, bad signature,
wrong vector, shares for the wrong peers, ...); the server state stays consistent. Whenever
the round cannot finish safely (fewer than t shares, too few survivors, unrecoverable
secret) a stage method raises `SecAggAborted` and the masked sum is discarded.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from . import crypto, shamir
from .errors import SecAggAborted, SecAggProtocolError, SecAggStateError
from .masking import MaskApplier
from .messages import (
    CLIENT_MESSAGES,
    AdvertiseKeys,
    AdvertiseRequest,
    ConsistencyRequest,
    ConsistencySignature,
    MaskedInput,
    MaskedInputRequest,
    Message,
    ShareKeys,
    ShareKeysRequest,
    Stage,
    UnmaskRequest,
    UnmaskShares,
)
from .session import SessionConfig
from .view import SessionView
from .wire import encode_members

Observer = Callable[[str, int | None, np.ndarray], None]


class ServerPhase(str, Enum):
    READY = "ready"
    ADVERTISE = "advertise"
    SHARE_KEYS = "share_keys"
    MASKED_INPUT = "masked_input"
    CONSISTENCY = "consistency"
    UNMASK = "unmask"
    FINISHED = "finished"
    ABORTED = "aborted"


@dataclass(frozen=True)
class Rejection:
    client_id: int
    stage: str
    reason: str


@dataclass(frozen=True)
class AggregateResult:
    """The unmasked sum mod 2^b over `survivors` (U3), and what happened on the way."""

    total: np.ndarray
    survivors: frozenset[int]
    dropped: frozenset[int]
    rejections: tuple[Rejection, ...]
    # Holders whose revealed shares were wrong (found by error-correcting reconstruction).
    bad_share_holders: frozenset[int]


@dataclass
class _Advert:
    mask_public_key: bytes
    encryption_public_key: bytes
    seed_commitment: bytes
    signature: bytes


@dataclass
class _Round:
    """Per-round bookkeeping; sets are named after the paper: U1 ⊇ U2 ⊇ U3 ⊇ U4 ⊇ U5."""

    adverts: dict[int, _Advert] = field(default_factory=dict)
    used_keys: set[bytes] = field(default_factory=set)
    u1: frozenset[int] = frozenset()
    inbox: dict[int, list[tuple[int, bytes]]] = field(default_factory=dict)
    u2: frozenset[int] = frozenset()
    forwarded: dict[int, tuple[int, ...]] = field(default_factory=dict)  # F_i
    accepted_shares: dict[int, frozenset[int]] = field(default_factory=dict)  # P_i
    total: np.ndarray | None = None
    u3: frozenset[int] = frozenset()
    survivors_bitmap: bytes = b""
    signatures: dict[int, bytes] = field(default_factory=dict)
    responders: frozenset[int] = frozenset()  # who is asked to unmask: U3 or U4
    seed_points: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    key_points: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    x_to_client: dict[int, int] = field(default_factory=dict)
    # Dropped clients whose pairwise masks are in the sum (fixed once unmasking opens).
    mask_dropped: frozenset[int] = frozenset()
    # ("seed" | "key", owner) whose masks are already off `total` (see _unmask_early).
    unmasked: set[tuple[str, int]] = field(default_factory=set)
    applier: MaskApplier | None = None


class SecAggServer:
    """Server protocol state for one session."""

    def __init__(
        self,
        session: SessionConfig,
        *,
        identity_public_keys: Mapping[int, Ed25519PublicKey | bytes] | None = None,
        observer: Observer | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if session.malicious:
            missing = [c for c in session.client_ids if c not in (identity_public_keys or {})]
            if missing:
                raise ValueError(f"malicious mode: no identity key for clients {missing[:5]}")
        self.session = session
        self._identity = {
            cid: crypto.load_identity_public(key)
            for cid, key in (identity_public_keys or {}).items()
        }
        self._observer = observer
        self.phase = ServerPhase.READY
        self._asked: frozenset[int] = frozenset()
        self._replied: set[int] = set()
        self._failed: set[int] = set()
        self._rejections: list[Rejection] = []
        self._neighbours: dict[int, frozenset[int]] = {}
        self._round = _Round()
        # Seconds spent in each stage's methods (`clock`: wall by default, CPU for benchmarks).
        self._clock = clock
        self.stage_seconds: dict[str, float] = {}

    # --- helpers shared by the stages -------------------------------------------------------

    @property
    def rejections(self) -> tuple[Rejection, ...]:
        return tuple(self._rejections)

    @property
    def survivors(self) -> frozenset[int]:
        """U3, the clients whose masked input was accepted: known once the consistency or
        unmask requests are built, before any of them is sent (so a caller can check and
        charge the release before the first unmasking request goes out)."""
        if self.phase not in (ServerPhase.CONSISTENCY, ServerPhase.UNMASK):
            raise SecAggStateError(
                f"server: survivors are known from the consistency or unmask stage on; "
                f"current phase is {self.phase.value}"
            )
        return self._round.u3

    def neighbours(self, client_id: int) -> frozenset[int]:
        if client_id not in self._neighbours:
            self._neighbours[client_id] = self.session.graph.neighbours(client_id)
        return self._neighbours[client_id]

    def _open(self, phase: ServerPhase, asked: frozenset[int]) -> None:
        self.phase = phase
        self._asked = asked
        self._replied = set()
        self._failed = set()

    def _close(self, expected: ServerPhase) -> frozenset[int]:
        """End the reply window of `expected`; returns the clients that replied validly."""
        if self.phase is not expected:
            raise SecAggStateError(
                f"server: cannot close stage {expected.value}, current phase is {self.phase.value}"
            )
        return frozenset(self._replied)

    def _abort(self, reason: str) -> SecAggAborted:
        self.phase = ServerPhase.ABORTED
        self._round = _Round()  # drop the masked sum and every share
        return SecAggAborted(reason)

    def _prune(self, alive: frozenset[int], stage: str) -> frozenset[int]:
        """Drop clients with fewer than t live share holders, until stable; abort below t."""
        t = self.session.threshold
        current = set(alive)
        changed = True
        while changed:
            changed = False
            for cid in sorted(current):
                if len(self.neighbours(cid) & current) + 1 < t:
                    current.discard(cid)
                    changed = True
        if len(current) < t:
            raise self._abort(
                f"{stage}: only {len(current)} usable clients remain, threshold is {t}"
            )
        return frozenset(current)

    def _timed(self, stage: str, started: float) -> None:
        self.stage_seconds[stage] = self.stage_seconds.get(stage, 0.0) + (self._clock() - started)

    # --- stage requests -------------------------------------------------------------------

    def next_requests(self) -> dict[int, Message] | None:
        """Requests of the next stage, or None when the next step is `finalize()`."""
        step: dict[ServerPhase, Callable[[], dict[int, Message]] | None] = {
            ServerPhase.READY: self.advertise_requests,
            ServerPhase.ADVERTISE: self.share_keys_requests,
            ServerPhase.SHARE_KEYS: self.masked_input_requests,
            ServerPhase.MASKED_INPUT: (
                self.consistency_requests if self.session.malicious else self.unmask_requests
            ),
            ServerPhase.CONSISTENCY: self.unmask_requests,
            ServerPhase.UNMASK: None,
        }
        if self.phase not in step:
            raise SecAggStateError(f"server: round is {self.phase.value}")
        method = step[self.phase]
        return None if method is None else dict(method())

    def advertise_requests(self) -> dict[int, AdvertiseRequest]:
        if self.phase is not ServerPhase.READY:
            raise SecAggStateError("server: advertise_requests() starts a round only once")
        started = self._clock()
        self._open(ServerPhase.ADVERTISE, frozenset(self.session.client_ids))
        session, sid = self.session, self.session.session_id
        # Semi-honest clients get only their own neighbourhood, never the cohort list.
        requests = {
            cid: AdvertiseRequest(
                session_id=sid,
                client_id=cid,
                session=(
                    session
                    if session.malicious
                    else SessionView.of(session, cid, self.neighbours(cid))
                ),
            )
            for cid in session.client_ids
        }
        self._timed("advertise", started)
        return requests

    def share_keys_requests(self) -> dict[int, ShareKeysRequest]:
        round_ = self._round
        started = self._clock()
        replied = self._close(ServerPhase.ADVERTISE)
        round_.u1 = self._prune(replied, "advertise")
        requests = {}
        for cid in sorted(round_.u1):
            peers = sorted(self.neighbours(cid) & round_.u1)
            adverts = [round_.adverts[p] for p in peers]
            requests[cid] = ShareKeysRequest(
                session_id=self.session.session_id,
                client_id=cid,
                peer_ids=tuple(peers),
                mask_public_keys=tuple(a.mask_public_key for a in adverts),
                encryption_public_keys=tuple(a.encryption_public_key for a in adverts),
                seed_commitments=tuple(a.seed_commitment for a in adverts),
                signatures=tuple(a.signature for a in adverts),
            )
        round_.inbox = {cid: [] for cid in round_.u1}
        self._open(ServerPhase.SHARE_KEYS, round_.u1)
        self._timed("share_keys", started)
        return requests

    def masked_input_requests(self) -> dict[int, MaskedInputRequest]:
        round_ = self._round
        started = self._clock()
        replied = self._close(ServerPhase.SHARE_KEYS)
        round_.u2 = self._prune(replied, "share_keys")
        requests = {}
        for cid in sorted(round_.u2):
            mail = [(src, ct) for src, ct in round_.inbox[cid] if src in round_.u2]
            round_.forwarded[cid] = tuple(src for src, _ in mail)
            requests[cid] = MaskedInputRequest(
                session_id=self.session.session_id,
                client_id=cid,
                sender_ids=tuple(src for src, _ in mail),
                ciphertexts=tuple(ct for _, ct in mail),
            )
        round_.inbox = {}
        round_.total = np.zeros(self.session.dimension, dtype=self.session.dtype)
        self._open(ServerPhase.MASKED_INPUT, round_.u2)
        self._timed("masked_input", started)
        return requests

    def consistency_requests(self) -> dict[int, ConsistencyRequest]:
        if not self.session.malicious:
            raise SecAggStateError("server: the consistency round is for malicious mode only")
        started = self._clock()
        self._close_masked_input()
        round_ = self._round
        requests = {
            cid: ConsistencyRequest(
                session_id=self.session.session_id,
                client_id=cid,
                survivors=round_.survivors_bitmap,
            )
            for cid in sorted(round_.u3)
        }
        self._open(ServerPhase.CONSISTENCY, round_.u3)
        self._timed("consistency", started)
        return requests

    def unmask_requests(self) -> dict[int, UnmaskRequest]:
        round_ = self._round
        started = self._clock()
        if self.session.malicious:
            signers = self._close(ServerPhase.CONSISTENCY)
            self._check_recoverable(signers, "consistency")
            round_.responders = signers
        else:
            self._close_masked_input()
            round_.responders = round_.u3
        requests = {}
        malicious, count = self.session.malicious, len(round_.u3)
        for cid in sorted(round_.responders):
            cosigners = sorted(self.neighbours(cid) & round_.responders)
            if malicious:
                survivors = round_.survivors_bitmap
            else:  # one bit per member of its neighbourhood: no id outside it
                hood = np.array(sorted(self.neighbours(cid) | {cid}), dtype=np.uint64)
                survivors = encode_members(round_.u3 & frozenset(hood.tolist()), hood)
            requests[cid] = UnmaskRequest(
                session_id=self.session.session_id,
                client_id=cid,
                survivor_count=count,
                survivors=survivors,
                signer_ids=tuple(cosigners) if malicious else (),
                signatures=tuple(round_.signatures[s] for s in cosigners) if malicious else (),
            )
        round_.seed_points = {cid: [] for cid in round_.u3}
        round_.key_points = {cid: [] for cid in round_.u2 - round_.u3}
        round_.mask_dropped = frozenset(self._dropped_with_masks())
        self._open(ServerPhase.UNMASK, round_.responders)
        self._timed("unmask", started)
        return requests

    def _close_masked_input(self) -> None:
        round_ = self._round
        round_.u3 = self._close(ServerPhase.MASKED_INPUT)
        if len(round_.u3) < self.session.threshold:
            raise self._abort(
                f"masked_input: {len(round_.u3)} survivors, threshold {self.session.threshold}"
            )
        self._check_recoverable(round_.u3, "masked_input")
        round_.survivors_bitmap = encode_members(round_.u3, self.session.ids_array)
        if self._observer is not None and round_.total is not None:
            self._observer("masked_sum", None, round_.total & self.session.modulus_mask)

    def _check_recoverable(self, responders: frozenset[int], stage: str) -> None:
        """Abort now if some secret we must reconstruct has fewer than t possible holders."""
        round_, t = self._round, self.session.threshold
        holders: dict[int, int] = {}
        for responder in responders:
            for owner in round_.accepted_shares[responder]:
                holders[owner] = holders.get(owner, 0) + 1
        for owner in round_.u3:
            count = holders.get(owner, 0) + (owner in responders)  # its own share
            if count < t:
                raise self._abort(
                    f"{stage}: seed of survivor {owner} has {count} reachable shares, need {t}"
                )
        for owner in self._dropped_with_masks():
            count = holders.get(owner, 0)
            if count < t:
                raise self._abort(
                    f"{stage}: mask key of dropped client {owner} has {count} reachable "
                    f"shares, need {t}"
                )

    def _dropped_with_masks(self) -> set[int]:
        round_ = self._round
        return {src for cid in round_.u3 for src in round_.forwarded[cid]} - round_.u3

    # --- replies --------------------------------------------------------------------------

    def receive(self, client_id: int, message: Message) -> None:
        """Accept one client reply for the open stage, or raise SecAggProtocolError."""
        started = self._clock()
        stage = self.phase.value
        try:
            self._receive(client_id, message)
        except _Reject as rejected:
            self._rejections.append(Rejection(client_id, stage, rejected.reason))
            raise SecAggProtocolError(
                f"client {client_id} rejected at {stage}: {rejected.reason}"
            ) from None
        finally:
            self._timed(stage, started)

    def _receive(self, client_id: int, message: Message) -> None:
        try:
            stage = Stage(self.phase.value)
        except ValueError:
            raise _Reject(f"no stage is open (round is {self.phase.value})") from None
        if client_id not in self._asked:
            raise _Reject("not a participant of this stage")
        if client_id in self._replied:
            raise _Reject("duplicate message for this stage (first one kept)")
        if client_id in self._failed:
            raise _Reject("already rejected in this stage")
        try:
            self._check_and_apply(client_id, message, stage)
        except _Reject:
            self._failed.add(client_id)
            raise
        self._replied.add(client_id)

    def _check_and_apply(self, client_id: int, message: Message, stage: Stage) -> None:
        expected = CLIENT_MESSAGES[stage]
        if type(message) is not expected:
            raise _Reject(f"expected {expected.KIND}, got {type(message).__name__}")
        try:
            message = message.validated()
        except SecAggProtocolError as exc:
            raise _Reject(str(exc)) from None
        if message.session_id != self.session.session_id:
            raise _Reject("session_id is not this session's (replayed or misrouted)")
        if message.client_id != client_id:
            raise _Reject(f"message claims sender {message.client_id}")
        handler = {
            Stage.ADVERTISE: self._on_advertise,
            Stage.SHARE_KEYS: self._on_share_keys,
            Stage.MASKED_INPUT: self._on_masked_input,
            Stage.CONSISTENCY: self._on_consistency,
            Stage.UNMASK: self._on_unmask,
        }[stage]
        handler(client_id, message)

    def _on_advertise(self, cid: int, msg: AdvertiseKeys) -> None:
        if self.session.malicious:
            transcript = crypto.advert_transcript(
                self.session.digest,
                cid,
                msg.mask_public_key,
                msg.encryption_public_key,
                msg.seed_commitment,
            )
            if not crypto.verify(self._identity[cid], msg.signature, transcript):
                raise _Reject("advertise_keys.signature: invalid for the client's identity key")
        keys = {msg.mask_public_key, msg.encryption_public_key}
        if keys & self._round.used_keys:
            raise _Reject("advertise_keys: public key already used by another client")
        # Low-order points would make every neighbour abort later; refuse them here.
        if any(crypto.x25519_unusable(key) for key in keys):
            raise _Reject("advertise_keys: public key is not a usable X25519 point")
        self._round.used_keys |= keys
        self._round.adverts[cid] = _Advert(
            msg.mask_public_key, msg.encryption_public_key, msg.seed_commitment, msg.signature
        )

    def _on_share_keys(self, cid: int, msg: ShareKeys) -> None:
        expected = self.neighbours(cid) & self._round.u1
        if set(msg.recipient_ids) != expected:
            raise _Reject("share_keys.recipient_ids: must be exactly the advertised neighbours")
        for dst, ciphertext in zip(msg.recipient_ids, msg.ciphertexts, strict=True):
            self._round.inbox[dst].append((cid, ciphertext))

    def _on_masked_input(self, cid: int, msg: MaskedInput) -> None:
        session, round_ = self.session, self._round
        vector = msg.masked_vector
        if vector.dtype != np.dtype(session.dtype) or vector.shape != (session.dimension,):
            raise _Reject(
                f"masked_input.masked_vector: expected {np.dtype(session.dtype).name}"
                f"[{session.dimension}], got {vector.dtype.name}{list(vector.shape)}"
            )
        if session.modulus_bits < vector.dtype.itemsize * 8 and int(vector.max()) > (
            session.modulus_mask
        ):
            raise _Reject(f"masked_input.masked_vector: values >= 2^{session.modulus_bits}")
        forwarded = set(round_.forwarded[cid])
        if not set(msg.invalid_share_senders) <= forwarded:
            raise _Reject("masked_input.invalid_share_senders: not senders forwarded to it")
        round_.accepted_shares[cid] = frozenset(forwarded - set(msg.invalid_share_senders))
        if self._observer is not None:
            self._observer("masked_input", cid, vector)
        assert round_.total is not None
        np.add(round_.total, vector, out=round_.total)

    def _on_consistency(self, cid: int, msg: ConsistencySignature) -> None:
        transcript = crypto.survivors_transcript(
            self.session.digest, cid, self._round.survivors_bitmap
        )
        if not crypto.verify(self._identity[cid], msg.signature, transcript):
            raise _Reject("consistency_signature.signature: not a signature on this survivor set")
        self._round.signatures[cid] = msg.signature

    def _on_unmask(self, cid: int, msg: UnmaskShares) -> None:
        round_ = self._round
        held = round_.accepted_shares[cid] | {cid}
        want_seed = {o for o in held if o in round_.u3}
        want_key = held - want_seed
        if set(msg.seed_owner_ids) != want_seed:
            raise _Reject("unmask_shares.seed_owner_ids: not exactly the surviving peers it holds")
        if set(msg.key_owner_ids) != want_key:
            raise _Reject("unmask_shares.key_owner_ids: not exactly the dropped peers it holds")
        x = self.session.share_x(cid)
        decoded = []
        for kind, owners, shares in (
            ("seed", msg.seed_owner_ids, msg.seed_shares),
            ("key", msg.key_owner_ids, msg.key_shares),
        ):
            for i, (owner, raw) in enumerate(zip(owners, shares, strict=True)):
                value = shamir.decode_share(raw)
                if value is None:
                    raise _Reject(f"unmask_shares.{kind}_shares[{i}]: not a field element")
                decoded.append((kind, owner, value))
        for kind, owner, value in decoded:
            points = round_.seed_points if kind == "seed" else round_.key_points
            if owner in points:  # key shares of dropped clients nobody masked with are moot
                points[owner].append((x, value))
        round_.x_to_client[x] = cid
        for kind, owner, _value in decoded:
            self._unmask_early(kind, owner)

    # --- unmasking --------------------------------------------------------------------------

    def finalize(self) -> AggregateResult:
        """Reconstruct seeds and dropped keys, strip the masks, return the sum over U3."""
        started = self._clock()
        self._close(ServerPhase.UNMASK)
        session, round_ = self.session, self._round
        total = round_.total
        assert total is not None
        applier = self._applier()
        bad_holders: set[int] = set()
        for owner in sorted(round_.u3):
            if ("seed", owner) not in round_.unmasked:
                self._strip_self_mask(owner, round_.seed_points[owner], bad_holders, final=True)
        for owner in sorted(round_.mask_dropped):
            if ("key", owner) not in round_.unmasked:
                self._strip_dropped_masks(owner, round_.key_points[owner], bad_holders, final=True)
        applier.reduce(total)
        result = AggregateResult(
            total=total,
            survivors=round_.u3,
            dropped=frozenset(session.client_ids) - round_.u3,
            rejections=self.rejections,
            bad_share_holders=frozenset(bad_holders),
        )
        self.phase = ServerPhase.FINISHED
        self._round = _Round()
        self._timed("finalize", started)
        return result

    def _applier(self) -> MaskApplier:
        round_, session = self._round, self.session
        if round_.applier is None:
            round_.applier = MaskApplier(session.dimension, session.dtype, session.modulus_bits)
        return round_.applier

    def _unmask_early(self, kind: str, owner: int) -> None:
        """Strip `owner`'s mask(s) off the sum as soon as it has t shares, while the other
        replies are still arriving, when those t shares reconstruct its secret.

        It is the work finalize would do, with the same result: finalize's first try is the
        first t shares in arrival order (shamir.robust_reconstruct's fast path, which
        finds no wrong holder), and those are the t shares used here. A secret whose
        first t shares do not reconstruct is left to finalize, which error-corrects over
        all the shares (or aborts) as before. Masks are added and subtracted mod 2^32,
        so the order of stripping does not change a bit of the sum."""
        round_, t = self._round, self.session.threshold
        if kind == "seed":
            points = round_.seed_points.get(owner)
        else:
            points = round_.key_points.get(owner) if owner in round_.mask_dropped else None
        if points is None or len(points) != t or (kind, owner) in round_.unmasked:
            return
        strip = self._strip_self_mask if kind == "seed" else self._strip_dropped_masks
        if strip(owner, points, set(), final=False):
            round_.unmasked.add((kind, owner))

    def _recover(
        self,
        owner: int,
        points: list[tuple[int, int]],
        kind: str,
        valid: Callable[[bytes], bool],
        bad_holders: set[int],
        *,
        final: bool,
    ) -> bytes | None:
        """`owner`'s secret from its shares, checked by `valid`; holders of wrong shares
        go to `bad_holders`. If too few shares or none reconstructs: abort when `final`,
        else None (an early try, see _unmask_early)."""
        t = self.session.threshold

        def check(value: int) -> bool:
            secret = shamir.int_to_secret(value)
            return secret is not None and valid(secret)

        if len(points) < t:
            if not final:
                return None
            raise self._abort(f"unmask: {len(points)} {kind} shares of client {owner}, need {t}")
        found = shamir.robust_reconstruct(points, t, check)
        if found is None:
            if not final:
                return None
            raise self._abort(f"unmask: the {kind} of client {owner} does not reconstruct")
        value, wrong = found
        bad_holders.update(self._round.x_to_client[x] for x in wrong)
        secret = shamir.int_to_secret(value)
        assert secret is not None
        return secret

    def _strip_self_mask(
        self, owner: int, points: list[tuple[int, int]], bad_holders: set[int], *, final: bool
    ) -> bool:
        """Subtract survivor `owner`'s self mask, from its seed checked against its
        commitment; False if it did not reconstruct (only when not `final`)."""
        round_, digest = self._round, self.session.digest
        assert round_.total is not None
        commitment = round_.adverts[owner].seed_commitment
        seed = self._recover(
            owner,
            points,
            "self-mask seed",
            lambda s: crypto.seed_commitment(digest, owner, s) == commitment,
            bad_holders,
            final=final,
        )
        if seed is None:
            return False
        self._applier().subtract(round_.total, crypto.self_mask_key(seed, digest, owner))
        return True

    def _strip_dropped_masks(
        self, owner: int, points: list[tuple[int, int]], bad_holders: set[int], *, final: bool
    ) -> bool:
        """Undo the pairwise masks survivors added with `owner`, a client that dropped after
        sharing; False if its mask key did not reconstruct (only when not `final`)."""
        round_, digest = self._round, self.session.digest
        assert round_.total is not None
        total, applier = round_.total, self._applier()
        public = round_.adverts[owner].mask_public_key
        # Checking a candidate computes its key pair: keep it rather than compute it again.
        candidates: dict[bytes, crypto.KeyPair] = {}

        def matches(secret: bytes) -> bool:
            pair = candidates[secret] = crypto.KeyPair(secret)
            return pair.public_bytes == public

        secret = self._recover(owner, points, "mask key", matches, bad_holders, final=final)
        if secret is None:
            return False
        pair = candidates[secret]
        # Forwarding is symmetric: the survivors that masked with `owner` are exactly
        # those whose ciphertexts were forwarded to it.
        for survivor in sorted(set(round_.forwarded[owner]) & round_.u3):
            shared = pair.agree(round_.adverts[survivor].mask_public_key)
            key = crypto.pairwise_mask_key(shared, digest, owner, survivor)
            # The survivor added the mask if its id is the smaller one: undo that.
            if survivor < owner:
                applier.subtract(total, key)
            else:
                applier.add(total, key)
        return True


class _Reject(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
