"""Dispatch units of asynchronous training, and how their updates are computed.

A unit is what the server dispatches at once: one client in the clear, or a group of G
clients (under secure aggregation one protocol session, whose sum alone the server
learns). Each dispatch has a unique, increasing sequence number `seq`, sent as the
request's round: a client's training randomness differs per dispatch, and a reply
for a sequence number not in flight (a replay, or a late reply after a resume) is
recognised and dropped.

Updates are computed eagerly, before the unit's simulated arrival: units in the
clear that downloaded the same model version travel in one transport exchange
(`compute_plain`); a secure-aggregation group runs its whole session at dispatch
(`run_group`), since its arrival time is the protocol's stage times. Nothing is
released early: the engine holds the result until the unit's arrival.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from fedveil.config import RunConfig
from fedveil.privacy.secagg import SecAggError
from fedveil.protocol.envelope import Envelope
from fedveil.protocol.kinds import TRAINING_KINDS, TRAINING_STAGE, Kind, Stage
from fedveil.server.engine.aggregation import Aggregate, NoUpdates, UpdateChannel
from fedveil.server.engine.requests import ClientPrivacy, build_train_request
from fedveil.server.engine.secagg_channel import SecAggChannel
from fedveil.server.engine.sim_clock import DEFAULT_LATENCY_S, Availability, Verdict
from fedveil.server.engine.transport import LEFT_OUT, ClientFailure, ReplySink, Transport
from fedveil.server.engine.unmask_gate import Aborted

Outcome = Aggregate | Aborted | NoUpdates | None


@dataclass
class GroupKeyedAhead:
    """A secure-aggregation group formed ahead of a free slot: its key stages (advertise,
    share keys; they do not depend on the model) run at once, while other groups train,
    and its training request goes out with masked input when a slot frees, no earlier
    than the keys are agreed. Its members are busy meanwhile (drawn for nothing else)."""

    seq: int
    clients: tuple[int, ...]
    keys_ready: float  # simulated time the key stages end
    keys: Any = None  # the channel's agreed session; None after a restore (agreed again)
    # server.group_member_model = 'start': the key stages are only timed when the group
    # forms (DispatchRunner.time_keys; the session runs whole at the group's arrival);
    # the members left after them. None: the keys were agreed (keys).
    live: tuple[int, ...] | None = None

    def to_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "seq": self.seq, "clients": list(self.clients), "keys_ready": self.keys_ready
        }  # fmt: skip
        if self.live is not None:
            state["live"] = list(self.live)
        return state

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> GroupKeyedAhead:
        clients = tuple(int(c) for c in state["clients"])
        live = state.get("live")
        group = cls(int(state["seq"]), clients, float(state["keys_ready"]))
        group.live = None if live is None else tuple(int(c) for c in live)
        return group


@dataclass
class Dispatch:
    """One dispatch: its clients, the model version they downloaded, when it comes back."""

    seq: int
    clients: tuple[int, ...]
    version: int
    dispatched_at: float
    arrival: float = 0.0
    failed: dict[int, str] = field(default_factory=dict)  # simulated dropouts at dispatch
    outcome: Outcome = None
    computed: bool = False
    # A secure-aggregation group on the simulated clock: when each member stops training
    # (its masked input sent, or lost); from then on it is free to join another group
    # while this one waits for its stragglers. Empty: every member busy until arrival.
    frees: dict[int, float] = field(default_factory=dict)
    # server.group_dispatch_at (rolling): how long after its training stage began each member
    # started training (its slot came free then); kept so a recomputed session (resume)
    # leaves out the same members. Empty: every member started with the stage.
    delays: dict[int, float] = field(default_factory=dict)
    # Rolling dispatch: when each member starts training (simulated time; after its keys
    # are agreed and its slot is free). Empty: counted as training from dispatch.
    starts: dict[int, float] = field(default_factory=dict)
    # server.group_member_model = 'start': the model version each member trained on (the
    # one current at its start), set when the session is computed at the group's arrival.
    # Empty: every member trained on `version`.
    bases: dict[int, int] = field(default_factory=dict)

    def busy(self, now: float) -> list[int]:
        """The members still training at simulated time `now`."""
        if not self.frees:
            return list(self.clients)
        return [c for c in self.clients if self.frees.get(c, self.arrival) > now]

    def waiting(self, now: float) -> list[int]:
        """Rolling dispatch: the members not training yet at `now`, waiting for their keys
        or for their slot to come free (they count against C in `busy`)."""
        return [c for c, t in self.starts.items() if t > now and self.frees.get(c, t) > t]

    def to_state(self) -> dict[str, Any]:
        """What a checkpoint keeps (never the update: it is recomputed on resume)."""
        return {
            "seq": self.seq,
            "clients": list(self.clients),
            "version": self.version,
            "dispatched_at": self.dispatched_at,
            "arrival": self.arrival,
            "frees": [[c, t] for c, t in sorted(self.frees.items())],
            "delays": [[c, t] for c, t in sorted(self.delays.items())],
            "starts": [[c, t] for c, t in sorted(self.starts.items())],
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> Dispatch:
        unit = cls(
            int(state["seq"]),
            tuple(int(c) for c in state["clients"]),
            int(state["version"]),
            float(state["dispatched_at"]),
            float(state["arrival"]),
        )
        unit.frees = {int(c): float(t) for c, t in state.get("frees", [])}
        unit.delays = {int(c): float(t) for c, t in state.get("delays", [])}
        unit.starts = {int(c): float(t) for c, t in state.get("starts", [])}
        return unit


class _Replies:
    """A transport that hands back replies already collected (one unit's share of an
    exchange), so the update channel checks them as it checks any reply."""

    def __init__(self, replies: Mapping[int, Envelope | ClientFailure]) -> None:
        self.replies = replies

    def client_ids(self) -> Sequence[int]:
        return sorted(self.replies)

    def exchange(
        self,
        requests: Mapping[int, Envelope],
        timeout_s: float | None,
        on_reply: ReplySink | None = None,
    ) -> dict[int, Envelope | ClientFailure]:
        return {c: self.replies.get(c, ClientFailure(c, "no reply")) for c in requests}

    def close(self) -> None:
        return None


class StagedAvailability:
    """One secure-aggregation group's exchanges under the availability model: each stage's
    members drop or straggle as the model decides at (seq, stage); a member lost at one
    stage stays lost; the group's simulated time is the sum of its stages' waits.
    `trained` holds when each member stopped training (from the session's start): its
    reply to the training stage, or the end of the stage at which it was lost.

    Rolling dispatch (server.group_dispatch_at): `ready` says when each member's training slot
    comes free (from the session's start); a member starts training then, or with the
    training stage if that is later. Its reply comes its drawn latency after its own start,
    and its deadline runs from its own start. `delays` (a recomputed session's, from
    Dispatch.delays) fixes the starts instead; `self.delays` holds those applied."""

    def __init__(
        self,
        inner: Transport,
        availability: Availability | None,
        ready: Mapping[int, float] | None = None,
        delays: Mapping[int, float] | None = None,
    ) -> None:
        self.inner, self.availability = inner, availability
        self.gone: dict[int, str] = {}
        self.elapsed = 0.0
        self.trained: dict[int, float] = {}
        self.ready = dict(ready or {})
        self.delays: dict[int, float] = dict(delays or {})
        self.train_began = 0.0  # when the training stage began (from the session's start)

    def client_ids(self) -> Sequence[int]:
        return self.inner.client_ids()

    def exchange(
        self,
        requests: Mapping[int, Envelope],
        timeout_s: float | None,
        on_reply: ReplySink | None = None,
    ) -> dict[int, Envelope | ClientFailure]:
        return self.exchange_first(requests, timeout_s, 0, on_reply)

    def exchange_first(
        self,
        requests: Mapping[int, Envelope],
        timeout_s: float | None,
        quorum: int,
        on_reply: ReplySink | None = None,
    ) -> dict[int, Envelope | ClientFailure]:
        """The stage's exchange; with `quorum` R > 0 (FirstReplies) it ends at the R-th
        reply in simulated time (without a latency model every reply comes at once: the R
        lowest client ids): later members are left out by design (lost from then on, free
        at the release) and never reach the clients' transport. At the unmask stage
        (server.group_unmask = 'threshold', quorum t) the members left out are survivors
        whose shares are not waited for: they stopped training at their masked input."""
        out: dict[int, Envelope | ClientFailure] = {}
        live = {c: m for c, m in requests.items() if c not in self.gone}
        for cid in requests.keys() - live.keys():
            out[cid] = ClientFailure(cid, f"gone since an earlier stage: {self.gone[cid]}")
        training = bool(live) and next(iter(live.values())).kind in TRAINING_KINDS
        field = "server.group_release_at" if training else "server.group_unmask"
        if self.availability is not None and live:
            first = next(iter(live.values()))
            verdict = self.availability.judge(first.round, first.kind, sorted(live), timeout_s)
            wait = verdict.simulated_time(timeout_s)
            if training and (self.ready or self.delays):
                wait = self._start_late(verdict, timeout_s)
            not_waited: set[int] = set()
            if 0 < quorum <= len(verdict.latency):
                failed_before = set(verdict.failed)
                wait = self._release_at(verdict.latency, quorum, verdict.failed, field)
                not_waited = set(verdict.failed) - failed_before
            for cid, reason in verdict.failed.items():
                self.gone[cid] = reason
                out[cid] = ClientFailure(cid, reason)
                del live[cid]
                if training or cid not in not_waited:
                    self.trained[cid] = self.elapsed + wait
            if training:
                for cid, latency in verdict.latency.items():
                    self.trained[cid] = self.elapsed + latency
            self.elapsed += wait
        elif 0 < quorum < len(live):  # no latency model: every reply at once, ties by id
            for cid in sorted(live)[quorum:]:
                reason = f"{LEFT_OUT}: after the group's first {quorum} ({field})"
                self.gone[cid] = reason
                out[cid] = ClientFailure(cid, reason)
                del live[cid]
        if live:
            out.update(self.inner.exchange(live, timeout_s, on_reply=on_reply))
        return out

    def _start_late(self, verdict: Verdict, timeout_s: float | None) -> float:
        """Rolling dispatch: shifts each member's reply (and, past its deadline, when it is
        noticed) by its start delay; the stage's wait for all of them."""
        self.train_began = self.elapsed
        if not self.delays:
            self.delays = {c: max(0.0, t - self.elapsed) for c, t in self.ready.items()}
        delay = {c: self.delays.get(c, 0.0) for c in [*verdict.latency, *verdict.failed]}
        for cid in verdict.latency:
            verdict.latency[cid] += delay[cid]
        noticed = [delay[c] + timeout_s for c in verdict.failed] if timeout_s else []
        return max([*verdict.latency.values(), *noticed], default=0.0)

    @staticmethod
    def _release_at(
        latency: dict[int, float], quorum: int, failed: dict[int, str], field: str
    ) -> float:
        """Ends the stage at the `quorum`-th reply (ties: the lower client id): moves every
        later member from `latency` to `failed`, left out by design (`field`: the setting
        that says so); the stage's wait."""
        order = sorted(latency, key=lambda c: (latency[c], c))
        release = latency[order[quorum - 1]]
        for cid in order[quorum:]:
            failed[cid] = (
                f"{LEFT_OUT}: its reply would come at {latency.pop(cid):.2f} s, after the "
                f"group's first {quorum} at {release:.2f} s ({field})"
            )
        return release

    def close(self) -> None:
        return None


class DispatchRunner:
    """Computes units' updates over the transport, through the run's update channel."""

    def __init__(
        self,
        cfg: RunConfig,
        transport: Transport,
        channel: UpdateChannel,
        model_size: int,
        availability: Availability | None,
        privacy_fields: Callable[[], ClientPrivacy | None] | None = None,
    ) -> None:
        self.cfg, self.transport, self.channel = cfg, transport, channel
        self.model_size, self.availability = model_size, availability
        self.timeout = cfg.server.round_timeout or None
        # Async DP (central_release.AsyncCentralDP): the clip C the request carries, which the plain
        # channel then enforces (re-clip, weight 1).
        self.privacy_fields = privacy_fields

    def requests(self, unit: Dispatch, weights: torch.Tensor) -> dict[int, Envelope]:
        """The unit's training requests: its sequence number is their round."""
        privacy = self.privacy_fields() if self.privacy_fields is not None else None
        base = build_train_request(self.cfg, unit.seq, weights, privacy)
        return {
            c: Envelope(base.kind, unit.seq, dict(base.config), base.arrays) for c in unit.clients
        }

    def compute_plain(
        self, units: Sequence[Dispatch], weights_of: Callable[[int], torch.Tensor]
    ) -> None:
        """Every unit's update in the clear: one exchange per model version."""
        by_version: dict[int, list[Dispatch]] = {}
        for unit in units:
            by_version.setdefault(unit.version, []).append(unit)
        for version in sorted(by_version):
            group = by_version[version]
            weights = weights_of(version)
            asked = {u.seq: self.requests(u, weights) for u in group}
            sent = {c: m for u in group for c, m in asked[u.seq].items() if c not in u.failed}
            replies = self.transport.exchange(sent, self.timeout) if sent else {}
            for unit in group:
                self._finish_plain(unit, asked[unit.seq], replies)

    def _finish_plain(
        self,
        unit: Dispatch,
        requests: dict[int, Envelope],
        replies: Mapping[int, Envelope | ClientFailure],
    ) -> None:
        mine = {c: replies[c] for c in requests if c in replies}
        for cid, reason in unit.failed.items():
            mine[cid] = ClientFailure(cid, reason)
        unit.outcome = self.channel.collect(_Replies(mine), requests, self.model_size, None)
        unit.computed = True

    def run_group(
        self,
        unit: Dispatch,
        weights: torch.Tensor,
        start: float | None = None,
        ready: Mapping[int, float] | None = None,
    ) -> float:
        """A secure-aggregation group's whole session; its simulated duration (and, given
        the simulated time `start` its first stage begins, when each member is free).
        `ready`: rolling dispatch, when each member's slot comes free (StagedAvailability)."""
        return self.run_keyed_group(unit, weights, None, start, ready)

    def time_keys(self, seq: int, clients: Sequence[int]) -> tuple[tuple[int, ...] | None, float]:
        """server.group_member_model = 'start': a group's key stages timed when it forms,
        as `agree_keys` would run them (the same availability verdicts at (seq, stage)),
        without running them: the session runs whole at the group's arrival, when every
        member's model is known. The members left after them (None: fewer than the
        session's threshold t, the group aborts as agree_keys's would) and the stages'
        simulated duration."""
        staged = StagedAvailability(_Replies({}), self.availability)
        live = self._timed_stages(staged, seq, clients, (Stage.ADVERTISE, Stage.SHARE_KEYS))
        return live, staged.elapsed

    def time_keyed_group(
        self,
        unit: Dispatch,
        live: Sequence[int],
        start: float,
        ready: Mapping[int, float],
    ) -> float:
        """server.group_member_model = 'start': a group's masked-input and unmask stages
        timed at dispatch, as `run_keyed_group` runs them from `start` with the members
        `live` after its key stages, rolling dispatch's slots `ready`: sets `unit.frees`,
        `unit.starts` and `unit.delays` as that does, computes nothing (the session runs at
        the arrival: run_late_group); the simulated duration."""
        staged = StagedAvailability(_Replies({}), self.availability, ready)
        stages = (Stage.MASKED_INPUT, Stage.UNMASK)
        assert isinstance(self.channel, SecAggChannel)
        self._timed_stages(staged, unit.seq, live, stages, self.channel.release_at)
        unit.delays = {c: t for c, t in staged.delays.items() if t > 0}
        unit.frees = {c: start + staged.trained.get(c, staged.elapsed) for c in unit.clients}
        began = start + staged.train_began
        unit.starts = {c: began + unit.delays.get(c, 0.0) for c in unit.clients}
        return staged.elapsed

    def _timed_stages(
        self,
        staged: StagedAvailability,
        seq: int,
        clients: Sequence[int],
        stages: Sequence[Stage],
        quorum: int = 0,
    ) -> tuple[int, ...] | None:
        """Each stage's exchange under the availability model alone (nothing reaches a
        client), to the members still live; None once fewer than the threshold t are."""
        assert isinstance(self.channel, SecAggChannel)
        members = sorted(clients)
        try:
            threshold = self.channel.session(members, self.model_size, seq).threshold
        except (SecAggError, ValueError):
            return None
        live = tuple(members)
        unmask_at = threshold if self.channel.unmask_at_threshold else 0
        for stage in stages:
            kind = Kind.secagg(stage)
            asked = {c: Envelope(kind, seq, {}, {}) for c in live}
            at = quorum if stage is TRAINING_STAGE else unmask_at if stage is Stage.UNMASK else 0
            staged.exchange_first(asked, self.timeout, at)
            live = tuple(c for c in live if c not in staged.gone)
            if len(live) < threshold:
                return None
        return live

    def run_late_group(
        self, unit: Dispatch, weights_of: Callable[[int], torch.Tensor], bases: Mapping[int, int]
    ) -> None:
        """server.group_member_model = 'start': the group's whole session (its key stages
        as timed when it formed, then masked input and unmask), computed at its arrival,
        each member's training request carrying the model version `bases` names (the one
        current at its start): the masked sum is of deltas, each against its member's own
        model. The session (members, keys, threshold t, release at R) is the one fixed at
        dispatch; unit.delays starts the same members late as the timing did."""
        staged = StagedAvailability(self.transport, self.availability, None, unit.delays)
        privacy = self.privacy_fields() if self.privacy_fields is not None else None
        built = {v: build_train_request(self.cfg, unit.seq, weights_of(v), privacy) for v in
                 sorted(set(bases.values()))}  # fmt: skip
        requests = {
            c: Envelope(built[bases[c]].kind, unit.seq, dict(built[bases[c]].config),
                        built[bases[c]].arrays)
            for c in unit.clients
        }  # fmt: skip
        unit.outcome = self.channel.collect(staged, requests, self.model_size, self.timeout)
        unit.bases = dict(bases)
        unit.computed = True

    def agree_keys(self, seq: int, clients: Sequence[int]) -> tuple[Any, float]:
        """A group's key stages, run before its training (GroupKeyedAhead): the agreed keys
        (None: the session aborted, nothing revealed) and their simulated duration."""
        assert isinstance(self.channel, SecAggChannel)
        staged = StagedAvailability(self.transport, self.availability)
        keys = self.channel.agree_keys(staged, seq, list(clients), self.model_size, self.timeout)
        return keys, staged.elapsed

    def run_keyed_group(
        self,
        unit: Dispatch,
        weights: torch.Tensor,
        keys: Any,
        start: float | None = None,
        ready: Mapping[int, float] | None = None,
    ) -> float:
        """A group's session from masked input on when `keys` (agree_keys) are given, else
        whole; its simulated duration. With `start` (the simulated time the session's first
        stage here begins) `unit.frees` says when each member stops training. `ready`
        (from `start`): rolling dispatch, when each member's slot comes free; the delays
        applied go to `unit.delays` (a recomputed session applies those again)."""
        staged = StagedAvailability(self.transport, self.availability, ready, unit.delays)
        requests = self.requests(unit, weights)
        if keys is None:
            unit.outcome = self.channel.collect(staged, requests, self.model_size, self.timeout)
        else:
            assert isinstance(self.channel, SecAggChannel)
            unit.outcome = self.channel.collect(
                staged, requests, self.model_size, self.timeout, keys=keys
            )
        unit.computed = True
        unit.delays = {c: t for c, t in staged.delays.items() if t > 0}
        if self.availability is None or self.availability.latency_median <= 0:
            return DEFAULT_LATENCY_S
        if start is not None:
            unit.frees = {c: start + staged.trained.get(c, staged.elapsed) for c in unit.clients}
            if ready is not None:
                began = start + staged.train_began
                unit.starts = {c: began + unit.delays.get(c, 0.0) for c in unit.clients}
        return staged.elapsed
