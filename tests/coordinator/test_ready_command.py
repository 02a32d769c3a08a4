"""`fedveil ready`: the coordinator tutorial (docs/tutorials/coordinator-and-devices.md)
starts the server in the background, then enrolls devices with the admin token the server
generates at its first start. Without a readiness wait the
enrolment ran before the token existed ("no such file: state/admin.token")."""

from __future__ import annotations

import subprocess
import sys

import deployment_harness
import pytest
from deployment_harness import Deployment


@pytest.mark.slow
@pytest.mark.procs
def test_ready_waits_for_the_coordinator_and_then_the_token_exists(tmp_path):
    dep = Deployment(tmp_path, clients=1)
    # As in the tutorial: no admin token configured, so the server generates state/admin.token.
    text = dep.config.read_text().replace('[auth]\nadmin_token_file = "admin.token"\n', "")
    dep.config.write_text(text)
    env = deployment_harness.test_env(
        {
            "FEDVEIL_API": f"https://127.0.0.1:{dep.api_port}",
            "FEDVEIL_CA": str(dep.certs / "ca.pem"),
            "FEDVEIL_ADMIN_TOKEN_FILE": str(dep.state / "admin.token"),
        }
    )
    cli = [sys.executable, "-m", "fedveil.cli.main"]

    def fedveil(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*cli, *args], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=timeout
        )

    nothing = fedveil("ready", "--wait", "0")
    assert nothing.returncode == 1
    assert "not ready" in nothing.stderr and "cannot reach" in nothing.stderr

    dep.server = subprocess.Popen(
        [*cli, "server", "--config", str(dep.config)],
        env=env,
        cwd=tmp_path,
        stdout=dep._log("server"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        ready = fedveil("ready", "--wait", "90")
        assert ready.returncode == 0, ready.stderr
        assert "ready:" in ready.stdout
        # What the tutorial does next works at once: the generated token is there, owner-only.
        assert (dep.state / "admin.token").stat().st_mode & 0o077 == 0
        pub = dep.certs / "clients" / "client-0.pub"
        enrolled = fedveil("clients", "enroll", str(pub), "--id", "0")
        assert enrolled.returncode == 0, enrolled.stderr
        # A DP run whose noise swamps the update: the submitter sees the warning, with numbers.
        run = tmp_path / "private-run.toml"
        run.write_text(
            '[data]\ndataset = "synthetic"\nnum_clients = 3\n[model]\nname = "mlp"\n'
            "[server]\nrounds = 2\nper_round = 3\n"
            '[dp]\nmechanism = "central"\nepsilon = 50.0\nclip = 1.0\n'
        )
        submitted = fedveil("run", "submit", str(run))
        assert submitted.returncode == 0, submitted.stderr
        assert "warning:" in submitted.stderr and "noise" in submitted.stderr
    finally:
        dep.close()


def test_ready_refuses_an_out_of_range_wait(fedveil_cli):
    out = fedveil_cli("ready", "--wait", "-1")
    assert out.returncode == 2
    assert "--wait -1: must be within [0, 3600]" in out.stderr
