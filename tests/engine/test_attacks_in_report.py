"""Attack results saved under a run's privacy/attacks/ appear in its privacy report:
report.json lists each attack's figures and plain-words findings, report.html embeds the
figures as data: URIs (the report's CSP allows no other image source) and renders them in
a real browser."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from html import escape
from pathlib import Path

import pytest

from fedveil.cli.main import main
from fedveil.config import load_config
from fedveil.simulations.simulate_run import simulate

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]
MEMBERSHIP_TOML = """\
seed = 0
device = "cpu"
[data]
dataset = "digits"
partition = "iid"
num_clients = 5
[model]
name = "mlp"
[server]
rounds = 1
per_round = 5
[client]
local_epochs = 2
[eval]
central_every = 0
"""


def _attack_outputs(run: Path, tmp_path: Path) -> Path:
    """Run two attacks the way a user does, writing into run/privacy/attacks/<name>."""
    attacks = run / "privacy" / "attacks"
    assert main(
        ["privacy", "attack", "inversion", "--out", str(attacks / "inversion"), "--k", "2",
         "--iterations", "10", "--unmix-steps", "20"]
    ) == 0  # fmt: skip
    config = tmp_path / "membership.toml"
    config.write_text(MEMBERSHIP_TOML)
    code = main(
        ["privacy", "attack", "membership", "--config", str(config), "--shadows", "0",
         "--out", str(attacks / "membership")]
    )  # fmt: skip
    assert code in (0, 1)  # 1 only flags a DP-bound violation; this config has no DP
    return attacks


@pytest.mark.procs
def test_report_of_a_dp_run_shows_its_attacks(tmp_path: Path) -> None:
    run = tmp_path / "run"
    cfg = load_config(
        None,
        {
            "model.task": "tiny_task:make",
            "data.num_clients": 6,
            "server.per_round": 3,
            "server.rounds": 2,
            "dp.mechanism": "central",
            "dp.epsilon": 8.0,
            "simulation.workers": 1,
            "out": str(run),
        },
    )
    simulate(cfg)
    before = (run / "privacy" / "report.html").read_text()
    assert "Attacks on this run" not in before
    _attack_outputs(run, tmp_path)
    assert main(["privacy", "report", str(run)]) == 0

    report = json.loads((run / "privacy" / "report.json").read_text())
    assert "adversaries" in report  # still the DP report, now with the attacks
    found = {e["kind"]: e for e in report["attacks"]["found"]}
    assert set(found) == {"update_inversion", "membership"}
    assert len(found["update_inversion"]["figures"]) == 3  # plain, secure sum, DP
    assert "Secure aggregation" in found["update_inversion"]["statement"]
    assert "AUC" in found["membership"]["statement"]

    html = (run / "privacy" / "report.html").read_text()
    assert "Attacks on this run" in html and "epsilon" in html
    for entry in found.values():
        for figure in entry["figures"]:
            data = (run / "privacy" / figure).read_bytes()
            assert base64.b64encode(data).decode() in html  # embedded, not linked
    assert 'src="attacks/' not in html and "http://" not in html and "https://" not in html
    assert escape(found["update_inversion"]["statement"]) in html  # the plain words
    assert "Secure aggregation alone does not stop update inversion" in html

    if CHROMIUM is not None:
        shot = tmp_path / "report.png"
        subprocess.run(
            [CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}",
             f"--screenshot={shot}", "--window-size=1000,6000",
             (run / "privacy" / "report.html").as_uri()],
            capture_output=True, timeout=120, check=True,
        )  # fmt: skip
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_run_without_dp_gets_a_report_of_its_attacks_alone(tmp_path: Path) -> None:
    run = tmp_path / "plain-run"
    run.mkdir()
    attacks = run / "privacy" / "attacks" / "inversion"
    assert main(
        ["privacy", "attack", "inversion", "--out", str(attacks), "--k", "2",
         "--iterations", "10", "--unmix-steps", "20"]
    ) == 0  # fmt: skip
    assert main(["privacy", "report", str(run)]) == 0
    report = json.loads((run / "privacy" / "report.json").read_text())
    assert [e["kind"] for e in report["attacks"]["found"]] == ["update_inversion"]
    html = (run / "privacy" / "report.html").read_text()
    assert html.count('src="data:image/png;base64,') == 3


def test_run_without_dp_or_attacks_is_still_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    run = tmp_path / "empty"
    run.mkdir()
    assert main(["privacy", "report", str(run)]) != 0
    assert "no privacy ledger" in capsys.readouterr().err
