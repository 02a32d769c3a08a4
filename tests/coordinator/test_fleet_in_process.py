"""Issue 33: the Fleet API served in the SuperLink's own process (fleet_listener.py).

Flower's real SuperLink app (flwr.superlink.main.create_app, in-memory state) and, on
its state, fedveil's Fleet-only app behind the gateway, as the SuperLink child serves
them. Requests are built and signed by Flower's own SuperNode client code
(benchmarks/fleet_wire.py) with real P-256 keys. What must hold:

- a node registered through Flower's Control API (on the full app) is the node a
  signed Fleet request reaches: one LinkState, not a copy;
- the Fleet-only app has no route but the Fleet's: Control and Runtime paths are
  404 even past the gateway's own path check;
- SuperNode authentication is Flower's: an unknown key, a node id not the key's, and
  a broken signature are refused 401, before any state is read for them.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from flwr.proto.control_pb2 import (
    ListNodesRequest,
    ListNodesResponse,
    RegisterNodeRequest,
    RegisterNodeResponse,
)
from flwr.proto.fleet_pb2 import (
    ActivateNodeRequest,
    PullMessagesRequest,
    PullMessagesResponse,
)
from flwr.proto.node_pb2 import Node

from fedveil.benchmarks.fleet_wire import build, capturing_client
from fedveil.server.coordinator.fleet_listener import LocalFleet, fleet_only_app
from fedveil.server.coordinator.gateway import FleetGateway
from fedveil.server.coordinator.metrics import ServiceCounters

PROTOBUF = "application/protobuf"


def _superlink() -> Any:
    from flwr.superlink.main import create_app

    app = create_app()  # in-memory LinkState, no lifespan servers
    app.state.enable_supernode_auth = True
    return app


def _pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    # What fedveil registers and a SuperNode sends (flwr-public-key, ActivateNode).
    return key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


async def _register(superlink: Any, key: ec.EllipticCurvePrivateKey) -> int:
    """RegisterNode through Flower's Control API route on the full app."""
    transport = httpx.ASGITransport(app=superlink)
    async with httpx.AsyncClient(transport=transport, base_url="https://link") as http:
        r = await http.post(
            "/v1/control/register-node",
            content=RegisterNodeRequest(public_key=_pem(key), name="d").SerializeToString(),
            headers={"content-type": PROTOBUF, "accept": PROTOBUF},
        )
    assert r.status_code == 200, r.text
    res = RegisterNodeResponse()
    res.ParseFromString(r.content)
    return int(res.node_id)


async def _send(gateway: FleetGateway, request: httpx.Request) -> httpx.Response:
    transport = httpx.ASGITransport(app=gateway, client=("10.0.0.7", 4000))
    async with httpx.AsyncClient(transport=transport, base_url="https://fleet") as http:
        return await http.send(request)


def _rebase(request: httpx.Request) -> httpx.Request:
    """Flower's signed request, sent to the in-process gateway (same path, headers, body)."""
    return httpx.Request(
        "POST", f"https://fleet{request.url.path}", headers=request.headers, content=request.content
    )


def _local_gateway(superlink: Any, counters: ServiceCounters) -> FleetGateway:
    """fedveil's gateway in front of the Fleet-only app on `superlink`'s state, in process."""
    return FleetGateway(
        "http://fleet.local", False, 1 << 20, counters, local=LocalFleet(fleet_only_app(superlink))
    )


async def _list_nodes(superlink: Any, body: bytes) -> httpx.Response:
    """The Control API's list-nodes call on Flower's full app (not the Fleet port)."""
    transport = httpx.ASGITransport(app=superlink)
    async with httpx.AsyncClient(transport=transport, base_url="https://link") as http:
        return await http.post(
            "/v1/control/list-nodes",
            content=body,
            headers={"content-type": PROTOBUF, "accept": PROTOBUF},
        )


def test_signed_fleet_requests_reach_the_control_apis_state() -> None:
    async def main() -> None:
        superlink = _superlink()
        counters = ServiceCounters()
        gateway = _local_gateway(superlink, counters)
        key = ec.generate_private_key(ec.SECP256R1())
        registered = await _register(superlink, key)
        device = capturing_client("fleet:443", key)
        req = ActivateNodeRequest(public_key=_pem(key), heartbeat_interval=30.0)
        r = await _send(gateway, _rebase(build(device, "ActivateNode", req)))
        assert r.status_code == 200, r.text
        pull = PullMessagesRequest(node=Node(node_id=registered))
        r = await _send(gateway, _rebase(build(device, "PullMessages", pull)))
        assert r.status_code == 200, r.text
        res = PullMessagesResponse()
        res.ParseFromString(r.content)
        assert list(res.messages_list) == []
        # One LinkState: the Control API lists the node the Fleet activated as online.
        r = await _list_nodes(superlink, ListNodesRequest().SerializeToString())
        nodes = ListNodesResponse()
        nodes.ParseFromString(r.content)
        assert {n.node_id: n.status for n in nodes.nodes_info} == {registered: "online"}
        assert counters.fleet_requests == 2 and counters.fleet_bytes_out > 0

    asyncio.run(main())


def test_control_and_runtime_routes_do_not_exist_on_the_fleet_app() -> None:
    async def main() -> None:
        superlink = _superlink()
        fleet = LocalFleet(fleet_only_app(superlink))
        body = b""  # a well-formed (empty) message of every type: only the route decides
        headers = [(b"content-type", PROTOBUF.encode()), (b"accept", PROTOBUF.encode())]
        for path in (
            "/v1/control/register-node",
            "/v1/control/list-nodes",
            "/v1/control/start-run",
            "/v1/runtime/get-nodes",
            "/health",
        ):
            res = await fleet.post(path, body, headers)
            assert res.status == 404, (path, res.status, res.content)
        # The same Control call on Flower's full app is served: the 404 is the app's.
        r = await _list_nodes(superlink, b"")
        assert r.status_code == 200, r.text

    asyncio.run(main())


def test_unknown_keys_wrong_nodes_and_bad_signatures_are_refused() -> None:
    async def main() -> None:
        superlink = _superlink()
        counters = ServiceCounters()
        gateway = _local_gateway(superlink, counters)
        enrolled = ec.generate_private_key(ec.SECP256R1())
        other = ec.generate_private_key(ec.SECP256R1())
        stranger = ec.generate_private_key(ec.SECP256R1())
        node = await _register(superlink, enrolled)
        other_node = await _register(superlink, other)

        # A key nobody registered, claiming the enrolled node's id.
        r = await _send(
            gateway,
            _rebase(
                build(
                    capturing_client("fleet:443", stranger),
                    "PullMessages",
                    PullMessagesRequest(node=Node(node_id=node)),
                )
            ),
        )
        assert r.status_code == 401, r.text
        # A registered key, claiming another registered node's id.
        r = await _send(
            gateway,
            _rebase(
                build(
                    capturing_client("fleet:443", enrolled),
                    "PullMessages",
                    PullMessagesRequest(node=Node(node_id=other_node)),
                )
            ),
        )
        assert r.status_code == 401, r.text
        # The enrolled key and its own node, with the signature's last byte changed.
        good = build(
            capturing_client("fleet:443", enrolled),
            "PullMessages",
            PullMessagesRequest(node=Node(node_id=node)),
        )
        forged = _rebase(good)
        sig_name = next(k for k in forged.headers if "signature" in k.lower())
        sig = forged.headers[sig_name]
        forged.headers[sig_name] = sig[:-2] + ("AA" if sig[-2:] != "AA" else "BB")
        r = await _send(gateway, forged)
        assert r.status_code == 401, r.text
        # And the untouched request is served: the refusals were the checks', not the path's.
        r = await _send(gateway, _rebase(good))
        assert r.status_code == 200, r.text

    asyncio.run(main())
