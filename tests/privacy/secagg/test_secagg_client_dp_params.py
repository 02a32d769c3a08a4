"""The client holds the distributed-DP parameters: a server that changes them is refused."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
import torch
from secagg_helpers import make_session

from fedveil.client.secagg_stages import handle_secagg
from fedveil.privacy.dp import SkellamParams
from fedveil.privacy.secagg import SecAggServer, decode_message
from fedveil.protocol.envelope import Envelope, MessageError
from fedveil.protocol.fields import ENC
from fedveil.protocol.secagg_frame import protocol_part, wrap

DIM = 6
PARAMS = SkellamParams.calibrate(
    dim=DIM, clip_norm=1.0, noise_multiplier=1.0, num_clients=4, min_clients=3, bits=20
)


class Client:
    """One client's handle_secagg with its own pinned parameters; counts its trainings."""

    def __init__(self, cid: int, expected: SkellamParams | None) -> None:
        self.cid, self.expected, self.state, self.trained = cid, expected, {}, 0

    def train(self, cid: int, msg: Envelope) -> tuple[dict[str, Any], torch.Tensor]:
        self.trained += 1
        return {"loss": 0.0, "weight": 1.0}, torch.full((DIM,), 0.01)

    def __call__(self, msg: Envelope) -> Envelope:
        return handle_secagg(
            self.cid,
            msg,
            self.state,
            self.train,
            min_survivors=3,
            expected_skellam=self.expected,
            run_id=b"test-run",
        )


def _to_masked_input(expected: SkellamParams | None) -> tuple[SecAggServer, dict[int, Client]]:
    session = make_session(4, bits=PARAMS.bits, dimension=PARAMS.padded_dim)
    server = SecAggServer(session)
    clients = {c: Client(c, expected) for c in session.client_ids}
    for _ in ("advertise", "share_keys"):
        for cid, request in server.next_requests().items():  # type: ignore[union-attr]
            reply = clients[cid](wrap(f"secagg.{request.STAGE.value}", 1, request))
            server.receive(cid, decode_message(*protocol_part(reply)))
    return server, clients


def _masked_input(request: Any, params: SkellamParams) -> Envelope:
    msg = wrap("secagg.masked_input", 1, request)
    msg.config.update(
        {
            ENC + "kind": "skellam",
            ENC + "params": json.dumps(params.to_dict()),
            ENC + "rotation_seed": 7,
        }
    )
    return msg


@pytest.mark.parametrize(
    ("field", "value"),
    [("local_variance", PARAMS.local_variance / 4), ("min_clients", 2), ("clip_norm", 10.0)],
)
def test_a_server_that_changes_the_parameters_mid_run_is_refused(field: str, value: Any) -> None:
    server, clients = _to_masked_input(PARAMS)
    changed = dataclasses.replace(PARAMS, **{field: value})
    for cid, request in server.masked_input_requests().items():
        refusal = f"distributed-DP parameters differ from this client's: field {field} "
        with pytest.raises(MessageError, match=refusal):
            clients[cid](_masked_input(request, changed))
        assert clients[cid].trained == 0  # refused before any training


def test_a_client_without_its_own_parameters_takes_none_from_the_server() -> None:
    server, clients = _to_masked_input(None)
    for cid, request in server.masked_input_requests().items():
        with pytest.raises(MessageError, match="this client holds none for this run"):
            clients[cid](_masked_input(request, PARAMS))


def test_the_parameters_the_client_holds_are_used() -> None:
    server, clients = _to_masked_input(PARAMS)
    for cid, request in server.masked_input_requests().items():
        reply = clients[cid](_masked_input(request, PARAMS))
        server.receive(cid, decode_message(*protocol_part(reply)))
    for cid, request in server.unmask_requests().items():  # type: ignore[union-attr]
        reply = clients[cid](wrap("secagg.unmask", 1, request))
        server.receive(cid, decode_message(*protocol_part(reply)))
    assert len(server.finalize().survivors) == 4
