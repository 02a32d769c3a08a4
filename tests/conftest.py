from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

TESTS = Path(__file__).parent
sys.path.insert(0, str(TESTS))  # tests/tiny_task.py is importable as `tiny_task`

# Process discipline (tests/procguard.py): leftovers swept and failed, fast tier guarded.
pytest_plugins = ["procguard"]


@pytest.fixture(autouse=True, scope="session")
def _temporary_key_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Ledger signing keys (and subprocesses') go to a temp store, never to ~."""
    saved = os.environ.get("FEDVEIL_KEY_DIR")
    os.environ["FEDVEIL_KEY_DIR"] = str(tmp_path_factory.mktemp("fedveil-keys"))
    yield
    if saved is None:
        os.environ.pop("FEDVEIL_KEY_DIR", None)
    else:
        os.environ["FEDVEIL_KEY_DIR"] = saved


@pytest.fixture(autouse=True, scope="session")
def _ray_shut_down_at_session_end() -> Iterator[None]:
    """Tests that run Flower's simulation engine start one local Ray for the session
    (tests/local_ray.py) and leave it up for the next: it is shut down here, before the
    session-end check (tests/procguard.py) looks for processes left behind. Ray's workers
    (`ray::ClientAppActor`) can outlive ray.shutdown() by more than that check's grace on
    a loaded machine: as the owner of this Ray, the fixture ends them."""
    yield
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        from procguard import end_processes  # the plugin (pytest_plugins), loaded by now

        ray.shutdown()
        end_processes("ray::")


@pytest.fixture(autouse=True)
def _ray_workers_end_with_their_run(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a Flower or Ray test whose run shut its Ray down (simulations/flower_runner.py,
    ray.cluster_utils.Cluster.shutdown), that Ray's workers (`ray::ClientAppActor`) were
    measured still running 10 s later: they are ended here, so that they neither pile up
    over the session nor fail its end check.
    The session's own Ray (tests/local_ray.py), still up, keeps its workers for the next."""
    yield
    if not any(request.node.get_closest_marker(m) for m in ("flower", "procs")):
        return  # a fast-tier test starts no Ray
    ray = sys.modules.get("ray")
    if ray is not None and not ray.is_initialized():
        from procguard import end_processes

        end_processes("ray::")


@pytest.fixture
def tiny_env() -> dict[str, str]:
    """Environment for a subprocess that must import the tiny task."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")])
    return env


@dataclass(frozen=True)
class CliResult:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def fedveil_cli(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Callable[..., CliResult]:
    """`fedveil ARGS` in this process (main([...]), the console script's body) for argument
    and error tests: a subprocess would spend its time importing torch. argparse's own
    refusals (SystemExit) come back as their exit code, as from the command. PYTHONPATH is
    restored after the test."""
    from fedveil.cli.main import main

    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))

    def run(*args: str) -> CliResult:
        capsys.readouterr()  # what the test printed before is not the command's
        try:
            code = main(list(args))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        out = capsys.readouterr()
        return CliResult(code, out.out, out.err)

    return run


# Modules another change is moving (the README's blocks move into docs/, issue 29): they
# start processes, and are marked here rather than edited under that change. Once moved,
# each carries `pytestmark = pytest.mark.procs` itself and leaves this list.
_PROCS_MODULES_BEING_MOVED = frozenset(
    {
        "test_containers.py",
        "test_model_metadata.py",
        "test_readme_task.py",
        "test_registry_readme.py",
        "test_serve.py",
    }
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name in _PROCS_MODULES_BEING_MOVED:
            item.add_marker(pytest.mark.procs)
        if item.name.startswith("test_image_builds_and_runs_as_non_root"):
            # A container build may take its own 1800 s (test_containers.py, being moved).
            item.add_marker(pytest.mark.timeout(2100))
