"""run_in_memory: a whole round over in-memory dicts, for tests, benchmarks and examples.

Every request and reply can go through `to_wire()` / `from_wire()` (as a transport would),
client state can be round-tripped through `to_state()` / `from_state()` between stages, and
clients fall silent according to a `DropoutPattern`. Hooks let tests tamper with traffic.
Per-stage compute time (`clock`: wall time by default; pass `time.process_time` for CPU
time on a busy machine) and wire bytes are recorded for every client and for the server.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from .client import SecAggClient
from .errors import SecAggError, SecAggProtocolError
from .messages import CLIENT_MESSAGES, SERVER_MESSAGES, AdvertiseRequest, Message, Stage
from .server import AggregateResult, Observer, SecAggServer
from .session import SessionConfig
from .wire import wire_size

STAGES = tuple(Stage)
Inputs = Mapping[int, np.ndarray] | Callable[[int], np.ndarray]
TamperDown = Callable[[Stage, int, Message], Message | None]
TamperUp = Callable[[Stage, int, Message], Iterable[Message]]


@dataclass(frozen=True)
class DropoutPattern:
    """Clients that fall silent (for good) when the given stage's request reaches them."""

    by_stage: Mapping[Stage, frozenset[int]] = field(default_factory=dict)

    def silent_at(self, stage: Stage) -> frozenset[int]:
        silent: set[int] = set()
        for s in STAGES[: STAGES.index(stage) + 1]:
            silent |= self.by_stage.get(s, frozenset())
        return frozenset(silent)

    @classmethod
    def of(cls, **by_stage: Iterable[int]) -> DropoutPattern:
        """E.g. DropoutPattern.of(masked_input=[3, 7], unmask=[9])."""
        return cls({Stage(name): frozenset(ids) for name, ids in by_stage.items()})

    @classmethod
    def random(
        cls,
        client_ids: Iterable[int],
        rate: float,
        seed: int,
        stages: Iterable[Stage] = (Stage.SHARE_KEYS, Stage.MASKED_INPUT, Stage.UNMASK),
    ) -> DropoutPattern:
        """round(rate · n) clients drop, spread evenly over `stages` (simulation only)."""
        ids = sorted(client_ids)
        rng = np.random.default_rng(seed)
        chosen = rng.permutation(np.array(ids, dtype=np.uint64))[: round(rate * len(ids))]
        stage_list = list(stages)
        groups = np.array_split(chosen, len(stage_list))
        return cls({s: frozenset(g.tolist()) for s, g in zip(stage_list, groups, strict=True)})


@dataclass
class RoundReport:
    result: AggregateResult
    client_seconds: dict[str, dict[int, float]]
    server_seconds: dict[str, float]
    bytes_down: dict[str, dict[int, int]]
    bytes_up: dict[str, dict[int, int]]
    client_errors: dict[int, str]
    server_rejections: list[str]


def run_in_memory(
    session: SessionConfig,
    inputs: Inputs,
    *,
    dropouts: DropoutPattern | None = None,
    identity_keys: Mapping[int, Ed25519PrivateKey] | None = None,
    via_wire: bool = True,
    persist_state: bool = False,
    observer: Observer | None = None,
    tamper_down: TamperDown | None = None,
    tamper_up: TamperUp | None = None,
    server: SecAggServer | None = None,
    clock: Callable[[], float] = time.perf_counter,
    overwrite_inputs: bool = False,
) -> RoundReport:
    """Run one round; raises SecAggAborted if it cannot complete. See module docstring.

    `overwrite_inputs`: clients may mask their input vectors in place (only for a callable
    `inputs` that makes a new vector per call)."""
    dropouts = dropouts or DropoutPattern()
    identity_public = (
        {cid: key.public_key() for cid, key in identity_keys.items()} if identity_keys else None
    )
    server = server or SecAggServer(
        session, identity_public_keys=identity_public, observer=observer, clock=clock
    )
    driver = _Driver(
        server=server,
        inputs=inputs,
        identity_keys=identity_keys,
        identity_public=identity_public,
        via_wire=via_wire,
        persist_state=persist_state,
        tamper_down=tamper_down,
        tamper_up=tamper_up,
        clock=clock,
        overwrite_inputs=overwrite_inputs,
    )
    requests = server.next_requests()
    while requests:
        stage = next(iter(requests.values())).STAGE
        silent = dropouts.silent_at(stage)
        for cid, request in requests.items():
            if cid not in silent and cid not in driver.failed:
                driver.exchange(stage, cid, request)
        requests = server.next_requests()
    result = server.finalize()
    return RoundReport(
        result=result,
        client_seconds=driver.client_seconds,
        server_seconds=dict(server.stage_seconds),
        bytes_down=driver.bytes_down,
        bytes_up=driver.bytes_up,
        client_errors=driver.failed,
        server_rejections=driver.rejections,
    )


def _per_stage() -> dict[str, dict[int, Any]]:
    return {s.value: {} for s in STAGES}


@dataclass
class _Driver:
    """The clients of one in-memory round and the traffic between them and the server."""

    server: SecAggServer
    inputs: Inputs
    identity_keys: Mapping[int, Ed25519PrivateKey] | None
    identity_public: Mapping[int, Ed25519PublicKey] | None
    via_wire: bool
    persist_state: bool
    tamper_down: TamperDown | None
    tamper_up: TamperUp | None
    clock: Callable[[], float]
    overwrite_inputs: bool
    clients: dict[int, SecAggClient] = field(default_factory=dict)
    failed: dict[int, str] = field(default_factory=dict)
    rejections: list[str] = field(default_factory=list)
    client_seconds: dict[str, dict[int, float]] = field(default_factory=_per_stage)
    bytes_down: dict[str, dict[int, int]] = field(default_factory=_per_stage)
    bytes_up: dict[str, dict[int, int]] = field(default_factory=_per_stage)

    def exchange(self, stage: Stage, cid: int, request: Message) -> None:
        """One request to client `cid` and its reply (if any) to the server."""
        outgoing = self.tamper_down(stage, cid, request) if self.tamper_down else request
        if outgoing is None:
            return
        if self.via_wire:
            config, arrays = outgoing.to_wire()
            self.bytes_down[stage.value][cid] = wire_size(config, arrays)
            outgoing = SERVER_MESSAGES[stage].from_wire(config, arrays)
        reply = self._respond(stage, cid, outgoing)
        if reply is None:
            return
        if self.via_wire:
            config, arrays = reply.to_wire()
            self.bytes_up[stage.value][cid] = wire_size(config, arrays)
            reply = CLIENT_MESSAGES[stage].from_wire(config, arrays)
        for message in self.tamper_up(stage, cid, reply) if self.tamper_up else (reply,):
            try:
                self.server.receive(cid, message)
            except SecAggProtocolError as exc:
                self.rejections.append(str(exc))

    def _respond(self, stage: Stage, cid: int, request: Message) -> Message | None:
        """The client's reply, or None when it failed (recorded in `failed`)."""
        try:
            client = self._client_for(cid, request)
            vector = None
            if stage is Stage.MASKED_INPUT:
                vector = self.inputs(cid) if callable(self.inputs) else self.inputs[cid]
            started = self.clock()
            reply = client.respond(request, vector, overwrite_input=self.overwrite_inputs)
            self.client_seconds[stage.value][cid] = self.clock() - started
            self.clients[cid] = client
        except SecAggError as exc:
            self.failed[cid] = str(exc)
            return None
        return reply

    def _client_for(self, cid: int, request: Message) -> SecAggClient:
        key = self.identity_keys.get(cid) if self.identity_keys else None
        if isinstance(request, AdvertiseRequest):
            return SecAggClient(
                cid, request.session, identity_key=key, identity_public_keys=self.identity_public
            )
        client = self.clients[cid]
        if self.persist_state:
            client = SecAggClient.from_state(
                client.to_state(), identity_key=key, identity_public_keys=self.identity_public
            )
        return client
