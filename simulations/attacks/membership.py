"""Membership inference on a run's final global model, at the level its DP guarantee covers.

User-level DP (the engine's central or distributed noise) protects whether a client took
part; sample-level DP-SGD (client.dp_sgd_noise > 0) whether one example did. The harness
trains the target with fedveil's own simulation path on a population it builds itself:

  the dataset is split into 4 * data.num_clients clients (a seeded permutation);
  members:   data.num_clients of them, the target run's whole population;
  held out:  as many again, never trained on (the non-members);
  shadow pool: the other 2 * data.num_clients, from which each shadow model draws
             data.num_clients clients, so no shadow ever saw a target (offline LiRA).

At example level the members' clients train on a random half of their examples; the other
half are the non-members. Two attacks score each target (higher: more likely a member):
  loss:  minus the loss under the final model (Yeom et al. 2018);
  lira:  offline LiRA (Carlini et al. 2022): a Gaussian fitted to the target's
         logit-scaled confidence log(p / (1 - p)) under the shadows (all trained
         without it); the score is its one-sided z-score.
A client's score is the mean of its examples'.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional

from fedveil.config import RunConfig, config_from_dict
from fedveil.flat_model import FlatModel
from fedveil.server.engine.lifecycle import MODEL_FILE
from fedveil.server.engine.runstore import RunStore
from fedveil.simulations.attacks.roc import (
    Roc,
    bound_violations,
    plot_roc,
    roc_auc,
    roc_curve,
    tpr_at_fpr,
)
from fedveil.simulations.run_setup import PreparedTask, open_run_dir, resolve_device
from fedveil.simulations.simulate_run import Attempt
from fedveil.tasks import ClientData, Task, make_task

LEVELS = ("client", "example")
FPR_POINT = 0.01  # TPR at 1% FPR: what LiRA argues matters (confident inference of a few)
POOLED_BELOW = 8  # fewer shadows than this: one variance for all targets (Carlini et al.)


def membership_level(cfg: RunConfig) -> str:
    """The unit the run's DP covers: an example under DP-SGD, else a client."""
    return "example" if cfg.client.dp_sgd_noise > 0 else "client"


def is_private(cfg: RunConfig) -> bool:
    return cfg.dp.mechanism != "none" or cfg.client.dp_sgd_noise > 0


def without_dp(cfg: RunConfig) -> RunConfig:
    """The same run with every DP mechanism off (the non-private baseline)."""
    return with_settings(cfg, {"dp.mechanism": "none", "client.dp_sgd_noise": 0.0})


def with_settings(cfg: RunConfig, settings: dict[str, Any]) -> RunConfig:
    values = cfg.to_dict()
    for key, value in settings.items():
        section, _, name = key.rpartition(".")
        node = values
        for part in filter(None, section.split(".")):
            node = node[part]
        node[name] = value
    return config_from_dict(_without_none(values))


def _without_none(values: dict[str, Any]) -> dict[str, Any]:
    return {
        k: _without_none(v) if isinstance(v, dict) else v
        for k, v in values.items()
        if v is not None
    }


# -- the population -------------------------------------------------------------------
@dataclass
class Population:
    """Who is a member, who is held out, and what the shadows may draw from."""

    task: Task  # the whole split: 4 * members clients
    members: np.ndarray
    held_out: np.ndarray
    pool: np.ndarray
    level: str
    rng: np.random.Generator
    # Example level: the indices each member client trains on (the rest are non-members).
    kept: dict[int, np.ndarray] = field(default_factory=dict)


def build_population(cfg: RunConfig, level: str) -> Population:
    if level not in LEVELS:
        raise ValueError(f"level = {level!r}: must be one of {', '.join(LEVELS)}")
    m = cfg.data.num_clients
    if m < 2:
        raise ValueError(f"data.num_clients = {m}: membership needs at least 2 member clients")
    task = make_task(with_settings(cfg, {"data.num_clients": 4 * m}))
    if task.num_clients != 4 * m:
        raise ValueError(
            f"data.num_clients: the task made {task.num_clients} clients for 4 * {m} asked; "
            "membership inference splits the data into 4 * data.num_clients clients"
        )
    # Seeded, not secret: the audit is an experiment to reproduce, not a key.
    rng = np.random.default_rng([cfg.seed, 0x4D494100])
    perm = rng.permutation(4 * m)
    pop = Population(task, perm[:m], perm[m : 2 * m], perm[2 * m :], level, rng)
    if level == "example":
        for cid in pop.members:
            n = len(task.client_data(int(cid)))
            pop.kept[int(cid)] = np.sort(rng.permutation(n)[: n - n // 2])
    return pop


def half_of_each(task: Task, ids: np.ndarray, rng: np.random.Generator) -> dict[int, np.ndarray]:
    """A random half of each client's examples (shadows at example level match the target)."""
    kept = {}
    for cid in ids:
        n = len(task.client_data(int(cid)))
        kept[int(cid)] = np.sort(rng.permutation(n)[: n - n // 2])
    return kept


def subset_task(task: Task, ids: np.ndarray, kept: dict[int, np.ndarray] | None = None) -> Task:
    """The clients `ids` of `task` as a population of their own (client i = ids[i])."""
    ids = np.asarray(ids, dtype=np.int64)

    def client_data(i: int) -> ClientData:
        cid = int(ids[i])
        data = task.client_data(cid)
        if kept is None or cid not in kept:
            return data
        idx = torch.from_numpy(kept[cid])
        return ClientData(data.x[idx], data.y[idx], data.x_eval, data.y_eval)

    if kept is not None:
        sizes = np.array([len(client_data(i)) for i in range(len(ids))], dtype=np.int64)
    else:
        sizes = None if task.client_sizes is None else np.asarray(task.client_sizes)[ids]
    return Task(
        name=task.name,
        input_shape=task.input_shape,
        num_classes=task.num_classes,
        num_clients=len(ids),
        model_fn=task.model_fn,
        client_data=client_data,
        test_data=task.test_data,
        loss_fn=task.loss_fn,
        client_sizes=sizes,
        info={},
    )


# -- training ---------------------------------------------------------------------------
def train_in_simulation(
    cfg: RunConfig, task: Task, out: Path, *, seed: int
) -> tuple[nn.Module, dict[str, Any]]:
    """Train `task` with fedveil's simulation path (engine, DP, in-process clients) into
    the run directory `out`; the final model as written to model.safetensors."""
    run_cfg = with_settings(
        cfg,
        {
            "seed": seed,
            "data.num_clients": task.num_clients,
            "out": str(out),
            # One in-process lane: spawned workers would rebuild the task from the config
            # and so train on the whole split, members and non-members alike.
            "simulation.workers": 1,
            "transport": "inprocess",
            "simulation.plots": False,
            "tracking.tensorboard": "",
            "tracking.mlflow_uri": "",
        },
    )
    start = time.perf_counter()
    device = resolve_device(run_cfg.device)
    store = RunStore(out)
    open_run_dir(store, PreparedTask(run_cfg, task), None)
    attempt = Attempt(run_cfg, task, device, store, resume=False, on_round=None)
    with one_thread():
        attempt.drive(None)
    summary = attempt.finish(time.perf_counter() - start)
    model = task.model_fn()
    flat = FlatModel(model)
    flat.set(flat.load(str(out / MODEL_FILE)))
    return model.eval(), summary


@contextmanager
def one_thread() -> Iterator[None]:
    """Tiny models in one lane: intra-op threads cost far more than they save (OpenMP's
    spinning barriers on a loaded machine made a run 12x slower), as in simulations.inprocess."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# -- what the attacker measures -----------------------------------------------------------
@dataclass
class Targets:
    """Every example the attack scores, its group (client) and whether it was trained on."""

    x: torch.Tensor
    y: torch.Tensor
    group: np.ndarray  # index into the scored units (clients, or examples themselves)
    member: np.ndarray  # per scored unit


def targets_of(pop: Population) -> Targets:
    xs, ys, groups, member = [], [], [], []
    if pop.level == "client":
        for g, cid in enumerate(np.r_[pop.members, pop.held_out]):
            data = pop.task.client_data(int(cid))
            xs.append(data.x)
            ys.append(data.y)
            groups.append(np.full(len(data), g))
            member.append(g < len(pop.members))
        return Targets(torch.cat(xs), torch.cat(ys), np.concatenate(groups), np.array(member))
    for cid in pop.members:
        data = pop.task.client_data(int(cid))
        inside = np.zeros(len(data), dtype=bool)
        inside[pop.kept[int(cid)]] = True
        xs.append(data.x)
        ys.append(data.y)
        member.append(inside)
    flags = np.concatenate(member)
    return Targets(torch.cat(xs), torch.cat(ys), np.arange(len(flags)), flags)


@torch.no_grad()
def example_statistics(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int = 1024
) -> tuple[np.ndarray, np.ndarray]:
    """Per example: the cross-entropy loss and the logit-scaled confidence
    log(p_y / (1 - p_y)) = z_y - logsumexp_{j != y} z_j (stable where p_y is near 1)."""
    model.eval()
    losses, confidences = [], []
    for i in range(0, len(y), batch):
        logits = model(x[i : i + batch]).double()
        yb = y[i : i + batch]
        losses.append(functional.cross_entropy(logits, yb, reduction="none"))
        own = logits.gather(1, yb[:, None]).squeeze(1)
        others = logits.scatter(1, yb[:, None], -math.inf).logsumexp(1)
        confidences.append(own - others)
    return torch.cat(losses).numpy(), torch.cat(confidences).numpy()


def per_group_mean(values: np.ndarray, group: np.ndarray) -> np.ndarray:
    sums = np.bincount(group, weights=values)
    return sums / np.bincount(group)


def lira_offline_scores(target_conf: np.ndarray, shadow_conf: np.ndarray) -> np.ndarray:
    """One-sided z-score of each example's confidence against its out-distribution (the
    shadows', none trained on it): monotone in the offline LiRA likelihood test."""
    shadows = shadow_conf.shape[0]
    if shadows < 2:
        raise ValueError(f"shadows = {shadows}: offline LiRA needs at least 2 shadow models")
    mu = shadow_conf.mean(axis=0)
    if shadows >= POOLED_BELOW:
        sigma = shadow_conf.std(axis=0, ddof=1)
    else:
        sigma = np.full_like(mu, float(np.sqrt(shadow_conf.var(axis=0, ddof=1).mean())))
    return (target_conf - mu) / np.maximum(sigma, 1e-6)


def attack_report(
    scores: np.ndarray, member: np.ndarray, epsilon: float | None, delta: float
) -> tuple[dict[str, Any], Roc]:
    roc = roc_curve(scores, member)
    report: dict[str, Any] = {
        "auc": roc_auc(scores, member),
        "tpr_at_1pct_fpr": tpr_at_fpr(roc, FPR_POINT),
    }
    if epsilon is not None:
        report["bound"] = bound_violations(roc, epsilon, delta).to_json()
    return report, roc


# -- one run: target + shadows + both attacks -------------------------------------------------
def dp_claim(
    cfg: RunConfig, summary: dict[str, Any], level: str, run_dir: Path
) -> tuple[float | None, float]:
    """The epsilon the run claims at the attacked level (None without DP there). DP-SGD's
    per-client worst case is the operator's (the private annex), never published."""
    if level == "example":
        eps = _private_dp_sgd_epsilon(run_dir) if cfg.client.dp_sgd_noise > 0 else None
    else:
        eps = summary.get("epsilon") if cfg.dp.mechanism != "none" else None
    return (None if eps is None else float(eps)), float(cfg.dp.delta)


def _private_dp_sgd_epsilon(run_dir: Path) -> float | None:
    rounds = RunStore(run_dir).read_private()
    figures = [r["dp_sgd_epsilon_max"] for r in rounds if "dp_sgd_epsilon_max" in r]
    return figures[-1] if figures else None


def run_membership(
    cfg: RunConfig,
    out: Path,
    *,
    shadows: int,
    level: str,
    on_step: Callable[[str], None] | None = None,
) -> tuple[dict[str, Any], dict[str, Roc]]:
    """Train the target and `shadows` shadow models; attack the target at `level`."""
    if shadows < 0 or shadows == 1:
        raise ValueError(f"shadows = {shadows}: must be 0 (loss attack only) or at least 2")
    say = on_step or (lambda _msg: None)
    pop = build_population(cfg, level)
    kept = pop.kept if level == "example" else None
    say("training the target model")
    model, summary = train_in_simulation(
        cfg, subset_task(pop.task, pop.members, kept), out / "target", seed=cfg.seed
    )
    targets = targets_of(pop)
    loss, conf = example_statistics(model, targets.x, targets.y)
    shadow_conf = []
    for s in range(shadows):
        say(f"training shadow model {s + 1} of {shadows}")
        ids = pop.rng.choice(pop.pool, size=len(pop.members), replace=False)
        shadow_kept = half_of_each(pop.task, ids, pop.rng) if level == "example" else None
        shadow, _ = train_in_simulation(
            cfg,
            subset_task(pop.task, ids, shadow_kept),
            out / f"shadow-{s}",
            seed=cfg.seed + 1 + s,
        )
        shadow_conf.append(example_statistics(shadow, targets.x, targets.y)[1])
    epsilon, delta = dp_claim(cfg, summary, level, out / "target")
    member = targets.member
    attacks: dict[str, Any] = {}
    curves: dict[str, Roc] = {}
    scored = {"loss": per_group_mean(-loss, targets.group)}
    if shadows:
        z = lira_offline_scores(conf, np.stack(shadow_conf))
        scored["lira"] = per_group_mean(z, targets.group)
    for name, scores in scored.items():
        attacks[name], curves[name] = attack_report(scores, member, epsilon, delta)
    result = {
        "level": level,
        "private": is_private(cfg),
        "epsilon": epsilon,
        "delta": delta,
        "members": int(member.sum()),
        "non_members": int((~member).sum()),
        "shadows": shadows,
        "test_accuracy": summary.get("test_accuracy"),
        "attacks": attacks,
    }
    return result, curves


def attack_membership(
    cfg: RunConfig,
    out: Path,
    *,
    shadows: int = 4,
    baseline: bool = True,
    on_step: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Membership inference on `cfg` as configured and, for a DP config, on the same
    config without DP (`baseline`). Writes out/membership.json and out/membership_roc.png
    (an SVG without matplotlib); returns what membership.json holds."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    level = membership_level(cfg)
    variants = {"dp" if is_private(cfg) else "nondp": cfg}
    if baseline and is_private(cfg):
        variants = {"nondp": without_dp(cfg), **variants}
    runs: dict[str, Any] = {}
    curves: dict[str, Roc] = {}
    claim: tuple[float | None, float] = (None, cfg.dp.delta)
    for name, variant in variants.items():
        say = None if on_step is None else _prefixed(on_step, name)
        runs[name], got = run_membership(
            variant, out / "runs" / name, shadows=shadows, level=level, on_step=say
        )
        curves.update({f"{name} {attack}": roc for attack, roc in got.items()})
        if runs[name]["epsilon"] is not None:
            claim = (runs[name]["epsilon"], runs[name]["delta"])
    title = f"{level}-level membership inference ({len(runs)} run(s), {shadows} shadows)"
    image = plot_roc(
        curves, out / "membership_roc.png", epsilon=claim[0], delta=claim[1], title=title
    )
    result = {"level": level, "shadows": shadows, "runs": runs, "roc_image": image.name}
    (out / "membership.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def _prefixed(on_step: Callable[[str], None], name: str) -> Callable[[str], None]:
    return lambda msg: on_step(f"{name}: {msg}")
