"""One lane of the in-process engine: clients run one after another on one model.

A lane is a ClientRuntime plus the clients' state between the messages of a
round (e.g. secure-aggregation keys). The state is dropped when the round
changes, so memory is bounded by the cohort, never by the population.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from fedveil.client.runtime import ClientRuntime
from fedveil.envelope import Envelope

log = logging.getLogger("fedveil.inprocess")


def _client_seed(msg: Envelope, cid: int) -> int:
    seed = msg.config.get("seed", 0)
    seed = seed if isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0 else 0
    state = np.random.SeedSequence([seed, msg.round, cid, 0x6C0BA1]).generate_state(2)
    return int(state[0]) << 32 | int(state[1])


class ClientLane:
    def __init__(self, runtime: ClientRuntime) -> None:
        self.runtime = runtime
        device = runtime.model.device
        self._devices = [device] if device.type == "cuda" else []
        self.states: dict[int, dict[str, Any]] = {}
        self._round: int | None = None

    def handle(self, cid: int, msg: Envelope) -> Envelope | str:
        """The client's reply, or why it failed (a failing client never stops the lane)."""
        if msg.round != self._round:
            self.states.clear()
            self._round = msg.round
        # Torch's global generator (dropout layers, random augmentation) is seeded per
        # (seed, round, client) and restored afterwards: a client's result does not
        # depend on which lane ran it or on who ran before it.
        with torch.random.fork_rng(devices=self._devices):
            # Not torch.manual_seed: on a CPU-only run it queues a lazy CUDA call, which
            # captures a stack trace per client.
            seed = _client_seed(msg, cid)
            torch.default_generator.manual_seed(seed)
            if self._devices:
                torch.cuda.manual_seed(seed)
            try:
                return self.runtime.handle(cid, msg, self.states.setdefault(cid, {}))
            except Exception as exc:
                log.debug("client %d failed", cid, exc_info=True)
                return f"{type(exc).__name__}: {exc}"
