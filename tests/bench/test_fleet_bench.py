"""`fedveil bench fleet`: the emulated devices are Flower SuperNodes on the wire, and a
small run against a real coordinator holds every one of them connected.

Nothing here asserts a latency or a CPU figure: those live in the benchmark's output.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import threading
from base64 import b64decode
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from flwr.proto.fleet_pb2 import ActivateNodeRequest, PullMessagesRequest
from flwr.proto.heartbeat_pb2 import SendNodeHeartbeatRequest
from flwr.proto.node_pb2 import Node
from flwr.supercore.primitives.asymmetric import (
    bytes_to_public_key,
    public_key_to_bytes,
    verify_signature,
)
from flwr.supernode.fleet_http_client import FleetHttpClient

from fedveil.benchmarks.fleet_wire import call, capturing_client, supernode_interceptors
from fedveil.cli.main import main as cli_main
from fedveil.ops.certs import CLIENT_CURVE, create_test_deployment

SIGNED = {"flwr-timestamp", "flwr-signature"}  # differ per request: time, ECDSA nonce
# The figures per device count, for fedveil and for the peer alike (issue 33).
PER_N = (
    "devices",
    "devices_connected",
    "p50_s",
    "p99_s",
    "requests_per_s",
    "coordinator_cpu_percent",
    "coordinator_rss_mb",
    "coordinator_cpu_ms_per_request",
)


class Recorder(BaseHTTPRequestHandler):
    """A TLS HTTP server that keeps every request and answers an empty protobuf."""

    seen: ClassVar[list[dict[str, Any]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        self.seen.append(
            {
                "method": self.command,
                "path": self.path,
                "headers": {k.lower(): v for k, v in self.headers.items()},
                "body": body,
            }
        )
        self.send_response(200)
        self.send_header("content-type", "application/protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def recorder(tmp_path: Path) -> Iterator[tuple[str, Path, list[dict[str, Any]]]]:
    files = create_test_deployment(tmp_path / "certs", ["127.0.0.1"], 0)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(files["cert"], files["key"])
    Recorder.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}", files["ca"], Recorder.seen
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.procs
def test_emulated_requests_equal_flowers_supernode_client_on_the_wire(
    recorder: tuple[str, Path, list[dict[str, Any]]],
) -> None:
    address, ca, seen = recorder
    key = ec.generate_private_key(CLIENT_CURVE)
    pk = public_key_to_bytes(key.public_key())
    node = Node(node_id=1234567)
    requests = [
        ("ActivateNode", ActivateNodeRequest(public_key=pk, heartbeat_interval=30)),
        ("PullMessages", PullMessagesRequest(node=node)),
        ("SendNodeHeartbeat", SendNodeHeartbeatRequest(node=node, heartbeat_interval=30)),
    ]
    # Flower's SuperNode client as flwr.supernode.fleet_http_connection builds it.
    with FleetHttpClient.from_server_address(
        address, False, ca.read_bytes(), interceptors=supernode_interceptors(key)
    ) as flower:
        for method, req in requests:
            getattr(flower, method)(req)

    async def emulate() -> None:
        ours = capturing_client(address, key)
        async with httpx.AsyncClient(verify=ssl.create_default_context(cafile=str(ca))) as http:
            for method, req in requests:
                await call(http, ours, method, req, 10)

    asyncio.run(emulate())
    assert len(seen) == 2 * len(requests)
    for theirs, ours in zip(seen[: len(requests)], seen[len(requests) :], strict=True):
        assert ours["method"] == theirs["method"] == "POST"
        assert ours["path"] == theirs["path"]
        assert ours["body"] == theirs["body"]
        assert ours["headers"].keys() == theirs["headers"].keys()
        assert {k: v for k, v in ours["headers"].items() if k not in SIGNED} == {
            k: v for k, v in theirs["headers"].items() if k not in SIGNED
        }
        # The SuperLink's check (flwr.superlink.routers.fleet.node_auth) passes on ours.
        h = ours["headers"]
        assert b64decode(h["flwr-public-key"]) == pk
        assert verify_signature(
            bytes_to_public_key(pk), h["flwr-timestamp"].encode(), b64decode(h["flwr-signature"])
        )
    assert [s["path"] for s in seen[:3]] == [
        "/v1/fleet/activate-node",
        "/v1/fleet/pull-messages",
        "/v1/fleet/send-node-heartbeat",
    ]


@pytest.mark.procs
def test_a_small_run_split_over_two_emulator_processes_holds_every_device_on_both(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # With stock Flower's SuperLink as the peer, on the same devices, in the same run.
    code = cli_main(
        [
            "bench",
            "fleet",
            "--devices",
            "20",
            "--warmup",
            "1",
            "--window",
            "4",
            "--peer",
            "flower",
            # Two emulator processes, 10 devices each, on both sides (fleet_emulator.py).
            "--emulator-procs",
            "2",
            "--json",
        ]
    )
    assert code == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for key in (*PER_N, "secagg_round_ok", "held_at_p99_under_1s"):
        assert key in summary, key
    assert summary["devices"] == 20
    # GET /cluster (enrolled keys the SuperLink lists online), asked while all 20 polled.
    assert summary["devices_connected"] == 20
    # No device lost a pull (after Flower's retries): every one stayed a working device.
    assert summary["devices_failed"] == 0 and summary["activation_failures"] == {}
    assert summary["requests"] > 0 and 0 < summary["p50_s"] <= summary["p99_s"]
    assert summary["coordinator_cpu_percent"] > 0 and summary["coordinator_rss_mb"] > 0
    assert summary["secagg_round_ok"] is None and summary["secagg_round_note"]
    # Both emulator processes held their half and counted requests in the one window; the
    # emulator's CPU is the sum of theirs.
    for side in (summary, summary["peer_sweep"][0]):
        assert side["emulator_procs"] == 2
        assert side["emulator_devices_per_proc"] == [10, 10]
        assert all(r > 0 for r in side["emulator_requests_per_proc"])
        assert sum(side["emulator_requests_per_proc"]) == side["requests"]
        assert side["emulator_cpu_percent"] == pytest.approx(
            sum(side["emulator_cpu_percent_per_proc"]), abs=0.15
        )
    # The peer: flower-superlink (TLS, SuperNode auth) held the same 20 devices, each
    # listed online by its own Control API, with the same keys per N.
    assert summary["peer"].startswith("flower-superlink ")
    (theirs,) = summary["peer_sweep"]
    assert theirs["coordinator"] == summary["peer"]
    for key in (*PER_N, "load_average_1m"):
        assert key in theirs and key in summary, key
    assert theirs["devices"] == theirs["devices_connected"] == 20
    assert theirs["devices_failed"] == 0 and theirs["activation_failures"] == {}
    assert theirs["requests"] > 0 and theirs["coordinator_cpu_ms_per_request"] > 0
    ours, peer = summary["held_at_p99_under_1s"], summary["peer_held_at_p99_under_1s"]
    assert peer in (0, 20) and ours in (0, 20)
    assert summary["capacity_ratio"] == (ours / peer if peer else None)


@pytest.mark.flower
@pytest.mark.slow
def test_a_secure_round_of_emulated_devices_equals_the_simulation() -> None:
    """Eight emulated devices (Flower's SuperNode connection, enrolled keys, TLS) answer a
    secure-aggregation round through a real coordinator; its model equals `fedveil
    simulate`'s within twice the quantisation bound (each side rounds under its own
    fresh key), and the rounding did happen (the two are not equal bit for bit)."""
    from fedveil.benchmarks.fleet_secagg_round import secagg_round

    # Its own temporary directory: a pytest path is too long for the SuperLink's socket.
    r = secagg_round(8, seed=3, poll_s=0.5)
    assert r["secagg_round_status"] == "completed"
    assert r["secagg_round_cohort_aggregated"] == 8 and r["secagg_round_dropped"] == 0
    # Every device answered every secure-aggregation exchange of the round.
    assert r["secagg_round_messages_answered"] >= 8 * 3
    assert 0 < r["secagg_round_tolerance"] < 1e-4
    assert r["secagg_round_max_abs_diff"] <= r["secagg_round_tolerance"]
    assert r["secagg_round_models_differ"]
    assert r["secagg_round_ok"] is True
