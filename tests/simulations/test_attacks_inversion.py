"""Update inversion plays the server: what it recovers from one client's update, from a
secure sum, and from a DP-noised sum (Fashion-MNIST, the built-in MLP, updates computed
through fedveil's own local training)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fedveil.cli.main import main
from fedveil.simulations.attacks import image_scores, inversion
from fedveil.simulations.attacks.inversion_run import (
    Pool,
    Scenario,
    attack_scenario,
    fashion_mnist_pool,
)
from fedveil.simulations.attacks.updates import observe


@pytest.fixture(scope="module")
def pool() -> Pool:
    full = fashion_mnist_pool()
    # 3,000 images are plenty to draw clients and the baseline from.
    return Pool(full.x[:3000], full.y[:3000], full.num_classes, full.mean, full.std, full.hw)


@pytest.mark.parametrize("local_steps", [1, 3])
def test_analytic_attack_recovers_a_single_image_exactly(pool: Pool, local_steps: int) -> None:
    # Every step's first-layer gradient on one image is (bias gradient) x image, so the
    # ratio stays exact over several local steps too.
    obs = observe(pool.x, pool.y, 10, clients=1, batch=1, local_steps=local_steps, seed=3)
    recon = inversion.analytic_first_layer(obs.model, obs.update)
    assert float((recon[0] - obs.images[0].reshape(-1)).abs().max()) < 1e-4


def test_idlg_label_is_the_true_label(pool: Pool) -> None:
    for seed in range(3):
        obs = observe(pool.x, pool.y, 10, clients=1, batch=1, local_steps=1, seed=seed)
        assert inversion.infer_label(obs.model, obs.update) == int(obs.labels[0])


def test_optimisation_attack_beats_random_image_on_one_update(pool: Pool) -> None:
    res = attack_scenario(
        pool, Scenario("plain", 1, 1, 1), seed=1, attacks=("optimisation",), opt_iterations=60
    )
    assert res["attacks"]["optimisation"]["psnr"] > res["random_baseline_psnr"] + 5.0


def test_cocktail_party_unmixes_a_secure_sum_of_four_images(pool: Pool) -> None:
    # 2 clients x 2 images, FedSGD: the server sees only the sum, and still gets images.
    res = attack_scenario(
        pool, Scenario("secagg", 2, 2, 1), seed=0, attacks=("cocktail_party",), cpa_steps=300
    )
    got = res["attacks"]["cocktail_party"]
    assert got["reconstructed"] == 4
    assert got["psnr"] > res["random_baseline_psnr"] + 3.0
    assert got["recognisable"] >= 2


def test_dp_noised_sum_gives_no_more_than_a_random_image(pool: Pool) -> None:
    res = attack_scenario(
        pool,
        Scenario("dp", 2, 2, 1, dp_noise=0.5, clip_norm=1.0),
        seed=0,
        attacks=("analytic", "cocktail_party"),
        cpa_steps=100,
        rng=np.random.default_rng(7),
    )
    assert res["psnr"] <= res["random_baseline_psnr"] + 1.0
    assert all(a["recognisable"] == 0 for a in res["attacks"].values())


def test_scores_match_each_reconstruction_to_its_own_image() -> None:
    rng = np.random.default_rng(0)
    truth = rng.random((3, 28, 28))
    matches = image_scores.match(truth, truth[[2, 0, 1]])
    assert sorted((m.truth, m.reconstruction) for m in matches) == [(0, 1), (1, 2), (2, 0)]
    assert all(m.psnr == 100.0 and m.ssim > 0.999 for m in matches)


def test_cli_writes_attack_json_and_grids(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "inv"
    code = main(
        ["privacy", "attack", "inversion", "--out", str(out), "--k", "2",
         "--iterations", "10", "--unmix-steps", "20", "--seed", "1"]
    )  # fmt: skip
    assert code == 0
    report = json.loads((out / "attack.json").read_text())
    assert [o["observer"] for o in report["observers"]] == ["plain", "secagg", "dp"]
    for obs in report["observers"]:
        assert (out / obs["grid"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert obs["random_baseline_psnr"] > 0
    assert "Secure aggregation" in report["statement"] and "DP" in report["statement"]
    assert "attack.json" in capsys.readouterr().out


@pytest.mark.parametrize(("flag", "value"), [("--k", "0"), ("--batch", "0"), ("--dp-noise", "0.1")])
def test_cli_refuses_bad_settings_naming_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture, flag: str, value: str
) -> None:
    code = main(["privacy", "attack", "inversion", "--out", str(tmp_path), flag, value])
    assert code == 2
    assert flag in capsys.readouterr().err
    assert not (tmp_path / "attack.json").exists()
