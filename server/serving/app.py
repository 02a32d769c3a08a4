"""The prediction service's HTTP API (FastAPI).

    POST /v1/models/{name}/predict   JSON {"inputs": [...]} or NPZ "inputs" -> outputs
    GET  /models                     the names served, their versions and shares (needs
                                     the token, as prediction does)
    GET  /healthz, /readyz           the process answers; every model's worker runs
    GET  /metrics                    Prometheus text (per version: requests, latency,
                                     merged batch sizes)

Prediction needs the bearer token unless the server is public. Bad input is answered
with 422 naming the problem and the limit, and counted against the version it was
routed to; the server goes on serving. So is finite input whose outputs are not finite
(it overflowed float32 inside the model): NaN is never answered as a prediction.
"""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.concurrency import run_in_threadpool

from fedveil.ops.bearer import BearerToken
from fedveil.server.serving.batching import DynamicBatcher
from fedveil.server.serving.inputs import (
    InputError,
    check,
    check_outputs,
    decode,
    encode,
    human_bytes,
)
from fedveil.server.serving.prediction_metrics import ServingMetrics
from fedveil.server.serving.versions import ServedVersion, Split

METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"
DRAIN_FACTOR = 8


@dataclass(frozen=True)
class ServeLimits:
    max_batch: int = 512  # rows per forward pass (merged requests); also per request
    max_wait_ms: float = 2.0  # how long a batch that is not full waits for more rows
    max_body_bytes: int = 32 * 1024 * 1024
    threads: int | None = None  # torch threads per forward pass; None: one core left free

    def __post_init__(self) -> None:
        if not 1 <= self.max_batch <= 65536:
            raise ValueError(f"--max-batch = {self.max_batch}: must be in [1, 65536]")
        if not 0 <= self.max_wait_ms <= 10_000:
            raise ValueError(f"--max-wait-ms = {self.max_wait_ms}: must be in [0, 10000]")
        if not 1024 <= self.max_body_bytes <= 2**31:
            raise ValueError(f"--max-body-bytes = {self.max_body_bytes}: must be in [1024, 2^31]")
        if self.threads is not None and not 1 <= self.threads <= 256:
            raise ValueError(f"--threads = {self.threads}: must be in [1, 256]")


def create_app(
    splits: list[Split],
    *,
    token: BearerToken | None,
    limits: ServeLimits,
    metrics: ServingMetrics | None = None,
) -> FastAPI:
    """The API over `splits` (one per name served); `token` None: prediction is public."""
    metrics = metrics if metrics is not None else ServingMetrics()
    by_name = {s.name: s for s in splits}
    if len(by_name) != len(splits):
        raise ValueError(f"model names served twice: {[s.name for s in splits]}")
    batchers: dict[tuple[str, str], DynamicBatcher] = {}
    lock = threading.Lock()

    def batcher(version: ServedVersion) -> DynamicBatcher:
        """The version's worker, started the first time it is needed (a newly promoted
        version, in the coordinator's service, arrives while serving)."""
        key = (version.name, version.version)
        with lock:
            if key not in batchers:
                metrics.add_version(*key)
                batchers[key] = DynamicBatcher(
                    version.model,
                    max_batch=limits.max_batch,
                    max_wait_s=limits.max_wait_ms / 1000,
                    on_batch=lambda rows, s: metrics.batch(*key, rows, s),
                    name=f"{key[0]}@{key[1]}",
                    threads=limits.threads,
                )
            return batchers[key]

    for split in splits:  # started now: /readyz answers once they run
        for version, _share in split.versions:
            batcher(version)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        for b in list(batchers.values()):
            b.close()

    app = FastAPI(title="fedveil prediction service", lifespan=lifespan, docs_url=None)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> Response:
        down = [f"{n}@{v}" for (n, v), b in list(batchers.items()) if not b.alive]
        if down:
            return JSONResponse({"status": "not ready", "down": down}, status_code=503)
        return JSONResponse({"status": "ready", "models": sorted(by_name)})

    @app.get("/metrics")
    async def prometheus() -> Response:
        return PlainTextResponse(metrics.text(), media_type=METRICS_TYPE)

    def refused(request: Request) -> Response | None:
        """The 401/403 answer when the server needs a token and the request lacks it."""
        if token is None:
            return None
        status = token.check(request.headers.get("authorization"))
        if status == 200:
            return None
        metrics.reject("unauthorized" if status == 401 else "forbidden")
        return JSONResponse(
            {"detail": "this server needs its token (Authorization: Bearer)"},
            status_code=status,
            headers={"WWW-Authenticate": "Bearer"},
        )

    @app.get("/models")
    async def models(request: Request) -> Response:
        # What is served (names, versions, guarantees) is for those who may query it.
        denied = refused(request)
        if denied is not None:
            return denied
        return JSONResponse(
            {
                "models": [
                    {
                        "name": s.name,
                        "public": token is None,
                        "versions": [v.describe(share) for v, share in s.versions],
                    }
                    for s in splits
                ]
            }
        )

    @app.post("/v1/models/{name}/predict")
    async def predict(name: str, request: Request) -> Response:
        start = time.perf_counter()
        denied = refused(request)
        if denied is not None:
            return denied
        split = by_name.get(name)
        if split is None:
            metrics.reject("unknown_model")
            return JSONResponse(
                {"detail": f"model {name!r} is not served here; served: {sorted(by_name)}"},
                status_code=404,
            )
        version = split.pick()
        if version is None:
            metrics.reject("no_version")
            return JSONResponse(
                {"detail": f"model {name!r} has no promoted version yet"}, status_code=503
            )
        key = (name, version.version)
        headers = {"X-Fedveil-Model-Version": version.version}
        try:
            body = await _read_body(request, limits.max_body_bytes)
            # Decoding is CPU work bounded by the body and the limits; off the event
            # loop, so a heavy request never stalls the health checks beside it.
            x, npz = await run_in_threadpool(
                _decoded, body, request.headers.get("content-type", ""), version, limits
            )
        except InputError as exc:
            metrics.request(*key, 422, 0, time.perf_counter() - start)
            return JSONResponse({"detail": str(exc)}, status_code=422, headers=headers)
        out = await batcher(version).predict(x)
        try:
            check_outputs(out)
        except InputError as exc:
            metrics.request(*key, 422, 0, time.perf_counter() - start)
            return JSONResponse({"detail": str(exc)}, status_code=422, headers=headers)
        content, media = encode(out, npz, {"model": name, "version": version.version})
        metrics.request(*key, 200, len(x), time.perf_counter() - start)
        return Response(content, media_type=media, headers=headers)

    return app


def _decoded(
    body: bytes, content_type: str, version: ServedVersion, limits: ServeLimits
) -> tuple[np.ndarray, bool]:
    shape = version.info.input_shape
    array, npz = decode(body, content_type, shape, limits.max_batch)
    return check(array, shape, limits.max_batch), npz


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, or InputError when it exceeds `limit` bytes. An oversized body is read
    and dropped (up to DRAIN_FACTOR x limit) so the client, still sending, gets the 422
    rather than a broken pipe; past that the connection is closed."""
    text = request.headers.get("content-length", "")
    declared = int(text) if text.isdigit() else None
    keep = declared is None or declared <= limit
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        keep = keep and size <= limit
        if keep:
            chunks.append(chunk)
        elif size > limit * DRAIN_FACTOR:
            break
    if not keep:
        over = declared is not None and declared > limit
        shown = f"{declared} bytes" if over else f"more than {limit} bytes"
        raise InputError(
            f"body: {shown}; the limit is {limit} bytes ({human_bytes(limit)}, --max-body-bytes)"
        )
    return b"".join(chunks)
