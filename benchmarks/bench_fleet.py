"""`fedveil bench fleet`: how many devices one coordinator holds, and at what latency.

One real `fedveil server` (TLS, SuperNode authentication, Flower's SuperLink behind
fedveil's Fleet gateway) on loopback, and N emulated devices in this one process. Each
device has its own enrolled key (fedveil.ops.certs.CLIENT_CURVE) and speaks the Fleet
protocol as Flower's SuperNode does when idle: ActivateNode, then PullMessages every 3 s
(the SuperNode's sleep after an empty pull, flwr.supernode.start_client_internal) and
SendNodeHeartbeat every (30 - 5) * U(0.7, 0.9) s (flwr.supercore.heartbeat,
HEARTBEAT_DEFAULT_INTERVAL 30).
Requests are built and signed by Flower's own client code (fleet_wire.py) and sent with
one shared asyncio httpx client, so a thousand devices need no thousand SuperNodes.

Measured over a window after a warm-up, per device count: p50/p99 latency of every
Fleet request, the request rate achieved, failures, the devices the coordinator lists
as connected (GET /cluster), and the CPU and RSS of the coordinator's process tree
(the `fedveil server` process and its SuperLink child) read from /proc; the
emulator's own CPU is reported too, as it shares the machine.

`--peer flower` holds the same devices (same keys, poll, heartbeats and Flower client
code) against stock Flower's `flower-superlink` with TLS and SuperNode authentication
(fleet_peer_flower.py), in the same run, one after the other: `peer_sweep`,
`peer_held_at_p99_under_1s` and `capacity_ratio` (fedveil's knee over Flower's). Every
count records the machine's load average (`load_average_1m`): quote ratios, not
absolute figures, on a shared machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import resource
import signal
import ssl
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
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

from fedveil.benchmarks.fleet_coordinator import Coordinator
from fedveil.benchmarks.fleet_wire import call, capturing_client
from fedveil.benchmarks.harness import command_main, int_list
from fedveil.ops.certs import CLIENT_CURVE

RETRY_STATUS = (502, 503, 504)  # e.g. the gateway's "SuperLink starting or restarting"
REQUEST_TIMEOUT_S = 30.0  # ProtobufClient's default timeout
GRACE_S = 30.0  # after the window: open calls may finish, then they count as lost
SECAGG_NOT_RUN = (
    "not run: pass --secagg-round N for one round of N emulated devices with secure "
    "aggregation through this coordinator, compared with `fedveil simulate` "
    "(benchmarks/fleet_secagg_round.py)"
)

# The SuperNode's sleep after an empty PullMessages (flwr 1.42, start_client_internal.py).
FLOWER_IDLE_POLL_S = 3.0
FLEET_SUMMARY = (
    "`fedveil bench fleet`: start a real coordinator on loopback (TLS, SuperNode "
    "authentication) and hold N emulated devices on its Fleet gateway at Flower's idle "
    "poll, with requests built and signed by Flower's SuperNode client code; print p50/p99 "
    "Fleet request latency and the coordinator's CPU and RSS per N; --peer flower runs the "
    "same devices against stock Flower's SuperLink in the same run. --json prints one JSON "
    "object as the last line of stdout."
)


def add_fleet_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of `fedveil bench fleet`."""
    p.add_argument(
        "--devices",
        type=int_list,
        default=[100],
        metavar="N[,N,...]",
        help="emulated devices; a list sweeps them against one coordinator [100]",
    )
    p.add_argument("--window", type=float, default=30.0, help="measured seconds per N [30]")
    p.add_argument("--warmup", type=float, default=10.0, help="seconds before the window [10]")
    p.add_argument(
        "--poll",
        type=float,
        default=FLOWER_IDLE_POLL_S,
        help=f"seconds between a device's pulls [{FLOWER_IDLE_POLL_S:g}: Flower's idle poll]",
    )
    p.add_argument(
        "--profile",
        type=Path,
        metavar="FILE",
        help="write a cProfile (pstats) of the coordinator process to FILE",
    )
    p.add_argument(
        "--peer",
        choices=["flower"],
        help="also hold the same devices against stock Flower's SuperLink (flower-superlink "
        "with TLS and SuperNode authentication, as shipped) in the same run: peer_sweep, "
        "peer_held_at_p99_under_1s and capacity_ratio in the JSON",
    )
    p.add_argument(
        "--secagg-round",
        type=int,
        metavar="N",
        help="also run one secure-aggregation round of N emulated devices (fresh "
        "coordinator) and compare its model with `fedveil simulate` of the cohort it "
        "aggregated; secagg_round_ok also needs at most 1%% of the devices (at least one) "
        "dropped",
    )
    p.add_argument(
        "--secagg-logs",
        type=Path,
        metavar="DIR",
        help="with --secagg-round: keep the round's coordinator logs (server.log, the "
        "SuperLink's superlink.log, the run's server.log) in DIR [a new fedveil-secagg-* "
        "folder in the temporary directory, printed]",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print a JSON summary as the last line")


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


def _error_name(exc: BaseException) -> str:
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
            what = f"{method} {_error_name(exc)}"
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


async def _poll(
    http: httpx.AsyncClient, d: Device, poll_s: float, tally: Tally, rng: random.Random
) -> None:
    await _nap(rng.uniform(0, poll_s), tally.stop)  # devices come up at different moments
    node = Node(node_id=d.node_id)
    while time.perf_counter() < tally.stop:
        await _timed(http, d, "PullMessages", PullMessagesRequest(node=node), tally, tries=5)
        await _nap(poll_s, tally.stop)


async def _heartbeat(http: httpx.AsyncClient, d: Device, tally: Tally, rng: random.Random) -> None:
    req = SendNodeHeartbeatRequest(
        node=Node(node_id=d.node_id), heartbeat_interval=HEARTBEAT_DEFAULT_INTERVAL
    )
    # HeartbeatSender sends its first heartbeat as soon as the node is activated.
    while time.perf_counter() < tally.stop:
        await _timed(http, d, "SendNodeHeartbeat", req, tally, tries=1)
        await _nap(heartbeat_interval(rng), tally.stop)


async def _bounded(limit: int, coros: list[Any]) -> list[Any]:
    sem = asyncio.Semaphore(limit)

    async def one(c: Any) -> Any:
        async with sem:
            return await c

    return await asyncio.gather(*(one(c) for c in coros))


async def _activate(http: httpx.AsyncClient, d: Device, tries: int = 10) -> None:
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


async def _deactivate(http: httpx.AsyncClient, d: Device) -> None:
    # On failure the SuperLink marks it offline after its heartbeat patience anyway.
    with contextlib.suppress(httpx.HTTPError):
        await call(http, d.client, "DeactivateNode", DeactivateNodeRequest(node_id=d.node_id), 30)


def _self_cpu_s() -> float:
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def tls_context(ca: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca))
    return ctx


async def measure(
    coord: Coordinator,
    devices: list[Device],
    *,
    poll_s: float,
    warmup_s: float,
    window_s: float,
    seed: int,
) -> dict[str, Any]:
    """Hold `devices` connected at the idle poll; measure over the window."""
    n = len(devices)
    limits = httpx.Limits(max_connections=n + 16, max_keepalive_connections=n + 16)
    async with httpx.AsyncClient(verify=tls_context(coord.ca), limits=limits) as http:
        # Each device starts polling and heartbeating once it is activated, as a SuperNode
        # does; the window opens `warmup_s` after the last activation.
        tally = Tally((math.inf, math.inf))
        rng = random.Random(seed)
        sem, activated, all_up = asyncio.Semaphore(32), [0], asyncio.Event()
        activation_errors: dict[str, int] = {}

        async def device(d: Device) -> None:
            try:
                async with sem:
                    await _activate(http, d)
            except httpx.HTTPError as exc:
                name = _error_name(exc)
                activation_errors[name] = activation_errors.get(name, 0) + 1
                return
            finally:
                activated[0] += 1
                if activated[0] == n:
                    all_up.set()
            beat = asyncio.create_task(_heartbeat(http, d, tally, rng))
            await _poll(http, d, poll_s, tally, rng)
            await beat

        t0 = time.perf_counter()
        tasks = [asyncio.create_task(device(d)) for d in devices]
        await all_up.wait()
        activate_s = time.perf_counter() - t0
        start = time.perf_counter()
        window = (start + warmup_s, start + warmup_s + window_s)
        tally.window = window
        await asyncio.sleep(max(0.0, window[0] - time.perf_counter()))
        before, self_before, t_before = coord.sample(), _self_cpu_s(), time.perf_counter()
        await asyncio.sleep(max(0.0, window[1] - time.perf_counter()))
        after, self_after, t_after = coord.sample(), _self_cpu_s(), time.perf_counter()
        # The coordinator's view while every device is still polling.
        connected = await asyncio.to_thread(coord.connected)
        # Calls still open GRACE_S after the window are counted as lost, not waited for
        # (with Flower's retries one could take minutes on an overloaded machine).
        _, pending = await asyncio.wait(tasks, timeout=GRACE_S)
        if tally.open:
            tally.failures["unanswered"] = tally.open
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(
                _bounded(32, [_deactivate(http, d) for d in devices if d.node_id]), GRACE_S
            )
    wall = t_after - t_before
    lat = tally.latencies
    requests = len(lat) + sum(tally.failures.values())
    attempts = requests + sum(tally.retries.values())  # what reached the coordinator
    return {
        "devices": n,
        "devices_connected": connected,
        "devices_failed": len(tally.failed_devices),
        "poll_interval_s": poll_s,
        "window_s": round(wall, 2),
        "requests": requests,
        "requests_per_s": round(requests / window_s, 1),
        "attempts": attempts,
        "failures": dict(sorted(tally.failures.items())),
        "retries": dict(sorted(tally.retries.items())),
        "p50_s": _round(percentile(lat, 0.50)),
        "p99_s": _round(percentile(lat, 0.99)),
        "max_s": _round(max(lat) if lat else None),
        "coordinator_cpu_percent": round(100 * (after.cpu_s - before.cpu_s) / wall, 1),
        "coordinator_rss_mb": round(after.rss_mb, 1),
        # CPU per request: what a request costs, however loaded the machine (the
        # shared machine's load stretches latency, not this).
        "coordinator_cpu_ms_per_request": (
            round(1000 * (after.cpu_s - before.cpu_s) / attempts, 2) if attempts else None
        ),
        # The split: the `fedveil server` process (API, run supervisor) and its children
        # (Flower's SuperLink, which serves the Fleet port with the gateway since issue 33).
        "server_process_cpu_percent": round(100 * (after.root_cpu_s - before.root_cpu_s) / wall, 1),
        "superlink_cpu_percent": round(
            100 * ((after.cpu_s - after.root_cpu_s) - (before.cpu_s - before.root_cpu_s)) / wall,
            1,
        ),
        "emulator_cpu_percent": round(100 * (self_after - self_before) / wall, 1),
        "activate_s": round(activate_s, 2),
        "activation_failures": dict(sorted(activation_errors.items())),
    }


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 4)


def make_devices(
    count: int, address: str, curve: ec.EllipticCurve = CLIENT_CURVE, first_id: int = 0
) -> list[Device]:
    """`count` devices with fresh keys on `curve` (fedveil's enrollment curve by default)."""
    devices = [Device(first_id + i, ec.generate_private_key(curve)) for i in range(count)]
    for d in devices:
        d.client = capturing_client(address, d.key)
    return devices


def run(
    counts: list[int],
    *,
    poll_s: float = FLOWER_IDLE_POLL_S,
    warmup_s: float = 10.0,
    window_s: float = 30.0,
    seed: int = 0,
    idle_s: float = 3.0,
    profile: Path | None = None,
    workdir: Path | None = None,
    log: Any = sys.stderr,
    peer: str | None = None,
) -> list[dict[str, Any]]:
    """One coordinator; for each count, that many devices activated, held, measured, left.

    `peer="flower"`: stock Flower's SuperLink (fleet_peer_flower.py) instead of fedveil's
    coordinator, with the same devices, poll and heartbeats."""
    # SIGTERM unwinds like Ctrl-C, so the coordinator (its own session) is stopped too.
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    with tempfile.TemporaryDirectory(prefix="fedveil-fleet-", dir=workdir) as tmp:
        coord = _coordinator(Path(tmp), peer, profile)
        name = "fedveil" if peer is None else coord.name
        try:
            t0 = time.perf_counter()
            coord.start()
            print(f"{name}: ready in {time.perf_counter() - t0:.1f} s", file=log)
            devices = make_devices(max(counts), coord.fleet_address)
            t0 = time.perf_counter()
            for d in devices:
                coord.enroll(d.client_id, d.openssh())
            print(f"enrolled {len(devices)} devices in {time.perf_counter() - t0:.1f} s", file=log)
            # The coordinator's own CPU with no device connected (its supervisor, the
            # SuperLink and SuperExec polling): the floor under every count's figure.
            before, t_idle = coord.sample(), time.perf_counter()
            time.sleep(idle_s)
            idle_pct = 100 * (coord.sample().cpu_s - before.cpu_s) / (time.perf_counter() - t_idle)
            print(f"{name} idle: {idle_pct:.1f}% CPU", file=log)
            results = []
            for n in counts:
                r = asyncio.run(
                    measure(
                        coord,
                        devices[:n],
                        poll_s=poll_s,
                        warmup_s=warmup_s,
                        window_s=window_s,
                        seed=seed,
                    )
                )
                r["coordinator"] = name
                # The machine's 1-minute load average as the window closed: on a shared
                # machine every figure comes with it.
                r["load_average_1m"] = round(os.getloadavg()[0], 2)
                r["gateway_warnings"] = coord.gateway_warnings()
                r["coordinator_idle_cpu_percent"] = round(idle_pct, 1)
                busy_s = (r["coordinator_cpu_percent"] - idle_pct) / 100 * r["window_s"]
                r["coordinator_cpu_ms_per_request_above_idle"] = (
                    round(1000 * busy_s / r["attempts"], 2) if r["attempts"] else None
                )
                print(format_row(r), file=log)
                for line in r["gateway_warnings"][-3:]:
                    print(f"  {name}: {line}", file=log)
                results.append(r)
                if n != counts[-1]:
                    time.sleep(2.5)  # past /cluster's node cache before the next step
        finally:
            coord.stop()
    return results


def _coordinator(root: Path, peer: str | None, profile: Path | None) -> Any:
    if peer is None:
        return Coordinator(root, profile=profile)
    if peer == "flower":
        from fedveil.benchmarks.fleet_peer_flower import StockSuperLink

        return StockSuperLink(root)
    raise ValueError(f"--peer = {peer!r}: the one peer is 'flower'")


HEADER = (
    f"{'devices':>8} {'connected':>9} {'req/s':>7} {'p50 ms':>8} {'p99 ms':>8} "
    f"{'fail':>5} {'coord CPU%':>10} {'server%':>8} {'link%':>6} {'coord RSS MB':>12} "
    f"{'emul CPU%':>9}"
)


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{1000 * v:.1f}"


def format_row(r: dict[str, Any]) -> str:
    return (
        f"{r['devices']:>8} {r['devices_connected']:>9} {r['requests_per_s']:>7} "
        f"{_ms(r['p50_s']):>8} {_ms(r['p99_s']):>8} {sum(r['failures'].values()):>5} "
        f"{r['coordinator_cpu_percent']:>10} {r['server_process_cpu_percent']:>8} "
        f"{r['superlink_cpu_percent']:>6} {r['coordinator_rss_mb']:>12} "
        f"{r['emulator_cpu_percent']:>9}"
    )


def format_table(results: list[dict[str, Any]]) -> str:
    return "\n".join([HEADER, *(format_row(r) for r in results)])


def held_at(results: list[dict[str, Any]], target_p99_s: float = 1.0) -> int:
    """The largest count that held every device (all connected, none lost a pull) with
    p99 under the target; 0 if none did."""
    held = [
        r["devices"]
        for r in results
        if r["devices_connected"] == r["devices"]
        and r["devices_failed"] == 0
        and r["p99_s"] is not None
        and r["p99_s"] < target_p99_s
    ]
    return max(held) if held else 0


def summary(
    results: list[dict[str, Any]],
    target_p99_s: float = 1.0,
    secagg: dict[str, Any] | None = None,
    peer: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The largest count's figures at the top level, the sweep under `sweep`, and the
    knee: the largest count that held every device with p99 under the target. `secagg`:
    the `secagg_round_*` figures of fleet_secagg_round.secagg_round, if it ran. `peer`:
    stock Flower's sweep on the same devices, under `peer_sweep`, with its knee and
    `capacity_ratio` (fedveil's knee over the peer's; None when the peer held none)."""
    top = dict(results[-1])
    top.update(
        {
            "secagg_round_ok": None,
            "secagg_round_note": SECAGG_NOT_RUN,
            "held_at_p99_under_1s": held_at(results, target_p99_s),
            "sweep": results,
        }
    )
    if peer is not None:
        ours, theirs = top["held_at_p99_under_1s"], held_at(peer, target_p99_s)
        top.update(
            {
                "peer": peer[-1]["coordinator"],
                "peer_sweep": peer,
                "peer_held_at_p99_under_1s": theirs,
                "capacity_ratio": round(ours / theirs, 3) if theirs else None,
            }
        )
    top.update(secagg or {})
    return top


def cmd_bench_fleet(args: argparse.Namespace) -> int:
    for name in ("window", "poll"):
        if getattr(args, name) <= 0:
            raise ValueError(f"--{name} = {getattr(args, name)}: must be > 0")
    if args.warmup < 0:
        raise ValueError(f"--warmup = {args.warmup}: must be >= 0")
    if args.secagg_round is not None and args.secagg_round < 3:
        raise ValueError(
            f"--secagg-round = {args.secagg_round}: secure aggregation needs >= 3 devices"
        )
    common = {
        "poll_s": args.poll,
        "warmup_s": args.warmup,
        "window_s": args.window,
        "seed": args.seed,
    }
    out = sys.stderr if args.json else sys.stdout
    counts = sorted(args.devices)
    results = run(counts, profile=args.profile.resolve() if args.profile else None, **common)
    peer = None
    if args.peer is not None:
        peer = run(counts, peer=args.peer, **common)
    print(format_table(results), file=out)
    if peer is not None:
        print(f"peer: {peer[-1]['coordinator']}", file=out)
        print(format_table(peer), file=out)
    secagg = None
    if args.secagg_round is not None:
        from fedveil.benchmarks.fleet_secagg_round import secagg_round

        logs = args.secagg_logs or Path(tempfile.mkdtemp(prefix="fedveil-secagg-"))
        secagg = secagg_round(
            args.secagg_round, seed=args.seed, poll_s=args.poll, logs=logs.resolve(), log=out
        )
        print(
            f"secure round of {args.secagg_round} devices: {secagg['secagg_round_status']} in "
            f"{secagg['secagg_round_s']} s; {'ok' if secagg['secagg_round_ok'] else 'NOT ok'}: "
            f"{secagg['secagg_round_verdict']}; logs in {secagg['secagg_round_logs']}",
            file=out,
        )
    if args.json:
        print(json.dumps(summary(results, secagg=secagg, peer=peer), sort_keys=True))
    return 0


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """`fedveil bench ...` and `python -m fedveil.benchmarks.bench_fleet`."""
    return command_main(
        argv,
        prog=prog or "python -m fedveil.benchmarks.bench_fleet",
        description=FLEET_SUMMARY,
        add_arguments=add_fleet_arguments,
        run=cmd_bench_fleet,
    )


if __name__ == "__main__":
    sys.exit(main())
