"""The bench's stock Flower peer (benchmarks/fleet_peer_flower.py) takes its SuperLink's
port on the command line (Flower offers no port 0): when another process holds the port
it picked, the SuperLink exits and a fresh port is tried. Real processes: a listening
socket holds the first port, and the stock `flower-superlink` is started against it."""

from __future__ import annotations

import socket

import pytest

from fedveil.benchmarks.fleet_peer_flower import StockSuperLink


@pytest.mark.procs
def test_the_stock_superlink_starts_on_a_fresh_port_when_its_pick_is_taken(tmp_path):
    link = StockSuperLink(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        first = taken.getsockname()[1]
        link.port = first  # as if another process took it after the pick
        try:
            link.start(timeout=240)
            assert link.port != first
            assert link.connected() == 0  # its Control API answers, over TLS with its CA
        finally:
            link.stop()
    log = (tmp_path / "superlink.log").read_text(errors="replace")
    assert f"error while attempting to bind on address ('127.0.0.1', {first})" in log
    assert f"Uvicorn running on https://127.0.0.1:{link.port}" in log
