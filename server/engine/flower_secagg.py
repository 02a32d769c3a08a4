"""Secure aggregation for a Flower Message-API strategy: a Grid that runs fedveil's protocol.

    strategy = FedAvg(...)
    strategy.start(grid=secure(grid, strategy), ...)      # + fedveil_secagg_mod on clients

`Strategy.start` sends one train exchange per round, so the protocol's extra stages
cannot come from wrapping configure_train / aggregate_train: this Grid intercepts the
strategy's train exchange instead and runs, with a cohort from fedveil's sampler, the
stages of fedveil's secure aggregation (server.engine.secagg_channel, the same code as
fedveil's own engine) over the wrapped Grid. It hands the strategy one reply, from a
surviving node, whose arrays are the model plus the securely aggregated mean update and
whose weighting metric is the total weight: the strategy's own aggregate_train (an
average; FedAvgM and FedOpt then step their optimizer) therefore gives what it would
give on the plain replies, up to the quantisation of the protocol. No node's update
reaches the server. Without DP the next round's cohort is drawn a round early and its
key stages ride on this round's exchanges (SecAggChannel's pipelining), so a steady
secure round is two exchanges; the last round's early key stages go unused.

The cohort's size is the strategy's own rule (FedAvg: max(int(n x fraction), min
nodes)) on the nodes connected when the exchange starts, and at least the number of
messages the strategy sent: FedAvg sizes its sample from the nodes connected when it
configures the round, before it waits for min_available_nodes, so a SuperNode that
registers in between would otherwise leave the exchange short of the nodes the
strategy asked for. While that size is under the protocol's 3 nodes (or over the
nodes connected), the exchange waits for nodes to connect, at most
`SecureSettings.node_wait_s` (30 s), then refuses as before (SecureAggregationRefused).

Federated evaluation runs the same way over the app's evaluate metrics (averaged inside
the protocol). Under DP (`FlowerDP`) every client weighs 1 whatever it reports, clips its
update to the clip norm, the server adds Gaussian noise to the unmasked sum and divides
by the sampled cohort size; cohorts come from a secret key (SecretCohortSampler), and
per-client metrics and federated evaluation are withheld.
"""

from __future__ import annotations

import copy
import logging
import math
import secrets
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict
from flwr.app.message_type import MessageType
from flwr.common.logger import log as flwr_log
from flwr.server import Grid
from flwr.supercore.run import Run

from fedveil.config import RunConfig, SecAggSection, load_config, to_toml
from fedveil.config.validator import build
from fedveil.privacy.dp.accounting import compute_epsilon
from fedveil.privacy.dp.central import add_gaussian_noise
from fedveil.privacy.dp.events import PrivacyEvent
from fedveil.privacy.dp.signing import load_or_create_signer
from fedveil.privacy.encodings import QuantizedEncoding
from fedveil.privacy.secagg import flower_run_id
from fedveil.protocol import flower_secagg_codec as codec
from fedveil.protocol.dp_rules import CENTRAL_GAUSSIAN, FIXED, REPLACE_ONE, default_accountant
from fedveil.protocol.envelope import Envelope, MessageError
from fedveil.protocol.fields import CLIP_NORM
from fedveil.protocol.kinds import TRAINING_STAGE, Kind
from fedveil.server.engine.aggregation import Aggregate
from fedveil.server.engine.central_release import CentralDP
from fedveil.server.engine.flower_secagg_strategies import check_strategy
from fedveil.server.engine.grid_replies import replies_as_they_arrive
from fedveil.server.engine.privacy_report import ledger_path, write_privacy_report
from fedveil.server.engine.runstore import RunStore
from fedveil.server.engine.sampling import CohortSampler, SecretCohortSampler
from fedveil.server.engine.secagg_channel import SecAggChannel
from fedveil.server.engine.transport import ClientFailure, ReplySink

log = logging.getLogger("fedveil.flower")

MIN_NODES = 3  # with 2, each would learn the other's update from the sum
NODE_POLL_S = 0.5  # how often a secure exchange short of nodes looks for more
MAX_NODE_WAIT_S = 3600.0  # the longest node_wait_s: a stuck run still ends
TRAIN_METRICS = ("train_loss",)  # Flower's quickstart apps' metric names
EVALUATE_METRICS = ("eval_loss", "eval_acc")


class SecureAggregationRefused(ValueError):
    """The app is set up so that no secure round can succeed (too few nodes, or clients
    without fedveil_secagg_mod): the run stops at the first exchange, saying the fix,
    instead of aborting every round and exiting 0."""


class BudgetExhausted(RuntimeError):
    """The next release would take the run past FlowerDP's epsilon budget: nothing more
    is released, and the strategy stops here."""


@dataclass(frozen=True)
class FlowerDP:
    """Central DP on the securely aggregated sum: each client's update clipped to L2 norm
    `clip`, the sum noised with N(0, (noise_multiplier * clip)^2), divided by the sampled
    cohort size. Accounted with fedveil.privacy.dp (fixed-size sampling, replace-one).

    `budget` (epsilon at `delta`): checked before each release; a release that would
    exceed it is not made (BudgetExhausted). 0: no budget (the spent epsilon is still
    logged each round).

    `out`: a run directory for the privacy record `fedveil simulate` keeps: the signed
    ledger (an entry written before each release), report.json / report.html, checked
    by `fedveil privacy verify OUT`. It needs a `budget`, and `rounds` (the strategy's
    num_rounds) to close the ledger as final after the last release."""

    clip: float
    noise_multiplier: float
    budget: float = 0.0
    delta: float = 1e-5
    out: str = ""
    rounds: int = 0

    def __post_init__(self) -> None:
        for name in ("clip", "noise_multiplier"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"FlowerDP.{name} = {value!r}: must be a finite number > 0")
        if not (isinstance(self.budget, (int, float)) and 0 <= self.budget < math.inf):
            raise ValueError(f"FlowerDP.budget = {self.budget!r}: must be finite, >= 0")
        if not (isinstance(self.delta, (int, float)) and 0 < self.delta < 1):
            raise ValueError(f"FlowerDP.delta = {self.delta!r}: must be in (0, 1)")
        if not (isinstance(self.rounds, int) and self.rounds >= 0):
            raise ValueError(f"FlowerDP.rounds = {self.rounds!r}: must be an int >= 0")
        if self.out and not (self.budget > 0 and self.rounds > 0):
            raise ValueError(
                f"FlowerDP.out = {self.out!r}: a signed ledger needs a budget (budget > 0) "
                "and the strategy's rounds (rounds = num_rounds)"
            )

    def run_config(self, cohort: int, population: int) -> RunConfig:
        """The run as fedveil's config states it: central DP on fixed-size cohorts of
        `cohort` from `population` nodes, under secure aggregation (what the ledger, the
        report and `privacy verify` read)."""
        return load_config(
            None,
            {
                "data.num_clients": population,
                "server.per_round": cohort,
                "server.sampling": "fixed",
                "server.rounds": max(self.rounds, 1),
                "secagg.enabled": True,
                "dp.mechanism": "central",
                "dp.clip": float(self.clip),
                "dp.noise_multiplier": float(self.noise_multiplier),
                "dp.epsilon": float(self.budget),
                "dp.delta": float(self.delta),
                "transport": "flower",
                "out": self.out,
            },
        )

    def epsilon(self, rounds: int, cohort: int, population: int, delta: float) -> float:
        """Epsilon at `delta` after `rounds` rounds of `cohort` clients sampled (fixed
        size, without replacement) from `population` nodes: user-level, replace-one, the
        sound accountant for fixed-size sampling (fedveil.privacy.dp)."""
        if not 1 <= cohort <= population:
            raise ValueError(f"cohort = {cohort}: must be in [1, population = {population}]")
        event = PrivacyEvent(
            self.noise_multiplier,
            cohort / population,
            steps=rounds,
            sampling=FIXED,
            neighbouring=REPLACE_ONE,
            population_size=population,
        )
        return compute_epsilon(
            [event],
            delta,
            default_accountant(CENTRAL_GAUSSIAN, FIXED, REPLACE_ONE),
            mechanism=CENTRAL_GAUSSIAN,
        )


@dataclass(frozen=True)
class SecureSettings:
    """The protocol's parameters on this path (see `secure`)."""

    clip_range: float = 8.0
    levels: int = 2**24
    max_weight: int = 10_000
    metric_range: float = 100.0
    train_metrics: tuple[str, ...] = TRAIN_METRICS
    evaluate_metrics: tuple[str, ...] = EVALUATE_METRICS
    dropout_rate: float = 0.1
    adversarial_rate: float = 0.05
    neighbors: int = 0  # 0: from the threat model (dropout and adversarial rates)
    threshold: int = 0
    seed: int = 0
    # How long an exchange short of nodes waits for more to connect before refusing.
    node_wait_s: float = 30.0

    def __post_init__(self) -> None:
        wait = self.node_wait_s
        if isinstance(wait, bool) or not (
            isinstance(wait, (int, float)) and 0 <= wait <= MAX_NODE_WAIT_S
        ):
            raise ValueError(
                f"node_wait_s = {wait!r}: must be a number of seconds in [0, {MAX_NODE_WAIT_S:g}]"
            )
        # The protocol's parameters, by the run config's own validator and limits
        # ([secagg]): refused here, by name, not in the first round on the nodes.
        build(
            SecAggSection,
            {
                "enabled": True,
                "clip_range": self.clip_range,
                "levels": self.levels,
                "max_weight": self.max_weight,
                "dropout_rate": self.dropout_rate,
                "adversarial_rate": self.adversarial_rate,
                "neighbors": self.neighbors,
                "threshold": self.threshold,
            },
            prefix="SecureSettings.",
        )
        if not (isinstance(self.metric_range, (int, float)) and 0 < self.metric_range < math.inf):
            raise ValueError(
                f"SecureSettings.metric_range = {self.metric_range!r}: must be finite and > 0"
            )
        if isinstance(self.seed, bool) or not (isinstance(self.seed, int) and self.seed >= 0):
            raise ValueError(f"SecureSettings.seed = {self.seed!r}: must be an integer >= 0")

    def section(self, dp: bool, pipeline: bool = False) -> SecAggSection:
        return SecAggSection(
            enabled=True,
            threat="semi_honest",
            adversarial_rate=self.adversarial_rate,
            dropout_rate=self.dropout_rate,
            neighbors=self.neighbors,
            threshold=self.threshold,
            clip_range=self.clip_range,
            levels=self.levels,
            max_weight=1 if dp else self.max_weight,
            pipeline=pipeline,
        )


class _Stages:
    """fedveil's Transport over a Flower Grid for one exchange of the strategy: each
    stage is a message of the strategy's type carrying fedveil's records, the
    masked-input stage also the strategy's own (model and config)."""

    def __init__(self, grid: Grid, app_content: RecordDict, mtype: str, group_id: str) -> None:
        self.grid, self.app_content, self.mtype, self.group_id = grid, app_content, mtype, group_id
        self.last_reply: Message | None = None

    def client_ids(self) -> Sequence[int]:
        return sorted(self.grid.get_node_ids())

    def exchange(
        self,
        requests: Mapping[int, Envelope],
        timeout_s: float | None,
        on_reply: ReplySink | None = None,
    ) -> dict[int, Envelope | ClientFailure]:
        """Every node's reply; with `on_reply`, each is handed to it as a pull brings it."""
        messages = []
        for node_id, env in requests.items():
            content = RecordDict(dict(self.app_content.items())) if _trains(env) else None
            messages.append(
                Message(
                    codec.pack(env, content),
                    dst_node_id=node_id,
                    message_type=self.mtype,
                    group_id=self.group_id,
                )
            )
        out: dict[int, Envelope | ClientFailure] = {}
        answered: set[int] = set()
        for reply in replies_as_they_arrive(self.grid, messages, timeout_s):
            node_id = reply.metadata.src_node_id
            if node_id not in requests or node_id in answered:
                continue
            answered.add(node_id)
            result = self._decode(node_id, reply)
            if on_reply is None:
                out[node_id] = result
            else:
                on_reply(node_id, result)
        for node_id in requests:
            if node_id not in answered:
                out[node_id] = ClientFailure(node_id, "no reply before the deadline")
        return out

    def _decode(self, node_id: int, reply: Message) -> Envelope | ClientFailure:
        if reply.has_error():
            return ClientFailure(node_id, f"client error: {reply.error.reason}")
        try:
            env = codec.unpack(reply.content)
        except MessageError as exc:
            return ClientFailure(node_id, str(exc))
        self.last_reply = reply
        return env

    def close(self) -> None:
        return None


def _trains(env: Envelope) -> bool:
    return env.kind == Kind.secagg(TRAINING_STAGE)


class SecAggGrid(Grid):
    """The wrapped Grid, with the strategy's train and evaluate exchanges run as fedveil's
    secure aggregation. Other messages pass through unchanged."""

    def __init__(
        self,
        grid: Grid,
        strategy: Any,
        settings: SecureSettings | None = None,
        dp: FlowerDP | None = None,
    ) -> None:
        check_strategy(strategy)
        # The strategy's own sampling rule per exchange (fraction, fewest nodes): FedAvg's
        # public parameters, which every strategy check_strategy admits has.
        self._sampling: dict[str, tuple[float, int]] = {
            MessageType.TRAIN: (float(strategy.fraction_train), int(strategy.min_train_nodes)),
            MessageType.EVALUATE: (
                float(strategy.fraction_evaluate),
                int(strategy.min_evaluate_nodes),
            ),
        }
        self.grid = grid
        self.settings = settings or SecureSettings()
        self.dp = dp
        self.strategy_weight_key = str(strategy.weighted_by_key)
        # What weighs a client inside the protocol ("": 1 each, under DP).
        self.weight_key = "" if dp is not None else self.strategy_weight_key
        self._channels: dict[str, SecAggChannel] = {}
        self._samplers: dict[tuple[str, int, int], CohortSampler | SecretCohortSampler] = {}
        self._drawn: dict[tuple[str, int, int], list[int]] = {}  # next cohort (node ids)
        # What each secure exchange gave: aggregated clients (None under DP), or aborted.
        self.rounds: list[dict[str, Any]] = []
        self.releases = 0  # DP releases made (each one charged)
        # Under DP, cohorts come from one secret key (OS CSPRNG), which the signed ledger
        # commits to when FlowerDP.out keeps one.
        self._cohort_key = secrets.token_bytes(32)
        self._stage: CentralDP | None = None

    # -- Grid, delegated ------------------------------------------------------------------
    @property
    def run(self) -> Run:
        return self.grid.run

    def set_run(self, run: Run) -> None:
        self.grid.set_run(run)

    def create_message(self, *args: Any, **kwargs: Any) -> Message:
        return self.grid.create_message(*args, **kwargs)

    def get_node_ids(self) -> Iterable[int]:
        return self.grid.get_node_ids()

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        return self.grid.push_messages(messages)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return self.grid.pull_messages(message_ids)

    # -- the strategy's exchanges -----------------------------------------------------------
    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        messages = list(messages)
        if not messages:
            return []
        types = sorted({str(m.metadata.message_type) for m in messages})
        purpose = types[0] if len(types) == 1 else None
        aggregated = (MessageType.TRAIN, MessageType.EVALUATE)
        if purpose not in aggregated:
            if purpose is None or purpose.split(".")[0] in aggregated:
                raise ValueError(
                    f"secure aggregation: one exchange of message types {types}; "
                    "it serves the strategy's plain 'train' and 'evaluate' exchanges"
                )
            return self.grid.send_and_receive(messages, timeout=timeout)
        metrics = (
            self.settings.train_metrics
            if purpose == MessageType.TRAIN
            else self.settings.evaluate_metrics
        )
        if self.dp is not None:
            if purpose == MessageType.EVALUATE:
                log.info("federated evaluation withheld under DP (per-client metrics)")
                return []
            metrics = ()
        elif purpose == MessageType.EVALUATE and not metrics:
            return []
        return self._secure(messages, purpose, tuple(metrics), timeout)

    def _secure(
        self,
        messages: list[Message],
        purpose: str,
        metrics: tuple[str, ...],
        timeout: float | None,
    ) -> list[Message]:
        content = messages[0].content
        if any(m.content is not content for m in messages[1:]):
            raise ValueError(
                "secure aggregation: the strategy sent different content to different nodes; "
                "it needs one model and config for the whole cohort"
            )
        model = _only(content.array_records, "ArrayRecord")
        server_round = int(_only(content.config_records, "ConfigRecord").get("server-round", 0))
        size = sum(int(a.numpy().size) for a in model.values()) if purpose == "train" else 0
        cohort, upcoming = self._cohort(purpose, len(messages))
        # Train and evaluate sessions are apart (channels, and client state stores).
        session_round = server_round
        fields: dict[str, Any] = {
            codec.PURPOSE: purpose,
            codec.WEIGHT_KEY: self.weight_key,
            codec.METRIC_RANGE: float(self.settings.metric_range),
        }
        if metrics:
            fields[codec.METRICS] = list(metrics)
        if self.dp is not None:
            fields[CLIP_NORM] = float(self.dp.clip)
        requests = {nid: Envelope(Kind.TRAIN, session_round, dict(fields)) for nid in cohort}
        stages = _Stages(
            self.grid,
            content,
            str(messages[0].metadata.message_type),
            messages[0].metadata.group_id,
        )
        channel = self._channel(purpose)
        result = channel.collect(stages, requests, size + len(metrics), timeout, upcoming)
        if not isinstance(result, Aggregate):
            _refuse_stock_clients(result.dropped.values())
            # Client errors name no one under DP (who dropped reveals participation).
            reasons = sorted(set(result.dropped.values()))[:3] if self.dp is None else []
            log.warning(
                "round %d: secure %s aborted, nothing released: %s%s",
                server_round,
                purpose,
                result.reason if self.dp is None else "(reason withheld under DP)",
                f"; client errors: {reasons}" if reasons else "",
            )
            self.rounds.append({"round": server_round, "purpose": purpose, "aborted": True})
            return []
        assert stages.last_reply is not None  # an aggregate needs replies
        # Under DP how many took part reveals participation: the operator gets no count.
        count = len(result.contributors) if self.dp is None else None
        self.rounds.append({"round": server_round, "purpose": purpose, "aggregated": count})
        # A reply of its own, addressed as a survivor's last reply was: the real one
        # stays as the wrapped Grid delivered it.
        content = self._content(purpose, model, result, size, metrics, len(cohort))
        return [Message(content=content, metadata=copy.deepcopy(stages.last_reply.metadata))]

    def _content(
        self,
        purpose: str,
        model: ArrayRecord,
        agg: Aggregate,
        size: int,
        metrics: tuple[str, ...],
        sampled: int,
    ) -> RecordDict:
        """The one reply the strategy aggregates: model + mean update, total weight."""
        total = agg.total.numpy().astype(np.float64)
        if self.dp is None:
            mean, weight = total / agg.weight, float(agg.weight)
        elif self.dp.out:  # the run's ledger: charged (budget first), then noised
            mean, weight = self._release(total[:size], sampled), 1.0
        else:  # noise on the sum, a fixed (public) denominator: the sampled cohort size
            self._charge(sampled)
            noised = add_gaussian_noise(total[:size], self.dp.noise_multiplier, self.dp.clip)
            mean, weight = noised.astype(np.float64) / sampled, 1.0
        values: dict[str, float] = {self.strategy_weight_key: weight}
        span = self.settings.metric_range / self.settings.clip_range
        for i, name in enumerate(metrics):
            values[name] = float(mean[size + i] * span)
        out = RecordDict({"metrics": MetricRecord(values)})
        if purpose == MessageType.TRAIN:
            out["arrays"] = ArrayRecord(_plus(model, mean[:size]))
        return out

    def _release(self, total: np.ndarray, sampled: int) -> np.ndarray:
        """FlowerDP with a run directory: the same central-DP stage as fedveil's engine
        (budget check, signed ledger entry, noise from the OS CSPRNG), then the report.
        The ledger closes final after FlowerDP.rounds releases, or when the budget stops
        the run."""
        assert self.dp is not None
        stage = self._dp_stage(sampled)
        allowed, spent = stage.admits_next_round()
        if not allowed:
            stage.close("final", stage.last_round, reason="budget")
            write_privacy_report(self.dp.out)
            raise BudgetExhausted(
                f"FlowerDP.budget = {self.dp.budget:g}: release {self.releases + 1} would "
                f"spend {spent:.4g} (delta {self.dp.delta:g}); nothing more is released"
            )
        agg = Aggregate(torch.from_numpy(total.astype(np.float32)), float(sampled), [], 0.0)
        release = stage.release(self.releases + 1, agg, total.size)
        self.releases += 1
        flwr_log(
            logging.INFO,
            "[fedveil] release %d: epsilon %.4g of %g (delta %g), ledger %s",
            self.releases,
            release.metrics["epsilon"],
            self.dp.budget,
            self.dp.delta,
            ledger_path(Path(self.dp.out)),
        )
        if self.releases >= self.dp.rounds:
            stage.close("final", self.releases)
        write_privacy_report(self.dp.out)
        return release.update.numpy().astype(np.float64)

    def _dp_stage(self, sampled: int) -> CentralDP:
        if self._stage is None:
            assert self.dp is not None
            population = len(list(self.grid.get_node_ids()))
            cfg = self.dp.run_config(sampled, population)
            store = RunStore(cfg.out)
            store.write_config(to_toml(cfg))
            self._stage = CentralDP(
                cfg,
                population,
                ledger_path(store.path),
                run_id=store.run_identity()["run_id"],
                signer=load_or_create_signer(None),
                private=store.append_private,
                cohort_key=self._cohort_key,
            )
        return self._stage

    def _charge(self, sampled: int) -> None:
        """Before a DP release: its epsilon, checked against the budget, then logged."""
        assert self.dp is not None
        population = len(list(self.grid.get_node_ids()))
        spent = self.dp.epsilon(self.releases + 1, sampled, population, self.dp.delta)
        if self.dp.budget and not (spent <= self.dp.budget):  # NaN fails closed
            raise BudgetExhausted(
                f"FlowerDP.budget = {self.dp.budget:g}: release {self.releases + 1} would "
                f"spend {spent:.4g} (delta {self.dp.delta:g}); nothing more is released"
            )
        self.releases += 1
        flwr_log(
            logging.INFO,
            "[fedveil] release %d: epsilon %.4g of %s (delta %g)",
            self.releases,
            spent,
            f"{self.dp.budget:g}" if self.dp.budget else "no budget",
            self.dp.delta,
        )

    def _pipelined(self, purpose: str) -> bool:
        """Whether the next round's key stages ride on this round's exchanges: training
        without DP (the next cohort then hears of its selection one round early)."""
        return purpose == MessageType.TRAIN and self.dp is None

    def _channel(self, purpose: str) -> SecAggChannel:
        if purpose not in self._channels:
            run_id = flower_run_id(int(self.grid.run.run_id))
            section = self.settings.section(self.dp is not None, self._pipelined(purpose))
            encoding = QuantizedEncoding(section.clip_range, section.levels, section.max_weight)
            self._channels[purpose] = SecAggChannel(
                section, encoding, run_id=run_id, quiet_counts=self.dp is not None
            )
        return self._channels[purpose]

    def _cohort(self, purpose: str, sent: int) -> tuple[list[int], list[int] | None]:
        """The cohort's node ids from fedveil's sampler (the strategy's own draw is
        ignored; its size: `_nodes`), and the next round's when pipelined (drawn now,
        assuming the same size: a round of another size discards the early key exchange
        and starts afresh)."""
        nodes, size = self._nodes(purpose, sent)
        key = (purpose, len(nodes), size)
        sampler = self._samplers.get(key)
        if sampler is None:
            if self.dp is not None:  # the OS CSPRNG's key: cohorts stay secret
                sampler = SecretCohortSampler(len(nodes), "fixed", size, 1.0, self._cohort_key)
            else:
                sampler = CohortSampler(len(nodes), "fixed", size, 1.0, self.settings.seed)
            self._samplers[key] = sampler
        drawn = self._drawn.pop(key, None)
        if drawn is None or not set(drawn) <= set(nodes):  # nodes came and went: draw anew
            drawn = [nodes[i] for i in sampler.sample()]
        if not self._pipelined(purpose):
            return drawn, None
        self._drawn[key] = [nodes[i] for i in sampler.sample()]
        return drawn, self._drawn[key]

    def _size(self, purpose: str, sent: int, connected: int) -> int:
        """The strategy's rule on the nodes connected now (FedAvg's configure_train:
        max(int(n x fraction), min nodes)), never fewer than the `sent` messages."""
        fraction, fewest = self._sampling[purpose]
        return max(sent, int(connected * fraction), fewest)

    def _nodes(self, purpose: str, sent: int) -> tuple[list[int], int]:
        """(the connected node ids, the cohort size) once the size is at least MIN_NODES
        and at most the nodes connected: waits for nodes to connect, at most
        settings.node_wait_s, then refuses (fails closed, naming the fix)."""
        deadline = time.monotonic() + self.settings.node_wait_s
        waited = False
        while True:
            nodes = sorted(self.grid.get_node_ids())
            size = self._size(purpose, sent, len(nodes))
            if MIN_NODES <= size <= len(nodes):
                return nodes, size
            left = deadline - time.monotonic()
            if not left > 0:
                break
            if not waited:
                flwr_log(
                    logging.INFO,
                    "[fedveil] secure %s: %d of %d nodes connected; waiting up to %.0f s for more",
                    purpose,
                    len(nodes),
                    max(size, MIN_NODES),
                    self.settings.node_wait_s,
                )
                waited = True
            time.sleep(min(NODE_POLL_S, left))
        have = min(size, len(nodes))
        if have < MIN_NODES:
            raise SecureAggregationRefused(
                f"secure aggregation needs at least {MIN_NODES} nodes per round; this "
                f"{purpose} exchange has {have} of {len(nodes)} connected "
                f"nodes (after waiting {self.settings.node_wait_s:g} s for more). Run more "
                "SuperNodes (`flwr run . --federation-config "
                f"num-supernodes={MIN_NODES}`, or options.num-supernodes in the federation), "
                "or let the strategy sample at least 3 (fraction_train, min_train_nodes)"
            )
        raise ValueError(
            f"secure aggregation: a cohort of {size} from {len(nodes)} nodes (after "
            f"waiting {self.settings.node_wait_s:g} s for more)"
        )


def _refuse_stock_clients(reasons: Iterable[str]) -> None:
    """A ClientApp without fedveil_secagg_mod runs its own train function on the
    protocol's key stages, which carry no 'arrays' record: every such client fails with
    KeyError 'arrays'. Say the fix once instead of aborting every round."""
    stock = [r for r in reasons if "KeyError" in r and "arrays" in r]
    if stock:
        raise SecureAggregationRefused(
            f"{len(stock)} clients answered secure aggregation's key stages with their own "
            "train function (KeyError 'arrays'): their ClientApp lacks fedveil_secagg_mod. "
            "Add it: `from fedveil.flower import fedveil_secagg_mod` and "
            "`app = ClientApp(mods=[fedveil_secagg_mod])`"
        )


def _plus(model: ArrayRecord, mean: np.ndarray) -> dict[str, Array]:
    """The model's arrays plus the mean update, in the dtypes plain FedAvg's average gives
    (float arrays keep theirs; integer buffers become float64). Integer buffers (counters
    such as BatchNorm's num_batches_tracked) are rounded to the nearest integer: the
    quantised mean lands a hair off, and a client loading 3.9999 into an int truncates."""
    out: dict[str, Array] = {}
    offset = 0
    for key, array in model.items():
        values = array.numpy()
        n = values.size
        new = values.astype(np.float64) + mean[offset : offset + n].reshape(values.shape)
        dtype = values.dtype if values.dtype.kind == "f" else np.dtype(np.float64)
        if values.dtype.kind in "iub":
            new = np.rint(new)
        out[key] = Array(np.array(new, dtype=dtype, order="C"))  # keeps 0-d shapes
        offset += n
    return out


def _only(records: Mapping[str, Any], kind: str) -> Any:
    values = list(records.values())
    if len(values) != 1:
        raise ValueError(f"secure aggregation: the strategy's message has {len(values)} {kind}s")
    return values[0]


def secure(
    grid: Grid,
    strategy: Any,
    *,
    dp: FlowerDP | None = None,
    **settings: Any,
) -> SecAggGrid:
    """`grid` with the strategy's rounds run under fedveil's secure aggregation (clients
    need `fedveil_secagg_mod`). `settings`: SecureSettings' fields (clip_range, levels,
    max_weight, metric_range, train_metrics, evaluate_metrics, dropout_rate,
    adversarial_rate, neighbors, threshold, seed, node_wait_s: how long an exchange
    short of nodes waits for more to connect). Refuses strategies that need each
    client's update (StrategyRefused)."""
    return SecAggGrid(grid, strategy, SecureSettings(**settings), dp)
