"""The device's Runtime API port (client/edge/runtime_port.py): a port another process
takes between the worker's pick and the SuperNode's bind costs a restart on a fresh port,
never the device; a fixed port that is taken is a clear error, not a device that talks to
whatever listens there. Real SuperNode processes on loopback."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from loopback_ports import free_port

from fedveil.client.edge.device_app import EdgeClient, TaskSource
from fedveil.client.edge.edge import EdgeNode, EdgeOptions
from fedveil.ops.procs import stop_group

pytestmark = [pytest.mark.procs, pytest.mark.timeout(180)]

TESTS = Path(__file__).resolve().parents[2]


@pytest.fixture
def taken() -> Iterator[int]:
    """A loopback port another server listens on (here: a listening socket)."""
    with socket.create_server(("127.0.0.1", 0)) as sock:
        yield sock.getsockname()[1]


def test_a_port_taken_after_its_pick_costs_a_restart_not_the_device(tmp_path, taken):
    picks = iter([taken])  # the pick loses the race: the port is someone else's by now
    opts = EdgeOptions(f"127.0.0.1:{free_port()}", 0, tmp_path / "state", insecure=True)
    node = EdgeNode(
        opts,
        EdgeClient(TaskSource("tiny_task:make"), 0),
        pick_port=lambda: next(picks, 0) or free_port(),
    )
    try:
        node.start_runtime()
        assert node.proc is not None and node.proc.poll() is None
        assert node.port not in (0, taken)
        # The port the worker talks to is its own SuperNode's: a claim signed with this
        # start's secret is answered (no task yet), not refused or unanswered.
        client = node._runtime_client(None)
        try:
            assert node._acquire(client) is None
        finally:
            client.close()
    finally:
        if node.proc is not None:
            stop_group(node.proc, timeout=5)
    log = (tmp_path / "state" / "supernode.log").read_text()
    assert f"could not listen on 127.0.0.1:{taken}" in log


def test_a_fixed_runtime_port_that_is_taken_is_a_clear_error(tmp_path, taken):
    # The whole device loop (EdgeNode.run) in its own process, as `fedveil client` runs it.
    script = textwrap.dedent(
        f"""
        import sys
        from pathlib import Path
        from fedveil.client.edge.device_app import EdgeClient, TaskSource
        from fedveil.client.edge.edge import EdgeNode, EdgeOptions
        opts = EdgeOptions("127.0.0.1:{free_port()}", 0, Path(sys.argv[1]), insecure=True,
                           runtime_port={taken})
        try:
            EdgeNode(opts, EdgeClient(TaskSource("tiny_task:make"), 0)).run()
        except ValueError as exc:
            print("error:", exc)
            sys.exit(2)
        """
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", script, str(tmp_path / "state")],
            cwd=TESTS,
            capture_output=True,
            text=True,
            timeout=90,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the device kept going on a taken runtime port: {exc.stdout!r}")
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"port {taken} (1 tries; in use by another process?)" in done.stdout
