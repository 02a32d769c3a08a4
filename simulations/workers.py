"""Worker processes for the in-process engine: every CPU core trains clients.

Each worker holds one SequentialClients (one reusable model, the task's data) and
torch threads of its own share of the cores. Requests and replies travel
through shared memory: the server packs each distinct request array (the
global model) once per exchange into a request arena; a worker packs its
replies (updates) into one of two reply arenas of its own, alternating per
chunk, and the server copies them out. Pipes carry only small descriptors.

Scheduling is dynamic (a worker gets the next chunk of units when it is
ready) but sticky within a round: a client's later messages go to the worker
that holds its state. Any worker gives a client the same result: its
computation depends only on (seed, round, client) and on its unit, which the
server plans from the requests alone (lane.plan_units), and every worker runs
with the same number of threads.

Workers are forked when they run one torch thread each (fast start, the
task's data shared copy-on-write). More threads per worker, or CUDA, need
spawned workers (GNU OpenMP and CUDA do not survive fork), which rebuild the
task from a picklable factory.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import multiprocessing as mp
import os
import platform
import queue
import signal
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

import torch

from fedveil.client.runtime import IdentitySource
from fedveil.client.sessions import Advance, RoundClock, outlives
from fedveil.config import RunConfig
from fedveil.config.async_mode import rounds_are_dispatches
from fedveil.privacy.secagg import SIMULATION_RUN_ID
from fedveil.protocol.envelope import Envelope
from fedveil.protocol.piggyback import latest_round
from fedveil.simulations.sequential_clients import SequentialClients, Unit
from fedveil.simulations.shm import Arena, ArrayRef, Packer, take
from fedveil.tasks import Task

log = logging.getLogger("fedveil.workers")

CLOSE_GRACE_S = 1.0  # a worker still busy after "stop" is mid-chunk: its result is moot
DEPTH = 2  # chunks in flight per worker: one computing, one queued (= reply arenas per worker)
MAX_CHUNK = 8


def keep_freed_memory() -> bool:
    """Let glibc keep freed memory for reuse instead of returning it to the OS (and back).

    Every client allocates and frees the same few buffers (its data, gradients,
    update). Above glibc's mmap threshold each of those is a fresh mapping whose
    pages fault in again, which costs more than the training itself on some
    virtual machines. Serving them from the heap makes the steady state free of
    page faults; the process keeps its peak heap, which a round bounds anyway.
    """
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(None)
        m_trim_threshold, m_mmap_threshold = -1, -3
        ok = libc.mallopt(m_mmap_threshold, 256 << 20) or libc.mallopt(m_mmap_threshold, 32 << 20)
        return bool(ok and libc.mallopt(m_trim_threshold, 512 << 20))
    except (OSError, AttributeError):
        return False


def cpu_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def death_cause(exitcode: int | None) -> str:
    """Why a worker process ended, in words: its exit code, or the signal that killed it."""
    if exitcode is None:
        return "it did not exit"
    if exitcode >= 0:
        return f"exit code {exitcode}"
    try:
        name = signal.Signals(-exitcode).name
    except ValueError:
        return f"killed by signal {-exitcode}"
    hints = {
        "SIGKILL": ": out of memory? (see `dmesg`)",
        "SIGSEGV": ": a crash in native code (torch, numpy)",
        "SIGABRT": ": aborted by native code",
    }
    return f"killed by {name}{hints.get(name, '')}"


@dataclass
class ChunkTiming:
    """One chunk's way through the pool, in time.perf_counter() seconds (the system's
    monotonic clock, the same in every process): sent by the server, started and ended
    by the worker, its replies copied out by the server."""

    worker: int
    clients: int
    first_client: int
    sent: float
    started: float
    ended: float
    received: float
    copied: float
    cpu_s: float
    reply_bytes: int


@dataclass
class ExchangeStats:
    """Where one exchange's time went (`WorkerPool(on_exchange=...)`, profiling): from
    `begun` (the pool's `run` called) to `finished` (its last reply handed over), the
    server's packing of the requests (`packed`: when done) and every chunk's timeline."""

    workers: int
    begun: float
    packed: float = 0.0
    finished: float = 0.0
    request_bytes: int = 0
    chunks: list[ChunkTiming] = field(default_factory=list)


@dataclass
class WorkerSetup:
    """What a worker needs; pickled only for spawned workers (then `task` is None)."""

    index: int
    threads: int
    device: str
    unit_size: int
    request: tuple[int, int]
    replies: tuple[tuple[int, int], ...]
    inherited: bool
    task: Task | None
    task_factory: Callable[[], Task] | None
    identities: IdentitySource | None = None
    run_id: bytes = SIMULATION_RUN_ID
    run_config: RunConfig | None = None


# -- worker side ------------------------------------------------------------
def _reader(conn: Connection, inbox: queue.SimpleQueue) -> None:
    """Drains the pipe into `inbox`, so the server never blocks sending while we reply."""
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            msg = ("stop",)
        inbox.put(msg)
        if msg[0] == "stop":
            return


PARENT_POLL_S = 0.2


def _exit_with_parent(parent: int) -> None:
    """Ends this worker once the server's process is gone, however it went.

    A server killed outright (or one that exits without closing the pool) closes no pipe
    that a worker would notice: forked siblings hold copies of each other's pipe ends.
    """
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    os._exit(0)


def _worker_main(conn: Connection, setup: WorkerSetup, parent: int = 0) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server decides when to stop
    # A forked worker inherits the server's SIGTERM handler (a run stops cleanly on it);
    # a worker has nothing to save, so SIGTERM simply ends it.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if parent:
        threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True).start()
    try:
        keep_freed_memory()
        torch.set_num_threads(setup.threads)
        task = setup.task if setup.task is not None else setup.task_factory()  # type: ignore[misc]
        lane = SequentialClients(
            task,
            setup.device,
            unit_size=setup.unit_size,
            identities=setup.identities,
            run_id=setup.run_id,
            run_config=setup.run_config,
        )
        request = Arena.attach(setup.request, setup.inherited)
        replies = [Arena.attach(r, setup.inherited) for r in setup.replies]
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        return
    conn.send(("ready", os.getpid()))
    inbox: queue.SimpleQueue = queue.SimpleQueue()
    threading.Thread(target=_reader, args=(conn, inbox), daemon=True).start()
    cache_key: int | None = None
    cache: dict[int, Any] = {}
    while True:
        msg = inbox.get()
        if msg[0] == "stop":
            return
        _, chunk_id, exchange, slot, units = msg
        if exchange != cache_key:  # each distinct request array is copied once per exchange
            cache_key, cache = exchange, {}
        start, cpu = time.perf_counter(), time.process_time()
        packer = Packer(replies[slot])
        results = []
        for unit in units:
            envelopes = []
            for cid, kind, round_num, config, refs in unit:
                arrays = {}
                for key, ref in refs.items():
                    if ref.offset not in cache:
                        cache[ref.offset] = take(request, ref)
                    arrays[key] = cache[ref.offset]
                envelopes.append((cid, Envelope(kind, round_num, config, arrays)))
            for cid, reply in lane.run_unit(envelopes):
                results.append((cid, _pack(packer, reply)))
        try:
            timing = (start, time.perf_counter(), time.process_time() - cpu, packer.offset)
            conn.send(("done", chunk_id, results, timing))
        except (BrokenPipeError, OSError):
            return


def _pack(packer: Packer, reply: Envelope | str) -> tuple | str:
    if isinstance(reply, str):
        return reply
    try:
        packed = {k: packer.put(v) for k, v in reply.arrays.items()}
    except (TypeError, ValueError) as exc:
        return f"reply cannot be shared: {exc}"
    return (reply.kind, reply.round, reply.config, packed)


# -- server side ------------------------------------------------------------
@dataclass
class _Worker:
    index: int
    process: Any
    conn: Connection
    replies: list[Arena]
    free_slots: list[int]
    in_flight: dict[int, tuple[int, list[int]]]  # chunk id -> (slot, client ids)


class WorkerPool:
    """`workers` processes running clients; `run` is one exchange."""

    def __init__(
        self,
        task: Task,
        workers: int,
        *,
        device: str = "cpu",
        threads: int | None = None,
        unit_size: int = 1,
        task_factory: Callable[[], Task] | None = None,
        identities: IdentitySource | None = None,
        run_id: bytes = SIMULATION_RUN_ID,
        run_config: RunConfig | None = None,
        on_exchange: Callable[[ExchangeStats], None] | None = None,
    ) -> None:
        """`on_exchange`: given each exchange's ExchangeStats as it ends (profiling)."""
        if workers < 2:
            raise ValueError(f"simulation.workers = {workers}: a worker pool needs at least 2")
        self.task, self.device, self.task_factory = task, device, task_factory
        self.unit_size = unit_size
        self.identities = identities
        self.run_id, self.run_config = run_id, run_config
        self.on_exchange = on_exchange
        self._stats: ExchangeStats | None = None
        self._sent: dict[int, float] = {}  # chunk id -> when sent (profiling only)
        self.threads = threads or max(1, cpu_cores() // workers)
        # GNU OpenMP (torch's intra-op pool) and CUDA break in forked children.
        self.method = "fork" if self.threads == 1 and device == "cpu" else "spawn"
        if self.method == "spawn" and task_factory is None:
            raise ValueError(
                f"simulation.workers = {workers} with {self.threads} torch threads each "
                f"on {device} needs spawned workers, which rebuild the task from the config; "
                "run through `fedveil simulate` (or pass task_factory), or set "
                "simulation.workers to the number of cores"
            )
        self.ctx = mp.get_context(self.method)
        self.request = Arena.create("fedveil-requests")
        self.workers: list[_Worker] = []
        # client -> (worker holding its state, round it was last sent there); state
        # lives as long as client.sessions says (into the next round).
        self.owner: dict[int, tuple[int, int]] = {}
        self.lost: dict[int, int] = {}  # client -> round its worker died with its state
        self._clock = RoundClock()
        self._pinned: list[deque] = []
        self._free: deque = deque()
        self._cap = 1
        self._queued = 0
        self._exchange = 0
        self._chunk = 0
        self._client_state = True  # whether this exchange's messages leave client state
        # Async rounds are dispatch numbers: affinities are not expired by round (a
        # client's keys agreed ahead are used after later dispatches), only overwritten.
        self._by_round = not rounds_are_dispatches(run_config)
        try:
            for i in range(workers):
                self.workers.append(self._start(i))
            for w in self.workers:
                self._await_ready(w)
        except BaseException:
            self.close()
            raise

    def _start(self, index: int, replies: list[Arena] | None = None) -> _Worker:
        replies = replies or [Arena.create(f"fedveil-replies-{index}") for _ in range(DEPTH)]
        setup = WorkerSetup(
            index=index,
            threads=self.threads,
            device=self.device,
            unit_size=self.unit_size,
            request=self.request.owner,
            replies=tuple(a.owner for a in replies),
            inherited=self.method == "fork",
            task=self.task if self.method == "fork" else None,
            task_factory=None if self.method == "fork" else self.task_factory,
            identities=self.identities,
            run_id=self.run_id,
            run_config=self.run_config,
        )
        parent, child = self.ctx.Pipe(duplex=True)
        proc = self.ctx.Process(
            target=_worker_main,
            args=(child, setup, os.getpid()),
            daemon=True,
            name=f"fedveil-worker-{index}",
        )
        proc.start()
        child.close()
        return _Worker(index, proc, parent, replies, list(range(DEPTH)), {})

    def _await_ready(self, w: _Worker) -> None:
        try:
            kind, detail = w.conn.recv()
        except (EOFError, OSError):
            raise RuntimeError(f"worker {w.index} exited while starting") from None
        if kind != "ready":
            raise RuntimeError(f"worker {w.index} failed to start:\n{detail}")

    @property
    def size(self) -> int:
        return len(self.workers)

    # -- one exchange -------------------------------------------------------
    def run(
        self,
        units: Sequence[Unit],
        on_progress: Callable[[int], None] | None = None,
        *,
        client_state: bool = True,
        take: Callable[[int, Envelope | str], None] | None = None,
    ) -> dict[int, Envelope | str]:
        """Every request's reply, or the reason it failed; `on_progress(done)` per chunk.
        `take`: each reply is handed to it as its chunk comes back, and not returned
        (the caller folds replies as they arrive instead of holding them all).

        A unit (see lane.plan_units) is never split: one worker runs it.
        `client_state=False`: the messages are no client's and leave no state (the central
        evaluation's slices): they neither advance the round clock nor move affinities.
        Their round is the model version, which in async mode trails the dispatch numbers
        the clients' sessions are kept by, and would read as a new run.
        """
        out: dict[int, Envelope | str] = {}
        if not units:
            return out
        self._client_state = client_state
        if client_state and self._by_round:
            latest = max(msg.round for unit in units for _, msg in unit)
            step = self._clock.advance(latest)
            if step is Advance.NEW_RUN:
                self.owner.clear()
                self.lost.clear()
            if step is not Advance.SAME:
                self.owner = {c: o for c, o in self.owner.items() if outlives(o[1], latest)}
                self.lost = {c: r for c, r in self.lost.items() if outlives(r, latest)}
        self._exchange += 1
        stats = ExchangeStats(len(self.workers), time.perf_counter())
        self._stats = stats if self.on_exchange is not None else None
        self._sent = {}
        packed = self._pack_requests(units)
        stats.packed = time.perf_counter()
        self._pinned = [deque() for _ in self.workers]
        self._free = deque()
        pending = 0
        for unit in packed:
            cid = unit[0][0]
            if len(unit) == 1 and self.lost.get(cid) == unit[0][2]:
                out[cid] = "client state lost: its worker process died"
                continue
            pending += len(unit)
            owner = self.owner.get(cid) if len(unit) == 1 else None
            (self._pinned[owner[0]] if owner is not None else self._free).append(unit)
        self._queued = pending  # clients not yet sent to a worker
        self._cap = max(1, min(MAX_CHUNK, -(-pending // (4 * self.size))))
        for w in self.workers:
            for _ in range(DEPTH):
                self._dispatch(w)
        done = len(out)
        while pending:
            by_conn = {w.conn: w for w in self.workers if w.in_flight}
            for conn in wait(list(by_conn)):
                w = by_conn[conn]
                finished = self._receive(w, out)
                pending -= finished
                done += finished
                self._dispatch(self.workers[w.index])
                _hand_over(out, take)
            if on_progress is not None:
                on_progress(done)
        _hand_over(out, take)
        if self.on_exchange is not None:
            stats.finished = time.perf_counter()
            self.on_exchange(stats)
        return out

    def _pack_requests(self, units: Sequence[Unit]) -> list[list[tuple]]:
        packer = Packer(self.request)
        refs: dict[int, ArrayRef] = {}  # id(array) -> where it is; shared arrays packed once
        packed = []
        for unit in units:
            items = []
            for cid, msg in unit:
                msg_refs = {}
                for key, value in msg.arrays.items():
                    if id(value) not in refs:
                        refs[id(value)] = packer.put(value)
                        if self._stats is not None:
                            self._stats.request_bytes += refs[id(value)].nbytes
                    msg_refs[key] = refs[id(value)]
                items.append((cid, msg.kind, msg.round, msg.config, msg_refs))
            packed.append(items)
        return packed

    def _dispatch(self, w: _Worker) -> None:
        if not w.free_slots:
            return
        queue = self._pinned[w.index] or self._free
        if not queue:
            return
        if w.in_flight and queue is self._free and len(queue) <= self.size:
            # The last units go to whichever worker is free first: a worker slowed down
            # (by other load on its core, say) never holds one queued behind its own.
            return
        # Whole units, up to a chunk's worth of clients; smaller chunks towards the end
        # keep the workers finishing together.
        want = max(1, min(self._cap, -(-self._queued // (2 * self.size))))
        skip = 0
        if w.in_flight and queue is self._free:
            # Queued behind its own chunk: the front units are left to the workers with
            # nothing running (they start them sooner), so replies come back close to
            # client-id order and less of the server's in-order sum waits for the end.
            idle = sum(1 for o in self.workers if not o.in_flight and o.free_slots)
            skip = min(len(queue) - 1, idle)
        queue.rotate(-skip)
        chunk = [queue.popleft()]
        size = len(chunk[0])
        while len(queue) > skip and size + len(queue[0]) <= want:
            size += len(queue[0])
            chunk.append(queue.popleft())
        queue.rotate(skip)
        self._queued -= size
        cids = [item[0] for unit in chunk for item in unit]
        chunk_items = (item for unit in chunk for item in unit) if self._client_state else ()
        for cid, _, round_num, config, _ in chunk_items:
            # The state it leaves there may be for the round of a rider it carries, or
            # (held since an earlier message) for a later round than this message's.
            latest = latest_round(round_num, config)
            held = self.owner.get(cid)
            if held is not None and held[0] == w.index:
                latest = max(latest, held[1])
            self.owner[cid] = (w.index, latest)
        slot = w.free_slots.pop()
        self._chunk += 1
        w.in_flight[self._chunk] = (slot, cids)
        # A dead worker is noticed when its pipe reports EOF.
        if self._stats is not None:
            self._sent[self._chunk] = time.perf_counter()
        with contextlib.suppress(BrokenPipeError, OSError):
            w.conn.send(("run", self._chunk, self._exchange, slot, chunk))

    def _receive(self, w: _Worker, out: dict[int, Envelope | str]) -> int:
        try:
            msg = w.conn.recv()
        except (EOFError, OSError):
            return self._worker_died(w, out)
        received = time.perf_counter()
        _, chunk_id, results, (started, ended, cpu_s, nbytes) = msg
        slot, cids = w.in_flight.pop(chunk_id)
        # The worker's next chunk first (into its other reply arena), then the copying
        # out: a worker with nothing queued would otherwise wait for the copy.
        self._dispatch(w)
        arena = w.replies[slot]
        for cid, result in results:
            if isinstance(result, str):
                out[cid] = result
                continue
            kind, round_num, config, packed = result
            arrays = {key: take(arena, ref) for key, ref in packed.items()}
            out[cid] = Envelope(kind, round_num, config, arrays)
        w.free_slots.append(slot)
        if self._stats is not None:
            sent = self._sent.pop(chunk_id, received)
            self._stats.chunks.append(
                ChunkTiming(
                    w.index, len(cids), min(cids, default=-1), sent, started, ended, received,
                    time.perf_counter(), cpu_s, nbytes,
                )
            )  # fmt: skip
        return len(cids)

    def _worker_died(self, w: _Worker, out: dict[int, Envelope | str]) -> int:
        w.process.join(timeout=5)
        running = sorted(cid for _, cids in w.in_flight.values() for cid in cids)
        # No client ids in the reason or the warning: under DP who ran (and so who took
        # part) is private, and a reason is logged and may reach the summary. Each
        # failure is keyed by its client already; the ids go to the debug log only.
        reason = (
            f"worker process {w.index} died ({death_cause(w.process.exitcode)}) "
            f"while running {len(running)} client(s)"
        )
        log.warning("%s; restarting it; its clients this round count as dropped", reason)
        log.debug("worker process %d was running client(s) %s", w.index, running)
        failed = list(running)
        # Clients whose state it held cannot go on this round, like crashed devices.
        stranded = [item[0] for unit in self._pinned[w.index] for item in unit]
        self._pinned[w.index].clear()
        self._queued -= len(stranded)
        failed += stranded
        for cid in failed:
            out[cid] = reason
        for cid, (index, round_num) in list(self.owner.items()):
            if index == w.index:
                self.lost[cid] = round_num
                del self.owner[cid]
        w.conn.close()
        fresh = self._start(w.index, w.replies)
        self._await_ready(fresh)
        self.workers[w.index] = fresh
        return len(failed)

    def close(self) -> None:
        """Stops the workers: idle ones at once; busy ones (an interrupted round) are
        killed after CLOSE_GRACE_S rather than waited for."""
        for w in self.workers:
            with contextlib.suppress(BrokenPipeError, OSError):
                w.conn.send(("stop",))
        deadline = time.monotonic() + CLOSE_GRACE_S
        for w in self.workers:
            w.process.join(timeout=max(0.0, deadline - time.monotonic()))
            if w.process.is_alive():
                w.process.kill()
                w.process.join(timeout=5)
            w.conn.close()
            for a in w.replies:
                a.close()
        self.workers = []
        self.request.close()


def _hand_over(
    out: dict[int, Envelope | str], take: Callable[[int, Envelope | str], None] | None
) -> None:
    """Moves the replies gathered so far from `out` to `take` (none: they stay)."""
    if take is None:
        return
    while out:
        cid = next(iter(out))
        take(cid, out.pop(cid))
