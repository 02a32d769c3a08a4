"""One lane of the in-process engine: clients run one after another on one model.

A lane is a ClientRuntime plus the clients' state between messages (e.g.
secure-aggregation keys). State older than the previous round is dropped when
the round changes, so memory is bounded by two cohorts, never by the
population.

A unit of several same-size clients' training requests (see `plan_units`) can
be trained at once (simulations/batched.py); each client's message then still
goes through the ClientRuntime, which finds its training already done.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from fedveil.client.runtime import (
    TRAIN_FIELDS,
    ClientRuntime,
    IdentitySource,
    client_generator,
    parse_training,
)
from fedveil.client.sessions import ClientStates
from fedveil.client.training import LocalResult, LocalTraining, LossFn, train_local
from fedveil.config import RunConfig
from fedveil.config.async_mode import rounds_are_dispatches
from fedveil.flat_model import FlatModel
from fedveil.model_evaluation import evaluate_batches
from fedveil.privacy.secagg import SIMULATION_RUN_ID
from fedveil.protocol import fields as F
from fedveil.protocol.envelope import Envelope
from fedveil.protocol.kinds import Kind
from fedveil.protocol.piggyback import latest_round
from fedveil.simulations.batched import BatchedTrainer
from fedveil.simulations.poisoning import attack_plan
from fedveil.tasks import ClientData, PartitionedData, Task

log = logging.getLogger("fedveil.inprocess")

Unit = list[tuple[int, Envelope]]
# The server's own evaluation of a slice of the test set, run by a worker between rounds.
CENTRAL_EVAL = "server.evaluate"
# A training request may be batched only when the trainer knows every field in it: a
# field added later (DP-SGD settings, say) sends it through the ClientRuntime's own path.
BATCHABLE_FIELDS = frozenset(name for name, _ in TRAIN_FIELDS) | {F.SEED}


def plan_units(
    requests: Sequence[tuple[int, Envelope]],
    sizes: np.ndarray | None,
    seen: set[int] | frozenset[int],
    unit_size: int,
) -> list[Unit]:
    """Split an exchange's requests into units; only same-size fresh training requests share one.

    The split depends only on the requests, the clients' sizes, which clients were
    already contacted this round and `unit_size`: never on workers or timing, so
    a client's result is the same whoever runs its unit.
    """
    units: list[Unit] = []
    groups: dict[tuple, Unit] = {}
    # A cohort's requests usually share one config dict: its key is worked out once
    # (this runs on the server while every worker waits for its first unit).
    config_keys: dict[int, tuple] = {}
    for cid, msg in sorted(requests, key=lambda r: r[0]):
        if unit_size > 1 and sizes is not None and cid not in seen and _batchable(msg):
            # Not the round: async dispatches of one model version share a unit, each
            # with its own round (sequence number) and so its own generator.
            config_key = config_keys.get(id(msg.config))
            if config_key is None:
                config_key = config_keys[id(msg.config)] = _config_key(msg)
            key = (int(sizes[cid]), _model_key(msg), config_key)
            groups.setdefault(key, []).append((cid, msg))
        else:
            units.append([(cid, msg)])
    for group in groups.values():
        units.extend(_split(group, unit_size))
    # Larger units first: the small ones fill the gaps at the end of an exchange.
    units.sort(key=lambda u: (-len(u), u[0][0]))
    return units


def _split(group: Unit, unit_size: int) -> list[Unit]:
    """Near-equal units of at most `unit_size`; at least 4 when there are 8 clients per unit
    to be had, so that a few workers share even a small cohort evenly."""
    n = len(group)
    count = max(-(-n // unit_size), min(4, -(-n // 8)))
    bounds = [round(i * n / count) for i in range(count + 1)]
    return [group[a:b] for a, b in itertools.pairwise(bounds)]


def _batchable(msg: Envelope) -> bool:
    return (
        msg.kind == Kind.TRAIN
        and set(msg.arrays) == {F.MODEL}
        and msg.config.keys() <= (BATCHABLE_FIELDS)
    )


def _model_key(msg: Envelope) -> int:
    """Requests share a unit when their models share one tensor's storage: the same
    global model, or rows of one stacked (clients x d) tensor (gossip: each client's own)."""
    model = msg.arrays[F.MODEL]
    if isinstance(model, torch.Tensor):
        return model.untyped_storage().data_ptr()
    return id(model)


def _config_key(msg: Envelope) -> tuple:
    return tuple(sorted((k, repr(v)) for k, v in msg.config.items()))


def _client_seed(msg: Envelope, cid: int) -> int:
    seed = msg.config.get(F.SEED, 0)
    seed = seed if isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0 else 0
    state = np.random.SeedSequence([seed, msg.round, cid, 0x6C0BA1]).generate_state(2)
    return int(state[0]) << 32 | int(state[1])


class SequentialClients:
    def __init__(
        self,
        task: Task,
        device: torch.device | str = "cpu",
        *,
        unit_size: int = 1,
        identities: IdentitySource | None = None,
        run_id: bytes = SIMULATION_RUN_ID,
        run_config: RunConfig | None = None,
    ) -> None:
        """`run_id`, `run_config`: what the clients hold fixed for the run (ClientRuntime)."""
        self.task = task
        keep_data_on(task, device)
        self._fetched: dict[int, ClientData] = {}  # data loaded for a unit, used once
        # The runtime reads client data through the lane, so a unit's data is loaded once,
        # and trains through it, so a client of a unit trained at once gets its result.
        self.runtime = ClientRuntime(
            dataclasses.replace(task, client_data=self._data),
            device,
            identities,
            run_id=run_id,
            run_config=run_config,
            trainer=self._train,
        )
        self._done: dict[int, LocalResult] = {}  # a unit's results, until its clients ask
        self._replay: LocalResult | None = None
        # Each client's store between messages (async: kept by dispatch, not round).
        self._states = ClientStates(retire_by_round=not rounds_are_dispatches(run_config))
        # [poisoning]: which clients attack, and how (None: every client is honest).
        self.attack = attack_plan(run_config, task)
        self._client: int | None = None  # the client whose message is being handled
        device = self.runtime.model.device
        self._devices = [device] if device.type == "cuda" else []
        self.batcher: BatchedTrainer | None = None
        if unit_size > 1 and task.num_clients > 0:
            batcher = BatchedTrainer(self.runtime.model, task.loss_fn)
            why: list[str] = []
            if batcher.probe(task.client_data(0), why):
                self.batcher = batcher
            else:
                log.info("clients train one at a time: %s", why[0])

    def run_unit(self, unit: Unit) -> list[tuple[int, Envelope | str]]:
        """Replies for a unit's clients, in order (training several at once when it can)."""
        if unit and unit[0][1].kind == CENTRAL_EVAL:
            return [(cid, self._central_eval(msg)) for cid, msg in unit]
        if len(unit) > 1 and self.batcher is not None:
            self._train_unit(unit)
        return [(cid, self.handle(cid, msg)) for cid, msg in unit]

    def _central_eval(self, msg: Envelope) -> Envelope | str:
        """Per-batch loss sums and the correct count of the model on test examples
        [start, stop) (a multiple of the batch size from the start of the test set)."""
        if self.task.test_data is None:
            return "the task has no test set"
        start, stop = msg.get("start", int), msg.get("stop", int)
        x, y = self.task.test_data
        weights = msg.tensor("model", numel=self.runtime.model.size)
        losses, correct = evaluate_batches(
            self.runtime.model,
            weights,
            x[start:stop],
            y[start:stop],
            self.task.loss_fn,
            msg.get("batch_size", int),
        )
        return Envelope(
            CENTRAL_EVAL, msg.round, {"correct": correct}, {"losses": np.asarray(losses)}
        )

    def handle(self, cid: int, msg: Envelope) -> Envelope | str:
        """The client's reply, or why it failed (a failing client never stops the lane)."""
        store = self._states.store_for(cid, msg.round, latest_round(msg.round, msg.config))
        self._replay = self._done.pop(cid, None)
        self._client = cid
        # Torch's global generator (dropout layers, random augmentation) is seeded per
        # (seed, round, client) and restored afterwards: a client's result does not
        # depend on which lane ran it or on who ran before it.
        with torch.random.fork_rng(devices=self._devices):
            # Not torch.manual_seed: on a CPU-only run it queues a lazy CUDA call, which
            # captures a stack trace per client.
            seed = _client_seed(msg, cid)
            torch.default_generator.manual_seed(seed)
            if self._devices:
                torch.cuda.manual_seed(seed)
            try:
                return self.runtime.handle(cid, msg, store)
            except Exception as exc:
                log.debug("client %d failed", cid, exc_info=True)
                return f"{type(exc).__name__}: {exc}"
            finally:
                self._replay = None
                self._client = None
                self._fetched.pop(cid, None)
                self._states.release_if_empty(cid)  # plain training keeps nothing

    @property
    def states(self) -> dict[int, dict[str, Any]]:
        """The clients' state stores held now (client id -> store)."""
        return self._states.stores

    def _train_unit(self, unit: Unit) -> None:
        assert self.batcher is not None
        msg = unit[0][1]
        try:
            hp = parse_training(msg)
            seed = msg.get(F.SEED, int)
            size = self.runtime.model.size
            first = msg.arrays[F.MODEL]
            if all(m.arrays[F.MODEL] is first for _, m in unit):
                global_vector = msg.tensor(F.MODEL, numel=size)
            else:  # each client its own model (gossip): one row each
                global_vector = torch.stack([m.tensor(F.MODEL, numel=size) for _, m in unit])
            data = [self.task.client_data(cid) for cid, _ in unit]
            generators = [client_generator(seed, m.round, cid) for cid, m in unit]
            results = self.batcher.train(global_vector, data, hp, generators)
        except Exception as exc:  # the clients then train, or fail, one at a time
            log.debug("unit of %d trained one at a time: %s", len(unit), exc)
            return
        for (cid, _), d, r in zip(unit, data, results, strict=True):
            self._fetched[cid], self._done[cid] = d, r

    def _data(self, cid: int) -> ClientData:
        data = self._fetched.pop(cid, None)
        return data if data is not None else self.task.client_data(cid)

    def _train(
        self,
        model: FlatModel,
        global_vector: torch.Tensor,
        x: torch.Tensor,
        y: torch.Tensor,
        hp: LocalTraining,
        loss_fn: LossFn,
        generator: torch.Generator,
    ) -> LocalResult:
        done, self._replay = self._replay, None
        if self.attack is not None and self._client in self.attack.attackers:
            # An attacker trains through its attack policy, never a unit's honest result.
            poisoned = self.attack.policy.wrap(train_local)
            return poisoned(model, global_vector, x, y, hp, loss_fn, generator)
        if done is not None and done.num_examples == int(x.shape[0]):
            return done
        return train_local(model, global_vector, x, y, hp, loss_fn, generator)


def keep_data_on(task: Task, device: torch.device | str) -> bool:
    """Move a built-in task's whole training set to a GPU once, when it fits comfortably.

    Each client's examples are then gathered on the device: no host-to-device copy
    per client. Returns whether the data moved.
    """
    device = torch.device(device)
    data = task.client_data
    if device.type != "cuda" or not isinstance(data, PartitionedData):
        return False
    if data.x.device == device:
        return True
    need = data.x.nbytes + data.y.nbytes
    free, _ = torch.cuda.mem_get_info(device)
    if need > free // 4:
        log.info("training set (%d MB) stays in host memory: too large for the GPU", need >> 20)
        return False
    data.x, data.y = data.x.to(device), data.y.to(device)
    return True
