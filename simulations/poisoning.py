"""Poisoning attacks by malicious clients, in simulation only (`[poisoning]`, issue 22).

An attacker is an ordinary simulated client: the same ClientRuntime, the same
messages, the same client-side clip under DP. Only its local training differs: the
lane hands its runtime a trainer that wraps the honest one (`PoisonedTrainer`),
poisoning the data it trains on and/or the update it returns. Nothing here is
importable by the device app (import contract: client and client.edge never
import simulations), and the coordinator refuses a deployed run that sets it.

Attacks:
- label_flip: every label y becomes (classes - 1 - y) (Tolpegin et al. 2020, "Data
  Poisoning Attacks Against Federated Learning Systems", ESORICS).
- sign_flip: the honest update times -scale (Blanchard et al. 2017, "Machine Learning
  with Adversaries: Byzantine Tolerant Gradient Descent", NeurIPS; Fang et al. 2020,
  "Local Model Poisoning Attacks to Byzantine-Robust Federated Learning", USENIX Sec.).
- gaussian: the update replaced by N(0, std^2) noise per coordinate (Blanchard et al.
  2017's Gaussian Byzantine clients).
- backdoor: a share of the attacker's examples carries a pixel-pattern trigger and is
  relabelled to the target class, the rest stays clean, and the update is multiplied by
  `boost` (Bagdasaryan et al. 2020, "How To Backdoor Federated Learning", AISTATS).
- scaled: the same backdoor training with the update multiplied by `scale`: model
  replacement (Bagdasaryan et al. 2020, Sec. 3.2: boost gamma ~ n / eta so that the
  attacker's model replaces the global one).

Backdoor accuracy (Bagdasaryan et al. 2020; Sun et al. 2019, "Can You Really Backdoor
Federated Learning?") is the share of triggered test inputs whose true class is not the
target that the global model classifies as the target: a clean model scores near 0.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedveil.client.training import LocalResult, LocalTraining, LossFn, Trainer
from fedveil.config import RunConfig
from fedveil.config.run_schema import PoisoningConfig
from fedveil.flat_model import FlatModel
from fedveil.model_evaluation import evaluate_batches
from fedveil.server.engine.rounds import RoundEngine
from fedveil.tasks import Task

RECORD = "poisoning.json"  # in the run directory: the attack and which clients attacked
_ATTACKER_DOMAIN = 0xBAD5EED  # separates the attackers' draw from every other use of the seed
_DATA_DOMAIN = 0x7A16  # the backdoor examples' draw, from the client's training seed
_NOISE_DOMAIN = 0x6A55  # the Gaussian attacker's noise, from the client's training seed
_BACKDOOR_DATA = ("backdoor", "scaled")


def choose_attackers(num_clients: int, fraction: float, seed: int) -> list[int]:
    """The attacking clients, sorted: round(fraction * num_clients) of them (at least one
    when fraction > 0), drawn without replacement from the run seed alone."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"poisoning.fraction = {fraction}: must be in [0, 1]")
    count = min(num_clients, round(fraction * num_clients))
    if fraction > 0 and count == 0:
        count = 1
    rng = np.random.default_rng(np.random.SeedSequence([seed, _ATTACKER_DOMAIN]))
    return sorted(int(c) for c in rng.choice(num_clients, size=count, replace=False))


def apply_trigger(x: torch.Tensor, size: int, value: float) -> torch.Tensor:
    """A copy of the batch `x` with the trigger: a size x size square of `value` in the
    bottom-right corner of each image (the last size^2 features of a flat input)."""
    out = x.clone()
    if out.dim() >= 3:  # (N, [C,] H, W)
        if size > out.shape[-1] or size > out.shape[-2]:
            raise ValueError(
                f"poisoning.trigger_size = {size}: larger than the inputs' "
                f"{out.shape[-2]}x{out.shape[-1]} images"
            )
        out[..., -size:, -size:] = value
    else:
        flat = out.view(out.shape[0], -1)
        if size * size > flat.shape[1]:
            raise ValueError(
                f"poisoning.trigger_size = {size}: {size * size} trigger features, the "
                f"inputs have {flat.shape[1]}"
            )
        flat[:, -size * size :] = value
    return out


@dataclass(frozen=True)
class AttackPolicy:
    """What an attacker does to its data and its update (see the module docstring)."""

    attack: str
    num_classes: int
    scale: float = 10.0
    std: float = 1.0
    boost: float = 1.0
    target_class: int = 0
    trigger_size: int = 3
    poison_share: float = 0.5
    trigger_value: float = 1.0

    def poison_data(
        self, x: torch.Tensor, y: torch.Tensor, seed: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.attack == "label_flip":
            return x, (self.num_classes - 1) - y
        if self.attack not in _BACKDOOR_DATA:
            return x, y
        n = int(x.shape[0])
        k = max(1, round(self.poison_share * n))
        g = torch.Generator().manual_seed(seed ^ _DATA_DOMAIN)
        idx = torch.randperm(n, generator=g)[:k].to(x.device)
        x, y = x.clone(), y.clone()
        x[idx] = apply_trigger(x[idx], self.trigger_size, self.trigger_value)
        y[idx] = self.target_class
        return x, y

    def poison_update(self, delta: torch.Tensor, seed: int) -> torch.Tensor:
        if self.attack == "sign_flip":
            return delta * -self.scale
        if self.attack == "gaussian":
            g = torch.Generator().manual_seed(seed ^ _NOISE_DOMAIN)
            noise = torch.randn(delta.shape, generator=g, dtype=torch.float32) * self.std
            return noise.to(delta.device, delta.dtype)
        if self.attack == "scaled":
            return delta * self.scale
        if self.attack == "backdoor" and self.boost != 1.0:
            return delta * self.boost
        return delta

    def wrap(self, honest: Trainer) -> PoisonedTrainer:
        return PoisonedTrainer(self, honest)


class PoisonedTrainer:
    """A Trainer (client/training.py) for an attacker: the honest trainer on poisoned
    data, its update then poisoned. Deterministic in the client's training seed."""

    def __init__(self, policy: AttackPolicy, honest: Trainer) -> None:
        self.policy, self.honest = policy, honest

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
        seed = int(generator.initial_seed())
        x, y = self.policy.poison_data(x, y, seed)
        result = self.honest(model, global_vector, x, y, hp, loss_fn, generator)
        result.delta = self.policy.poison_update(result.delta, seed)
        return result


@dataclass(frozen=True)
class AttackPlan:
    """The run's attack: its policy and which clients carry it out."""

    policy: AttackPolicy
    attackers: frozenset[int]
    settings: PoisoningConfig

    def record(self, run_dir: str | Path, seed: int) -> Path:
        """poisoning.json: the attack, its parameters and the attackers (simulation only:
        there are no real clients to expose)."""
        path = Path(run_dir) / RECORD
        body: dict[str, Any] = {
            "attack": self.policy.attack,
            "settings": vars(self.settings),
            "seed": seed,
            "attackers": sorted(self.attackers),
            "count": len(self.attackers),
        }
        path.write_text(json.dumps(body, indent=2) + "\n")
        return path


def attack_plan(cfg: RunConfig | None, task: Task) -> AttackPlan | None:
    """The run's attack, or None when `[poisoning] attack` is 'none' (nothing changes)."""
    if cfg is None or cfg.poisoning.attack == "none":
        return None
    p = cfg.poisoning
    if p.target_class >= task.num_classes:
        raise ValueError(
            f"poisoning.target_class = {p.target_class}: the task has {task.num_classes} "
            f"classes; must be < {task.num_classes}"
        )
    policy = AttackPolicy(
        attack=p.attack,
        num_classes=task.num_classes,
        scale=p.scale,
        std=p.std,
        boost=p.boost,
        target_class=p.target_class,
        trigger_size=p.trigger_size,
        poison_share=p.poison_share,
        trigger_value=_trigger_value(task),
    )
    if p.attack in _BACKDOOR_DATA and task.test_data is not None:
        apply_trigger(task.test_data[0][:1], p.trigger_size, 0.0)  # refuse a trigger too big
    attackers = choose_attackers(task.num_clients, p.fraction, cfg.seed)
    return AttackPlan(policy, frozenset(attackers), p)


def _trigger_value(task: Task) -> float:
    """The brightest value in the test set: a trigger as bright as the data gets."""
    if task.test_data is not None and task.test_data[0].numel() > 0:
        return float(task.test_data[0].max())
    return 1.0


def backdoor_test_set(task: Task, policy: AttackPolicy) -> tuple[torch.Tensor, torch.Tensor]:
    """Triggered test inputs whose true class is not the target, labelled with the target."""
    if task.test_data is None:
        raise ValueError("backdoor accuracy needs the task's test set; this task has none")
    x, y = task.test_data
    keep = y != policy.target_class
    xs = apply_trigger(x[keep], policy.trigger_size, policy.trigger_value)
    return xs, torch.full_like(y[keep], policy.target_class)


def backdoor_measurable(task: Task, policy: AttackPolicy) -> bool:
    """Whether backdoor accuracy can be measured: a test set the trigger fits."""
    if task.test_data is None:
        return False
    try:
        apply_trigger(task.test_data[0][:1], policy.trigger_size, 0.0)
    except ValueError:
        return False
    return True


class BackdoorMeter:
    """A RoundEngine annotator: `backdoor_accuracy` of the round's global model, in the
    rounds the server evaluates centrally (its own test set, so no client data). Every
    attack's run measures it (the attack x aggregator table has the column for all)."""

    def __init__(
        self, task: Task, policy: AttackPolicy, weights: Any, device: torch.device, batch: int
    ) -> None:
        """`weights()`: the engine's current global weights."""
        self.x, self.y = backdoor_test_set(task, policy)
        self.loss_fn, self.weights, self.batch = task.loss_fn, weights, batch
        # Its own model, built off the global generator: a run's draws stay as they were.
        with torch.random.fork_rng(devices=[]):
            self.model = FlatModel(task.model_fn(), device)
        self.last: float | None = None

    def measure(self) -> float:
        if int(self.x.shape[0]) == 0:
            return 0.0
        _, correct = evaluate_batches(
            self.model, self.weights(), self.x, self.y, self.loss_fn, self.batch
        )
        return correct / int(self.x.shape[0])

    def __call__(self, record: Any) -> None:
        if record.test_accuracy is None:
            return
        self.last = self.measure()
        record.extra["backdoor_accuracy"] = self.last


def install_attack(
    plan: AttackPlan, task: Task, engine: RoundEngine, cfg: RunConfig
) -> BackdoorMeter | None:
    """Record the attack in the engine's run directory and measure backdoor accuracy in
    its rounds (when the trigger fits the test inputs); the meter, or None."""
    if engine.store is not None:
        plan.record(engine.store.path, cfg.seed)
    if not backdoor_measurable(task, plan.policy):
        return None
    meter = BackdoorMeter(
        task, plan.policy, lambda: engine.weights, engine.model.device, cfg.eval.batch_size
    )
    engine.annotators.append(meter)
    return meter


def attackers_in(cohort: Sequence[int], plan: AttackPlan) -> int:
    """How many of a cohort attack (what robust aggregators' bounds are about)."""
    return sum(1 for c in cohort if c in plan.attackers)
