"""Client state machine: ordering, persistence, and never revealing both share kinds."""

from __future__ import annotations

import contextlib
import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from secagg_helpers import identity_keys, make_session, random_inputs

from fedveil.privacy.secagg import (
    ClientStage,
    SecAggAborted,
    SecAggClient,
    SecAggProtocolError,
    SecAggServer,
    SecAggStateError,
    SessionConfig,
    ThreatMode,
    UnmaskRequest,
    UnmaskShares,
)
from fedveil.privacy.secagg.wire import encode_members


def _drive_to_unmask(
    session: SessionConfig, persist: bool = False
) -> tuple[SecAggServer, dict[int, SecAggClient], dict[int, UnmaskRequest]]:
    """Run advertise .. (consistency) with every client, return the unmask requests."""
    keys = identity_keys(session) if session.malicious else None
    public = {c: k.public_key() for c, k in keys.items()} if keys else None
    server = SecAggServer(session, identity_public_keys=public)
    clients = {
        cid: SecAggClient(
            cid, session, identity_key=keys and keys[cid], identity_public_keys=public
        )
        for cid in session.client_ids
    }
    inputs = random_inputs(session, 0)
    steps = ["advertise", "share_keys", "masked_input"] + (
        ["consistency"] if session.malicious else []
    )
    for step in steps:
        requests = server.next_requests()
        assert requests is not None
        for cid, request in requests.items():
            if persist:
                state = clients[cid].to_state()
                assert all(isinstance(v, (bytes, int, str)) for v in state.values())
                clients[cid] = SecAggClient.from_state(
                    state, identity_key=keys and keys[cid], identity_public_keys=public
                )
            method = getattr(clients[cid], step)
            reply = method(request, inputs[cid]) if step == "masked_input" else method(request)
            server.receive(cid, reply)
    requests = server.next_requests()
    assert requests is not None
    return server, clients, requests  # type: ignore[return-value]


def test_out_of_order_calls_are_refused_without_side_effects() -> None:
    session = make_session(4)
    client = SecAggClient(session.client_ids[0], session)
    server = SecAggServer(session)
    request = server.advertise_requests()[client.client_id]
    for call in (
        lambda: client.share_keys(None),  # type: ignore[arg-type]
        lambda: client.masked_input(None, np.zeros(16, np.uint32)),  # type: ignore[arg-type]
        lambda: client.unmask(None),  # type: ignore[arg-type]
    ):
        with pytest.raises(SecAggStateError, match="current stage is new"):
            call()
    assert client.stage is ClientStage.NEW
    client.advertise(request)
    with pytest.raises(SecAggStateError, match="advertise"):
        client.advertise(request)
    with pytest.raises(SecAggStateError, match="malicious mode"):
        client.consistency(None)  # type: ignore[arg-type]
    assert client.stage is ClientStage.ADVERTISED


def test_round_completes_with_state_round_trips_and_secrets_are_dropped() -> None:
    session = make_session(6, threshold=4)
    server, clients, requests = _drive_to_unmask(session, persist=True)
    for cid, request in requests.items():
        state = clients[cid].to_state()
        assert "seed" not in state and "pair_keys" not in state and "mask_sk" not in state
        restored = SecAggClient.from_state(state)
        server.receive(cid, restored.unmask(request))
        done = restored.to_state()
        assert done["stage"] == "done" and not any("share" in key for key in done)
    assert server.finalize().survivors == frozenset(session.client_ids)


def test_second_unmask_and_restored_done_state_reveal_nothing_more() -> None:
    session = make_session(6, threshold=4)
    _, clients, requests = _drive_to_unmask(session)
    cid = session.client_ids[0]
    peer = session.client_ids[1]
    first = clients[cid].unmask(requests[cid])
    assert peer in first.seed_owner_ids and peer not in first.key_owner_ids
    # The server now claims `peer` dropped, hoping for its mask-key share as well.
    lie = dataclasses.replace(
        requests[cid],
        survivors=encode_members(set(session.client_ids) - {peer}, session.ids_array),
    )
    with pytest.raises(SecAggStateError, match="current stage is done"):
        clients[cid].unmask(lie)
    with pytest.raises(SecAggStateError):
        SecAggClient.from_state(clients[cid].to_state()).unmask(lie)


def test_one_reply_never_holds_both_kinds() -> None:
    session = make_session(8, threshold=4)
    _, clients, requests = _drive_to_unmask(session)
    dropped = set(session.client_ids[5:7])
    for cid in session.client_ids[:5]:
        view = dataclasses.replace(
            requests[cid],
            survivors=encode_members(set(session.client_ids) - dropped, session.ids_array),
        )
        reply: UnmaskShares = clients[cid].unmask(view)
        assert not set(reply.seed_owner_ids) & set(reply.key_owner_ids)
        assert set(reply.key_owner_ids) == dropped


def test_unmask_request_that_marks_the_client_itself_dropped_aborts_it() -> None:
    session = make_session(6, threshold=3)
    _, clients, requests = _drive_to_unmask(session)
    cid = session.client_ids[0]
    lie = dataclasses.replace(
        requests[cid], survivors=encode_members(set(session.client_ids) - {cid}, session.ids_array)
    )
    with pytest.raises(SecAggProtocolError, match="marks this client"):
        clients[cid].unmask(lie)
    assert clients[cid].stage is ClientStage.ABORTED
    with pytest.raises(SecAggStateError):
        clients[cid].unmask(requests[cid])


def test_too_few_survivors_abort_the_client_before_it_reveals_anything() -> None:
    session = make_session(6, threshold=5)
    _, clients, requests = _drive_to_unmask(session)
    cid = session.client_ids[0]
    few = dataclasses.replace(
        requests[cid], survivors=encode_members(set(session.client_ids[:3]), session.ids_array)
    )
    with pytest.raises(SecAggAborted, match="too few survivors"):
        clients[cid].unmask(few)


def test_malicious_client_only_unmasks_the_set_it_signed() -> None:
    session = make_session(7, mode=ThreatMode.MALICIOUS)
    _, clients, requests = _drive_to_unmask(session)
    cid = session.client_ids[0]
    other = dataclasses.replace(
        requests[cid],
        survivor_count=6,
        survivors=encode_members(
            set(session.client_ids) - {session.client_ids[3]}, session.ids_array
        ),
    )
    with pytest.raises(SecAggProtocolError, match="differs from the set this client signed"):
        clients[cid].unmask(other)


def test_bad_input_vectors_are_refused_without_consuming_the_stage() -> None:
    session = make_session(4, dimension=5, bits=20, threshold=2)
    server = SecAggServer(session)
    clients = {cid: SecAggClient(cid, session) for cid in session.client_ids}
    for step in ("advertise", "share_keys"):
        for cid, request in server.next_requests().items():  # type: ignore[union-attr]
            server.receive(cid, getattr(clients[cid], step)(request))
    requests = server.next_requests()
    assert requests is not None
    cid = session.client_ids[0]
    for bad in (
        np.zeros(5, np.uint64),
        np.zeros(4, np.uint32),
        np.full(5, 1 << 20, np.uint32),
        [0, 0, 0, 0, 0],
    ):
        with pytest.raises(ValueError, match="input"):
            clients[cid].masked_input(requests[cid], bad)  # type: ignore[arg-type]
    assert clients[cid].stage is ClientStage.SHARED
    clients[cid].masked_input(requests[cid], np.zeros(5, np.uint32))


state_values = st.one_of(st.binary(max_size=80), st.integers(-5, 2**70), st.text(max_size=10))


@settings(max_examples=120, deadline=None)
@given(data=st.data())
def test_corrupted_state_raises_only_protocol_errors(data: st.DataObject) -> None:
    session = make_session(5, threshold=3)
    _, clients, _ = _drive_to_unmask(session)
    state = dict(clients[session.client_ids[0]].to_state())
    for _ in range(data.draw(st.integers(1, 3))):
        key = data.draw(st.sampled_from([*sorted(state), "extra"]))
        action = data.draw(st.sampled_from(["replace", "delete", "truncate"]))
        if action == "replace":
            state[key] = data.draw(state_values)
        elif action == "delete":
            state.pop(key, None)
        elif isinstance(state.get(key), bytes):
            state[key] = state[key][: data.draw(st.integers(0, len(state[key])))]
    with contextlib.suppress(SecAggProtocolError):
        SecAggClient.from_state(state)
