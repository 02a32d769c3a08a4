"""Issue 18, local and information leaks: owner-only state, no ServerApp token on any
command line, no server paths in public run views, deep nesting answered with 422."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
from pathlib import Path

import pytest
from deployment_harness import Deployment, run_toml, wait_for
from proctree import descendants

from fedveil.server.coordinator.runs import (
    MAX_CONFIG_DEPTH,
    RunManager,
    SubmissionError,
    parse_submission,
)
from fedveil.server.coordinator.settings import settings_from_dict

# -- deep nesting -------------------------------------------------------------------
GOOD = """seed = 1
[model]
name = "mlp"
[data]
num_clients = 4
[server]
rounds = 2
per_round = 2
"""


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        ("application/toml", GOOD + "x = " + "[" * 200_000 + "]" * 200_000 + "\n"),
        ("application/json", '{"x": ' + "[" * 200_000 + "]" * 200_000 + "}"),
        ("application/json", '{"x": ' + '{"a": ' * 100_000 + "1" + "}" * 100_000 + "}"),
        ("application/toml", GOOD + "x = " + "{a = " * 50_000 + "1" + "}" * 50_000 + "\n"),
    ],
)
def test_deep_nesting_is_refused_with_the_limit_not_a_crash(content_type, body):
    with pytest.raises(SubmissionError) as err:
        parse_submission(body.encode(), content_type, [])
    assert err.value.field == "body"
    assert f"at most {MAX_CONFIG_DEPTH} levels" in str(err.value)


def test_brackets_inside_strings_and_comments_do_not_count():
    deep = "[" * (MAX_CONFIG_DEPTH + 5)
    toml = GOOD.replace(
        "seed = 1",
        f'seed = 1\n# {deep}\nnote = "{deep}"\nlit = \'{deep}\'\nml = """\n{deep}\n"""',
    )
    # Unknown keys are refused by the validator: the point is that it got that far.
    with pytest.raises(SubmissionError) as err:
        parse_submission(toml.encode(), "application/toml", [])
    assert "levels are allowed" not in str(err.value)
    body = json.dumps({"seed": 1, "note": deep + '\\"' + deep})
    with pytest.raises(SubmissionError) as err:
        parse_submission(body.encode(), "application/json", [])
    assert "levels are allowed" not in str(err.value)


# -- paths in public views --------------------------------------------------------------
class FailingSuperLink:
    """A SuperLink that refuses to start runs, with an error naming a server file."""

    def start_run(self, fedveil_run_id, client_config_toml):
        raise RuntimeError("cannot read /root/.ssh/id_ed25519 (see /srv/fedveil/state/logs)")

    def runs(self):
        return {}


def test_public_run_views_show_no_server_paths(tmp_path):
    settings = settings_from_dict({"state_dir": "state"}, tmp_path, insecure=True)
    manager = RunManager(settings, FailingSuperLink())
    body = (GOOD + "[deploy]\nname = 'p'\nwait_for_clients = 2\n").encode()
    rid = manager.submit(body, "application/toml")["id"]
    manager.reconcile()
    admin = manager.view(rid, admin=True)
    assert admin["status"] == "failed"
    assert "/root/.ssh/id_ed25519" in admin["error"]  # the operator sees it all
    public = [manager.view(rid), *manager.list()]
    for view in public:
        text = json.dumps(view)
        assert "/root" not in text and "/srv" not in text and str(tmp_path) not in text
        assert view["error"].startswith("the SuperLink did not start the run: cannot read <path>")


# -- the real coordinator: file modes and the ServerApp token ----------------------------
def _cmdlines() -> dict[int, list[bytes]]:
    out = {}
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            out[int(proc.name)] = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
    return out


def _serverapp_started(state: Path) -> bool:
    marker = f"FEDVEIL_STATE_DIR={state}".encode()
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if marker not in (proc / "environ").read_bytes().split(b"\0"):
                continue
            if any(b"flwr-serverapp" in a for a in (proc / "cmdline").read_bytes().split(b"\0")):
                return True
        except OSError:
            continue
    return False


def _live_tokens(db: Path) -> list[str]:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        tokens = []
        for table in tables:
            cols = [r[1] for r in con.execute(f"PRAGMA table_info({table})")]
            if "token" in cols:
                tokens += [str(r[0]) for r in con.execute(f"SELECT token FROM {table}") if r[0]]
    return tokens


@pytest.mark.procs
def test_state_is_owner_only_and_no_token_on_a_command_line(tmp_path):
    dep = Deployment(tmp_path)
    # A state dir left world-readable by an older version: fixed at start.
    (dep.state / "logs").mkdir(parents=True)
    old_log = dep.state / "logs" / "old.log"
    old_log.write_text("x\n")
    os.chmod(old_log, 0o644)
    os.chmod(dep.state, 0o755)
    try:
        dep.start_server()
        # A run with no devices: its ServerApp starts and waits for clients.
        rid = dep.submit(run_toml(rounds=1, clients=2, per_round=2, seed=1, name="leaks"))
        wait_for(lambda: _serverapp_started(dep.state), 60, "the ServerApp to start")
        tokens = wait_for(lambda: _live_tokens(dep.state / "superlink.db"), 30, "a token")
        assert dep.server is not None
        ours = {dep.server.pid, *descendants(dep.server.pid)}
        assert len(ours) >= 3  # the coordinator, its SuperLink and the ServerApp at least
        argvs = _cmdlines()
        assert any(b"--token-file" in argvs.get(pid, []) for pid in ours)  # the ServerApp
        for pid, argv in argvs.items():
            # Any local user can read every command line: no process shows our tokens.
            joined = b" ".join(argv)
            assert not any(t.encode() in joined for t in tokens), argv[:3]
            # Stock Flower started by another test may pass --token; ours never do.
            if pid in ours:
                assert b"--token" not in argv, argv[:3]
        assert (dep.state / "runs" / rid / "run.json").exists()

        assert stat.S_IMODE(dep.state.stat().st_mode) == 0o700
        seen = []
        for path in [dep.state, *dep.state.rglob("*")]:
            if path.is_symlink():
                continue
            mode = stat.S_IMODE(path.stat().st_mode)
            seen.append(path.name)
            assert mode & 0o077 == 0, f"{path}: {oct(mode)}"
            if path.is_file() and path.parent.name != "bin":
                assert mode == 0o600, f"{path}: {oct(mode)}"
        assert {"superlink.db", "service.log", "superlink.log", "run.json", "old.log"} <= set(seen)
        dep.http.post(f"/runs/{rid}/stop", headers=dep.admin)
    finally:
        dep.close()
