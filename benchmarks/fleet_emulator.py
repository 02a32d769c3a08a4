"""The emulated fleet of `fedveil bench fleet`, split over processes.

One Python process cannot emulate a thousand devices: httpx, TLS and asyncio are
GIL-bound to one core, and at 1,000 devices (about 380 requests/s) the one-process
emulator ran at 90% of its core and its event loop's backlog was in every latency it
measured (the coordinator was at 45% of a core). Real devices are independent
processes, so the devices are dealt round-robin over `procs` child processes
(`multiprocessing` spawn), each running its share exactly as the one process did
(fleet_devices.py: Flower's own request construction and signing, the same poll and
heartbeats, TLS, one asyncio httpx client per process). The keys travel as PKCS#8 PEM;
the parent has enrolled them already.

The window is one instant for every process, by a barrier: each child activates its
devices (which then poll and heartbeat as a SuperNode does) and reports "up"; once
every child is up the parent picks the window (warm-up, then the measured seconds) on
CLOCK_MONOTONIC, which every process on the machine shares, and sends it to all. Each
child then counts the requests that start inside that window, reads its own CPU at the
window's edges and lets open calls finish (GRACE_S). Its devices leave (DeactivateNode)
only when the parent says so, after it has read the coordinator's view of the window's
end; then the child sends its tally back as plain lists and dicts. `merge` makes one
Tally of them, so the figures (p50, p99, requests/s, failures, retries) are those of
one fleet.

A child that fails sends its traceback and the parent raises it; the parent stops
every child on its way out, whatever happened.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import multiprocessing
import random
import time
import traceback
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from fedveil.benchmarks.fleet_devices import (
    GRACE_S,
    Device,
    Tally,
    activate,
    bounded,
    deactivate,
    error_name,
    heartbeat,
    poll,
    self_cpu_s,
    tls_context,
)

# Devices one emulator process carries by default: the one-process emulator held 600 at
# p99 0.27 s on a quiet machine and lagged at 800 (p99 3.1 s, 76% of its core).
DEVICES_PER_PROC = 350
ACTIVATING_AT_ONCE = 32  # activations in flight over all processes together
UP_TIMEOUT_S = 900.0  # every device activated (each one retries for minutes at most)


def procs_for(devices: int, requested: int | None) -> int:
    """Emulator processes for `devices`: `requested`, or (None: auto) enough that none
    carries more than DEVICES_PER_PROC; never more processes than devices."""
    if requested is not None and not requested >= 1:
        raise ValueError(f"--emulator-procs = {requested}: must be >= 1 or 'auto'")
    want = math.ceil(devices / DEVICES_PER_PROC) if requested is None else requested
    return max(1, min(want, devices))


def procs_arg(text: str) -> int | None:
    """`--emulator-procs`: 'auto' (None) or a count >= 1."""
    if text == "auto":
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not value >= 1:
        raise argparse.ArgumentTypeError(f"{text!r}: 'auto' or a count >= 1")
    return value


@dataclass(frozen=True)
class Share:
    """What one emulator process is given: its devices' ids and keys, and the pace."""

    index: int
    address: str
    ca: str
    keys: list[tuple[int, bytes]]  # (client id, PKCS#8 PEM private key)
    poll_s: float
    seed: int
    activating_at_once: int


@dataclass
class ShareResult:
    """What one emulator process sends back (plain data: it crosses a pipe)."""

    devices: int
    activate_s: float
    activation_failures: dict[str, int]
    latencies: list[float]
    failures: dict[str, int]
    retries: dict[str, int]
    failed_devices: list[int]
    unanswered: int  # calls started in the window and still open GRACE_S after it
    cpu_s: float  # the process's user + system CPU over the window
    window_s: float

    @property
    def requests(self) -> int:
        return len(self.latencies) + sum(self.failures.values()) + self.unanswered


@dataclass
class Fleet:
    """Every process's results, merged: one tally as if one emulator had measured."""

    shares: list[ShareResult]
    tally: Tally = field(init=False)

    def __post_init__(self) -> None:
        self.tally = merge(self.shares)

    @property
    def activate_s(self) -> float:
        return max(s.activate_s for s in self.shares)

    @property
    def activation_failures(self) -> dict[str, int]:
        return _sum_counts(s.activation_failures for s in self.shares)

    @property
    def cpu_s(self) -> float:
        """The emulator's CPU over the window: the sum over its processes."""
        return sum(s.cpu_s for s in self.shares)


def _sum_counts(counts: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in counts:
        for k, v in c.items():
            out[k] = out.get(k, 0) + v
    return dict(sorted(out.items()))


def merge(shares: list[ShareResult]) -> Tally:
    """One Tally of the processes' tallies: all latencies, failures and retries summed,
    calls still open counted as failures ("unanswered"), as the one process counted."""
    tally = Tally((math.nan, math.nan))
    tally.latencies = [x for s in shares for x in s.latencies]
    tally.failures = _sum_counts(s.failures for s in shares)
    unanswered = sum(s.unanswered for s in shares)
    if unanswered:
        tally.failures["unanswered"] = tally.failures.get("unanswered", 0) + unanswered
    tally.retries = _sum_counts(s.retries for s in shares)
    tally.failed_devices = {d for s in shares for d in s.failed_devices}
    return tally


class Emulator:
    """`devices` held by `procs` child processes against the Fleet API at `address`.

    with Emulator(...) as fleet:
        fleet.wait_up()                      # the barrier: every device activated
        opens, closes = fleet.open_window(warmup_s, window_s)   # CLOCK_MONOTONIC
        ...                                  # the coordinator's readings at opens, closes
        result = fleet.results()
    """

    def __init__(
        self,
        address: str,
        ca: Path,
        devices: list[Device],
        *,
        procs: int,
        poll_s: float,
        seed: int,
    ) -> None:
        at_once = max(1, math.ceil(ACTIVATING_AT_ONCE / procs))
        self.shares = [
            Share(
                index=i,
                address=address,
                ca=str(ca),
                keys=[(d.client_id, d.private_pem()) for d in devices[i::procs]],
                poll_s=poll_s,
                seed=seed,
                activating_at_once=at_once,
            )
            for i in range(procs)
        ]
        self._ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no
        # inherited threads, locks or event loop of the parent
        self._procs: list[BaseProcess] = []
        self._conns: list[Connection] = []

    def __enter__(self) -> Emulator:
        try:
            for share in self.shares:
                ours, theirs = self._ctx.Pipe()
                p = self._ctx.Process(
                    target=_child,
                    args=(theirs, share),
                    name=f"fleet-emulator-{share.index}",
                    daemon=True,
                )
                p.start()
                theirs.close()
                self._procs.append(p)
                self._conns.append(ours)
        except BaseException:
            self._stop()
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop(wait_s=10.0 if kind is None else 0.0)

    def _stop(self, wait_s: float = 0.0) -> None:
        """Let the children exit (`wait_s` each, after their "done"), then stop them."""
        for p in self._procs:
            p.join(timeout=wait_s if p.is_alive() else 0)
        for p in self._procs:
            if p.is_alive():
                p.terminate()
                p.join(5)
            if p.is_alive():
                p.kill()
                p.join(5)
        for c in self._conns:
            c.close()

    def _gather(self, kind: str, timeout: float) -> list[Any]:
        """One `kind` message from every child, in share order; a child's error, death
        or silence past `timeout` raises."""
        got: dict[int, Any] = {}
        deadline = time.monotonic() + timeout
        while len(got) < len(self._conns):
            waiting = [c for i, c in enumerate(self._conns) if i not in got]
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(
                    f"fleet emulator: {len(waiting)} of {len(self._conns)} processes sent no "
                    f"{kind!r} within {timeout:.0f} s"
                )
            for c in wait(waiting, timeout=min(left, 5.0)):
                i = self._conns.index(c)
                try:
                    what, payload = c.recv()
                except EOFError:
                    raise RuntimeError(
                        f"fleet emulator process {i} exited (code {self._procs[i].exitcode}) "
                        f"before sending {kind!r}"
                    ) from None
                if what == "error":
                    raise RuntimeError(f"fleet emulator process {i} failed:\n{payload}")
                if what != kind:
                    raise RuntimeError(f"fleet emulator process {i}: {what!r}, not {kind!r}")
                got[i] = payload
        return [got[i] for i in range(len(self._conns))]

    def wait_up(self, timeout: float = UP_TIMEOUT_S) -> None:
        """The barrier: return once every process has activated all its devices."""
        self._gather("up", timeout)

    def open_window(self, warmup_s: float, window_s: float) -> tuple[float, float]:
        """Open the window `warmup_s` from now for every process at once; its bounds on
        CLOCK_MONOTONIC (time.monotonic)."""
        opens = time.monotonic() + warmup_s
        window = (opens, opens + window_s)
        for c in self._conns:
            c.send(("window", window))
        return window

    def results(self) -> Fleet:
        """Let the devices leave (DeactivateNode), and every process's tally. Call it
        after reading the coordinator's view: until then every device stays activated."""
        for c in self._conns:
            c.send(("leave", None))
        return Fleet([ShareResult(**r) for r in self._gather("done", 2 * GRACE_S + 60)])


def _child(conn: Connection, share: Share) -> None:
    """An emulator process: hold `share`'s devices, report through `conn`."""
    try:
        asyncio.run(_hold(conn, share))
    except BaseException:
        with contextlib.suppress(OSError):  # the parent may be gone already
            conn.send(("error", traceback.format_exc()))
        raise
    finally:
        conn.close()


async def _hold(conn: Connection, share: Share) -> None:
    devices = [Device.from_pem(cid, pem, share.address) for cid, pem in share.keys]
    n = len(devices)
    limits = httpx.Limits(max_connections=n + 16, max_keepalive_connections=n + 16)
    async with httpx.AsyncClient(verify=tls_context(Path(share.ca)), limits=limits) as http:
        # Each device starts polling and heartbeating once it is activated, as a SuperNode
        # does; nothing counts until the parent has opened the window.
        tally = Tally((math.inf, math.inf))
        rng = random.Random(f"{share.seed}/{share.index}")  # jitter only, not a secret
        sem, activated, all_up = asyncio.Semaphore(share.activating_at_once), [0], asyncio.Event()
        activation_errors: dict[str, int] = {}

        async def device(d: Device) -> None:
            try:
                async with sem:
                    await activate(http, d)
            except httpx.HTTPError as exc:
                name = error_name(exc)
                activation_errors[name] = activation_errors.get(name, 0) + 1
                return
            finally:
                activated[0] += 1
                if activated[0] == n:
                    all_up.set()
            beat = asyncio.create_task(heartbeat(http, d, tally, rng))
            await poll(http, d, share.poll_s, tally, rng)
            await beat

        t0 = time.perf_counter()
        tasks = [asyncio.create_task(device(d)) for d in devices]
        await all_up.wait()
        activate_s = time.perf_counter() - t0
        conn.send(("up", None))
        # The devices keep polling while this waits for the parent's window.
        what, (opens, closes) = await asyncio.to_thread(conn.recv)
        if what != "window":
            raise RuntimeError(f"expected the window from the parent, got {what!r}")
        to_perf = time.perf_counter() - time.monotonic()  # the tally's clock
        tally.window = (opens + to_perf, closes + to_perf)
        await asyncio.sleep(max(0.0, tally.window[0] - time.perf_counter()))
        cpu_before, t_before = self_cpu_s(), time.perf_counter()
        await asyncio.sleep(max(0.0, tally.window[1] - time.perf_counter()))
        cpu_after, t_after = self_cpu_s(), time.perf_counter()
        # Calls still open GRACE_S after the window are counted as lost, not waited for
        # (with Flower's retries one could take minutes on an overloaded machine).
        _, pending = await asyncio.wait(tasks, timeout=GRACE_S)
        unanswered = tally.open
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        # The second barrier: no device leaves before the parent has read the
        # coordinator's view (GET /cluster) of the window's end.
        what, _ = await asyncio.to_thread(conn.recv)
        if what != "leave":
            raise RuntimeError(f"expected 'leave' from the parent, got {what!r}")
        # On a timeout the SuperLink marks them offline after its heartbeat patience.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(
                bounded(
                    share.activating_at_once, [deactivate(http, d) for d in devices if d.node_id]
                ),
                GRACE_S,
            )
    result = ShareResult(
        devices=n,
        activate_s=activate_s,
        activation_failures=dict(sorted(activation_errors.items())),
        latencies=tally.latencies,
        failures=dict(tally.failures),
        retries=dict(tally.retries),
        failed_devices=sorted(tally.failed_devices),
        unanswered=unanswered,
        cpu_s=cpu_after - cpu_before,
        window_s=t_after - t_before,
    )
    conn.send(("done", result.__dict__))
