"""The Transport over Flower's deployment Grid (SuperLink), where clients come and go.

Differences from the simulation-side FlowerTransport, all because devices are
real: the node <-> client map is refreshed every round (a device that
reconnects, or joins late, is asked who it is without blocking the round);
with SuperNode authentication the map comes from the enrollment registry and
a node claiming another client's id is refused; a round waits on replies by
polling at `poll_s` instead of Flower's fixed 3 s, and gives up on a client
as soon as its node goes offline rather than at the deadline.

Exchanges may run at the same time on disjoint clients (the asynchronous engine's
wall clock runs one per dispatch unit, server/engine/wall_clock.py): the node map and
the hello bookkeeping are under one lock, and each exchange pushes and pulls only its
own message ids. A reply that comes after its exchange gave up on it (deadline, node
offline, or the transport closed at the end of a run) is dropped and counted in
`late_replies`, never handed to a later exchange. `exchange_first` (FirstReplies) ends
an exchange at its first R usable replies (a reply the caller's sink refused does not
count): an asynchronous secure-aggregation group released at R of G
(server.group_release_at), or its unmask stage ended at t replies
(server.group_unmask = 'threshold'); the replies it did not wait for, even those that
came in the same pull as the R-th, are late replies too, never used.

Every message carries a TTL bounded by its exchange's deadline (`message_ttl`), not
Flower's 12-hour default: the SuperLink then forgets an unclaimed message minutes after
its round, and answers its node's idle polls from memory again
(server/coordinator/idle_polls.py).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from flwr.app import Message
from flwr.serverapp import Grid

from fedveil.protocol.envelope import Envelope, MessageError
from fedveil.protocol.fields import CLIENT_ID, SIZE
from fedveil.protocol.flower_codec import from_content, message_type, to_content
from fedveil.protocol.kinds import Kind
from fedveil.server.engine.transport import LEFT_OUT, ClientFailure, ReplySink

log = logging.getLogger("fedveil.deploy")

HELLO_RETRY_S = 30.0
HELLOS_KEPT = 4  # unanswered hellos per node whose replies still count
ABANDONED_KEPT = 1024  # given-up message ids whose late replies are still counted
# How long past its exchange's deadline a message stays deliverable, and its reply
# accepted (Flower refuses a reply once its instruction's TTL has passed): a reply
# that comes a little late is still counted as late, not lost.
LATE_REPLY_GRACE_S = 120.0
# A hello stays deliverable as long as a reply to it still counts.
HELLO_TTL_S = HELLO_RETRY_S * HELLOS_KEPT


def message_ttl(timeout_s: float | None) -> float | None:
    """The TTL of an exchange's messages: its deadline plus LATE_REPLY_GRACE_S; None
    (Flower's default, 12 hours) for an exchange without a deadline."""
    if timeout_s is None or timeout_s == math.inf:
        return None
    if not (timeout_s > 0):  # a deadline already passed (or NaN): the grace alone
        return LATE_REPLY_GRACE_S
    return timeout_s + LATE_REPLY_GRACE_S


class DeployTransport:
    def __init__(
        self,
        grid: Grid,
        *,
        num_clients: int,
        model_size: int,
        setup: Mapping[str, Any] | None = None,
        enrolled: Mapping[int, int] | None = None,
        poll_s: float = 0.2,
        liveness_s: float = 1.0,
    ) -> None:
        """`enrolled` maps node id -> client id (SuperNode auth on); None trusts hellos."""
        self.grid = grid
        self.num_clients = num_clients
        self.model_size = model_size
        self.setup = dict(setup or {})
        self.enrolled = None if enrolled is None else dict(enrolled)
        self.poll_s, self.liveness_s = poll_s, liveness_s
        self.node_of: dict[int, int] = {}  # client id -> node id
        self._hello_pending: dict[str, int] = {}  # message id -> node id
        self._hello_sent: dict[int, float] = {}  # node id -> when
        self.on_change: Callable[[int], None] | None = None
        # Concurrent exchanges (async deployment): the map and hellos under one lock.
        self._lock = threading.RLock()
        self._closed = threading.Event()
        self._abandoned: dict[str, int] = {}  # message id -> client id, given up on
        self.late_replies = 0

    # -- who is there ------------------------------------------------------
    def client_ids(self) -> Sequence[int]:
        # The whole population can be sampled; a client that is not connected
        # when sampled is a dropout of that round, as on a real fleet.
        return range(self.num_clients)

    def connected(self) -> list[int]:
        with self._lock:
            return sorted(self.node_of)

    def online(self) -> list[int]:
        """The clients connected now, after a refresh (whom a wall-clock async run may
        dispatch to)."""
        self.refresh()
        return self.connected()

    def refresh(self) -> int:
        """Update the map without blocking: collect hello replies, greet new nodes."""
        with self._lock:
            return self._refresh()

    def _refresh(self) -> int:
        online = set(self.grid.get_node_ids())
        self._drop_late_replies()
        for cid, node in list(self.node_of.items()):
            if node not in online:
                log.info("client %d (node %d) went offline", cid, node)
                del self.node_of[cid]
        now = time.monotonic()
        if self._hello_pending:
            replies = self.grid.pull_messages(list(self._hello_pending))
            for reply in replies:
                node = self._hello_pending.pop(reply.metadata.reply_to_message_id, None)
                if node is not None:
                    self._accept_hello(node, reply)
            mapped = set(self.node_of.values())
            for msg_id, node in list(self._hello_pending.items()):
                if node in mapped or node not in online:
                    del self._hello_pending[msg_id]
        # A hello can be lost (the device restarted its SuperNode) or answered late (a
        # device still busy with a task of a run the coordinator forgot in a crash answers
        # each hello only once the next one arrives): an unanswered node is greeted again
        # every HELLO_RETRY_S, and a reply to any of its last few hellos counts.
        fresh = [
            n
            for n in sorted(online - set(self.node_of.values()))
            if now - self._hello_sent.get(n, -HELLO_RETRY_S) >= HELLO_RETRY_S
        ]
        if fresh:
            hello = self._with_setup(Envelope(Kind.HELLO, 0))
            messages = [
                Message(to_content(hello), n, message_type(Kind.HELLO), ttl=HELLO_TTL_S)
                for n in fresh
            ]
            for node, msg_id in zip(fresh, self.grid.push_messages(messages), strict=True):
                self._hello_sent[node] = now
                if msg_id:
                    self._hello_pending[msg_id] = node
            # Keep only each node's most recent hellos: a device that never answers must
            # not grow the list pulled on every refresh.
            per_node: dict[int, list[str]] = {}
            for msg_id, node in self._hello_pending.items():
                per_node.setdefault(node, []).append(msg_id)
            for ids in per_node.values():
                for msg_id in ids[:-HELLOS_KEPT]:
                    del self._hello_pending[msg_id]
        if self.on_change is not None:
            self.on_change(len(self.node_of))
        return len(self.node_of)

    def _accept_hello(self, node: int, reply: Message) -> None:
        if reply.has_error():
            log.warning("node %d: hello refused: %s", node, reply.error.reason)
            return
        try:
            env = from_content(reply.content)
            cid = env.get(CLIENT_ID, int)
            size = env.get(SIZE, int)
        except MessageError as exc:
            log.warning("node %d: bad hello reply dropped: %s", node, exc)
            return
        if not 0 <= cid < self.num_clients:
            log.warning("node %d: client id %d outside [0, %d)", node, cid, self.num_clients)
            return
        if self.enrolled is not None and self.enrolled.get(node) != cid:
            log.warning(
                "node %d claims client id %d but is enrolled as %s; refused",
                node,
                cid,
                self.enrolled.get(node),
            )
            return
        if size != self.model_size:
            log.warning(
                "client %d (node %d): its model has %d values, this run's has %d; refused",
                cid,
                node,
                size,
                self.model_size,
            )
            return
        old = self.node_of.get(cid)
        if old is not None and old != node:
            log.info("client %d moved from node %d to node %d", cid, old, node)
        self.node_of[cid] = node
        log.info("client %d is node %d", cid, node)

    def wait_for(self, count: int, timeout_s: float) -> int:
        """Block until `count` clients are connected (or the timeout); returns how many are."""
        deadline = time.monotonic() + timeout_s
        n = self.refresh()
        while n < count and time.monotonic() < deadline:
            time.sleep(self.poll_s)
            n = self.refresh()
        return n

    # -- one exchange ------------------------------------------------------
    def _with_setup(self, env: Envelope) -> Envelope:
        config = dict(env.config)
        config.update(self.setup)
        return Envelope(env.kind, env.round, config, env.arrays)

    def exchange(
        self,
        requests: Mapping[int, Envelope],
        timeout_s: float | None,
        on_reply: ReplySink | None = None,
    ) -> dict[int, Envelope | ClientFailure]:
        return self.exchange_first(requests, timeout_s, 0, on_reply)

    def exchange_first(
        self,
        requests: Mapping[int, Envelope],
        timeout_s: float | None,
        quorum: int,
        on_reply: ReplySink | None = None,
    ) -> dict[int, Envelope | ClientFailure]:
        """The exchange (FirstReplies): every device's reply; with `on_reply`, each is
        handed to it as a pull brings it, and not kept here. With `quorum` R > 0 it ends
        once R devices have replied: the others are left out, and their replies, when
        they come, are dropped and counted as late replies (never handed to a later
        exchange)."""
        if self._closed.is_set():
            return {cid: ClientFailure(cid, "the run has ended") for cid in requests}
        self.refresh()
        out: dict[int, Envelope | ClientFailure] = {}
        targets: list[tuple[int, int]] = []
        messages: list[Message] = []
        ttl = message_ttl(timeout_s)
        with self._lock:
            nodes = {cid: self.node_of.get(cid) for cid in requests}
        for cid in sorted(requests):
            node = nodes[cid]
            if node is None:
                out[cid] = ClientFailure(cid, "not connected")
                continue
            env = self._with_setup(requests[cid])
            targets.append((cid, node))
            messages.append(
                Message(
                    to_content(env),
                    node,
                    message_type(env.kind),
                    ttl=ttl,
                    group_id=str(env.round),
                )
            )
        pending: dict[str, tuple[int, int]] = {}
        if messages:
            for target, msg_id in zip(targets, self.grid.push_messages(messages), strict=True):
                if msg_id:
                    pending[msg_id] = target
                else:
                    out[target[0]] = ClientFailure(target[0], "message could not be sent")
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        last_liveness = time.monotonic()
        replied = 0  # usable replies, kept or handed to on_reply (and not refused by it)
        kind = next(iter(requests.values())).kind if requests else ""
        left_out = f"{LEFT_OUT}: not among the first {quorum} usable replies to {kind}"
        while pending:
            for reply in self.grid.pull_messages(list(pending)):
                target = pending.pop(reply.metadata.reply_to_message_id, None)
                if target is None:
                    continue
                if quorum and replied >= quorum:  # in the pull that reached the quorum
                    self._count_late(target[0], reply)
                    out[target[0]] = ClientFailure(target[0], left_out)
                    continue
                answer = self._reply(target, reply)
                kept = None
                if on_reply is None:
                    out[target[0]] = answer
                else:
                    kept = on_reply(target[0], answer)
                replied += isinstance(answer, Envelope) and kept is not False
            if not pending or (deadline is not None and time.monotonic() >= deadline):
                break
            if quorum and replied >= quorum:
                break
            if self._closed.is_set():
                break
            if time.monotonic() - last_liveness >= self.liveness_s:
                last_liveness = time.monotonic()
                online = set(self.grid.get_node_ids())
                for msg_id, (cid, node) in list(pending.items()):
                    if node not in online:
                        del pending[msg_id]
                        self._forget_node(cid, node)
                        out[cid] = ClientFailure(cid, "went offline during the round")
            self._closed.wait(self.poll_s)
        why = "the run has ended" if self._closed.is_set() else "no reply before the deadline"
        if quorum and pending and not self._closed.is_set() and replied >= quorum:
            why = left_out
        for cid, _ in pending.values():
            out[cid] = ClientFailure(cid, why)
        self._abandon(pending)
        return out

    def _forget_node(self, cid: int, node: int) -> None:
        with self._lock:
            if self.node_of.get(cid) == node:  # another exchange may have seen it move
                del self.node_of[cid]

    def _abandon(self, pending: Mapping[str, tuple[int, int]]) -> None:
        """Message ids this exchange gave up on: a late reply to one is counted, not used."""
        if not pending:
            return
        with self._lock:
            for msg_id, (cid, _) in pending.items():
                self._abandoned[msg_id] = cid
            for msg_id in list(self._abandoned)[:-ABANDONED_KEPT]:
                del self._abandoned[msg_id]

    def _drop_late_replies(self) -> None:
        """Pull replies to given-up messages (under the lock): dropped and counted."""
        if not self._abandoned:
            return
        for reply in self.grid.pull_messages(list(self._abandoned)):
            cid = self._abandoned.pop(reply.metadata.reply_to_message_id, None)
            if cid is not None:
                self._count_late(cid, reply)

    def _count_late(self, cid: int, reply: Message) -> None:
        """A reply after its exchange ended (or past its quorum): dropped, never used. An
        error reply (the SuperLink's for an expired message or a lost node) ends the wait
        for it; only a device's own reply is a late one."""
        if not reply.has_error():
            with self._lock:
                self.late_replies += 1
            log.info("client %d: a reply after its exchange ended; dropped", cid)

    def _reply(self, target: tuple[int, int], reply: Message) -> Envelope | ClientFailure:
        cid, node = target
        if reply.has_error():  # the client's own error, or the SuperLink's for a lost node
            return ClientFailure(cid, f"error reply: {reply.error.reason}")
        if reply.metadata.src_node_id != node:
            return ClientFailure(cid, f"reply came from node {reply.metadata.src_node_id}")
        try:
            return from_content(reply.content)
        except MessageError as exc:
            return ClientFailure(cid, f"bad reply: {exc}")
        except Exception as exc:  # a reply Flower could decode but we cannot: never fatal
            return ClientFailure(cid, f"bad reply: {type(exc).__name__}: {exc}")

    def close(self) -> None:
        """End the exchanges still waiting (each answers "the run has ended" for its
        clients) and refuse new ones: the run is over."""
        self._closed.set()
