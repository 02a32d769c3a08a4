"""DP-FTRL in the round engine (issue 35): the schema's cohorts, correlated noise on each
round's sum, the ledger's ftrl record, verification, and the T that cannot grow."""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import torch

from fedveil.config import ConfigError, load_config
from fedveil.privacy.dp.ftrl import FtrlNoise, NoiseStateError, ParticipationSchema
from fedveil.privacy.dp.ftrl.optimize import banded_factorization
from fedveil.privacy.dp.verify import verify_ledger
from fedveil.server.engine.aggregation import Aggregate
from fedveil.server.engine.ftrl_stage import FtrlDP, noise_state_path
from fedveil.simulations.simulate_run import simulate

B, K, ROUNDS = 4, 2, 8


def config(out: Path, **extra: object):
    values = {
        "model.task": "tiny_task:make",
        "data.num_clients": 16,
        "server.per_round": 4,
        "server.rounds": ROUNDS,
        "server.sampling": "fixed",
        "dp.mechanism": "ftrl",
        "dp.ftrl_factorization": "banded",
        "dp.ftrl_min_separation": B,
        "dp.ftrl_max_participations": K,
        "dp.epsilon": 8.0,
        "dp.clip": 0.5,
        "simulation.workers": 1,
        "simulation.plots": False,
        "eval.central_every": ROUNDS,
        "out": str(out),
    }
    values.update(extra)
    return load_config(None, values)


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ftrl") / "run"
    simulate(config(out, **{"secagg.enabled": True}))
    return out


def test_a_secagg_ftrl_run_verifies_with_its_ftrl_record(finished: Path) -> None:
    ledger = finished / "privacy" / "ledger.jsonl"
    result = verify_ledger(ledger)
    assert result.status == "final", result.message
    releases = [json.loads(x) for x in ledger.read_text().splitlines()]
    releases = [e for e in releases if e.get("kind") == "release"]
    assert len(releases) == ROUNDS
    schema = ParticipationSchema(B, K)
    expected = banded_factorization(ROUNDS, schema)
    for entry in releases:
        assert entry["mechanism"] == "dp_ftrl" and entry["sampling_rate"] == 1.0
        assert entry["ftrl"]["factorization"] == expected.to_dict()
        assert entry["ftrl"]["participation"] == {"min_separation": B, "max_participations": K}
        assert entry["ftrl"]["sensitivity"] == pytest.approx(expected.sensitivity(schema))
    report = json.loads((finished / "privacy" / "report.json").read_text())
    assert "participation schema allows" in report["sampling_statement"]
    assert "trusted curator" in report["adversaries"]["coordinator"]["statement"]
    state = noise_state_path(ledger)
    assert state.exists() and state.stat().st_mode & 0o777 == 0o600


def test_the_sampler_kept_the_schema(finished: Path) -> None:
    seen: dict[int, list[int]] = defaultdict(list)
    for line in (finished / "private" / "rounds.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "cohort" in record:
            assert len(record["cohort"]) == 4
            for cid in record["cohort"]:
                seen[cid].append(record["round"])
    assert seen and max(len(r) for r in seen.values()) <= K
    for rounds in seen.values():
        assert all(b - a >= B for a, b in itertools.pairwise(rounds))


def test_the_finished_run_cannot_release_past_t_nor_grow_t(finished: Path) -> None:
    ledger = finished / "privacy" / "ledger.jsonl"
    cfg = config(finished)
    kwargs = {"model_size": 195, "noise_state": noise_state_path(ledger)}
    stage = FtrlDP(cfg, 16, ledger, **kwargs)
    assert stage.admits_next_round() == (False, float("inf"))
    longer = config(finished, **{"server.rounds": ROUNDS + 4})
    with pytest.raises(NoiseStateError, match="another factorisation, T"):
        FtrlDP(longer, 16, ledger, **kwargs)


def test_each_release_adds_the_correlated_noise_to_the_sum(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    ledger = tmp_path / "privacy" / "ledger.jsonl"
    stage = FtrlDP(cfg, 16, ledger, model_size=6, rng=np.random.default_rng(4))
    twin = FtrlNoise(stage.factorization, stage.noise.sigma, 6, None, rng=np.random.default_rng(4))
    for t in range(1, 4):
        total = torch.arange(6, dtype=torch.float32) * t
        release = stage.release(
            t, Aggregate(total=total, weight=4.0, contributors=[0, 1, 2, 3], loss=0.0), 6
        )
        assert release is not None
        published = release.update.double().numpy() * 4  # per_round
        np.testing.assert_allclose(published - total.numpy(), twin.next_noise(t), atol=1e-5)
    # sigma is z x clip x sensitivity, z calibrated for the budget at T.
    z = stage.config.noise_multiplier
    assert stage.noise.sigma == pytest.approx(z * 0.5 * stage.sensitivity)
    assert stage.epsilon() < 8.0


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (
            {"dp.mechanism": "distributed", "secagg.enabled": True},
            "distributed DP does not combine",
        ),
        ({"server.sampling": "poisson"}, "server.sampling = 'poisson' with dp.mechanism = 'ftrl'"),
        ({"dp.ftrl_min_separation": 0}, "dp.ftrl_max_participations = 2 needs"),
        ({"dp.neighbouring": "add_remove"}, "dp.neighbouring = 'add_remove'"),
        ({"server.mode": "async"}, "server.mode = 'async' with dp.mechanism = 'ftrl'"),
        ({"dp.accountant": "rdp"}, "dp.accountant = 'rdp' with dp.mechanism = 'ftrl'"),
    ],
)
def test_refused_combinations_name_the_fields(tmp_path: Path, extra: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        config(tmp_path, **extra)
