"""The client's own survivor floor: a server that skips its check still gets no share."""

from __future__ import annotations

import pytest
from secagg_helpers import identity_keys, make_session, random_inputs

from fedveil.privacy.secagg import (
    ClientStage,
    SecAggAborted,
    SecAggClient,
    SecAggServer,
    SecAggStateError,
    ThreatMode,
)

N, DROPPED, FLOOR = 10, 2, 9  # 8 survivors: above t = 7, below the clients' floor of 9


def _round_to_masked_input(mode: ThreatMode) -> tuple[SecAggServer, dict[int, SecAggClient]]:
    """Run a round up to masked input with DROPPED clients never sending their input."""
    session = make_session(N, threshold=7, mode=mode)
    assert session.threshold < N - DROPPED < FLOOR
    keys = identity_keys(session) if mode is ThreatMode.MALICIOUS else None
    public = None if keys is None else {c: k.public_key() for c, k in keys.items()}
    server = SecAggServer(session, identity_public_keys=public)
    clients = {
        c: SecAggClient(
            c,
            session,
            identity_key=None if keys is None else keys[c],
            identity_public_keys=public,
            min_survivors=FLOOR,
        )
        for c in session.client_ids
    }
    inputs = random_inputs(session, 0)
    for step in ("advertise", "share_keys"):
        for cid, request in server.next_requests().items():  # type: ignore[union-attr]
            server.receive(cid, getattr(clients[cid], step)(request))
    for cid, request in server.next_requests().items():  # type: ignore[union-attr]
        if cid >= session.client_ids[-DROPPED]:
            continue  # dropped before sending its masked input
        server.receive(cid, clients[cid].masked_input(request, inputs[cid]))
    return server, clients


def test_semi_honest_clients_refuse_to_unmask_below_their_own_floor() -> None:
    server, clients = _round_to_masked_input(ThreatMode.SEMI_HONEST)
    requests = server.unmask_requests()  # this server never checks a floor of its own
    assert len(server.survivors) == N - DROPPED
    sent = []
    for cid, request in requests.items():
        try:
            sent.append(clients[cid].unmask(request))
        except SecAggAborted as exc:
            assert "8 survivors < 9, the fewest this client unmasks for" in str(exc)
        assert clients[cid].stage is ClientStage.ABORTED
        assert clients[cid].to_state().keys().isdisjoint({"own_seed_share", "held_seed_shares"})
    assert sent == []  # not one share left any client
    with pytest.raises(SecAggAborted, match="shares of client"):
        server.finalize()  # nothing to reconstruct from: the sum stays masked


def test_malicious_clients_refuse_to_sign_a_survivor_set_below_their_floor() -> None:
    server, clients = _round_to_masked_input(ThreatMode.MALICIOUS)
    requests = server.consistency_requests()
    assert len(server.survivors) == N - DROPPED
    for cid, request in requests.items():
        with pytest.raises(SecAggAborted, match=r"consistency_request.survivors: 8 survivors < 9"):
            clients[cid].consistency(request)
    with pytest.raises(SecAggAborted, match="consistency"):
        server.unmask_requests()  # no signatures: nobody will unmask


def test_a_client_at_its_floor_unmasks() -> None:
    server, clients = _round_to_masked_input(ThreatMode.SEMI_HONEST)
    for client in clients.values():
        client.min_survivors = N - DROPPED
    for cid, request in server.unmask_requests().items():
        server.receive(cid, clients[cid].unmask(request))
    assert len(server.finalize().survivors) == N - DROPPED


def test_survivors_are_known_only_once_masked_input_closed() -> None:
    session = make_session(4)
    server = SecAggServer(session)
    with pytest.raises(SecAggStateError, match="current phase is ready"):
        _ = server.survivors
    with pytest.raises(ValueError, match="min_survivors = -1"):
        SecAggClient(session.client_ids[0], session, min_survivors=-1)
