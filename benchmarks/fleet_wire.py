"""Fleet requests exactly as Flower's SuperNode builds them, sent with asyncio.

Flower's `FleetHttpClient` (flwr.supernode.fleet_http_client) is synchronous: one
httpx.Client and one thread per SuperNode, which would need a thousand processes or
threads to emulate a thousand devices. Here each emulated device keeps Flower's own
client object, with Flower's own interceptors (runtime version headers and the signed
SuperNode authentication headers, `NodeAuthHttpInterceptor`), and lets it build every
request: the path, the deterministic protobuf body and the headers. Only the last step,
the transport, is swapped: the built `httpx.Request` is captured instead of sent, and
one shared `httpx.AsyncClient` sends it. The request on the wire is therefore Flower's
byte for byte (tests/bench/test_fleet_bench.py checks it against a real SuperNode
client's request); the response is parsed with Flower's response type.

What is skipped: RuntimeVersionHttpInterceptor's look at the response (it only logs or
exits on a version mismatch, and both sides are the same flwr here).
"""

from __future__ import annotations

from typing import Any

import httpx
from cryptography.hazmat.primitives.asymmetric import ec
from flwr.supercore.interceptors.http.runtime_version import RuntimeVersionHttpInterceptor
from flwr.supercore.protobuf.client import ProtobufRequestContext
from flwr.supernode.fleet_http_client import FleetHttpClient
from flwr.supernode.node_auth_http_interceptor import NodeAuthHttpInterceptor
from google.protobuf.message import Message


class CapturedCall(Exception):
    """Raised by the capturing transport: carries the request Flower built."""

    def __init__(self, request: httpx.Request) -> None:
        super().__init__("captured")
        self.request = request


class CapturingFleetClient(FleetHttpClient):
    """Flower's Fleet client whose transport captures the request instead of sending it."""

    def _send(self, context: ProtobufRequestContext, *, stream: bool = False) -> httpx.Response:
        def terminal(ctx: ProtobufRequestContext) -> httpx.Response:
            raise CapturedCall(ctx.request)

        call_next = terminal
        for interceptor in reversed(self._interceptors):
            call_next = _wrap(interceptor, call_next)
        return call_next(context)


def _wrap(interceptor: Any, call_next: Any) -> Any:
    def call(ctx: ProtobufRequestContext) -> httpx.Response:
        return interceptor.intercept(ctx, call_next)

    return call


def supernode_interceptors(private_key: ec.EllipticCurvePrivateKey) -> list[Any]:
    """The interceptors flwr.supernode.fleet_http_connection gives a SuperNode's client."""
    return [
        RuntimeVersionHttpInterceptor(component_name="SuperNode"),
        NodeAuthHttpInterceptor(private_key, private_key.public_key()),
    ]


def capturing_client(server_address: str, private_key: ec.EllipticCurvePrivateKey) -> Any:
    """A device's Flower client (TLS address form as the SuperNode's: https://host:port)."""
    # verify=False: this client never opens a connection; the shared AsyncClient verifies.
    return CapturingFleetClient(
        f"https://{server_address}",
        interceptors=supernode_interceptors(private_key),
        verify=False,
    )


def build(client: Any, method: str, request: Message) -> httpx.Request:
    """The httpx.Request Flower's `client.<method>(request)` would send (e.g. "PullMessages")."""
    try:
        getattr(client, method)(request)
    except CapturedCall as call:
        return call.request
    raise AssertionError(f"{method}: Flower's client did not reach the transport")


RESPONSE_TYPES: dict[str, str] = {
    "ActivateNode": "ActivateNodeResponse",
    "DeactivateNode": "DeactivateNodeResponse",
    "PullMessages": "PullMessagesResponse",
    "PushMessages": "PushMessagesResponse",
    "SendNodeHeartbeat": "SendNodeHeartbeatResponse",
}


def parse(method: str, response: httpx.Response) -> Any:
    """Flower's response message for `method`, after raise_for_status as Flower does."""
    from flwr.proto import fleet_pb2, heartbeat_pb2

    response.raise_for_status()
    name = RESPONSE_TYPES[method]
    module = heartbeat_pb2 if name.startswith("SendNode") else fleet_pb2
    result = getattr(module, name)()
    result.ParseFromString(response.content)
    return result


async def call(
    http: httpx.AsyncClient, client: Any, method: str, request: Message, timeout: float
) -> Any:
    """Build with Flower, send with the shared async client, parse with Flower's type."""
    req = build(client, method, request)
    req.extensions["timeout"] = httpx.Timeout(timeout).as_dict()
    return parse(method, await http.send(req))
