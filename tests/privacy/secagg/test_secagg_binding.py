"""Sessions are bound to their run and round: a replayed session or message is refused."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from secagg_helpers import identity_keys, make_session

from fedveil.client.secagg_stages import handle_secagg
from fedveil.privacy.secagg import (
    AdvertiseRequest,
    SecAggClient,
    SecAggError,
    SecAggServer,
    SessionConfig,
    ThreatMode,
    crypto,
)
from fedveil.protocol.envelope import Envelope, MessageError
from fedveil.protocol.secagg_frame import wrap

RUN = b"run-A"


def _no_training(client_id: int, msg: Envelope) -> tuple[dict[str, Any], torch.Tensor]:
    raise AssertionError("no stage here trains")


def _advertise(session: SessionConfig, envelope_round: int, cid: int) -> Envelope:
    request = AdvertiseRequest(session.session_id, cid, session)
    return wrap("secagg.advertise", envelope_round, request)


def test_a_session_replayed_into_another_round_is_refused_by_name() -> None:
    session = make_session(5, run_id=RUN, round_num=3)
    cid = session.client_ids[0]
    with pytest.raises(MessageError, match=r"session\.round: session of round 3 .* round 4"):
        handle_secagg(cid, _advertise(session, 4, cid), {}, _no_training, run_id=RUN)
    # The same request in its own round is answered.
    state: dict[str, Any] = {}
    reply = handle_secagg(cid, _advertise(session, 3, cid), state, _no_training, run_id=RUN)
    assert reply.kind == "secagg.advertise"


def test_a_session_replayed_into_another_run_is_refused_by_name() -> None:
    session = make_session(5, run_id=RUN, round_num=3)
    cid = session.client_ids[0]
    with pytest.raises(MessageError, match=r"session\.run_id: b'run-A' is not this client's run"):
        handle_secagg(cid, _advertise(session, 3, cid), {}, _no_training, run_id=b"run-B")


def test_a_later_stage_request_of_another_round_is_refused() -> None:
    """Round 3's share-keys request, delivered while the client is in round 4's session."""
    old = make_session(4, run_id=RUN, round_num=3)
    new = make_session(4, run_id=RUN, round_num=4, session_id=b"round-0002")
    server = SecAggServer(old)
    clients = {c: SecAggClient(c, old) for c in old.client_ids}
    for cid, request in server.advertise_requests().items():
        server.receive(cid, clients[cid].advertise(request))
    stale = server.share_keys_requests()
    cid = old.client_ids[0]
    state: dict[str, Any] = {}
    handle_secagg(cid, _advertise(new, 4, cid), state, _no_training, run_id=RUN)
    replay = wrap("secagg.share_keys", 4, stale[cid])
    with pytest.raises(MessageError, match="not this session"):
        handle_secagg(cid, replay, state, _no_training, run_id=RUN)


@pytest.mark.parametrize("field", ["run_id", "round"])
def test_run_and_round_are_inside_what_is_signed_and_derived(field: str) -> None:
    """Two sessions differing only in run or round have different digests: an advertisement
    signed for one does not verify for the other (the server refuses it), and the keys the
    digest salts differ."""
    session = make_session(5, mode=ThreatMode.MALICIOUS, run_id=RUN, round_num=3)
    other = dataclasses.replace(session, **{field: b"run-B" if field == "run_id" else 4})
    assert other.session_id == session.session_id and other.digest != session.digest
    assert SessionConfig.from_bytes(other.to_bytes()) == other
    keys = identity_keys(session)
    public = {c: k.public_key() for c, k in keys.items()}
    cid = session.client_ids[0]
    client = SecAggClient(cid, session, identity_key=keys[cid], identity_public_keys=public)
    advert = client.advertise(AdvertiseRequest(session.session_id, cid, session))
    server = SecAggServer(other, identity_public_keys=public)
    server.advertise_requests()
    with pytest.raises(SecAggError, match="signature: invalid"):
        server.receive(cid, advert)
    seed = bytes(32)
    assert crypto.self_mask_key(seed, session.digest, cid) != crypto.self_mask_key(
        seed, other.digest, cid
    )


def test_session_run_id_and_round_are_checked_on_the_wire() -> None:
    session = make_session(3, run_id=RUN, round_num=2)
    config, arrays = session.to_wire()
    with pytest.raises(SecAggError, match=r"session\.run_id: length 0"):
        SessionConfig.from_wire({**config, "run_id": b""}, arrays)
    with pytest.raises(SecAggError, match=r"session\.round: missing"):
        SessionConfig.from_wire({k: v for k, v in config.items() if k != "round"}, arrays)
    assert SessionConfig.from_wire(config, arrays) == session
