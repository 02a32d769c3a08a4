"""Secure aggregation as an UpdateChannel: the server only ever holds the sum.

The round's exchanges are the protocol's stages (advertise keys, share keys,
masked input, [consistency], unmask), each one `Transport.exchange`. The
training request rides on the masked-input stage, so the plain update never
waits in a client's state between exchanges (Flower moves a node's state
with every message).

Pipelining: the key stages do not depend on the model, so when the engine
knows the next round's cohort, that round's advertise and share-keys stages
ride on this round's exchanges (fedveil.protocol.piggyback; clients in the next
cohort only get them alone). A round whose keys were shared early starts at
masked input: one exchange beyond a plain round instead of three. Every
round still has fresh keys, seeds, session id and neighbour graph; only the
moment they are made moves. A client that fails, times out or
sends a message the protocol rejects is a dropped client; fewer than t
survivors abort the round (nothing is released) and the next round proceeds.

An asynchronous group released at R of G (server.group_release_at) ends its
masked-input stage at the first R replies (a transport's FirstReplies): the
other members are dropped by design, exactly as clients that timed out, so the
unmask stage removes their pairwise masks from Shamir shares of their keys and
their masked input, sent later, is never taken (the stage is closed). With
server.group_unmask = 'threshold' its unmask stage ends at the first t replies the
protocol server accepted, on the simulated clock and on devices alike: each holds a
share of every secret to reconstruct (complete neighbour graph), so t of them give the
same sum, and the later ones are not waited for (nor taken: they are late replies).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Set
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from fedveil.config import SecAggSection
from fedveil.privacy.encodings import Decoded, Encoding, QuantizedEncoding, SkellamEncoding
from fedveil.privacy.secagg import (
    SIMULATION_RUN_ID,
    Message,
    SecAggAborted,
    SecAggError,
    SecAggServer,
    SessionConfig,
    ThreatModel,
    decode_message,
)
from fedveil.privacy.secagg.server import ServerPhase
from fedveil.protocol.envelope import Envelope
from fedveil.protocol.fields import CLIP_NORM
from fedveil.protocol.kinds import TRAINING_STAGE, Kind, Stage
from fedveil.protocol.piggyback import IGNORED, attach, split_reply
from fedveil.protocol.secagg_frame import protocol_part, wrap
from fedveil.server.engine.aggregation import Aggregate
from fedveil.server.engine.requests import encoding_config
from fedveil.server.engine.sum_checks import check_quantized_sum
from fedveil.server.engine.transport import (
    LEFT_OUT,
    ClientFailure,
    FirstReplies,
    ReplySink,
    Transport,
)
from fedveil.server.engine.unmask_gate import Aborted, UnmaskGate

log = logging.getLogger("fedveil.secagg")

# The update encodings live in fedveil.privacy.encodings (one class each, both sides).
__all__ = ["Decoded", "Encoding", "QuantizedEncoding", "SecAggChannel", "SkellamEncoding"]


@dataclass
class _Ahead:
    """A round's session whose key stages (advertise, share keys) run early, as riders
    on the previous round's exchanges; its round then starts at masked input."""

    round: int
    cohort: tuple[int, ...]
    model_size: int
    server: SecAggServer
    dropped: dict[int, str] = field(default_factory=dict)
    dead: bool = False

    def riders(self) -> dict[int, Message]:
        """Requests of its next key stage, or {} once both ran (or the session aborted)."""
        if self.dead or self.server.phase not in (ServerPhase.READY, ServerPhase.ADVERTISE):
            return {}
        try:
            return self.server.next_requests() or {}
        except SecAggAborted as exc:
            log.info("round %d: early key exchange aborted, it starts afresh: %s", self.round, exc)
            self.dead = True
            return {}

    def receive(self, cid: int, reply: Envelope | str) -> None:
        if isinstance(reply, str):
            self.dropped.setdefault(cid, reply)
            return
        try:
            config, arrays = protocol_part(reply)
            self.server.receive(cid, decode_message(config, arrays))
        except (SecAggError, ValueError) as exc:
            self.dropped.setdefault(cid, str(exc))


@dataclass
class _Round:
    """One round's protocol run: its server, the training requests that ride on the
    masked-input stage, and what it found out so far."""

    round: int
    server: SecAggServer
    requests: dict[int, Envelope]
    enc_config: dict[str, Any]
    dropped: dict[int, str]
    unmasked: bool = False  # whether any unmasking request went out

    def envelope(self, cid: int, req: Message) -> Envelope:
        """A stage request as the client gets it; the training request rides on the
        training stage (masked input), so the plain update never waits between stages."""
        env = wrap(Kind.secagg(req.STAGE), self.round, req)
        if req.STAGE is TRAINING_STAGE:
            env.config.update(self.requests[cid].config)
            env.config.update(self.enc_config)
            env.arrays.update(self.requests[cid].arrays)
        return env


class SecAggChannel:
    """`roster` (client id -> Ed25519 identity public key) is needed for the
    malicious-server mode: the server checks signed advertisements with it, and a
    sampled client without an entry cannot take part (it is dropped before the round).
    The clients check each other with their own copy, which is what protects them."""

    def __init__(
        self,
        settings: SecAggSection,
        encoding: Encoding,
        roster: Mapping[int, bytes] | None = None,
        run_id: bytes = SIMULATION_RUN_ID,
        *,
        gate: UnmaskGate | None = None,
        quiet_counts: bool = False,
        graph_seeds: Callable[[int], bytes] | None = None,
        release_at: int = 0,
        unmask_at_threshold: bool = False,
    ) -> None:
        """`run_id`: the run every session names (and clients check against the run they
        serve): Flower's run id in deployment (`flower_run_id`), else the simulation's.
        `release_at` R > 0 (server.group_release_at, asynchronous groups): the masked-input
        stage ends at its first R replies when the transport can end an exchange early
        (FirstReplies); the members left out are dropped and their masks recovered.
        `unmask_at_threshold` (server.group_unmask = 'threshold'): the unmask stage ends at
        its first t replies in the same way; enough when every member holds a share of
        every secret (a complete neighbour graph, which the async scheduler checks), and
        a survivor whose shares were not waited for is not a dropped client."""
        if settings.threat == "malicious" and roster is None:
            raise ValueError(
                "secagg.threat = 'malicious' needs the clients' identity roster "
                "(client id -> Ed25519 public key)"
            )
        self.settings = settings
        self.encoding = encoding
        self.gate = gate
        # Under DP, survivor counts reveal participation: abort reasons (which name them)
        # go to the round's private record, not to the log.
        self.quiet_counts = quiet_counts
        # Under DP the graph seeds follow the committed cohort key (an auditor recomputes
        # them); otherwise each session draws a fresh one.
        self.graph_seeds = graph_seeds
        self.roster = roster if settings.threat == "malicious" else None
        self.last_session: SessionConfig | None = None
        self._last_round = -1
        self._ahead: _Ahead | None = None
        self.pipelining = settings.pipeline
        self.run_id = run_id
        self.release_at = release_at
        self.unmask_at_threshold = unmask_at_threshold

    def session(self, cohort: list[int], model_size: int, round_num: int) -> SessionConfig:
        """A fresh session of round `round_num` of this run (both inside its digest)."""
        s = self.settings
        threat = ThreatModel(s.adversarial_rate, s.dropout_rate, s.threat)
        return SessionConfig.create(
            cohort,
            dimension=self.encoding.dimension(model_size),
            modulus_bits=self.encoding.bits(len(cohort)),
            run_id=self.run_id,
            round=round_num,
            graph_seed=None if self.graph_seeds is None else self.graph_seeds(round_num),
            threat=threat,
            neighbors=s.neighbors or None,
            threshold=s.threshold or None,
        )

    def _server(self, session: SessionConfig) -> SecAggServer:
        if self.roster is None:
            return SecAggServer(session)
        keys = {cid: self.roster[cid] for cid in session.client_ids}
        return SecAggServer(session, identity_public_keys=keys)

    def _unlisted(self, cohort: list[int]) -> list[int]:
        """Clients the roster has no identity key for (malicious mode only)."""
        roster = self.roster
        return [] if roster is None else [c for c in cohort if c not in roster]

    def _take_ahead(self, round_num: int, cohort: list[int], model_size: int) -> _Ahead | None:
        ahead, self._ahead = self._ahead, None
        if ahead is None or ahead.dead:
            return None
        if (ahead.round, ahead.cohort, ahead.model_size) != (round_num, tuple(cohort), model_size):
            log.info("round %d: the early key exchange was for another cohort; afresh", round_num)
            return None
        return ahead

    def _start_ahead(self, round_num: int, upcoming: list[int] | None, model_size: int) -> None:
        if not self.pipelining or upcoming is None:
            return
        unlisted = set(self._unlisted(upcoming))  # left out of that round, as in `collect`
        upcoming = sorted(c for c in upcoming if c not in unlisted)
        if len(upcoming) < 2:
            return
        try:
            session = self.session(upcoming, model_size, round_num)
            server = self._server(session)
        except (SecAggError, ValueError) as exc:
            log.info("round %d: no early key exchange: %s", round_num, exc)
            return
        self._ahead = _Ahead(round_num, tuple(upcoming), model_size, server)

    def agree_keys(
        self,
        transport: Transport,
        round_num: int,
        cohort: list[int],
        model_size: int,
        timeout_s: float | None,
    ) -> _Ahead | None:
        """Round `round_num`'s key stages (advertise, share keys) now, each an exchange of
        its own, before the round's training: they do not depend on the model (the async
        engine agrees a group's keys while other groups train). Pass the result to
        `collect(keys=...)`, which then starts at masked input. None: the session could not
        start or aborted (too few members left); nothing was revealed."""
        listed = [c for c in sorted(cohort) if c not in set(self._unlisted(cohort))]
        try:
            session = self.session(listed, model_size, round_num)
            ahead = _Ahead(round_num, tuple(listed), model_size, self._server(session))
        except (SecAggError, ValueError) as exc:
            log.info("round %d: no key agreement: %s", round_num, exc)
            return None
        while stage := ahead.riders():
            sent = {c: wrap(Kind.secagg(m.STAGE), round_num, m) for c, m in stage.items()}
            exchange_each(
                transport,
                sent,
                timeout_s,
                lambda cid, reply: ahead.receive(
                    cid, reply.reason if isinstance(reply, ClientFailure) else reply
                ),
            )
        return None if ahead.dead else ahead

    def collect(
        self,
        transport: Transport,
        requests: dict[int, Envelope],
        model_size: int,
        timeout_s: float | None,
        upcoming: list[int] | None = None,
        keys: _Ahead | None = None,
    ) -> Aggregate | Aborted:
        """The round's secure sum, or where and why it aborted. `upcoming`, the next round's
        cohort when known, has that round's key stages ride on this round's exchanges (see
        _Ahead). `keys`: this round's key stages, already run by `agree_keys`. The gate
        (distributed DP) checks and charges before any unmasking."""
        cohort = sorted(requests)
        round_num = requests[cohort[0]].round
        dropped = self._leave_out_unlisted(round_num, cohort)
        if keys is not None:
            self._ahead = keys
        ahead = self._take_ahead(round_num, cohort, model_size)
        self._start_ahead(round_num + 1, upcoming, model_size)
        if len(cohort) < 2:
            reason = f"a cohort of {len(cohort)} cannot be securely aggregated"
            log.warning("round %d: %s", round_num, reason)
            return Aborted(reason, unmasked=False, dropped=dropped)
        started = self._start(round_num, cohort, model_size, ahead, requests, dropped)
        if isinstance(started, Aborted):
            return started
        try:
            self._run_stages(transport, started, timeout_s)
            result = started.server.finalize()
            self._check_sum(result.total, len(result.survivors), model_size, requests)
            decoded = self.encoding.decode(result.total, len(result.survivors), model_size)
        except SecAggAborted as exc:
            return self._aborted(started, exc)
        for cid in result.dropped:
            dropped.setdefault(cid, "dropped during secure aggregation")
        if self.unmask_at_threshold:  # a survivor whose shares were not waited for is in the sum
            for cid in result.survivors:
                if dropped.get(cid, "").startswith(LEFT_OUT):
                    del dropped[cid]
        loss = decoded.loss if decoded.loss is not None else math.nan
        return Aggregate(
            decoded.total, decoded.weight, sorted(result.survivors), loss, dropped, decoded.extras
        )

    def _check_sum(
        self, total: Any, contributors: int, model_size: int, requests: Mapping[int, Envelope]
    ) -> None:
        """`secagg.sum_check`: raise SumRejected (an abort after unmasking) when the sum is
        outside what honest clipped clients can produce (see sum_checks.py)."""
        if not self.settings.sum_check or not isinstance(self.encoding, QuantizedEncoding):
            return
        clip = next(iter(requests.values())).config.get(CLIP_NORM) if requests else None
        check_quantized_sum(total, self.encoding, contributors, model_size, clip or None)

    def _leave_out_unlisted(self, round_num: int, cohort: list[int]) -> dict[int, str]:
        """Removes from `cohort` the clients without an identity key (malicious mode);
        their drop reasons."""
        dropped: dict[int, str] = {}
        for cid in self._unlisted(cohort):
            dropped[cid] = "no identity key in the secure-aggregation roster"
            cohort.remove(cid)
        if dropped and len(cohort) >= 2:
            # Under DP the count and the ids reveal participation: debug log only.
            log.log(
                logging.DEBUG if self.quiet_counts else logging.WARNING,
                "round %d: %d sampled clients have no identity key in the roster and are "
                "left out: %s",
                round_num,
                len(dropped),
                sorted(dropped)[:10],
            )
        return dropped

    def _start(
        self,
        round_num: int,
        cohort: list[int],
        model_size: int,
        ahead: _Ahead | None,
        requests: dict[int, Envelope],
        dropped: dict[int, str],
    ) -> _Round | Aborted:
        """The round's protocol server (the one whose keys were shared early, if any)."""
        try:
            enc_config = encoding_config(self.encoding.request_fields(len(cohort)))
            if ahead is not None:
                server = ahead.server
                dropped.update(ahead.dropped)
            else:
                server = self._server(self.session(cohort, model_size, round_num))
        except (SecAggError, ValueError) as exc:
            log.warning("round %d: secure aggregation not started: %s", round_num, exc)
            return Aborted(f"not started: {exc}", unmasked=False, dropped=dropped)
        self.last_session, self._last_round = server.session, round_num
        return _Round(round_num, server, requests, enc_config, dropped)

    def _run_stages(self, transport: Transport, run: _Round, timeout_s: float | None) -> None:
        """Every stage's exchange, until the protocol has no more requests."""
        stage_requests = run.server.next_requests()
        while stage_requests is not None:
            if not run.unmasked and _is_unmask(stage_requests):
                # Every unmasking is charged first, and only with enough honest noise.
                if self.gate is not None:
                    self.gate.before_unmask(run.round, run.server.survivors)
                run.unmasked = True
            out = {cid: run.envelope(cid, req) for cid, req in stage_requests.items()}
            riders = self._riders()
            sent = dict(out)
            for cid, rider in riders.items():
                sent[cid] = attach(out[cid], rider) if cid in out else rider
            # Each reply is taken in as it arrives (a masked input goes into the running
            # sum at once): the stage's replies are never all held together.
            # A group released at R (server.group_release_at): its masked-input stage
            # ends at the first R replies; the others are dropped members whose pairwise
            # masks the unmask stage removes, and the session never takes their masked
            # input afterwards (its stage is closed).
            quorum = self.release_at if _is_training(stage_requests) else 0
            if self.unmask_at_threshold and _is_unmask(stage_requests):
                quorum = run.server.session.threshold  # t shares of each secret suffice
            exchange_each(
                transport,
                sent,
                timeout_s,
                partial(self._receive_stage, run, riders, out.keys()),
                quorum,
            )
            stage_requests = run.server.next_requests()

    def _receive_stage(
        self,
        run: _Round,
        riders: Mapping[int, Envelope],
        primary: Set[int],
        cid: int,
        reply: Envelope | ClientFailure,
    ) -> bool:
        """One reply to a stage's exchange (`primary`: the clients sent this round's
        request; `riders`: the next round's key stage riding with it). False: the protocol
        server refused it (it does not count towards a FirstReplies quorum)."""
        return self._receive(run, cid, reply, riders.get(cid), cid in primary)

    def _receive(
        self,
        run: _Round,
        cid: int,
        reply: Envelope | ClientFailure,
        rider: Envelope | None,
        primary: bool,
    ) -> bool:
        """One client's reply: its answer to this round's stage, and to the rider; whether
        the protocol server accepted its answer to this round's stage."""
        mine, theirs = _split(reply, rider, primary)
        accepted = False
        if isinstance(mine, Envelope):
            try:
                config, arrays = protocol_part(mine)
                run.server.receive(cid, decode_message(config, arrays))
                accepted = True
            except (SecAggError, ValueError) as exc:
                run.dropped.setdefault(cid, str(exc))
        elif isinstance(mine, str):
            run.dropped.setdefault(cid, mine)
        if theirs is not None:
            assert self._ahead is not None
            self._ahead.receive(cid, theirs)
            # A valid answer without the rider's: a client that does not know riders
            # (garbage from a faulty one proves nothing).
            if accepted and isinstance(theirs, str) and theirs.startswith(IGNORED):
                self._riders_ignored(cid)
        return accepted

    def _aborted(self, run: _Round, exc: SecAggAborted) -> Aborted:
        where = (
            "after unmasking (the server may have seen the sum)"
            if run.unmasked
            else "before unmasking (nothing revealed)"
        )
        log.warning(
            "round %d: secure aggregation aborted %s; nothing released: %s",
            run.round,
            where,
            "(reason in the private annex)" if self.quiet_counts else exc,
        )
        return Aborted(str(exc), unmasked=run.unmasked, dropped=run.dropped)

    def round_report(self, round_num: int) -> dict[str, Any]:
        """The protocol's mode and parameters, for the round's record (when it started)."""
        s = self.last_session
        if s is None or self._last_round != round_num:
            return {}
        report: dict[str, Any] = {
            "secagg_threat": s.threat_mode.value,
            "secagg_neighbors": s.neighbors,
            "secagg_threshold": s.threshold,
        }
        if self.graph_seeds is not None:  # a DP run: private record only (audits)
            report["secagg_graph_seed"] = s.graph_seed.hex()
        return report

    def _riders_ignored(self, cid: int) -> None:
        """A client that does not know riders would be dropped from every early key
        exchange: stop pipelining for this run, so every round runs all its stages."""
        if self.pipelining:
            log.warning(
                "client %d ignores the next round's key stage riding on this round's "
                "message (an older fedveil client?): pipelining off for this run",
                cid,
            )
        self.pipelining = False
        if self._ahead is not None:
            self._ahead.dead = True

    def _riders(self) -> dict[int, Envelope]:
        ahead = self._ahead
        if ahead is None:
            return {}
        return {
            cid: wrap(Kind.secagg(req.STAGE), ahead.round, req)
            for cid, req in ahead.riders().items()
        }


def exchange_each(
    transport: Transport,
    sent: Mapping[int, Envelope],
    timeout_s: float | None,
    take: ReplySink,
    quorum: int = 0,
) -> None:
    """`take(cid, reply)` once for every client in `sent`: as each reply arrives (the
    transport's `on_reply`), then the ones it returned instead, and "no reply" for the
    silent, in client order. With `quorum` R > 0 and a transport that can end an
    exchange early (FirstReplies), the exchange ends at its first R replies that `take`
    did not refuse (return False)."""
    taken: set[int] = set()

    def sink(cid: int, reply: Envelope | ClientFailure) -> bool | None:
        if cid in sent and cid not in taken:  # each client's first reply, once
            taken.add(cid)
            return take(cid, reply)  # False: refused, not one of the quorum
        return False

    if quorum and isinstance(transport, FirstReplies):
        rest = transport.exchange_first(sent, timeout_s, quorum, on_reply=sink)
    else:
        rest = transport.exchange(sent, timeout_s, on_reply=sink)
    for cid in sorted(sent):
        reply = rest.pop(cid, None)
        sink(cid, ClientFailure(cid, "no reply") if reply is None else reply)


def _is_training(requests: Mapping[int, Message]) -> bool:
    first = next(iter(requests.values()), None)
    return first is not None and first.STAGE is TRAINING_STAGE


def _is_unmask(requests: Mapping[int, Message]) -> bool:
    first = next(iter(requests.values()), None)
    return first is not None and first.STAGE is Stage.UNMASK


def _split(
    reply: Envelope | ClientFailure, rider: Envelope | None, primary: bool
) -> tuple[Envelope | str | None, Envelope | str | None]:
    """(answer to this round's request, answer to the rider); None where none was sent."""
    if isinstance(reply, ClientFailure):
        return (reply.reason if primary else None), (reply.reason if rider else None)
    if rider is None:
        return reply, None
    if not primary:
        return None, reply
    return split_reply(reply, rider)
