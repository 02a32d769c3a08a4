"""The in-process transport: clients are function calls on one reusable model.

No per-client process and no serialization: the global model tensor is handed
to the client runtime as it is. A client's state between messages (e.g. its
secure-aggregation keys) lives in a dict that is dropped when the round ends.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from fedveil.client.runtime import ClientRuntime
from fedveil.envelope import Envelope
from fedveil.server.transport import ClientFailure
from fedveil.tasks import Task

log = logging.getLogger("fedveil.inprocess")


class InProcessTransport:
    def __init__(self, task: Task, device: torch.device | str = "cpu") -> None:
        self.task = task
        self.runtime = ClientRuntime(task, device)
        self.states: dict[int, dict[str, Any]] = {}
        self._round = 0

    def client_ids(self) -> Sequence[int]:
        return range(self.task.num_clients)

    def exchange(
        self, requests: Mapping[int, Envelope], timeout_s: float | None
    ) -> dict[int, Envelope | ClientFailure]:
        replies: dict[int, Envelope | ClientFailure] = {}
        for cid in sorted(requests):
            msg = requests[cid]
            if msg.round != self._round:
                # Client state never outlives its round: memory stays bounded by the cohort.
                self.states.clear()
                self._round = msg.round
            try:
                replies[cid] = self.runtime.handle(cid, msg, self.states.setdefault(cid, {}))
            except Exception as exc:  # a failing client is a dropped client, never a crash
                log.debug("client %d failed", cid, exc_info=True)
                replies[cid] = ClientFailure(cid, f"{type(exc).__name__}: {exc}")
        return replies

    def close(self) -> None:
        self.states.clear()
