"""Flower ServerApp adapter: the round engine over Flower's Grid (Message API).

The same engine runs under Flower's simulation engine and its deployment
engine (SuperLink); only the Grid behind it differs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence

from flwr.app import Context, Message
from flwr.server import Grid
from flwr.serverapp import ServerApp

from fedveil.protocol.envelope import Envelope, MessageError
from fedveil.protocol.fields import CLIENT_ID
from fedveil.protocol.flower_codec import from_content, message_type, to_content
from fedveil.protocol.kinds import Kind
from fedveil.server.engine.transport import ClientFailure

log = logging.getLogger("fedveil.flower")


class FlowerTransport:
    """Maps fedveil's logical client ids to Flower node ids and back."""

    def __init__(self, grid: Grid, *, expected_clients: int, wait_s: float = 600.0) -> None:
        self.grid = grid
        self.node_of: dict[int, int] = {}
        self._discover(expected_clients, wait_s)

    def _discover(self, expected: int, wait_s: float) -> None:
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
        for reply in self.grid.send_and_receive(messages, timeout=wait_s):
            if reply.has_error():
                continue
            try:
                cid = from_content(reply.content).get(CLIENT_ID, int)
            except MessageError as exc:
                log.warning("node %d: bad hello reply: %s", reply.metadata.src_node_id, exc)
                continue
            self.node_of[cid] = reply.metadata.src_node_id
        if len(self.node_of) < expected:
            raise RuntimeError(
                f"only {len(self.node_of)} of {expected} clients answered within {wait_s:.0f} s"
            )

    def client_ids(self) -> Sequence[int]:
        return sorted(self.node_of)

    def exchange(
        self, requests: Mapping[int, Envelope], timeout_s: float | None
    ) -> dict[int, Envelope | ClientFailure]:
        client_of: dict[int, int] = {}
        messages = []
        for cid, env in requests.items():
            node_id = self.node_of.get(cid)
            if node_id is None:
                continue
            client_of[node_id] = cid
            messages.append(Message(to_content(env), node_id, message_type(env.kind)))
        out: dict[int, Envelope | ClientFailure] = {
            cid: ClientFailure(cid, "not connected") for cid in requests if cid not in self.node_of
        }
        for reply in self.grid.send_and_receive(messages, timeout=timeout_s):
            cid = client_of.get(reply.metadata.src_node_id)
            if cid is None:
                continue
            if reply.has_error():
                out[cid] = ClientFailure(cid, f"client error: {reply.error.reason}")
                continue
            try:
                out[cid] = from_content(reply.content)
            except MessageError as exc:
                out[cid] = ClientFailure(cid, str(exc))
        for cid in requests:
            out.setdefault(cid, ClientFailure(cid, "no reply before the deadline"))
        return out

    def close(self) -> None:
        return None


def make_server_app(
    main: Callable[[FlowerTransport, Context], None], expected_clients: int
) -> ServerApp:
    """A ServerApp whose main builds a FlowerTransport and hands it to `main`."""
    app = ServerApp()

    @app.main()
    def _main(grid: Grid, context: Context) -> None:
        main(FlowerTransport(grid, expected_clients=expected_clients), context)

    return app
