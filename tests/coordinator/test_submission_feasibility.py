"""Issue 18 at submission: secure aggregation that cannot reach its threshold is refused
(field named), DP noise that dominates is warned about with numbers, and a deployed run
gets a round deadline so a dead device cannot stall a round."""

from __future__ import annotations

import pytest

from fedveil.config import load_config
from fedveil.server.coordinator.runs import (
    RunManager,
    SubmissionError,
    deployed_round_timeout,
    parse_submission,
)
from fedveil.server.coordinator.settings import settings_from_dict

QUICK_START = """[model]
name = "mlp"
[data]
num_clients = 2
[server]
rounds = 2
per_round = 2
[secagg]
enabled = true
[deploy]
wait_for_clients = 2
"""


class RecordingSuperLink:
    def __init__(self):
        self.started: list[tuple[str, str]] = []

    def start_run(self, fedveil_run_id, client_config_toml):
        self.started.append((fedveil_run_id, client_config_toml))
        return len(self.started)

    def runs(self):
        return {}


def manager(tmp_path) -> RunManager:
    settings = settings_from_dict({"state_dir": "state"}, tmp_path, insecure=True)
    return RunManager(settings, RecordingSuperLink())


def test_the_two_device_secure_quick_start_is_refused(tmp_path):
    link_manager = manager(tmp_path)
    with pytest.raises(SubmissionError, match="secure aggregation needs at least 3") as err:
        link_manager.submit(QUICK_START.encode(), "application/toml")
    assert err.value.field == "server.per_round"
    assert link_manager.link.started == []  # nothing reached the devices


def test_waiting_for_too_few_devices_is_refused():
    text = QUICK_START.replace("num_clients = 2", "num_clients = 5").replace(
        "per_round = 2", "per_round = 4"
    )
    with pytest.raises(SubmissionError) as err:
        parse_submission(text.encode(), "application/toml", [])
    assert err.value.field == "deploy.wait_for_clients"
    ok = text.replace("wait_for_clients = 2", "wait_for_clients = 4")
    parse_submission(ok.encode(), "application/toml", [])


CENTRAL = """[model]
name = "mlp"
[data]
num_clients = 3
[server]
rounds = 2
per_round = 3
[dp]
mechanism = "central"
epsilon = 8.0
noise_multiplier = 1.34
"""


def test_dominating_dp_noise_is_a_warning_in_the_response(tmp_path):
    view = manager(tmp_path).submit(CENTRAL.encode(), "application/toml")
    [warning] = view["warnings"]
    assert "1.34*1/3 = 0.447" in warning and "outweighs" in warning
    assert view["status"] in {"queued", "running"} and "id" in view  # the usual keys stay
    big = CENTRAL.replace("num_clients = 3", "num_clients = 400").replace(
        "per_round = 3", "per_round = 300"
    )
    assert manager(tmp_path / "b").submit(big.encode(), "application/toml")["warnings"] == []


def test_a_deployed_run_gets_a_round_deadline_in_its_resolved_config(tmp_path):
    m = manager(tmp_path)
    view = m.submit(CENTRAL.encode(), "application/toml")
    resolved = load_config(m.state_dir / "runs" / view["id"] / "config.toml")
    assert resolved.server.round_timeout == 120.0  # max(120 s, 60 s x 1 epoch)
    steps = load_config(None, {"client.local_steps": 1000, "client.local_epochs": 0})
    assert deployed_round_timeout(steps) == 500.0
    own = load_config(None, {"server.round_timeout": 30.0})
    assert deployed_round_timeout(own) == 30.0  # the run's own deadline is kept
    assert load_config(None, {}).server.round_timeout == 0.0  # simulation: no deadline
