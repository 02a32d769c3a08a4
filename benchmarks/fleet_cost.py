"""Coordinator CPU per Fleet request, measured closed-loop (load-insensitive).

`fedveil bench fleet` holds devices at Flower's idle poll and reads CPU over a time
window, so on a shared machine its per-request figure carries the idle floor's noise.
Here a fixed number of PullMessages, or with `--request heartbeat` SendNodeHeartbeat
(Flower's SuperNode interval, 30 s), each signed by Flower's own client code
(fleet_wire.py), is sent at a fixed concurrency, and the CPU seconds the coordinator's
process tree spent on them are divided by their count: CPU time, unlike latency, barely
depends on how busy the rest of the machine is.

Contenders, side by side in one run: fedveil's coordinator (`fedveil server` and its
SuperLink child, which serves the Fleet port with the gateway in front of Flower's Fleet
routes) and,
with `--peer flower`, stock Flower's SuperLink (fleet_peer_flower.py); each with device
keys on every curve of `--curves` (P-384, fedveil's enrollment curve before issue 33,
and P-256, after). `--profile DIR` writes a cProfile of each contender's processes and
prints the top functions by own time: fedveil's `fedveil server` (fedveil.pstats: the API and run
supervisor) and its SuperLink child, which serves the Fleet port (fedveil-superlink.pstats,
every thread: FleetListenerSpec.profile_path); Flower's SuperLink (flower.pstats: its
main thread, as `python -m cProfile` sees it, so the Fleet handlers that FastAPI runs in
its thread pool are not in it). Per request, `server` is the
`fedveil server` process's CPU and `link` its SuperLink's tree (the whole Fleet path).

    python -m fedveil.benchmarks.fleet_cost --devices 50 --requests 3000 --concurrency 16 \
        --peer flower --curves p384,p256 --json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from cryptography.hazmat.primitives.asymmetric import ec
from flwr.proto.fleet_pb2 import PullMessagesRequest
from flwr.proto.heartbeat_pb2 import SendNodeHeartbeatRequest
from flwr.proto.node_pb2 import Node
from google.protobuf.message import Message

from fedveil.benchmarks.fleet_coordinator import Coordinator
from fedveil.benchmarks.fleet_devices import activate, make_devices, tls_context
from fedveil.benchmarks.fleet_peer_flower import StockSuperLink
from fedveil.benchmarks.fleet_wire import call

CURVES: dict[str, ec.EllipticCurve] = {"p256": ec.SECP256R1(), "p384": ec.SECP384R1()}
REQUESTS = ("pull", "heartbeat")
HEARTBEAT_INTERVAL_S = 30.0  # a SuperNode's default (flwr HEARTBEAT_DEFAULT_INTERVAL)


def _request(kind: str, node_id: int) -> tuple[str, Message]:
    """The Fleet method and message a device sends for `kind` (one of REQUESTS)."""
    if kind == "heartbeat":
        return "SendNodeHeartbeat", SendNodeHeartbeatRequest(
            node=Node(node_id=node_id), heartbeat_interval=HEARTBEAT_INTERVAL_S
        )
    return "PullMessages", PullMessagesRequest(node=Node(node_id=node_id))


async def _drive(
    coord: Any, devices: list[Any], requests: int, concurrency: int, kind: str = "pull"
) -> dict[str, Any]:
    limits = httpx.Limits(
        max_connections=concurrency + 8, max_keepalive_connections=concurrency + 8
    )
    async with httpx.AsyncClient(verify=tls_context(coord.ca), limits=limits) as http:
        for d in devices:
            await activate(http, d)
        left, failures = [requests], [0]

        async def worker(i: int) -> None:
            d = devices[i % len(devices)]
            method, req = _request(kind, d.node_id)
            while left[0] > 0:
                left[0] -= 1
                try:
                    await call(http, d.client, method, req, 30.0)
                except httpx.HTTPError:
                    failures[0] += 1

        # Warm the connections on both hops before the count starts.
        await asyncio.gather(
            *(call(http, d.client, *_request(kind, d.node_id), 30.0) for d in devices[:concurrency])
        )
        before, t0 = coord.sample(), time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(concurrency)))
        after, wall = coord.sample(), time.perf_counter() - t0
    total_ms = 1000 * (after.cpu_s - before.cpu_s) / requests
    server_ms = 1000 * (after.root_cpu_s - before.root_cpu_s) / requests
    return {
        "request": kind,
        "requests": requests,
        "concurrency": concurrency,
        "failures": failures[0],
        "wall_s": round(wall, 1),
        "coordinator_cpu_ms_per_request": round(total_ms, 2),
        "server_process_cpu_ms_per_request": round(server_ms, 2),
        "superlink_cpu_ms_per_request": round(total_ms - server_ms, 2),
    }


def measure(
    contender: str,
    curves: list[str],
    devices: int,
    requests: int,
    concurrency: int,
    profile: Path | None = None,
    kind: str = "pull",
) -> list[dict[str, Any]]:
    """One coordinator (`fedveil` or `flower`), one closed-loop count per curve."""
    with tempfile.TemporaryDirectory(prefix="fedveil-fleet-cost-") as tmp:
        prof = None if profile is None else profile / f"{contender}.pstats"
        coord: Any = (
            Coordinator(Path(tmp), profile=prof)
            if contender == "fedveil"
            else StockSuperLink(Path(tmp), profile=prof)
        )
        out = []
        try:
            coord.start()
            fleets = {}
            for i, name in enumerate(curves):
                fleets[name] = make_devices(
                    devices, coord.fleet_address, CURVES[name], first_id=i * devices
                )
                for d in fleets[name]:
                    coord.enroll(d.client_id, d.openssh())
            for name in curves:
                r = asyncio.run(_drive(coord, fleets[name], requests, concurrency, kind))
                r.update(
                    coordinator=contender,
                    curve=name,
                    load_average_1m=round(os.getloadavg()[0], 2),
                )
                out.append(r)
                print(json.dumps(r, sort_keys=True), file=sys.stderr)
        finally:
            coord.stop()
    return out


def top_functions(path: Path, limit: int = 25) -> list[dict[str, Any]]:
    """The profile's functions by own time (tottime), with their share of the total."""
    stats = pstats.Stats(str(path))
    total = stats.total_tt or 1.0
    rows = sorted(stats.stats.items(), key=lambda kv: kv[1][2], reverse=True)[:limit]  # type: ignore[attr-defined]
    return [
        {
            "function": f"{Path(file).name}:{line}({fn})",
            "own_s": round(tt, 3),
            "own_share": round(tt / total, 3),
            "cumulative_s": round(ct, 3),
            "calls": nc,
        }
        for (file, line, fn), (_, nc, tt, ct, _) in rows
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--devices", type=int, default=50, help="devices per curve [50]")
    p.add_argument("--requests", type=int, default=3000, help="requests per curve [3000]")
    p.add_argument(
        "--request",
        choices=REQUESTS,
        default="pull",
        help="what each request is: PullMessages or SendNodeHeartbeat [pull]",
    )
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--peer", choices=["flower"], help="also stock Flower's SuperLink")
    p.add_argument(
        "--curves",
        default="p256",
        help="device key curves, comma-separated, each a contender [p256]: p256, p384",
    )
    p.add_argument("--profile", type=Path, metavar="DIR", help="cProfile each contender")
    p.add_argument("--json", action="store_true", help="print a JSON summary as the last line")
    args = p.parse_args(argv)
    for name in ("devices", "requests", "concurrency"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name} = {getattr(args, name)}: must be >= 1")
    curves = [c.strip() for c in args.curves.split(",") if c.strip()]
    for c in curves:
        if c not in CURVES:
            raise ValueError(f"--curves: {c!r} is not one of {sorted(CURVES)}")
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
        args.profile = args.profile.resolve()
    results, profiles = [], {}
    for contender in ["fedveil", *([args.peer] if args.peer else [])]:
        results += measure(
            contender,
            curves,
            args.devices,
            args.requests,
            args.concurrency,
            args.profile,
            args.request,
        )
        if args.profile is not None:
            for name in (contender, f"{contender}-superlink"):
                path = args.profile / f"{name}.pstats"
                if path.exists():
                    profiles[name] = top_functions(path)
    print(
        f"{'coordinator':>12} {'curve':>6} {'ms/request':>10} {'server':>8} {'link':>6} "
        f"{'fail':>5} {'load':>5}",
        file=sys.stderr,
    )
    for r in results:
        print(
            f"{r['coordinator']:>12} {r['curve']:>6} {r['coordinator_cpu_ms_per_request']:>10} "
            f"{r['server_process_cpu_ms_per_request']:>8} {r['superlink_cpu_ms_per_request']:>6} "
            f"{r['failures']:>5} {r['load_average_1m']:>5}",
            file=sys.stderr,
        )
    summary: dict[str, Any] = {"results": results}
    if profiles:
        summary["profiles"] = profiles
    print(json.dumps(summary, sort_keys=True) if args.json else json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
