"""Malicious clients in simulation (`[poisoning]`): what each attack does to a FedAvg run,
backdoor accuracy, the recorded choice of attackers, and the refusals."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from fedveil.client.runtime import client_generator
from fedveil.client.training import LocalTraining, train_local
from fedveil.config import ConfigError, load_config
from fedveil.flat_model import FlatModel
from fedveil.server.coordinator.runs import SubmissionError, parse_submission
from fedveil.server.engine.rounds import RoundEngine
from fedveil.simulations.inprocess import InProcessTransport
from fedveil.simulations.poisoning import RECORD, AttackPolicy, apply_trigger, choose_attackers
from fedveil.simulations.simulate_run import simulate
from fedveil.tasks import make_task

ATTACK = "poisoning.attack"


def tiny(tmp_path, name: str, **extra):
    """The tiny blob task, every client in every round (so attackers are in each cohort)."""
    overrides = {
        "model.task": "tiny_task:make",
        "data.num_clients": 10,
        "server.per_round": 10,
        "server.rounds": 5,
        "simulation.workers": 1,
        "simulation.plots": False,
        "device": "cpu",
        "out": str(tmp_path / name),
    }
    overrides.update(extra)
    return load_config(None, overrides)


def test_sign_flipping_at_20_percent_wrecks_fedavg(tmp_path):
    clean = simulate(tiny(tmp_path, "clean"))
    attacked = simulate(
        tiny(tmp_path, "attacked", **{ATTACK: "sign_flip", "poisoning.fraction": 0.2})
    )
    assert clean["test_accuracy"] > 0.9
    # Two attackers at x10 outweigh eight honest clients: the sum points uphill.
    assert attacked["test_accuracy"] < clean["test_accuracy"] - 0.4
    record = json.loads((tmp_path / "attacked" / RECORD).read_text())
    assert record["attack"] == "sign_flip" and record["count"] == 2


def _updates(cfg, workers: int, unit: int) -> dict[int, torch.Tensor]:
    task = make_task(cfg)
    with InProcessTransport(
        task, "cpu", workers=workers, unit_size=unit, run_config=cfg
    ) as transport:
        request = RoundEngine(cfg, task, transport).train_request(1)
        replies = transport.exchange(dict.fromkeys(range(task.num_clients), request), None)
    return {cid: reply.tensor("delta") for cid, reply in replies.items()}


# One lane, one client at a time; and worker processes training units of clients at once
# (each worker's lane must know the attackers, and an attacker never takes a unit's result).
@pytest.mark.parametrize(("workers", "unit"), [(1, 1), pytest.param(2, 4, marks=pytest.mark.procs)])
def test_label_flipping_changes_only_the_attackers_updates(tmp_path, workers, unit):
    honest = _updates(tiny(tmp_path, "h"), workers, unit)
    cfg = tiny(tmp_path, "p", **{ATTACK: "label_flip", "poisoning.fraction": 0.3})
    poisoned = _updates(cfg, workers, unit)
    attackers = set(choose_attackers(10, 0.3, cfg.seed))
    assert len(attackers) == 3
    for cid in range(10):
        same = torch.equal(honest[cid], poisoned[cid])
        assert same == (cid not in attackers), f"client {cid}"


def test_backdoor_accuracy_near_zero_when_clean_and_high_under_attack(tmp_path):
    trigger = {"poisoning.trigger_size": 2}
    clean = simulate(
        tiny(tmp_path, "clean", **{ATTACK: "backdoor", "poisoning.fraction": 0.0}, **trigger)
    )
    attacked = simulate(
        tiny(tmp_path, "bd", **{ATTACK: "backdoor", "poisoning.fraction": 0.5}, **trigger)
    )
    assert clean["backdoor_accuracy"] < 0.1
    assert attacked["backdoor_accuracy"] > 0.8
    # The main task survives: a backdoor is judged by backdoor accuracy, not accuracy.
    assert attacked["test_accuracy"] > 0.9
    rounds = [json.loads(line) for line in (tmp_path / "bd" / "metrics.jsonl").open()]
    assert [r["round"] for r in rounds if "backdoor_accuracy" in r] == [1, 2, 3, 4, 5]


def test_measuring_a_clean_run_changes_nothing_in_it(tmp_path):
    plain = simulate(tiny(tmp_path, "plain"))
    measured = simulate(
        tiny(
            tmp_path,
            "measured",
            **{ATTACK: "backdoor", "poisoning.fraction": 0.0, "poisoning.trigger_size": 2},
        )
    )
    a = load_file(str(tmp_path / "plain" / "model.safetensors"))
    b = load_file(str(tmp_path / "measured" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert plain["test_accuracy"] == measured["test_accuracy"]
    assert "backdoor_accuracy" not in plain
    assert not (tmp_path / "plain" / RECORD).exists()


def test_attackers_are_a_seeded_choice_recorded_in_the_run_dir(tmp_path):
    assert choose_attackers(100, 0.2, 7) == choose_attackers(100, 0.2, 7)
    assert choose_attackers(100, 0.2, 7) != choose_attackers(100, 0.2, 8)
    assert len(choose_attackers(100, 0.2, 7)) == 20
    assert len(choose_attackers(100, 0.001, 7)) == 1  # a fraction > 0 means an attacker
    assert choose_attackers(100, 0.0, 7) == []
    cfg = tiny(tmp_path, "g", seed=5, **{ATTACK: "gaussian", "poisoning.fraction": 0.2})
    simulate(cfg)
    record = json.loads((tmp_path / "g" / RECORD).read_text())
    assert record["attackers"] == choose_attackers(10, 0.2, 5)
    assert record["seed"] == 5 and record["settings"]["std"] == 1.0


def test_the_trigger_is_a_bright_corner_patch():
    images = torch.zeros(4, 1, 8, 8)
    out = apply_trigger(images, 3, 1.0)
    assert out[:, :, -3:, -3:].eq(1).all() and out.sum() == 4 * 9
    assert images.sum() == 0, "the caller's data is left alone"
    flat = apply_trigger(torch.zeros(2, 8), 2, 5.0)
    assert flat[:, -4:].eq(5).all() and flat[:, :4].eq(0).all()


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({ATTACK: "flip_everything"}, "poisoning.attack"),
        ({ATTACK: "sign_flip", "poisoning.fraction": 1.5}, "poisoning.fraction"),
        ({ATTACK: "sign_flip", "poisoning.scale": 0.0}, "poisoning.scale"),
        ({ATTACK: "gaussian", "poisoning.std": -1.0}, "poisoning.std"),
        ({ATTACK: "sign_flip", "transport": "flower"}, "poisoning.attack"),
        ({ATTACK: "label_flip", "client.dp_sgd_noise": 1.0}, "poisoning.attack"),
    ],
)
def test_config_errors_name_the_field(tmp_path, overrides, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        tiny(tmp_path, "x", **overrides)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"poisoning.target_class": 3}, "poisoning.target_class"),  # the task has 3 classes
        ({"poisoning.trigger_size": 3}, "poisoning.trigger_size"),  # 9 features of 8
    ],
)
def test_task_dependent_errors_name_the_field(tmp_path, overrides, field):
    cfg = tiny(tmp_path, "x", **{ATTACK: "backdoor"}, **overrides)
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        simulate(cfg)


def test_a_deployed_run_with_poisoning_is_refused():
    text = '[poisoning]\nattack = "backdoor"\nfraction = 0.1\n'
    with pytest.raises(SubmissionError) as refused:
        parse_submission(text.encode(), "application/toml", [])
    assert refused.value.field == "poisoning"
    assert "simulation only" in str(refused.value)


def _train(trainer, seed: int = 11):
    torch.manual_seed(0)
    model = FlatModel(torch.nn.Sequential(torch.nn.Linear(8, 3)))
    x, y = torch.randn(40, 8), torch.randint(0, 3, (40,))
    hp = LocalTraining(batch_size=8, lr=0.1)
    start = model.get().clone()
    loss = torch.nn.functional.cross_entropy
    return trainer(model, start, x, y, hp, loss, client_generator(seed, 1, 0)).delta


@pytest.mark.parametrize("attack", ["sign_flip", "scaled", "gaussian"])
def test_update_attacks_do_what_they_say(attack):
    honest = _train(train_local)
    policy = AttackPolicy(attack, num_classes=3, scale=10.0, std=2.0, trigger_size=2)
    poisoned = _train(policy.wrap(train_local))
    if attack == "sign_flip":
        assert torch.equal(poisoned, honest * -10.0)
    elif attack == "gaussian":
        assert torch.equal(poisoned, _train(policy.wrap(train_local))), "seeded"
        assert not torch.equal(poisoned, _train(policy.wrap(train_local), seed=12))
        assert 1.0 < float(poisoned.std()) < 3.0
    else:  # model replacement: backdoor data, then boosted
        assert not torch.equal(poisoned, honest * 10.0)
        plain = AttackPolicy("backdoor", num_classes=3, boost=1.0, trigger_size=2)
        assert torch.allclose(poisoned, _train(plain.wrap(train_local)) * 10.0)
