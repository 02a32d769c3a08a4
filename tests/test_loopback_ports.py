"""tests/loopback_ports.py: ports for the servers tests start, safe from other sessions."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import loopback_ports
import pytest
from loopback_ports import free_port


def test_ports_are_outside_the_kernels_ephemeral_range_and_never_handed_out_twice():
    low, high = loopback_ports._ephemeral_range()
    if not loopback_ports.outside_ephemeral_range():
        pytest.skip(f"this kernel's ephemeral ports {low}-{high} cover the tests' range")
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == 50
    for port in ports:
        assert loopback_ports.LOW <= port < loopback_ports.HIGH
        assert not low <= port <= high  # bind(0) and outgoing connections never get it
        with socket.socket() as s:  # free now: the server the test starts can bind it
            s.bind(("127.0.0.1", port))


@pytest.mark.procs
def test_a_port_reserved_here_is_refused_to_another_session():
    port = free_port()
    child = (
        "import sys; sys.path.insert(0, sys.argv[1]); import loopback_ports as p; "
        "port = int(sys.argv[2]); print(p._reserve(port), p.free_port() != port)"
    )
    done = subprocess.run(
        [sys.executable, "-c", child, str(Path(__file__).parent), str(port)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    # Ours is held for this process's life: the child gets another one.
    assert done.stdout.split() == ["False", "True"]
