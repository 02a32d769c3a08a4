"""The in-process engine: many clients on one machine, no per-client process, no serialization.

With one worker (the default for a GPU, or `simulation.workers = 1`) clients
run in this process on one reusable model that stays on the device (and so
does a built-in task's data), and the global model tensor is handed to the
client runtime as it is. With more workers, clients run in parallel in worker
processes that split the CPU cores between them, and tensors travel through
shared memory (simulations/workers.py). Either way, same-size clients' local
training runs a unit at a time (simulations/batched.py) when the model allows.

Either way the round engine drives the same ClientRuntime through the same
Transport interface as deployment, so secure aggregation and DP apply
unchanged, and a client's result depends only on (seed, round, client).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import torch

from fedveil.client.runtime import IdentitySource
from fedveil.config import RunConfig
from fedveil.model_evaluation import summarize
from fedveil.privacy.secagg import SIMULATION_RUN_ID
from fedveil.protocol.envelope import Envelope
from fedveil.server.engine.transport import ClientFailure, ReplySink
from fedveil.simulations.sequential_clients import CENTRAL_EVAL, SequentialClients, plan_units
from fedveil.simulations.workers import ExchangeStats, WorkerPool, cpu_cores, keep_freed_memory
from fedveil.tasks import Task

# on_progress(done, total): clients finished so far in the current exchange.
Progress = Callable[[int, int], None]


def auto_workers(device: torch.device | str) -> int:
    """One worker per core on a CPU; one in-process lane keeping a GPU's model resident."""
    return 1 if torch.device(device).type != "cpu" else cpu_cores()


class InProcessTransport:
    def __init__(
        self,
        task: Task,
        device: torch.device | str = "cpu",
        *,
        workers: int = 1,
        unit_size: int = 1,
        task_factory: Callable[[], Task] | None = None,
        on_progress: Progress | None = None,
        identities: IdentitySource | None = None,
        run_id: bytes = SIMULATION_RUN_ID,
        run_config: RunConfig | None = None,
        on_exchange: Callable[[ExchangeStats], None] | None = None,
    ) -> None:
        """`identities`: the clients' secure-aggregation identities (malicious mode).
        `run_id`, `run_config`: what the clients hold fixed for the run (ClientRuntime):
        the run id their sessions must name, and the config they derive distributed-DP
        parameters from. `on_exchange`: each worker-pool exchange's timings (profiling;
        unused with one lane)."""
        if workers < 1:
            raise ValueError(f"simulation.workers = {workers}: must be >= 1 once resolved")
        keep_freed_memory()
        self.task = task
        self.device = torch.device(device)
        self.on_progress = on_progress
        self.unit_size = unit_size
        self._round: int | None = None
        self._seen: set[int] = set()  # clients contacted earlier in this round
        self.pool: WorkerPool | None = None
        self.lane: SequentialClients | None = None
        self._threads: int | None = None
        if workers > 1:
            self.pool = WorkerPool(
                task,
                workers,
                device=str(self.device),
                unit_size=unit_size,
                task_factory=task_factory,
                identities=identities,
                run_id=run_id,
                run_config=run_config,
                on_exchange=on_exchange,
            )
            # The workers own the cores. This process's share of a round (copying,
            # checking and summing updates, evaluating) is small, and intra-op threads
            # here would contend with the workers: OpenMP's spinning barriers make
            # that cost far more than it saves once anything else loads the machine.
            self._threads = torch.get_num_threads()
            torch.set_num_threads(1)
        else:
            self.lane = SequentialClients(
                task,
                self.device,
                unit_size=unit_size,
                identities=identities,
                run_id=run_id,
                run_config=run_config,
            )

    @property
    def workers(self) -> int:
        return 1 if self.pool is None else self.pool.size

    def client_ids(self) -> Sequence[int]:
        return range(self.task.num_clients)

    def exchange(
        self,
        requests: Mapping[int, Envelope],
        timeout_s: float | None,
        on_reply: ReplySink | None = None,
    ) -> dict[int, Envelope | ClientFailure]:
        """Every client's reply; with `on_reply`, each is handed to it as its unit (lane)
        or chunk (workers) finishes, and none is kept here."""
        # No wall-clock deadline here: simulated time is the availability model's business.
        items = sorted(requests.items())
        rounds = {msg.round for _, msg in items}
        if self._round not in rounds:
            self._round = max(rounds, default=None)
            self._seen = set()
        units = plan_units(items, self.task.client_sizes, self._seen, self.unit_size)
        self._seen.update(cid for cid, _ in items)
        total = len(items)
        progress = self.on_progress
        if progress is not None:
            progress(0, total)
        out: dict[int, Envelope | ClientFailure] = {}
        sink = out.__setitem__ if on_reply is None else on_reply

        def take(cid: int, result: Envelope | str) -> None:
            sink(cid, ClientFailure(cid, result) if isinstance(result, str) else result)

        if self.pool is not None:
            self.pool.run(units, None if progress is None else _bind(progress, total), take=take)
        else:
            assert self.lane is not None
            done = 0
            for unit in units:
                for cid, result in self.lane.run_unit(unit):
                    take(cid, result)
                done += len(unit)
                if progress is not None:
                    progress(done, total)
        return out

    def evaluate_central(
        self, weights: torch.Tensor, round_num: int, batch_size: int
    ) -> tuple[float, float, int] | None:
        """(mean loss, accuracy, examples) on the task's test set, split across the workers.

        The workers are idle between exchanges; one thread each on a slice beats this
        process evaluating alone. None with a single lane: the caller evaluates.
        """
        if self.pool is None or self.task.test_data is None:
            return None
        total = int(self.task.test_data[0].shape[0])
        # Slices on batch boundaries: every batch is the one a single process would
        # evaluate, and summarize() sums exactly, so the result is the same bit for bit.
        batches = -(-total // batch_size)
        parts = min(self.pool.size, batches)
        bounds = [min(total, batches * i // parts * batch_size) for i in range(parts + 1)]
        units = [
            # Negative ids: never a client's (and client_state=False below: no client's
            # worker affinity or session clock changes).
            [(-1 - i, Envelope(CENTRAL_EVAL, round_num, config, {"model": weights}))]
            for i, config in enumerate(
                {"start": a, "stop": b, "batch_size": batch_size}
                for a, b in itertools.pairwise(bounds)
            )
        ]
        results = self.pool.run(units, client_state=False)
        losses: list[float] = []
        correct = 0
        for reply in results.values():
            if not isinstance(reply, Envelope):
                raise RuntimeError(f"central evaluation failed in a worker: {reply}")
            losses.extend(float(v) for v in np.asarray(reply.arrays["losses"]))
            correct += int(reply.config["correct"])
        return summarize(losses, correct, total)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None
        if self._threads is not None:
            torch.set_num_threads(self._threads)
            self._threads = None
        if self.lane is not None:
            self.lane.states.clear()

    def __enter__(self) -> InProcessTransport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _bind(progress: Progress, total: int) -> Callable[[int], None]:
    return lambda done: progress(done, total)
