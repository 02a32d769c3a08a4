"""The local SuperLink `flwr run` would start for a local-simulation federation, started by
the test instead: on ports of its own, with its FLWR_HOME in the test's tmp, stopped with
its whole process group at the end.

Left to `flwr run`, that SuperLink would listen on Flower's fixed ports (39091, 39093): a
run would join whatever SuperLink another test, session or checkout had left there, and
the SuperLink would outlive the test. `flwr run` also gives the one it starts only 15 s
to come up, too little on a loaded machine. With FLWR_LOCAL_SUPERLINK_HTTP_API_PORT and
FLWR_LOCAL_CONTROL_API_PORT in the environment, `flwr run` finds this one up and uses it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from loopback_ports import free_port

BIN = Path(sys.executable).parent
START_TIMEOUT_S = 90.0


@contextlib.contextmanager
def local_superlink(root: Path, env: dict[str, str]) -> Iterator[dict[str, str]]:
    """Start the SuperLink; yield `env` plus what `flwr run` needs to find it."""
    http_port, control_port = free_port(), free_port()
    env = dict(env)
    env.update(
        FLWR_HOME=str(root / "flwr-home"),
        FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=str(http_port),
        FLWR_LOCAL_CONTROL_API_PORT=str(control_port),
        FLWR_DISABLE_UPDATE_CHECK="1",
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
    )
    log_dir = root / "flwr-home" / "local-superlink"
    log_dir.mkdir(parents=True)
    superlink = subprocess.Popen(
        [
            str(BIN / "flower-superlink"),
            "--insecure",
            "--simulation",
            "--isolation",
            "subprocess",
            "--control-api-address",
            f"127.0.0.1:{control_port}",
            "--host",
            "127.0.0.1",
            "--port",
            str(http_port),
            "--log-file",
            str(log_dir / "superlink.log"),
        ],
        env=env,
        cwd=root,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its own group: stopped with its children below
    )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                socket.create_connection(("127.0.0.1", http_port), timeout=0.5).close()
                break
            except OSError:
                assert superlink.poll() is None, "flower-superlink exited at start"
                assert time.monotonic() < deadline, (
                    f"flower-superlink did not start in {START_TIMEOUT_S:.0f} s"
                )
                time.sleep(0.3)
        yield env
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(superlink.pid, signal.SIGTERM)
        try:
            superlink.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(superlink.pid, signal.SIGKILL)
            superlink.wait()
