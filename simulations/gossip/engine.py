"""The gossip rounds: every client trains its own model, then mixes with its neighbours.

Contract. The clients' models are one stacked tensor x (clients x d), all
starting from the run's initial model (`initial_model`, as a coordinator run).
A round:
  0. wake: every client, or with gossip.active = k a fixed-size draw of k clients
     (randomized gossip: Boyd et al. 2006; AD-PSGD: Lian et al. 2018), from the run
     seed (no guarantee rests on it: DP-SGD is accounted as if every round trained
     every client), or from a 256-bit key from the OS CSPRNG when DP-SGD is on, as the
     coordinator draws its cohorts.
  1. train: each awake client's training request carries its own row; the replies come
     from the ClientRuntime through the in-process transport (the same path as a
     coordinator round, so vmap units, worker processes and DP-SGD apply unchanged).
     A client whose training fails keeps its model for the round.
  1b. momentum (gossip.momentum = beta > 0; simulations/gossip/momentum.py): each
     client that trained adds beta x its quasi-global momentum buffer to its row, and
     after mixing folds its row's displacement since it last trained into the buffer.
  2. mix: x <- W x with W the Metropolis-Hastings matrix of the graph, or, when only
     some clients woke, of its edges that touch an awake client (topology.active_mixing:
     still doubly stochastic) (mixing.mix; D-PSGD's adapt-then-combine order).
  3. record: consensus distance, the average model's test loss and accuracy, the
     accuracies of a fixed seeded subset of clients' own models (their spread), the
     bytes each client sent (its model to each neighbour it mixed with: float32, d x 4
     bytes each).
After the last round the consensus model is the exact average of the rows (what
an all-reduce of the clients' models gives); it is what is evaluated and saved.
"""

from __future__ import annotations

import math
import secrets
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import numpy as np
import torch

from fedveil.config import RunConfig
from fedveil.flat_model import FlatModel
from fedveil.model_evaluation import evaluate
from fedveil.protocol import fields as F
from fedveil.protocol.envelope import Envelope, MessageError
from fedveil.protocol.kinds import Kind
from fedveil.server.engine.requests import training_config
from fedveil.server.engine.rounds import initial_model
from fedveil.server.engine.sampling import CohortSampler, SecretCohortSampler
from fedveil.server.engine.transport import ClientFailure
from fedveil.simulations.gossip.mixing import average, consensus_distance, mix
from fedveil.simulations.gossip.momentum import QuasiGlobalMomentum
from fedveil.simulations.gossip.topology import (
    Mixing,
    active_mixing,
    build_graph,
    bytes_sent,
    metropolis_hastings,
)
from fedveil.tasks import Task


class Exchange(Protocol):
    """What the engine needs of a transport (InProcessTransport has it)."""

    def exchange(
        self, requests: Mapping[int, Envelope], timeout_s: float | None
    ) -> Mapping[int, Envelope | ClientFailure]: ...


@dataclass
class GossipRecord:
    """One round's measurements (a line of metrics.jsonl)."""

    round: int
    client_updates: int  # local trainings so far (the training compute spent)
    consensus_distance: float
    test_loss: float | None
    test_accuracy: float | None
    client_accuracy_min: float | None
    client_accuracy_median: float | None
    client_accuracy_max: float | None
    client_accuracy_std: float | None
    bytes_sent_per_node_mean: float
    bytes_sent_per_node_max: int
    bytes_sent_total: int
    clients_trained: int
    clients_failed: int
    train_loss: float | None
    wall_s: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    # What the progress bar reads of a RoundRecord (fedveil/cli/progress.py).
    @property
    def dropped(self) -> int:
        return self.clients_failed

    @property
    def extra(self) -> dict[str, Any]:
        return {}


def gossip_graph(cfg: RunConfig, n: int) -> Mixing:
    g = cfg.gossip
    return metropolis_hastings(build_graph(g.topology, n, g.degree, cfg.seed))


def waker(cfg: RunConfig, n: int) -> CohortSampler | SecretCohortSampler | None:
    """Who wakes each round; None: every client (gossip.active 0 or n)."""
    k = cfg.gossip.active
    if k == 0 or k >= n:
        return None
    if cfg.client.dp_sgd_noise > 0:
        return SecretCohortSampler(n, "fixed", k, 1.0, secrets.token_bytes(32))
    return CohortSampler(n, "fixed", k, 1.0, cfg.seed)


def spread_subset(cfg: RunConfig, n: int) -> list[int]:
    """The clients whose own models are scored each round: a seeded, fixed choice."""
    k = min(cfg.gossip.spread_clients, n)
    rng = np.random.default_rng([cfg.seed, 0x5B8EAD])
    return sorted(int(i) for i in rng.choice(n, size=k, replace=False))


class GossipEngine:
    """The rounds of a gossip run over one transport; `x` holds every client's model."""

    def __init__(
        self,
        cfg: RunConfig,
        task: Task,
        transport: Exchange,
        device: torch.device | str = "cpu",
        *,
        on_round: Callable[[GossipRecord], None] | None = None,
    ) -> None:
        self.cfg, self.task, self.transport = cfg, task, transport
        self.model = FlatModel(initial_model(task, cfg.seed), device)
        self.n = task.num_clients
        start = self.model.get().detach().cpu()
        self.x = start.unsqueeze(0).repeat(self.n, 1)  # one row per client
        self.mixing = gossip_graph(cfg, self.n)
        self.sent = bytes_sent(self.mixing, self.model.size)
        self.waker = waker(cfg, self.n)
        self.spread = spread_subset(cfg, self.n)
        self.config = training_config(cfg, None)
        self.on_round = on_round
        beta = cfg.gossip.momentum
        self.momentum = QuasiGlobalMomentum(beta, self.x) if beta > 0 else None
        self.round = 0
        self.client_updates = 0
        self.failures: list[str] = []  # the first few failures' causes
        self.history: list[GossipRecord] = []

    def run(self, rounds: int | None = None) -> None:
        for _ in range(rounds if rounds is not None else self.cfg.server.rounds):
            self.run_round()

    def run_round(self) -> GossipRecord:
        """Wake clients, train them, mix, record (one line of metrics.jsonl)."""
        t0 = time.perf_counter()
        self.round += 1
        if self.waker is None:
            half, done, losses = self.train(self.round, self.x)
            step, sent = self.mixing, self.sent
        else:
            awake = self.waker.sample()
            rows = torch.tensor(awake, dtype=torch.int64)
            half = self.x.clone()
            half[rows], done_k, losses = self.train(self.round, self.x[rows], awake)
            done = [awake[k] for k in done_k]
            step = active_mixing(self.mixing.graph, awake)
            sent = bytes_sent(step, self.model.size)
        trained = len(done)
        if self.momentum is None:
            self.x = mix(half, step)
        else:
            self.x = mix(self.momentum.push(half, done), step)
            self.momentum.update(self.x, done)
        record = self.measure(trained, losses, time.perf_counter() - t0, sent)
        self.history.append(record)
        if self.on_round is not None:
            self.on_round(record)
        return record

    def train(
        self, round_num: int, x: torch.Tensor, clients: Sequence[int] | None = None
    ) -> tuple[torch.Tensor, list[int], list[float]]:
        """x (the rows of `clients`, default all) after each one's local training (a
        failed client's row unchanged), and the positions in x of those that trained."""
        ids = range(self.n) if clients is None else clients
        out, done, losses = local_training(
            self.transport, self.config, round_num, ids, x, self.failures
        )
        self.client_updates += len(done)
        return out, done, losses

    def consensus(self) -> torch.Tensor:
        """The consensus model: the exact average of the clients' models."""
        return average(self.x)

    def measure(
        self, trained: int, losses: list[float], wall: float, sent: list[int]
    ) -> GossipRecord:
        test_loss = test_acc = None
        accs: list[float] = []
        if self.task.test_data is not None:
            tx, ty = self.task.test_data
            test_loss, test_acc, _ = evaluate(
                self.model, self.consensus(), tx, ty, self.task.loss_fn
            )
            m = self.cfg.gossip.spread_examples
            for cid in self.spread:
                accs.append(evaluate(self.model, self.x[cid], tx[:m], ty[:m], self.task.loss_fn)[1])
        return GossipRecord(
            round=self.round,
            client_updates=self.client_updates,
            consensus_distance=consensus_distance(self.x),
            test_loss=test_loss,
            test_accuracy=test_acc,
            client_accuracy_min=min(accs) if accs else None,
            client_accuracy_median=statistics.median(accs) if accs else None,
            client_accuracy_max=max(accs) if accs else None,
            client_accuracy_std=statistics.pstdev(accs) if accs else None,
            bytes_sent_per_node_mean=sum(sent) / self.n,
            bytes_sent_per_node_max=max(sent),
            bytes_sent_total=sum(sent),
            clients_trained=trained,
            clients_failed=(self.n if self.waker is None else self.waker.per_round) - trained,
            train_loss=statistics.fmean(losses) if losses else None,
            wall_s=wall,
        )


def local_training(
    transport: Exchange,
    config: Mapping[str, Any],
    round_num: int,
    clients: Sequence[int],
    rows: torch.Tensor,
    failures: list[str],
) -> tuple[torch.Tensor, list[int], list[float]]:
    """`rows` (one per client of `clients`, in order) after each client's local training,
    and the positions (in `clients`) of the clients that trained.

    Each client's request carries its own row; every row is a view of `rows`, so the
    in-process transport trains same-size clients as vmap units. A client that fails,
    or whose update is not finite, keeps its row (the first causes go to `failures`).
    """
    requests = {
        cid: Envelope(Kind.TRAIN, round_num, dict(config), {F.MODEL: rows[k]})
        for k, cid in enumerate(clients)
    }
    replies = transport.exchange(requests, None)
    out = rows.clone()
    done: list[int] = []
    losses: list[float] = []
    size = rows.shape[1]
    for k, cid in enumerate(clients):
        reply = replies.get(cid)
        try:
            if not isinstance(reply, Envelope):
                why = reply.reason if isinstance(reply, ClientFailure) else "no reply"
                raise MessageError(why)
            delta = reply.tensor(F.DELTA, numel=size)  # refuses NaN and infinity
        except MessageError as exc:
            if len(failures) < 5:
                failures.append(f"client {cid}: {exc}")
            continue
        out[k] += delta.to(out.device)
        done.append(k)
        loss = reply.config.get(F.LOSS)
        # A DP-SGD reply carries no loss the guarantee covers: none is recorded.
        if F.DP_SGD_NOISE not in config and isinstance(loss, float) and math.isfinite(loss):
            losses.append(loss)
    return out, done, losses
