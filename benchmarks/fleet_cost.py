"""Coordinator CPU per Fleet request, measured closed-loop (load-insensitive).

`fedveil bench fleet` holds devices at Flower's idle poll and reads CPU over a time
window, so on a shared machine its per-request figure carries the idle floor's noise.
Here a fixed number of PullMessages (signed by Flower's own client code, fleet_wire.py)
is sent at a fixed concurrency through the gateway to the SuperLink, and the CPU
seconds the coordinator's process tree spent on them are divided by their count: CPU
time, unlike latency, barely depends on how busy the rest of the machine is.

    python -m fedveil.benchmarks.fleet_cost --devices 50 --requests 3000 --concurrency 16
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from flwr.proto.fleet_pb2 import PullMessagesRequest
from flwr.proto.node_pb2 import Node

from fedveil.benchmarks.bench_fleet import _activate, make_devices, tls_context
from fedveil.benchmarks.fleet_coordinator import Coordinator
from fedveil.benchmarks.fleet_wire import call


async def _drive(coord: Coordinator, devices: list[Any], requests: int, concurrency: int) -> dict:
    limits = httpx.Limits(
        max_connections=concurrency + 8, max_keepalive_connections=concurrency + 8
    )
    async with httpx.AsyncClient(verify=tls_context(coord.ca), limits=limits) as http:
        for d in devices:
            await _activate(http, d)
        left, failures = [requests], [0]

        async def worker(i: int) -> None:
            d = devices[i % len(devices)]
            req = PullMessagesRequest(node=Node(node_id=d.node_id))
            while left[0] > 0:
                left[0] -= 1
                try:
                    await call(http, d.client, "PullMessages", req, 30.0)
                except httpx.HTTPError:
                    failures[0] += 1

        # Warm the connections on both hops before the count starts.
        await asyncio.gather(
            *(
                call(
                    http,
                    d.client,
                    "PullMessages",
                    PullMessagesRequest(node=Node(node_id=d.node_id)),
                    30.0,
                )
                for d in devices[:concurrency]
            )
        )
        before, t0 = coord.sample(), time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(concurrency)))
        after, wall = coord.sample(), time.perf_counter() - t0
    total_ms = 1000 * (after.cpu_s - before.cpu_s) / requests
    gateway_ms = 1000 * (after.root_cpu_s - before.root_cpu_s) / requests
    return {
        "requests": requests,
        "concurrency": concurrency,
        "failures": failures[0],
        "wall_s": round(wall, 1),
        "coordinator_cpu_ms_per_request": round(total_ms, 2),
        "gateway_cpu_ms_per_request": round(gateway_ms, 2),
        "superlink_cpu_ms_per_request": round(total_ms - gateway_ms, 2),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--devices", type=int, default=50)
    p.add_argument("--requests", type=int, default=3000)
    p.add_argument("--concurrency", type=int, default=16)
    args = p.parse_args(argv)
    for name in ("devices", "requests", "concurrency"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name} = {getattr(args, name)}: must be >= 1")
    with tempfile.TemporaryDirectory(prefix="fedveil-fleet-cost-") as tmp:
        coord = Coordinator(Path(tmp))
        try:
            coord.start()
            devices = make_devices(args.devices, coord.fleet_address)
            for d in devices:
                coord.enroll(d.client_id, d.openssh())
            result = asyncio.run(_drive(coord, devices, args.requests, args.concurrency))
        finally:
            coord.stop()
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
