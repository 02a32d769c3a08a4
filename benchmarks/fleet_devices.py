"""The emulated devices of `fedveil bench fleet`: Flower SuperNodes at their idle pace.

Each device has its own enrolled key (fedveil.ops.certs.CLIENT_CURVE) and speaks the
Fleet protocol as Flower's SuperNode does when idle: ActivateNode, then PullMessages
every 3 s (the SuperNode's sleep after an empty pull, flwr.supernode.start_client_internal)
and SendNodeHeartbeat every (30 - 5) * U(0.7, 0.9) s (flwr.supercore.heartbeat,
HEARTBEAT_DEFAULT_INTERVAL 30), with Flower's retries. Requests are built and signed by
Flower's own client code (fleet_wire.py) and sent with one asyncio httpx client per
process; fleet_emulator.py runs a share of the devices in each of several processes.

A `Tally` keeps the latency of every request that started inside the measured window
(from its first attempt to its answer, as the device sees it), the requests lost after
Flower's retries and the retries themselves.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import resource
import ssl
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from flwr.common.constant import (
    HEARTBEAT_BASE_MULTIPLIER,
    HEARTBEAT_CALL_TIMEOUT,
    HEARTBEAT_DEFAULT_INTERVAL,
    HEARTBEAT_RANDOM_RANGE,
)
from flwr.proto.fleet_pb2 import (
    ActivateNodeRequest,
    DeactivateNodeRequest,
    PullMessagesRequest,
)
from flwr.proto.heartbeat_pb2 import SendNodeHeartbeatRequest
from flwr.proto.node_pb2 import Node
from flwr.supercore.primitives.asymmetric import public_key_to_bytes

from fedveil.benchmarks.fleet_wire import call, capturing_client
from fedveil.ops.certs import CLIENT_CURVE

RETRY_STATUS = (502, 503, 504)  # e.g. the gateway's "SuperLink starting or restarting"
REQUEST_TIMEOUT_S = 30.0  # ProtobufClient's default timeout
GRACE_S = 30.0  # after the window: open calls may finish, then they count as lost


def heartbeat_interval(rng: random.Random) -> float:
    """Flower's HeartbeatSender: (interval - call timeout) * (0.8 + U(-0.1, 0.1))."""
    return (HEARTBEAT_DEFAULT_INTERVAL - HEARTBEAT_CALL_TIMEOUT) * (
        HEARTBEAT_BASE_MULTIPLIER + rng.uniform(*HEARTBEAT_RANDOM_RANGE)
    )


@dataclass
class Device:
    client_id: int
    key: ec.EllipticCurvePrivateKey
    client: Any = None
    node_id: int = 0

    @property
    def public_key_bytes(self) -> bytes:
        return public_key_to_bytes(self.key.public_key())

    def openssh(self) -> str:
        return (
            self.key.public_key()
            .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
            .decode()
        )

    def private_pem(self) -> bytes:
        """The key as unencrypted PKCS#8 PEM: how it travels to an emulator process."""
        return self.key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    @classmethod
    def from_pem(cls, client_id: int, pem: bytes, address: str) -> Device:
        """The device `private_pem` sent, with its own Flower client for `address`."""
        key = serialization.load_pem_private_key(pem, password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ValueError(f"device {client_id}: not an EC private key ({type(key).__name__})")
        return cls(client_id, key, capturing_client(address, key))


@dataclass
class Tally:
    """Latencies and failures of the requests that started inside the window."""

    window: tuple[float, float]
    latencies: list[float] = field(default_factory=list)
    failures: dict[str, int] = field(default_factory=dict)  # "<method> <error>": calls lost
    retries: dict[str, int] = field(default_factory=dict)  # attempts retried, as Flower does
    failed_devices: set[int] = field(default_factory=set)  # a pull lost after its retries
    open: int = 0  # calls started in the window and not answered yet

    @property
    def stop(self) -> float:
        return self.window[1]

    def inside(self, started: float) -> bool:
        return self.window[0] <= started < self.window[1]

    def retried(self, started: float, what: str) -> None:
        if self.inside(started):
            self.retries[what] = self.retries.get(what, 0) + 1

    def record(self, device: Device, started: float, error: str | None, *, fatal: bool) -> None:
        if not self.inside(started):
            return
        if error is None:
            self.latencies.append(time.perf_counter() - started)
        else:
            self.failures[error] = self.failures.get(error, 0) + 1
            if fatal:
                self.failed_devices.add(device.client_id)


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def error_name(exc: BaseException) -> str:
    if isinstance(exc, httpx.HTTPStatusError):
        return f"http_{exc.response.status_code}"
    return type(exc).__name__


def _retryable(exc: BaseException) -> bool:
    """Flower's SuperNode retries these (flwr.supercore.retry.http_retry)."""
    if isinstance(exc, httpx.HTTPStatusError):
        return exc.response.status_code in RETRY_STATUS
    return isinstance(exc, httpx.TransportError)


async def _timed(
    http: httpx.AsyncClient, d: Device, method: str, req: Any, tally: Tally, *, tries: int
) -> Any:
    """One Fleet call as a SuperNode makes it: PullMessages goes through Flower's retry
    invoker (retried on 502/503/504 and transport errors, with backoff); a heartbeat is
    not retried (the next one comes ~20 s later; the SuperLink waits two intervals). The
    latency is the device's: from the first attempt to the answer."""
    started = time.perf_counter()
    tally.open += tally.inside(started)
    try:
        return await _attempts(http, d, method, req, tally, started, tries)
    finally:
        tally.open -= tally.inside(started)


async def _attempts(
    http: httpx.AsyncClient,
    d: Device,
    method: str,
    req: Any,
    tally: Tally,
    started: float,
    tries: int,
) -> Any:
    for attempt in range(tries):
        try:
            res = await call(http, d.client, method, req, REQUEST_TIMEOUT_S)
        except (httpx.HTTPError, ValueError) as exc:
            what = f"{method} {error_name(exc)}"
            if attempt < tries - 1 and _retryable(exc):
                tally.retried(started, what)
                await asyncio.sleep(min(8.0, 0.5 * 2**attempt))
                continue
            tally.record(d, started, what, fatal=method == "PullMessages")
            return None
        tally.record(d, started, None, fatal=False)
        return res
    return None


async def _nap(seconds: float, stop: float) -> None:
    """Sleep `seconds`, but wake at `stop`: a device's next request would fall after the
    window, and waiting for it would only lengthen the run."""
    await asyncio.sleep(max(0.0, min(seconds, stop - time.perf_counter())))


async def poll(
    http: httpx.AsyncClient, d: Device, poll_s: float, tally: Tally, rng: random.Random
) -> None:
    await _nap(rng.uniform(0, poll_s), tally.stop)  # devices come up at different moments
    node = Node(node_id=d.node_id)
    while time.perf_counter() < tally.stop:
        await _timed(http, d, "PullMessages", PullMessagesRequest(node=node), tally, tries=5)
        await _nap(poll_s, tally.stop)


async def heartbeat(http: httpx.AsyncClient, d: Device, tally: Tally, rng: random.Random) -> None:
    req = SendNodeHeartbeatRequest(
        node=Node(node_id=d.node_id), heartbeat_interval=HEARTBEAT_DEFAULT_INTERVAL
    )
    # HeartbeatSender sends its first heartbeat as soon as the node is activated.
    while time.perf_counter() < tally.stop:
        await _timed(http, d, "SendNodeHeartbeat", req, tally, tries=1)
        await _nap(heartbeat_interval(rng), tally.stop)


async def bounded(limit: int, coros: list[Any]) -> list[Any]:
    sem = asyncio.Semaphore(limit)

    async def one(c: Any) -> Any:
        async with sem:
            return await c

    return await asyncio.gather(*(one(c) for c in coros))


async def activate(http: httpx.AsyncClient, d: Device, tries: int = 10) -> None:
    """ActivateNode, retried on a transport error or 502/503/504 as Flower's retry invoker
    (make_simple_http_retry_invoker) retries a SuperNode's."""
    req = ActivateNodeRequest(
        public_key=d.public_key_bytes, heartbeat_interval=HEARTBEAT_DEFAULT_INTERVAL
    )
    for attempt in range(tries):
        try:
            res = await call(http, d.client, "ActivateNode", req, REQUEST_TIMEOUT_S)
        except (httpx.TransportError, httpx.HTTPStatusError) as exc:
            retry = not isinstance(exc, httpx.HTTPStatusError) or (
                exc.response.status_code in RETRY_STATUS
            )
            if not retry or attempt == tries - 1:
                raise
            await asyncio.sleep(min(5.0, 0.25 * 2**attempt))
            continue
        d.node_id = int(res.node_id)
        return


async def deactivate(http: httpx.AsyncClient, d: Device) -> None:
    # On failure the SuperLink marks it offline after its heartbeat patience anyway.
    with contextlib.suppress(httpx.HTTPError):
        await call(http, d.client, "DeactivateNode", DeactivateNodeRequest(node_id=d.node_id), 30)


def self_cpu_s() -> float:
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def tls_context(ca: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca))
    return ctx


def make_devices(
    count: int, address: str, curve: ec.EllipticCurve = CLIENT_CURVE, first_id: int = 0
) -> list[Device]:
    """`count` devices with fresh keys on `curve` (fedveil's enrollment curve by default)."""
    devices = [Device(first_id + i, ec.generate_private_key(curve)) for i in range(count)]
    for d in devices:
        d.client = capturing_client(address, d.key)
    return devices
