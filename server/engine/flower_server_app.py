"""Flower ServerApp adapter: the round engine over Flower's Grid (Message API).

The same engine runs under Flower's simulation engine and its deployment
engine (SuperLink); only the Grid behind it differs.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

from flwr.app import Context, Message
from flwr.server import Grid
from flwr.serverapp import ServerApp

from fedveil.protocol.envelope import Envelope, MessageError
from fedveil.protocol.fields import CLIENT_ID
from fedveil.protocol.flower_codec import from_content, message_type, to_content
from fedveil.protocol.kinds import Kind
from fedveil.server.engine.flower_stock_codec import (
    StockCodec,
    error_essence,
    legacy_refusal,
    node_kind_of,
    stock_refusal,
)
from fedveil.server.engine.grid_replies import replies_as_they_arrive
from fedveil.server.engine.transport import ClientFailure, ReplySink

log = logging.getLogger("fedveil.flower")


class ClientsRefused(RuntimeError):
    """The Flower nodes cannot take part in this run (legacy apps; stock apps in a run
    that needs fedveil's protocol): the message says what they lack."""


class FlowerTransport:
    """Maps fedveil's logical client ids to Flower node ids and back.

    fedveil's ClientApp answers `query.hello` with its client id. A stock Flower
    ClientApp (Message API) answers it with an error; with `stock` (the task's model
    layout) it takes part under Flower's conventions (flower_stock_codec.py), and gets the dense
    ids fedveil's clients left free, in node-id order. `protocol_needs`: what of fedveil's
    protocol the run needs from every client (secure aggregation, ...): stock nodes are then
    refused at once, as legacy (NumPyClient) nodes always are.
    """

    def __init__(
        self,
        grid: Grid,
        *,
        expected_clients: int,
        wait_s: float = 600.0,
        stock: StockCodec | None = None,
        protocol_needs: str | None = None,
    ) -> None:
        self.grid = grid
        self.node_of: dict[int, int] = {}
        self.stock = stock
        self.stock_nodes: set[int] = set()
        self._discover(expected_clients, wait_s, protocol_needs)

    def _discover(self, expected: int, wait_s: float, protocol_needs: str | None) -> None:
        """Ask every connected node which client it is (its partition or enrolled id).

        The wait ends as soon as every node has answered; the long limit only matters
        when Ray starts many virtual nodes on a loaded machine.
        """
        deadline = time.monotonic() + wait_s
        node_ids: list[int] = []
        while time.monotonic() < deadline:
            node_ids = list(self.grid.get_node_ids())
            if len(node_ids) >= expected:
                break
            time.sleep(0.5)
        hello = Envelope(Kind.HELLO, 0)
        messages = [
            Message(to_content(hello), node_id, message_type(Kind.HELLO)) for node_id in node_ids
        ]
        census = _Census()
        for reply in self.grid.send_and_receive(messages, timeout=wait_s):
            census.add(reply)
        total = len(node_ids)
        if census.legacy:
            raise ClientsRefused(legacy_refusal(len(census.legacy), total))
        if census.stock and protocol_needs is not None:
            raise ClientsRefused(stock_refusal(len(census.stock), total, protocol_needs))
        if census.stock and self.stock is None:
            raise ClientsRefused(
                f"{len(census.stock)} of {total} Flower nodes run a stock ClientApp and this "
                "server has no model layout to speak to them: run fedveil's ClientApp there"
            )
        self.node_of = dict(census.fedveil)
        free = (cid for cid in range(expected) if cid not in self.node_of)
        # Stock nodes beyond the population (more nodes than clients) stay unused.
        for node_id, cid in zip(sorted(census.stock), free, strict=False):
            self.node_of[cid] = node_id
            self.stock_nodes.add(node_id)
        if census.stock:
            log.info("%d of %d Flower nodes run a stock ClientApp", len(census.stock), total)
        if len(self.node_of) < expected:
            raise RuntimeError(census.shortfall(expected, total, len(messages), wait_s))

    def client_ids(self) -> Sequence[int]:
        return sorted(self.node_of)

    def exchange(
        self,
        requests: Mapping[int, Envelope],
        timeout_s: float | None,
        on_reply: ReplySink | None = None,
    ) -> dict[int, Envelope | ClientFailure]:
        """Every client's reply; with `on_reply`, each is handed to it as a pull of the
        Grid brings it (grid_replies), and not kept here."""
        client_of: dict[int, int] = {}
        messages = []
        out: dict[int, Envelope | ClientFailure] = {
            cid: ClientFailure(cid, "not connected") for cid in requests if cid not in self.node_of
        }
        for cid, env in requests.items():
            node_id = self.node_of.get(cid)
            if node_id is None:
                continue
            if node_id in self.stock_nodes:
                assert self.stock is not None  # stock nodes are admitted only with a codec
                try:
                    content, mtype = self.stock.request(env)
                except MessageError as exc:
                    out[cid] = ClientFailure(cid, str(exc))
                    continue
            else:
                content, mtype = to_content(env), message_type(env.kind)
            client_of[node_id] = cid
            messages.append(Message(content, node_id, mtype))
        answered: set[int] = set()
        for reply in replies_as_they_arrive(self.grid, messages, timeout_s):
            cid = client_of.get(reply.metadata.src_node_id)
            if cid is None or cid in answered:
                continue
            answered.add(cid)
            result = self._decode(cid, requests[cid], reply)
            if on_reply is None:
                out[cid] = result
            else:
                on_reply(cid, result)
        for cid in requests:
            if cid not in answered:
                out.setdefault(cid, ClientFailure(cid, "no reply before the deadline"))
        return out

    def _decode(self, cid: int, request: Envelope, reply: Message) -> Envelope | ClientFailure:
        """A node's reply as the engine reads it: the Envelope, or why it is none."""
        if reply.has_error():
            return ClientFailure(
                cid, f"client error: {error_essence(reply.error.reason, limit=2000)}"
            )
        try:
            if reply.metadata.src_node_id in self.stock_nodes:
                assert self.stock is not None
                return self.stock.reply(request, reply.content)
            return from_content(reply.content)
        except MessageError as exc:
            return ClientFailure(cid, str(exc))
        except Exception as exc:  # a reply we cannot read is the client's fault, never fatal
            return ClientFailure(cid, f"bad reply: {type(exc).__name__}: {exc}"[:300])

    def close(self) -> None:
        return None


class _Census:
    """The nodes' answers to `query.hello`: fedveil clients, stock and legacy apps, errors."""

    def __init__(self) -> None:
        self.fedveil: dict[int, int] = {}  # client id -> node id
        self.stock: list[int] = []
        self.legacy: list[int] = []
        self.errors: Counter[str] = Counter()

    def add(self, reply: Message) -> None:
        node_id = reply.metadata.src_node_id
        if reply.has_error():
            reason = reply.error.reason
            kind = node_kind_of(reason)
            if kind == "stock":
                self.stock.append(node_id)
            elif kind == "legacy":
                self.legacy.append(node_id)
            else:
                self.errors[error_essence(reason)] += 1
            return
        try:
            cid = from_content(reply.content).get(CLIENT_ID, int)
        except MessageError as exc:
            log.warning("node %d: bad hello reply: %s", node_id, exc)
            self.errors[f"bad hello reply: {exc}"[:200]] += 1
            return
        self.fedveil[cid] = node_id

    def shortfall(self, expected: int, connected: int, asked: int, wait_s: float) -> str:
        """Why fewer clients than expected joined, in words."""
        answered = len(self.fedveil) + len(self.stock)
        parts = [f"only {answered} of {expected} clients joined"]
        if connected < expected:
            parts.append(f"{connected} Flower nodes connected within {wait_s:.0f} s")
        errored = sum(self.errors.values())
        if errored:
            reasons = "; ".join(f"{n} x {r}" for r, n in self.errors.most_common(3))
            parts.append(f"{errored} of {asked} nodes answered with errors: {reasons}")
        silent = asked - answered - errored - len(self.legacy)
        if silent > 0:
            parts.append(f"{silent} of {asked} nodes sent no reply within {wait_s:.0f} s")
        return "; ".join(parts)


def make_server_app(
    main: Callable[[FlowerTransport, Context], None],
    expected_clients: int,
    *,
    stock: Callable[[], StockCodec] | None = None,
    protocol_needs: str | None = None,
) -> ServerApp:
    """A ServerApp whose main builds a FlowerTransport and hands it to `main`.
    `stock` builds the codec that lets stock Flower clients take part (None: only
    fedveil's ClientApp may)."""
    app = ServerApp()

    @app.main()
    def _main(grid: Grid, context: Context) -> None:
        transport = FlowerTransport(
            grid,
            expected_clients=expected_clients,
            stock=None if stock is None else stock(),
            protocol_needs=protocol_needs,
        )
        main(transport, context)

    return app
