"""The buffer of K (FedBuff) and the staleness bound (SSP): the scheduler of
server.mode = async | ssp.

C clients are in flight (server.concurrency) in dispatch units (dispatches.py). Each
unit that comes back is replaced at once, with the then-current model version, by
clients not already in flight, drawn from the run seed. An update tau versions old
(staleness.py) weighs s(tau) x its example weight; one older than server.max_staleness
is dropped and counted. After K client updates (server.buffer) the server optimizer
takes one step on sum(s(tau_i) w_i delta_i) / sum(w_i): a new model version, one
RoundRecord, one checkpoint. Under ssp a unit is dispatched only while the model is
at most server.ssp_bound versions ahead of the oldest download still in flight.
A secure-aggregation group takes G slots: by default it goes out once G are free; with
server.group_dispatch_at = S (rolling, simulated clock) once S are, its other members
starting to train as slots come free, never more than C training at once.

Arrivals come from an ArrivalClock (sim_clock.py): simulated time, never wall-clock
order, so every transport reaches the same model for the same config and seed.
The checkpoint at each apply (the buffer is empty then) holds the units in flight and
the weights of every version they downloaded; on resume their updates are computed
again (never stored), so the run continues to the model an uninterrupted run reaches.

The engine's pipeline (rounds.RoundEngine.run_round) is the same as for sync rounds:
`gather` runs arrivals until K updates are buffered and hands the engine their
staleness-weighted sum (in arrival order, the same float sums on every run); the
release mechanism publishes it; `after_apply` dispatches replacements with the new
version before the checkpoint.

Under DP every dispatch is counted against server.max_participations before it goes
out (release_mechanism.ParticipationCapped), and units are drawn from the secret cohort
key (unless dp.seeded_cohorts). Central DP noises and charges each apply; distributed
DP charges each secure-aggregation group at its unmask gate, which in simulation is at
dispatch: so no group is dispatched after the last update, and on resume every unit in
flight counts as a new dispatch of its clients (its recomputed session is a new
release).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from fedveil.config import RunConfig
from fedveil.config.async_mode import resolved_concurrency, resolved_group_size
from fedveil.server.engine.aggregation import Aggregate, PlainChannel
from fedveil.server.engine.dispatches import Dispatch, DispatchRunner, GroupKeyedAhead
from fedveil.server.engine.drops import drops_by_reason
from fedveil.server.engine.release_mechanism import ParticipationCapped
from fedveil.server.engine.round_record import RoundRecord
from fedveil.server.engine.round_steps import Collected
from fedveil.server.engine.sampling import SecretCohortSampler
from fedveil.server.engine.scheduler import EngineView, Gathered
from fedveil.server.engine.secagg_channel import SecAggChannel
from fedveil.server.engine.sim_clock import (
    ArrivalClock,
    Availability,
    SimulatedClock,
    plain_unit_fate,
)
from fedveil.server.engine.staleness import ssp_allows, staleness_weight, too_stale
from fedveil.server.engine.unmask_gate import Aborted

log = logging.getLogger("fedveil.server")

__all__ = ["BufferedScheduler"]

# A run stops once this many units per slot came back with no server update.
STALL_UNITS_PER_SLOT = 20
GROUP_LABEL = b"async-group"  # the keyed draw's domain (sync cohorts use b"cohort")
START_ORDER_LABEL = b"async-start-order"  # server.group_start_order = 'random', under DP
START_ORDER_STREAM = 0x5107  # its seeded stream otherwise (the draw's is 0xA5F1)


class _Window:
    """What happened since the last server update (one RoundRecord's worth)."""

    def __init__(self) -> None:
        self.buffer: list[tuple[Aggregate, int]] = []  # (update sum, staleness)
        self.seqs: list[int] = []  # the buffered units' dispatch numbers
        self.clients = 0  # clients of the units that came back
        self.dropped: dict[int, str] = {}  # why (the latest reason per client)
        self.dropped_count = 0
        self.stale_dropped = 0
        self.replays_dropped = 0
        self.aborted_groups = 0
        self.started = time.perf_counter()
        self.units = 0  # units that came back
        # server.group_member_model = 'start': each contributor's own staleness (its model's)
        self.member_staleness: list[int] = []

    @property
    def buffered(self) -> int:
        return sum(len(agg.contributors) for agg, _ in self.buffer)


class BufferedScheduler:
    """FedBuff's buffer of K, and with `ssp_bound` SSP's staleness bound on dispatch;
    the engine's `round` counts applied server updates (model versions)."""

    def __init__(
        self,
        cfg: RunConfig,
        *,
        availability: Availability | None = None,
        clock: ArrivalClock | None = None,
    ) -> None:
        """`availability`: simulated latency and dropouts (None: every unit takes 1 s);
        `clock`: where arrivals come from (None: the simulated clock)."""
        s = cfg.server
        self.cfg = cfg
        self.mode = s.mode
        self.min_contributors = 1  # a buffer is applied once K updates are in it
        self.concurrency, self.group = resolved_concurrency(cfg), resolved_group_size(cfg)
        self.clock: ArrivalClock = clock or SimulatedClock()
        self.availability = availability
        self.draw_rng = np.random.default_rng(np.random.SeedSequence([cfg.seed, 0xA5F1]))
        self.next_seq = 1
        self.in_flight: dict[int, Dispatch] = {}
        self.versions: dict[int, torch.Tensor] = {}  # weights of versions still in flight
        self.participations: Counter[int] = Counter()
        self.last_apply_clock = 0.0
        self.window = _Window()
        self._applying = self.window  # the window of the server update being applied
        self.totals: Counter[str] = Counter()
        self.ssp_bound = s.ssp_bound if s.mode == "ssp" else None
        # Units that may come back with no server update before the run gives up (every
        # client failing, or every update too stale, would otherwise never end).
        self.stall_limit = max(100, STALL_UNITS_PER_SLOT * max(self.concurrency, s.buffer))
        self.stalled = False
        self.keyed: list[GroupKeyedAhead] = []  # formed, keys agreed or agreeing, in seq order
        # server.group_member_model = 'start': when each version still needed became current
        # (simulated time), to find the model a late member started on.
        self.applied_at: dict[int, float] = {}

    def attach(self, engine: EngineView) -> None:
        privacy = engine.privacy
        if privacy is not None and not isinstance(privacy, ParticipationCapped):
            # The sync mechanisms account sampled rounds; asynchronous releases are not.
            raise ValueError(
                f"server.mode = {self.cfg.server.mode!r}: DP needs an asynchronous release "
                "mechanism with a participation cap (AsyncCentralDP, AsyncDistributedDP), "
                "not the sync one"
            )
        self.engine = engine
        # Async DP (H2): the dispatch gate, the request's clip, the release at apply
        # (distributed DP: also each group's unmask gate, held by the channel).
        self.dp: ParticipationCapped | None = privacy
        channel = engine.channel
        self.secagg = not isinstance(channel, PlainChannel)
        self.runner = self._runner(engine)
        # Under DP, who forms each unit comes from the secret cohort key (AES-CTR keyed by
        # the dispatch number), never the public seed: issue 16's secret cohorts.
        key = privacy.cohort_key if privacy is not None and privacy.cohorts_secret else None
        self.group_keys = (
            None
            if key is None
            else SecretCohortSampler(engine.task.num_clients, "fixed", 1, 1.0, key)
        )
        # Secure aggregation on the simulated clock: each slot's next group agrees its keys
        # while the slot's group trains (GroupKeyedAhead), so a dispatched group waits for two
        # exchanges (masked input with training, unmask), not four. Not under DP (a group
        # drawn ahead would be counted before its model goes out) nor on the wall clock.
        latency = self.availability is not None and self.availability.latency_median > 0
        simulated = isinstance(self.clock, SimulatedClock)
        self.keys_ahead = (
            self.secagg and latency and privacy is None and simulated
            and isinstance(channel, SecAggChannel)
        )  # fmt: skip
        # On the simulated clock a group member that has sent its masked input stops
        # training: it is free to join the next group while its own waits for stragglers
        # to report or hit the deadline (Dispatch.frees), so the slot holds no idle client.
        self.free_early = self.secagg and latency and simulated
        # Rolling dispatch: a group goes out once S slots are free (server.group_dispatch_at),
        # each other member starting to train as a slot comes free (the members' free times
        # are known on this clock: Dispatch.frees), so fewer slots wait idle for G to be
        # free at once. The session, its members, R and the threshold are the same.
        self.dispatch_at = self.cfg.server.group_dispatch_at or self.group
        self.rolling = self.dispatch_at < self.group
        if self.rolling and not self.free_early:
            raise ValueError(
                f"server.group_dispatch_at = {self.dispatch_at} needs secure aggregation on "
                "the simulated clock with a latency model (simulation.latency_median > 0): "
                "it starts each member as a slot comes free, known only there; set it to 0"
            )
        # server.group_member_model = 'start': a late member trains on the model current at
        # its own start. Its group's session is timed at formation and dispatch and computed
        # whole at the arrival, when every member's model is known (config: rolling, no DP).
        self.late = self.cfg.server.group_member_model == "start"
        if self.late and not (self.keys_ahead and self.rolling):
            raise ValueError(
                "server.group_member_model = 'start' needs rolling dispatch of secure-"
                "aggregation groups on the simulated clock with a latency model "
                "(simulation.latency_median > 0), whose group keys are agreed ahead; set it "
                "to 'dispatch'"
            )
        self._check_unmask_at_threshold(engine)

    def _check_unmask_at_threshold(self, engine: EngineView) -> None:
        """server.group_unmask = 'threshold' ends a group's unmask stage at its first t
        replies (on the simulated clock, and on devices where the transport can end an
        exchange early: FirstReplies): enough only when each member holds a share of
        every other's secrets (the session's neighbour graph is complete, k = G - 1);
        anything else refused, naming the field."""
        if self.cfg.server.group_unmask != "threshold":
            return
        channel = engine.channel
        assert isinstance(channel, SecAggChannel)
        session = channel.session(list(range(self.group)), engine.model.size, 0)
        if session.neighbors < self.group - 1:
            raise ValueError(
                f"server.group_unmask = 'threshold': a group of server.group_size = "
                f"{self.group} has {session.neighbors} neighbours per member, not all "
                f"{self.group - 1} others, so t replies may not hold t shares of every "
                "secret; set it to 'survivors' (or secagg.neighbors = 0, the threat model's)"
            )

    def _runner(self, engine: EngineView) -> DispatchRunner:
        return DispatchRunner(
            self.cfg, engine.transport, engine.channel, engine.model.size, self.availability,
            privacy_fields=engine.client_privacy,
        )  # fmt: skip

    # -- dispatch -----------------------------------------------------------
    def clients_in_flight(self) -> int:
        """Slots taken now: clients training (a group's members that have sent their masked
        input do not count: Dispatch.frees), and under rolling dispatch members waiting
        for a slot that is not free yet (Dispatch.waiting)."""
        now = self.clock.now()
        return sum(len(u.busy(now)) for u in self.in_flight.values())

    def clients_training(self) -> int:
        """Clients training now (rolling dispatch: not those still waiting for a slot)."""
        now = self.clock.now()
        return self.clients_in_flight() - sum(len(u.waiting(now)) for u in self.in_flight.values())

    def fill(self) -> None:
        """Dispatch units into every free slot the SSP gate and the cap allow (with keys
        ahead, then form the groups that agree their keys for the next free slots)."""
        self._recompute_restored()
        done = self.engine.round >= self.cfg.server.rounds
        if done and self.dp is not None and self.dp.charges_at_unmask:
            return  # distributed DP charges a group when unmasked: none after the last update
        while not self.stalled and self.concurrency - self.clients_in_flight() >= self.dispatch_at:
            if self.ssp_bound is not None:
                oldest = min((u.version for u in self.in_flight.values()), default=None)
                if not ssp_allows(self.engine.round, oldest, self.ssp_bound):
                    break
            if self.keyed:
                self._dispatch_keyed(self.keyed.pop(0))
                continue
            if self.late:  # every group goes out keyed (timed ahead), even with none formed
                self._form_keyed()
                if self.keyed:
                    continue
                break
            clients = self._draw()
            if clients is None:
                break
            self._dispatch(clients)
        if self.keys_ahead and not self.stalled and self.engine.round < self.cfg.server.rounds:
            self._form_keyed()

    def _recompute_restored(self) -> None:
        """With keys ahead, the groups restored in flight run their sessions again before
        any group agrees its keys: a client holds one session at a time (client/sessions.py),
        and a member freed early may be drawn into a group formed after the restore, whose
        session a recomputation at the old group's arrival would close."""
        if not self.keys_ahead or self.late:  # late: every session runs at its arrival
            return
        for unit in self.in_flight.values():
            if not unit.computed:
                self._compute(unit)

    def _form_keyed(self) -> None:
        """One group per slot agreeing its keys ahead; a group whose key agreement aborts
        (too few members left) is lost, never trained, and counted."""
        slots = self.concurrency // self.group
        if self.rolling:  # groups go out more often: one more agrees its keys ahead
            slots = -(-self.concurrency // self.group)
        for _ in range(slots):
            if len(self.keyed) >= slots:
                return
            clients = self._draw()
            if clients is None:
                return
            seq, self.next_seq = self.next_seq, self.next_seq + 1
            if self.late:  # timed now, agreed with the rest of its session at its arrival
                live, elapsed = self.runner.time_keys(seq, clients)
                if live is None:
                    self.window.aborted_groups += 1
                    continue
                ready = self.clock.now() + elapsed
                self.keyed.append(GroupKeyedAhead(seq, tuple(clients), ready, live=live))
                continue
            keys, elapsed = self.runner.agree_keys(seq, clients)
            if keys is None:
                self.window.aborted_groups += 1
                continue
            self.keyed.append(
                GroupKeyedAhead(seq, tuple(clients), self.clock.now() + elapsed, keys)
            )

    def _pool(self) -> Sequence[int]:
        """The clients a unit may be drawn from. (H4: on devices, DeviceScheduler in
        device_scheduler.py draws from those connected now.)"""
        return range(self.engine.task.num_clients)

    def _draw(self) -> list[int] | None:
        """G clients not in flight and under the participation cap (seeded draw; under
        DP keyed by the secret cohort key and the dispatch number)."""
        now = self.clock.now()
        busy = {c for u in self.in_flight.values() for c in u.busy(now)}
        busy.update(c for g in self.keyed for c in g.clients)
        cap = self.cfg.server.max_participations
        eligible = [
            c for c in self._pool() if c not in busy and (not cap or self.participations[c] < cap)
        ]
        if self.dp is not None:  # async DP: its durable per-client count is the cap's
            eligible = self.dp.eligible(eligible)
        if len(eligible) < self.group:
            return None
        if self.group_keys is not None:  # DP: the G smallest keyed uniforms
            u = self.group_keys.uniforms(GROUP_LABEL, self.next_seq, len(eligible))
            chosen = np.argpartition(u, self.group - 1)[: self.group]
        else:
            chosen = self.draw_rng.choice(len(eligible), size=self.group, replace=False)
        return sorted(eligible[int(i)] for i in chosen)

    def _dispatch_keyed(self, group: GroupKeyedAhead) -> None:
        """A group whose keys were agreed ahead: training goes out with masked input
        once the slot is free and the keys are agreed (whichever is later)."""
        unit = Dispatch(group.seq, group.clients, self.engine.round, self.clock.now())
        self.versions.setdefault(self.engine.round, self.engine.weights)
        self.participations.update(group.clients)
        start = unit.dispatched_at + max(0.0, group.keys_ready - unit.dispatched_at)
        ready = self._slots_for(unit.seq, unit.clients, start) if self.rolling else None
        if group.live is not None and ready is not None:  # late: computed at its arrival
            elapsed = self.runner.time_keyed_group(unit, group.live, start, ready)
            unit.arrival = start + elapsed
            self.in_flight[unit.seq] = unit
            self.clock.schedule(unit.seq, unit.arrival)
            self.totals["dispatched"] += 1
            return
        keys = group.keys
        if keys is None:  # restored from a checkpoint: the same stages, agreed again
            keys, _ = self.runner.agree_keys(group.seq, group.clients)
        elapsed = self.runner.run_keyed_group(
            unit, self.engine.weights, keys, start if self.free_early else None, ready
        )
        unit.arrival = start + elapsed
        self.in_flight[unit.seq] = unit
        self.clock.schedule(unit.seq, unit.arrival)
        self.totals["dispatched"] += 1

    def _dispatch(self, clients: list[int]) -> None:
        seq, self.next_seq = self.next_seq, self.next_seq + 1
        unit = Dispatch(seq, tuple(clients), self.engine.round, self.clock.now())
        self.versions.setdefault(self.engine.round, self.engine.weights)
        if self.dp is not None:  # counted durably BEFORE the model goes out
            for client in clients:
                self.dp.dispatch(client, self.engine.round)
        self.participations.update(clients)
        if self.secagg:
            start = unit.dispatched_at if self.free_early else None
            ready = self._slots_for(seq, unit.clients, unit.dispatched_at) if self.rolling else None
            latency = self.runner.run_group(unit, self.engine.weights, start, ready)
        else:
            timeout = self.cfg.server.round_timeout or None
            latency, unit.failed = plain_unit_fate(self.availability, seq, clients, timeout)
        unit.arrival = unit.dispatched_at + latency
        self.in_flight[seq] = unit
        self.clock.schedule(seq, unit.arrival)
        self.totals["dispatched"] += 1

    def _slots_for(self, seq: int, clients: Sequence[int], start: float) -> dict[int, float]:
        """Rolling dispatch: when each member's training slot comes free, from `start` (the
        session's first stage here): the slots free now (0), then the next free times of
        the members training now, earliest first, one member each (in client order, or
        with server.group_start_order = 'random' in an order drawn per dispatch `seq`).
        fill() dispatches only with a slot free and no member of an earlier group still
        waiting for one, so these free times are no other member's."""
        now = self.clock.now()
        free_now = self.concurrency - self.clients_in_flight()
        later = sorted(t for u in self.in_flight.values() for t in u.frees.values() if t > now)
        times = [now] * max(0, free_now) + later
        assert len(times) >= len(clients), "a group needs G <= C slots"
        order = self._start_order(seq, clients)
        return {c: max(0.0, t - start) for c, t in zip(order, times, strict=False)}

    def _start_order(self, seq: int, clients: Sequence[int]) -> list[int]:
        """The order in which a rolling group's members take the slots as they come free.
        By client id the same members of a group start last every time it forms, and
        with a release at R they are the ones left out: 'random' draws the order per
        dispatch (from the run seed; under DP from the secret cohort key, as the group)."""
        members = sorted(clients)
        if self.cfg.server.group_start_order != "random":
            return members
        if self.group_keys is not None:
            u = self.group_keys.uniforms(START_ORDER_LABEL, seq, len(members))
        else:
            u = np.random.default_rng([self.cfg.seed, START_ORDER_STREAM, seq]).random(len(members))
        return [members[int(i)] for i in np.argsort(u, kind="stable")]

    # -- arrivals -----------------------------------------------------------
    def deliver(self, seq: int) -> RoundRecord | None:
        """Unit `seq` came back: buffer its update (or drop it), and run the engine's
        server update once K are buffered (its record; None before)."""
        self._arrive(seq)
        if self._full():
            return self.engine.run_round()
        return None

    def _full(self) -> bool:
        return self.window.buffered >= self.cfg.server.buffer

    def _arrive(self, seq: int) -> None:
        """Unit `seq` came back: buffer its update, or drop it. A sequence number not in
        flight (a replay, or a reply from before a resume) is dropped and counted, never
        applied twice."""
        unit = self.in_flight.pop(seq, None)
        if unit is None:
            self.window.replays_dropped += 1
            log.warning("dispatch %d is not in flight (a replay or a late reply): dropped", seq)
            return
        if not unit.computed:
            self._compute(unit)
        self._receive(unit)
        self._forget_versions()
        if not self._full() and self.window.units >= self.stall_limit:
            self._stall()

    def _stall(self) -> None:
        """No server update after `stall_limit` units came back: the run stops, its
        last record saying what came back (a run that never applied anything is then a
        failed run, as a sync run whose every client failed)."""
        w = self.window
        record = RoundRecord(self.engine.round + 1, w.clients, 0, w.dropped_count, applied=False)
        record.extra.update(
            mode=self.cfg.server.mode,
            status="stalled",
            stale_dropped=w.stale_dropped,
            drops_by_reason=drops_by_reason(w.dropped),
        )
        self.engine.history.append(record)
        self.stalled = True
        self.engine.stopped_reason = (
            f"{w.units} dispatches came back after server update {self.engine.round} without "
            f"{self.cfg.server.buffer} usable updates (server.buffer): {w.dropped_count} "
            f"client failures, {w.stale_dropped} too stale (server.max_staleness); stopped"
        )
        if self.engine.first_client_error is None and w.dropped:
            self.engine.first_client_error = w.dropped[min(w.dropped)]

    def _compute(self, unit: Dispatch) -> None:
        """The unit's update, computed now: after a resume (never stored), or a unit in the
        clear together with every other one not computed yet (one exchange per version)."""
        if self.late:  # the whole session, each member on the model current at its start
            bases = {c: self._base_of(unit, c) for c in unit.clients}
            self.runner.run_late_group(unit, self.versions.__getitem__, bases)
            return
        if self.secagg:  # its arrival time stays the checkpoint's
            self.runner.run_group(unit, self.versions[unit.version])
            return
        pending = [u for u in self.in_flight.values() if not u.computed]
        self.runner.compute_plain([unit, *pending], self.versions.__getitem__)

    def _base_of(self, unit: Dispatch, client: int) -> int:
        """server.group_member_model = 'start': the version current when `client` started
        to train (the group's own for a member that started with it; a version applied at
        the very time a member starts is the one it downloads)."""
        start = unit.starts.get(client, unit.dispatched_at)
        if not start > unit.dispatched_at:
            return unit.version
        newer = [v for v, t in self.applied_at.items() if v >= unit.version and t <= start]
        return max([unit.version, *newer])

    def _receive(self, unit: Dispatch) -> None:
        w, outcome = self.window, unit.outcome
        w.clients += len(unit.clients)
        w.units += 1
        if isinstance(outcome, Aborted):
            w.aborted_groups += 1  # lost, never revealed
        if outcome is not None:
            w.dropped.update(outcome.dropped)
            w.dropped_count += len(outcome.dropped)
        if not isinstance(outcome, Aggregate) or not outcome.contributors:
            return
        # A group whose members trained on different versions (server.group_member_model =
        # 'start') is as stale as its oldest contributor's model: the sum is weighted so.
        bases = [unit.bases.get(c, unit.version) for c in outcome.contributors]
        tau = self.engine.round - min(bases)
        if too_stale(tau, self.cfg.server.max_staleness):
            w.stale_dropped += len(outcome.contributors)
            return
        w.buffer.append((outcome, tau))
        w.seqs.append(unit.seq)
        if unit.bases:
            w.member_staleness.extend(self.engine.round - b for b in bases)

    def _forget_versions(self) -> None:
        """Keep the weights of the versions units in flight downloaded, and no others."""
        used = {u.version for u in self.in_flight.values()}
        if self.late and used:  # a late member may start on any version since its group's
            used = {v for v in self.versions if v >= min(used)}
        for v in [v for v in self.versions if v not in used]:
            del self.versions[v]
        for v in [v for v in self.applied_at if v not in self.versions]:
            del self.applied_at[v]

    # -- one server update ---------------------------------------------------
    def admits_next(self) -> bool:
        return True  # the release mechanism's cap gates each dispatch instead

    def gather(self, round_num: int) -> Gathered | None:
        """Arrivals until K updates are buffered; the buffer's staleness-weighted sum.
        None: nothing more can arrive (every client capped, or stalled)."""
        while not self._full():
            self.fill()
            if self._member_freed():
                continue
            nxt = self.clock.next_arrival()
            if nxt is None or self.stalled:
                self._stop()
                return None
            self._arrive(nxt[1])
        self._applying, self.window = self.window, _Window()
        return self._sum(round_num, self._applying)

    def _stop(self) -> None:
        e = self.engine
        if e.stopped_reason is None:
            e.public_stop_reason = self._cap_reason(public=True)
            e.stopped_reason = self._cap_reason()
        log.warning(e.stopped_reason)

    def _sum(self, round_num: int, w: _Window) -> Gathered:
        """sum(s(tau_i) w_i delta_i) over the buffer, in arrival order (the same float
        sums on every run), as the one Aggregate the release step takes."""
        device = self.engine.weights.device
        total: torch.Tensor | None = None
        weight, loss_sum = 0.0, 0.0
        for agg, tau in w.buffer:
            part = agg.total.to(device) * staleness_weight(tau, self.cfg.server.staleness_exponent)
            total = part if total is None else total.add_(part)
            weight += agg.weight
            loss_sum += agg.loss * agg.weight
        assert total is not None
        contributors = [c for agg, _ in w.buffer for c in agg.contributors]
        record = RoundRecord(round_num, w.clients, len(contributors), w.dropped_count, False)
        record.extra["staleness"] = [tau for agg, tau in w.buffer for _ in agg.contributors]
        record.extra["applied_dispatches"] = list(w.seqs)
        if self.late:
            record.extra["member_staleness"] = list(w.member_staleness)
        got = Collected(agg=Aggregate(total, weight, contributors, loss_sum / weight))
        # Async DP: counts, staleness and losses go to the operator's annex only.
        annex = None if self.dp is None else {}
        return Gathered(record, got, w.started, annex)

    def after_apply(self, record: RoundRecord) -> None:
        """Replacements go out with the new version (before the checkpoint); the
        window's facts go on the record."""
        if self.late and self.in_flight:  # a late member may start on this version
            self.versions.setdefault(self.engine.round, self.engine.weights)
            self.applied_at[self.engine.round] = self.clock.now()
        self.fill()
        self._note_window(record, self._applying)

    def _note_window(self, record: RoundRecord, w: _Window) -> None:
        now = self.clock.now()
        self.totals.update(
            stale_dropped=w.stale_dropped,
            replays_dropped=w.replays_dropped,
            aborted_groups=w.aborted_groups,
            updates_applied=record.cohort_aggregated,
        )
        record.extra.update(
            mode=self.cfg.server.mode,
            status="applied",
            sim_time_s=round(now - self.last_apply_clock, 6),
            sim_clock_s=round(now, 6),
            in_flight=self.clients_training(),
            stale_dropped=w.stale_dropped,
            replays_dropped=w.replays_dropped,
            drops_by_reason=drops_by_reason(w.dropped),
        )
        if self.secagg:
            record.extra["aborted_groups"] = w.aborted_groups
        self.last_apply_clock = now
        if self.engine.first_client_error is None and w.dropped:
            self.engine.first_client_error = w.dropped[min(w.dropped)]

    # -- whole run ------------------------------------------------------------
    def begin(self) -> None:
        return None

    def end(self, failed: bool) -> None:
        return None

    def _cap_reason(self, public: bool = False) -> str:
        """Why nothing more can be dispatched: the cap, and what the clients' last
        dispatches brought back when it was only failures (a model gone NaN spends every
        client's cap on refused updates; the cap is then not the cause to fix).

        `public`: the reason the public ledger's final record states: the cap and the
        server updates only. Failure counts and a client's error are computed from the
        clients outside any accounted release; they stay in the operator's log and
        summary."""
        reason = (
            f"no client can be dispatched (server.max_participations = "
            f"{self.cfg.server.max_participations} reached); stopped after {self.engine.round} "
            "server updates"
        )
        if public:
            return reason
        w = self.window
        if w.units and w.dropped_count and not w.buffer:
            first = w.dropped[min(w.dropped)]
            reason += (
                f". The {w.units} dispatches that came back since then brought no update: "
                f"{w.dropped_count} client failures, e.g. {first}"
            )
        return reason

    def _member_freed(self) -> bool:
        """Free-early groups: move the clock to the next time a member stops training when
        that comes before the next arrival (then fill again); False when none does."""
        if not self.free_early:
            return False
        assert isinstance(self.clock, SimulatedClock)
        now = self.clock.now()
        frees = [t for u in self.in_flight.values() for t in u.frees.values() if t > now]
        arrival = self.clock.peek()
        if not frees or (arrival is not None and min(frees) > arrival):
            return False
        self.clock.advance(min(frees))
        return True

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "mode": self.cfg.server.mode,
            "concurrency": self.concurrency,
            "buffer": self.cfg.server.buffer,
            "group_size": self.group,
            "sim_clock_s": round(self.clock.now(), 6),
        }
        if self.dp is not None:
            # Async DP: counts reveal participation; the public bound instead.
            privacy = self.engine.privacy
            assert privacy is not None
            out.update(
                max_participations=privacy.config.max_participations,
                epsilon_cap_bound=self.dp.bound,
            )
            return out
        out.update(
            dispatched=self.totals["dispatched"],
            updates_applied=self.totals["updates_applied"],
            stale_dropped=self.totals["stale_dropped"],
            replays_dropped=self.totals["replays_dropped"],
        )
        return out

    # -- checkpoint -------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return {
            "async": {
                "clock": self.clock.state(),
                "next_seq": self.next_seq,
                "draw_rng": self.draw_rng.bit_generator.state,
                "participations": dict(self.participations),
                "in_flight": [u.to_state() for u in self.in_flight.values()],
                "keyed": [g.to_state() for g in self.keyed],
                "versions": {v: t.cpu() for v, t in self.versions.items()},
                "last_apply_clock": self.last_apply_clock,
                "totals": dict(self.totals),
                **({"applied_at": dict(self.applied_at)} if self.late else {}),
            }
        }

    def restore(self, state: dict[str, Any]) -> None:
        # Async DP: a release on the ledger after the checkpoint was lost in a crash (it
        # stays charged); the units in flight may have been in it, and are recomputed.
        # Distributed DP charged every group in flight when it was unmasked (at dispatch):
        # recomputing one is a new release, so always a new dispatch of its members.
        privacy = self.engine.privacy
        lost_release = (
            self.dp is not None
            and privacy is not None
            and (self.dp.charges_at_unmask or privacy.last_round > int(state["round"]))
        )
        a = state["async"]
        self.clock.restore(a["clock"])
        self.next_seq = int(a["next_seq"])
        self.draw_rng.bit_generator.state = a["draw_rng"]
        self.participations = Counter({int(c): int(n) for c, n in a["participations"].items()})
        device = self.engine.model.device
        self.versions = {int(v): t.to(device) for v, t in a["versions"].items()}
        self.in_flight = {}
        for s in a["in_flight"]:
            unit = Dispatch.from_state(s)
            if not self.secagg:  # the same dropouts as at dispatch
                timeout = self.cfg.server.round_timeout or None
                _, unit.failed = plain_unit_fate(self.availability, unit.seq, unit.clients, timeout)
            if lost_release and not self._recount(unit):
                continue  # a client past its cap: the unit is dropped, never recomputed
            self.in_flight[unit.seq] = unit
            self.clock.schedule(unit.seq, unit.arrival)
        self.keyed = [GroupKeyedAhead.from_state(g) for g in a.get("keyed", [])]
        self.last_apply_clock = float(a["last_apply_clock"])
        self.totals = Counter(a["totals"])
        self.applied_at = {int(v): float(t) for v, t in a.get("applied_at", {}).items()}

    def _recount(self, unit: Dispatch) -> bool:
        """Async DP after a lost release: a recomputed update counts as a new dispatch of
        each of its clients (it may have been in the lost release, which stays charged);
        False when that would pass a client's cap."""
        assert self.dp is not None
        if not all(self.dp.admits(c) for c in unit.clients):
            log.warning("dispatch %d: a client is at its participation cap; dropped", unit.seq)
            return False
        for client in unit.clients:
            self.dp.dispatch(client, unit.version)
        return True
