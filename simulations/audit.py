"""`fedveil privacy audit`: the configured training run again, with canary clients, and the
empirical epsilons they reveal.

Canaries: m Dirac canaries, each the clip norm on one coordinate of the update, at m
distinct coordinates drawn from a seed the auditor draws from the OS CSPRNG and never
writes down (`fedveil.privacy.audit.canaries`: exactly separable, one integer each; a
model of d parameters supports d of them, and more are refused). Each is inserted with
probability 1/2; the others are held out.
Inserted canaries are extra client ids of the simulated population, sampled like users
without changing the users' mechanism: under Poisson they get the users' rate q, under
fixed-size sampling the cohort grows in proportion. A canary's runtime is the ordinary
`ClientRuntime` with a declared `Trainer` that returns its direction scaled to the clip
norm (no training): the same request parsing, clipping, weighting and secure-aggregation
stages as every client, through the same round engine and update channel, in-process or on
Flower's simulation engine (where each worker's `AuditClientRuntime` hands canary ids to
the canary runtime).

Under distributed DP (zero-out adjacency) every canary is a client of the population: a
held-out canary is sampled like the others and takes part in secure aggregation with its
update zeroed, so its Skellam noise share is in the sum whether or not it is inserted
(the neighbouring runs differ in one client's update, not in who adds noise).

After the run each canary's statistic, fixed in advance, is the sum over rounds of the
released updates' projection on its coordinate (final minus initial model there), and
`fedveil.privacy.audit` turns the statistics into the verdict: the one-run f-DP test of
the ledger's own trade-off curve at 99% (with the ceiling this canary count reaches),
the Steinke-Nasr-Jagielski bound with its delta term as a second, conservative line,
and the one-shot estimate.

An audit is a run of its own: its directory is marked `audit: true`, and no model file is
written there, so its model can never be published. Audits run in simulation only.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedveil.client.runtime import ClientRuntime
from fedveil.client.training import LocalResult, LocalTraining, LossFn
from fedveil.config import RunConfig, config_from_dict, to_toml
from fedveil.flat_model import FlatModel
from fedveil.privacy.audit import (
    dirac_coordinates,
    estimate_epsilon,
    fdp_audit,
    one_run_lower_bound,
    projection_sums,
    supported_canaries,
)
from fedveil.privacy.audit.canaries import HELD_OUT, new_secret_seed
from fedveil.privacy.audit.fdp import CONFIDENCE
from fedveil.privacy.encodings import SkellamEncoding
from fedveil.protocol.dp_rules import CENTRAL_GAUSSIAN, PLD, sound_accountants
from fedveil.protocol.envelope import Envelope
from fedveil.protocol.kinds import Kind
from fedveil.server.engine.central_release import CentralDP
from fedveil.server.engine.lifecycle import RunLifecycle
from fedveil.server.engine.privacy_report import AUDIT_FILE, write_privacy_report
from fedveil.server.engine.release_mechanism import Release
from fedveil.server.engine.rounds import RoundEngine, RoundRecord
from fedveil.server.engine.runstore import RunStore
from fedveil.server.engine.transport import ClientFailure, ReplySink
from fedveil.simulations.inprocess import InProcessTransport
from fedveil.simulations.run_setup import prepare_task, resolve_device
from fedveil.tasks import ClientData, Task

log = logging.getLogger("fedveil.audit")

MIN_CANARIES = 4  # one guess each way (fdp.guesses_for)


class AuditRefused(ValueError):
    """An audit that must not run (or cannot be meaningful); the message names the field."""


@dataclass(frozen=True)
class AuditMechanism:
    """The auditor's seam onto the released noise, for tests and benchmarks that check the
    auditor has power: the ledger and report still claim the configured noise, but the
    released sum carries `noise_scale` times the noise actually drawn (0: none). Central DP,
    and distributed DP in-process (every client's Skellam share is drawn with `noise_scale`
    times its standard deviation; see `_cut_shares`). The default (1.0) is the honest
    mechanism, and the CLI never sets another."""

    noise_scale: float = 1.0

    def __post_init__(self) -> None:
        if not (self.noise_scale >= 0 and math.isfinite(self.noise_scale)):
            raise ValueError(f"noise_scale = {self.noise_scale}: must be a finite number >= 0")


class _ScaledNoise:
    """A CentralDP whose releases carry scaled noise; everything else (ledger, sampler,
    accountant) is the wrapped stage's own."""

    def __init__(self, inner: CentralDP, scale: float) -> None:
        self._inner, self._scale = inner, scale

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def release(self, round_num: int, agg: Any, model_size: int) -> Release | None:
        honest = self._inner.release(round_num, agg, model_size)
        if honest is None:
            return None
        expected = self._inner.expected_cohort
        total = torch.zeros(model_size) if agg is None else agg.total.detach().cpu().double()
        noise = honest.update.double() * expected - total
        update = ((total + self._scale * noise) / expected).to(honest.update.dtype)
        return Release(update, honest.metrics)


def _cut_shares(runtimes: Sequence[ClientRuntime], engine: RoundEngine, scale: float) -> None:
    """The distributed-DP side of AuditMechanism: the clients' and the server's run-constant
    Skellam parameters draw shares with `scale` times the honest standard deviation (they
    agree, so the protocol runs as ever), while the run's DP stage, and so its ledger and
    accountant, keep the honest plan and claim the configured z."""
    honest = runtimes[0].distributed_dp_plan()
    if honest is None:
        raise AuditRefused("AuditMechanism.noise_scale: the run has no distributed-DP plan")
    params = dataclasses.replace(
        honest.params, local_variance=honest.params.local_variance * scale**2
    )
    cut = dataclasses.replace(honest, params=params)
    for runtime in runtimes:
        runtime._dp_plan = cut  # the plan each client derived, cut
    engine.channel.encoding = SkellamEncoding(params)  # type: ignore[attr-defined]


@dataclass
class CanaryTrainer:
    """The canary clients' `Trainer`: the update is `norm` on the client's coordinate (its
    only 'example', see `canary_task`; HELD_OUT: a zero update); nothing is trained."""

    norm: float

    def __call__(
        self,
        model: FlatModel,
        global_vector: torch.Tensor,
        x: torch.Tensor,
        y: torch.Tensor,
        hp: LocalTraining,
        loss_fn: LossFn,
        generator: torch.Generator,
    ) -> LocalResult:
        delta = torch.zeros(global_vector.numel(), dtype=torch.float32, device=model.device)
        coordinate = int(x[0, 0])
        if coordinate != HELD_OUT:
            # Just inside the clip norm, so clipping leaves the canary exactly as it is.
            delta[coordinate] = self.norm * (1 - 1e-6)
        return LocalResult(delta, 1, 1, 0.0)


def canary_rows(coordinates: np.ndarray, inserted: np.ndarray, zero_out: bool) -> np.ndarray:
    """The canary clients' coordinates, one each: the inserted canaries'; under zero-out
    adjacency every canary, the held-out ones HELD_OUT (they take part and send their
    noise share, but their update is zeroed)."""
    if zero_out:
        return np.where(inserted, coordinates, HELD_OUT)
    return coordinates[inserted]


def canary_task(users: Task, coordinates: np.ndarray) -> Task:
    """The population the engine samples: the users, then one client per canary
    coordinate (ids users.num_clients + i, see `canary_rows`), whose single 'example' is
    its coordinate (one integer: no canary holds a model-sized vector)."""
    n = users.num_clients
    canaries = torch.from_numpy(np.asarray(coordinates, dtype=np.int64)).reshape(-1, 1)
    label = torch.zeros(1, dtype=torch.int64)  # shared: nothing reads or writes it

    def client_data(cid: int) -> ClientData:
        if cid < n:
            return users.client_data(cid)
        return ClientData(canaries[cid - n : cid - n + 1], label)

    sizes = None
    if users.client_sizes is not None:
        sizes = np.concatenate([users.client_sizes, np.ones(len(coordinates), dtype=np.int64)])
    return dataclasses.replace(
        users, num_clients=n + len(coordinates), client_data=client_data, client_sizes=sizes
    )


class CanaryTransport:
    """The users' in-process transport plus the canary clients, each answered by a
    `ClientRuntime` with the canary trainer. Records each round's cohort make-up."""

    def __init__(self, users: InProcessTransport, runtime: ClientRuntime, num_users: int) -> None:
        self.users, self.runtime, self.num_users = users, runtime, num_users
        self.states: dict[int, dict[str, Any]] = {}
        self.cohorts: dict[int, tuple[set[int], set[int]]] = {}  # round -> (users, canaries)

    def client_ids(self) -> Sequence[int]:
        return range(self.runtime.task.num_clients)

    def exchange(
        self,
        requests: Mapping[int, Envelope],
        timeout_s: float | None,
        on_reply: ReplySink | None = None,
    ) -> dict[int, Envelope | ClientFailure]:
        user_reqs = {c: m for c, m in requests.items() if c < self.num_users}
        canary_reqs = {c: m for c, m in requests.items() if c >= self.num_users}
        for cid, msg in requests.items():
            if msg.kind != Kind.EVALUATE:
                seen = self.cohorts.setdefault(msg.round, (set(), set()))
                seen[0 if cid < self.num_users else 1].add(cid)
        replies: dict[int, Envelope | ClientFailure] = {}
        if user_reqs:
            replies.update(self.users.exchange(user_reqs, timeout_s, on_reply=on_reply))
        for cid, msg in sorted(canary_reqs.items()):
            if msg.kind == Kind.EVALUATE:  # a canary has no data to evaluate on
                replies[cid] = ClientFailure(cid, "canary: no evaluation data")
                continue
            try:
                replies[cid] = self.runtime.handle(cid, msg, self.states.setdefault(cid, {}))
            except Exception as exc:
                replies[cid] = ClientFailure(cid, f"{type(exc).__name__}: {exc}")
        return replies

    def evaluate_central(
        self, weights: torch.Tensor, round_num: int, batch_size: int
    ) -> tuple[float, float, int] | None:
        return self.users.evaluate_central(weights, round_num, batch_size)

    def close(self) -> None:
        self.users.close()


class CohortRecorder:
    """Records each round's cohort make-up (users, canaries) from the requests a
    transport carries; everything else is the wrapped transport's own."""

    def __init__(self, inner: Any, num_users: int) -> None:
        self.inner, self.num_users = inner, num_users
        self.cohorts: dict[int, tuple[set[int], set[int]]] = {}  # round -> (users, canaries)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def client_ids(self) -> Sequence[int]:
        return self.inner.client_ids()

    def exchange(
        self,
        requests: Mapping[int, Envelope],
        timeout_s: float | None,
        on_reply: ReplySink | None = None,
    ) -> dict[int, Envelope | ClientFailure]:
        for cid, msg in requests.items():
            if msg.kind != Kind.EVALUATE:
                seen = self.cohorts.setdefault(msg.round, (set(), set()))
                seen[0 if cid < self.num_users else 1].add(cid)
        return self.inner.exchange(requests, timeout_s, on_reply=on_reply)

    def close(self) -> None:
        self.inner.close()


class AuditClientRuntime(ClientRuntime):
    """A Flower worker's runtime in an audit: the users' own ClientRuntime, which hands
    the canaries' ids to the canary runtime (`canaries`)."""

    def __init__(
        self,
        users: Task,
        canaries: ClientRuntime,
        device: torch.device | str,
        *,
        run_config: RunConfig,
    ) -> None:
        # The whole population's task (users' data for user ids): the client derives the
        # run's distributed-DP plan from the population size, as the server does.
        super().__init__(canaries.task, device, run_config=run_config)
        self.canaries, self.num_users = canaries, users.num_clients

    def handle(self, client_id: int, msg: Envelope, state: dict[str, Any]) -> Envelope:
        if client_id >= self.num_users:
            return self.canaries.handle(client_id, msg, state)
        return super().handle(client_id, msg, state)


class AuditRuntimeFactory:
    """Picklable: builds an AuditClientRuntime inside each Ray worker. It carries the
    canary seed into the simulation's own workers (never to a device or a file)."""

    def __init__(self, users_cfg: RunConfig, plan: AuditPlan, dim: int) -> None:
        self.users_cfg, self.audit_cfg, self.dim = users_cfg, plan.cfg, dim
        self._seed, self._inserted = plan.seed, plan.inserted

    def __repr__(self) -> str:
        return "AuditRuntimeFactory(<secret canaries>)"

    def __call__(self) -> ClientRuntime:
        from fedveil.simulations.ray_cluster import ray_client_device
        from fedveil.tasks import make_task

        users = make_task(self.users_cfg)
        coordinates = dirac_coordinates(self._seed, self._inserted.size, self.dim)
        rows = canary_rows(
            coordinates, self._inserted, self.audit_cfg.dp.mechanism == "distributed"
        )
        task = canary_task(users, rows)
        canaries = ClientRuntime(
            task,
            "cpu",
            run_config=self.audit_cfg,
            trainer=CanaryTrainer(self.audit_cfg.dp.clip_norm),
        )
        device = ray_client_device(self.audit_cfg.simulation.client_gpus)
        return AuditClientRuntime(users, canaries, device, run_config=self.audit_cfg)


@dataclass
class AuditPlan:
    """Who the canaries are (secret) and the config the audit run runs under."""

    cfg: RunConfig
    users: int
    inserted: np.ndarray  # bool per canary: inserted (True) or held out
    seed: int = field(repr=False)  # the auditor's secret: never logged or written
    per_round: int
    rate: float
    zero_out: bool = False  # distributed DP: held-out canaries take part with a zero update

    @property
    def population_canaries(self) -> int:
        """Canary clients in the sampled population (all of them under zero-out)."""
        return int(self.inserted.size if self.zero_out else self.inserted.sum())


def plan_audit(
    cfg: RunConfig, users: int, canaries: int, *, out: str, dim: int | None = None
) -> AuditPlan:
    """The audit run's config: the population grows by the inserted canaries and the
    users' sampling is unchanged. Refuses (naming the field) what cannot be audited,
    including more canaries than the model's `dim` parameters can keep apart."""
    if canaries < MIN_CANARIES:
        raise AuditRefused(
            f"audit.canaries = {canaries}: must be >= {MIN_CANARIES} (one guess each way)"
        )
    if dim is not None and canaries > supported_canaries(dim):
        raise AuditRefused(
            f"audit.canaries = {canaries}: the model has {dim} parameters, so it supports at "
            f"most {supported_canaries(dim)} canaries (each needs a coordinate of its own; "
            "more cannot be kept apart, and canaries that interfere pass a mechanism with "
            "far too little noise). Use --canaries <= "
            f"{supported_canaries(dim)}; the ceiling printed by the audit says what that "
            "canary count can refute"
        )
    if cfg.audit.target != "simulation":
        raise AuditRefused(
            f"audit.target = {cfg.audit.target!r}: an audit against real devices is a further "
            "release of their data and is refused; audits run in simulation"
        )
    if cfg.secagg.enabled and cfg.secagg.threat == "malicious":
        raise AuditRefused("secagg.threat = 'malicious': canaries have no identity keys")
    seed = new_secret_seed()
    rng = np.random.default_rng(np.random.SeedSequence(secrets.randbits(128)))
    inserted = rng.random(canaries) < 0.5
    zero_out = cfg.dp.mechanism == "distributed"
    m_in = canaries if zero_out else int(inserted.sum())  # canary clients in the population
    values = cfg.to_dict()
    values["out"] = out
    values["data"]["num_clients"] = users + m_in
    values["simulation"]["workers"] = 1
    values["simulation"]["dropout"] = 0.0
    values["eval"]["federated_every"] = 0  # canaries hold no data to evaluate on
    s = cfg.server
    if s.sampling == "poisson":
        rate = cfg.poisson_rate
        values["server"]["sample_rate"] = rate  # the users' q, whatever the population
        per_round = s.per_round
    else:
        per_round = min(users + m_in, round(s.per_round * (users + m_in) / users))
        values["server"]["per_round"] = per_round
        rate = per_round / (users + m_in)
    never = (1 - rate) ** s.rounds
    if never > 0.5:
        field_name = "server.sample_rate" if s.sampling == "poisson" else "server.per_round"
        raise AuditRefused(
            f"server.rounds = {s.rounds} with {field_name} (rate {rate:.3g}): a canary goes "
            f"unsampled with probability {never:.2f}; most canaries would get no chance to be "
            "sampled (need <= 0.5: more rounds or a higher rate)"
        )
    audit_cfg = config_from_dict(_without_none(values))
    return AuditPlan(audit_cfg, users, inserted, seed, per_round, rate, zero_out)


def _without_none(values: dict[str, Any]) -> dict[str, Any]:
    return {
        k: _without_none(v) if isinstance(v, dict) else v
        for k, v in values.items()
        if v is not None
    }


def run_audit(
    cfg: RunConfig,
    *,
    canaries: int,
    out: str | Path,
    mechanism: AuditMechanism | None = None,
    confidence: float = CONFIDENCE,
) -> dict[str, Any]:
    """Run `cfg` with `canaries` canaries into the audit directory `out`; write and return
    privacy/audit.json's content. `mechanism`: the test seam (see AuditMechanism)."""
    start = time.perf_counter()
    device = resolve_device(cfg.device)
    prepared = prepare_task(cfg, device, {})
    users_task = prepared.task
    model_size = sum(p.numel() for p in users_task.model_fn().parameters())
    plan = plan_audit(prepared.cfg, users_task.num_clients, canaries, out=str(out), dim=model_size)
    store = RunStore(str(out))
    store.clear()
    store.write_config(to_toml(plan.cfg))
    t_directions = time.perf_counter()
    coordinates = dirac_coordinates(plan.seed, canaries, model_size)
    t_run = time.perf_counter()
    task = canary_task(users_task, canary_rows(coordinates, plan.inserted, plan.zero_out))
    run = RunLifecycle(plan.cfg, task, store, device=device)
    cut_shares: float | None = None
    if mechanism is not None and mechanism.noise_scale != 1.0:
        dp_mechanism = plan.cfg.dp.mechanism
        if dp_mechanism == "distributed" and plan.cfg.transport != "flower":
            cut_shares = mechanism.noise_scale
        elif run.privacy is None or dp_mechanism != "central":
            raise AuditRefused(
                "AuditMechanism.noise_scale: needs dp.mechanism = 'central', or "
                "'distributed' in-process"
            )
        else:
            run.privacy = _ScaledNoise(run.privacy, mechanism.noise_scale)  # type: ignore[assignment]
    clip = plan.cfg.dp.clip_norm
    runtime = ClientRuntime(task, "cpu", run_config=plan.cfg, trainer=CanaryTrainer(clip))
    # The released model before the first round and after the last: the statistic
    # telescopes, so no per-round copy of the model is kept. The rounds are counted.
    snapshots: list[np.ndarray] = []
    rounds: list[int] = []
    built: list[RoundEngine] = []

    def snapshot(record: RoundRecord) -> None:
        rounds.append(record.round)
        snapshots[1:] = [built[0].weights.detach().cpu().double().numpy().copy()]

    def build(transport: Any) -> RoundEngine:
        # An audit publishes no model: its ledger binds none.
        built.append(run.engine(transport, on_round=snapshot, resume=False, publish_model=False))
        snapshots.append(built[0].weights.detach().cpu().double().numpy().copy())
        return built[0]

    recorder: CanaryTransport | CohortRecorder
    if plan.cfg.transport == "flower":
        from fedveil.simulations.flower_runner import run_on_flower

        factory = AuditRuntimeFactory(prepared.cfg, plan, model_size)
        holder: list[CohortRecorder] = []

        def build_on_flower(transport: Any) -> RoundEngine:
            holder.append(CohortRecorder(transport, users_task.num_clients))
            return build(holder[0])

        summary = run_on_flower(
            plan.cfg, task.num_clients, build_on_flower, runtime_factory=factory
        )["summary"]
        recorder = holder[0]
    else:
        # The population's task: users' runtimes derive the distributed-DP plan from it.
        with InProcessTransport(task, device, workers=1, run_config=plan.cfg) as inner:
            recorder = CanaryTransport(inner, runtime, users_task.num_clients)
            engine = build(recorder)
            if cut_shares is not None:
                assert inner.lane is not None  # one worker: the users' runtime is here
                _cut_shares([inner.lane.runtime, runtime], engine, cut_shares)
            summary = engine.run()
    t_analysis = time.perf_counter()
    result = _analyse(plan, coordinates, snapshots, len(rounds), recorder, run, confidence)
    end = time.perf_counter()
    result["wall_s"] = round(end - start, 3)
    # Where an audit's time goes (the cost of canaries: their coordinates, the run, the scoring).
    result["timings_s"] = {
        "canaries": round(t_run - t_directions, 3),
        "run": round(t_analysis - t_run, 3),
        "analysis": round(end - t_analysis, 3),
    }
    summary.update(audit=True, wall_s=result["wall_s"], out=str(out))
    store.write_summary(summary)
    if run.privacy is not None:
        # Under DP how many users each cohort held is participation: the operator's
        # private annex only, never privacy/ (docs/explanation/trust-model.md).
        private = store.private_dir / "audit_cohorts.json"
        private.write_text(json.dumps(result.pop("cohorts"), indent=2) + "\n")
        private.chmod(0o600)
        result["cohorts"] = []
        result["cohorts_private"] = str(Path("private") / "audit_cohorts.json")
    path = store.path / AUDIT_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    # The one report writer joins audit.json to what the ledger proves (a run without DP
    # has no ledger: its report holds the audit alone), as `fedveil privacy report` does.
    write_privacy_report(store.path, run.privacy.config if run.privacy is not None else None)
    return result


def _analyse(
    plan: AuditPlan,
    coordinates: np.ndarray,
    snapshots: list[np.ndarray],
    rounds: int,
    transport: CanaryTransport | CohortRecorder,
    run: RunLifecycle,
    confidence: float,
) -> dict[str, Any]:
    if rounds == 0 or len(snapshots) < 2:
        raise AuditRefused("the audit run released no round: nothing to score")
    delta = plan.cfg.dp.delta
    scores = projection_sums(coordinates, snapshots[0], snapshots[-1])
    inserted = plan.inserted
    m = int(inserted.size)
    estimate = None
    if inserted.sum() >= 2 and (~inserted).sum() >= 2:
        estimate = estimate_epsilon(scores[inserted], scores[~inserted], delta).to_json()
    accounted = None if run.privacy is None else float(run.privacy.epsilon())
    fdp: dict[str, Any] | None = None
    if run.privacy is not None:
        events, accountant = claim_of(run, plan.cfg)
        fdp = fdp_audit(scores, inserted, events, delta, accountant, confidence=confidence)
        fdp = fdp.to_json() | {"accountant": accountant}
    steinke = one_run_lower_bound(
        scores, inserted, confidence=confidence, delta=delta if run.privacy is not None else 0.0
    ).to_json()
    lower = float(fdp["lower_bound_epsilon"]) if fdp is not None else float(steinke["epsilon"])
    refuted = fdp is not None and bool(fdp["refuted"])
    result: dict[str, Any] = {
        "audit": True,
        "accounted_epsilon": accounted,
        "delta": delta if run.privacy is not None else None,
        "statistic": "sum over rounds of each Dirac canary's projection (final - initial)",
        "estimated_epsilon": None if estimate is None else estimate["epsilon"],
        "estimated_epsilon_interval": None if estimate is None else estimate["interval"],
        "estimate": estimate,
        "lower_bound_epsilon": lower,
        "lower_bound_confidence": confidence,
        "lower_bound_method": "f-DP" if fdp is not None else "Steinke-Nasr-Jagielski",
        "ceiling_epsilon": None if fdp is None else fdp["ceiling_epsilon"],
        "fdp": fdp,
        "steinke": steinke,
        "canaries": m,
        "canaries_supported": supported_canaries(int(snapshots[0].size)),
        "canaries_inserted": int(inserted.sum()),
        "canaries_held_out": int((~inserted).sum()),
        "users": plan.users,
        "sampling": plan.cfg.server.sampling,
        "sampling_rate": plan.rate,
        "rounds": rounds,
        # Data-independent: the share a cohort holds in expectation (q is the same for
        # users and canaries). Realised cohorts reveal participation: see cohort_rows.
        "canary_share_expected": plan.population_canaries / (plan.users + plan.population_canaries),
        # Zero-out adjacency (distributed DP): held-out canaries are sampled too and send
        # their noise share with a zero update.
        "held_out_canaries_take_part": plan.zero_out,
        "cohorts": cohort_rows(transport, plan),
        "histograms": {"projection_sum": _histograms(scores, inserted)},
        "refuted": refuted,
        "verdict": verdict(accounted, fdp, steinke),
    }
    return result


def claim_of(run: RunLifecycle, cfg: RunConfig) -> tuple[list[Any], str]:
    """The ledger's claim as the audit tests it: the run's privacy events, and the
    accountant whose profile gives the trade-off curve (the PLD for central DP wherever
    it models the sampling, else the run's own sound accountant, e.g. skellam_rdp)."""
    assert run.privacy is not None
    budget = run.privacy.budget
    events = list(budget.history)
    sampling, neighbouring = events[0].sampling, events[0].neighbouring
    # Sound for the central Gaussian's sampled events: PLD composes Poisson events only
    # (DP-FTRL's fixed-cohort rows name PLD too, but for one Gaussian, not a composition).
    sound = sound_accountants(CENTRAL_GAUSSIAN, sampling, neighbouring)
    if cfg.dp.mechanism == "central" and PLD in sound:
        return events, PLD
    return events, budget.accountant


def cohort_rows(
    transport: CanaryTransport | CohortRecorder, plan: AuditPlan
) -> list[dict[str, Any]]:
    """Each round's users, canaries and canary share, as the audit's transport saw them;
    under zero-out also how many of the canaries were held out (zero update, noise share)."""
    rows = []
    for r, (u, c) in sorted(transport.cohorts.items()):
        row: dict[str, Any] = {
            "round": r,
            "users": len(u),
            "canaries": len(c),
            "canary_share": len(c) / max(1, len(u) + len(c)),
        }
        if plan.zero_out:
            row["canaries_held_out"] = sum(not plan.inserted[cid - plan.users] for cid in c)
        rows.append(row)
    return rows


def verdict(
    accounted: float | None, fdp: Mapping[str, Any] | None, steinke: Mapping[str, Any]
) -> str:
    """The audit's finding in plain sentences: the f-DP test of the claim, and the most
    this audit could ever refute."""
    if accounted is None or fdp is None:
        return (
            "no accounted epsilon: this run has no DP, so there is no claim to test; the "
            f"Steinke-Nasr-Jagielski lower bound is {float(steinke['epsilon']):.3g}"
        )
    level = f"{float(fdp['confidence']):.0%}"
    seen = (
        f"{fdp['correct']} of {fdp['guesses']} guesses right, which the claimed mechanism "
        f"allows with probability at most {float(fdp['p_value']):.3g}"
    )
    ceiling = float(fdp["ceiling_epsilon"])
    limit = f"this audit cannot refute any epsilon above {ceiling:.3g} with {fdp['canaries']} "
    limit += "canaries"
    if ceiling <= accounted:
        limit += (
            f", so it cannot refute this claim (epsilon {accounted:.3g}) whatever the "
            "mechanism does: more canaries raise the ceiling"
        )
    if fdp["refuted"]:
        return (
            f"REFUTED at {level}: {seen}; the running mechanism does not deliver the "
            f"accounted epsilon {accounted:.3g} (it leaks at least as much as a claim of "
            f"epsilon {float(fdp['lower_bound_epsilon']):.3g}). {limit[0].upper()}{limit[1:]}."
        )
    return (
        f"consistent at {level}: {seen} (the lower bound {float(fdp['lower_bound_epsilon']):.3g}"
        f" does not exceed the accounted epsilon {accounted:.3g}). "
        f"{limit[0].upper()}{limit[1:]}."
    )


def _histograms(scores: np.ndarray, inserted: np.ndarray, bins: int = 30) -> dict[str, Any]:
    edges = np.histogram_bin_edges(scores, bins=bins)
    return {
        "edges": [float(e) for e in edges],
        "inserted": [int(c) for c in np.histogram(scores[inserted], edges)[0]],
        "held_out": [int(c) for c in np.histogram(scores[~inserted], edges)[0]],
    }
