"""Dynamic batching: concurrent requests to one model version run as one forward pass.

One worker thread per version owns the model. It takes the oldest waiting request and
merges the ones queued behind it, up to `max_batch` rows; if the batch is not full it
waits for more, but never past `max_wait_s` after the oldest request arrived. Latency
is thus bounded by max_wait_s plus one forward pass of at most max_batch rows (plus the
queue ahead); under load the queue is never empty, so batches fill without waiting.
Torch releases the GIL in the forward pass, so the event loop keeps parsing requests.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

log = logging.getLogger("fedveil.serving")


@dataclass
class _Job:
    x: np.ndarray
    future: asyncio.Future[np.ndarray]
    loop: asyncio.AbstractEventLoop
    arrived: float


def _resolve(future: asyncio.Future[np.ndarray], result: np.ndarray | BaseException) -> None:
    if future.done():  # the client went away
        return
    if isinstance(result, BaseException):
        future.set_exception(result)
    else:
        future.set_result(result)


def default_threads() -> int:
    """Torch threads per forward pass unless told: one fewer than torch's default (one per
    core), at least one."""
    return max(1, torch.get_num_threads() - 1)


class DynamicBatcher:
    """Runs `model` on merged batches in its own thread; `on_batch(rows, seconds)` is
    told each forward pass's size and duration."""

    def __init__(
        self,
        model: nn.Module,
        *,
        max_batch: int,
        max_wait_s: float,
        on_batch: Callable[[int, float], None] | None = None,
        name: str = "model",
        threads: int | None = None,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch = {max_batch}: must be >= 1")
        if not 0 <= max_wait_s <= 10:
            raise ValueError(f"max_wait_s = {max_wait_s}: must be in [0, 10]")
        self.model, self.max_batch, self.max_wait_s = model, max_batch, max_wait_s
        self.on_batch, self.threads = on_batch, threads
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=f"batcher-{name}", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    async def predict(self, x: np.ndarray) -> np.ndarray:
        """The model's outputs for `x` (rows <= max_batch), from a merged forward pass."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[np.ndarray] = loop.create_future()
        self._queue.put(_Job(x, future, loop, time.perf_counter()))
        return await future

    def close(self, timeout: float = 5.0) -> None:
        self._queue.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        # OpenMP's thread count is per calling thread: set here. By default one core is
        # left to the event loop, which parses the next requests while the model runs.
        torch.set_num_threads(self.threads or default_threads())
        carried: _Job | None = None
        while True:
            first = carried if carried is not None else self._queue.get()
            carried = None
            if first is None:
                return
            jobs, stop, carried = self._gather(first)
            self._forward(jobs)
            if stop:
                return

    def _gather(self, first: _Job) -> tuple[list[_Job], bool, _Job | None]:
        """`first` and the requests merged with it; whether to stop after; a request that
        did not fit (it starts the next batch)."""
        jobs, rows = [first], len(first.x)
        deadline = first.arrived + self.max_wait_s
        while rows < self.max_batch:
            wait = deadline - time.perf_counter()
            try:
                job = self._queue.get(timeout=wait) if wait > 0 else self._queue.get_nowait()
            except queue.Empty:
                break
            if job is None:
                return jobs, True, None
            if rows + len(job.x) > self.max_batch:
                return jobs, False, job
            jobs.append(job)
            rows += len(job.x)
        return jobs, False, None

    def _forward(self, jobs: list[_Job]) -> None:
        start = time.perf_counter()
        try:
            x = jobs[0].x if len(jobs) == 1 else np.concatenate([j.x for j in jobs])
            with torch.inference_mode():
                out = self.model(torch.from_numpy(x)).numpy()
        except Exception as exc:  # a model error fails these requests, not the server
            log.exception("forward pass of %d rows failed", sum(len(j.x) for j in jobs))
            for j in jobs:
                j.loop.call_soon_threadsafe(_resolve, j.future, exc)
            return
        if self.on_batch is not None:
            self.on_batch(len(x), time.perf_counter() - start)
        offset = 0
        for j in jobs:
            part = out[offset : offset + len(j.x)]
            offset += len(j.x)
            j.loop.call_soon_threadsafe(_resolve, j.future, part)
