"""A group member whose masked input comes after the server closed the masked-input stage
(an asynchronous group released at its first R of G, server.group_release_at) is refused:
its session never combines it, neither while unmasking nor after the sum, and the sum is
exactly the first R members' (their pairwise masks with the late members removed)."""

from __future__ import annotations

import pytest
from secagg_helpers import make_session, plain_sum, random_inputs

from fedveil.privacy.secagg import SecAggClient, SecAggProtocolError, SecAggServer

G, R = 5, 3


def test_a_left_out_members_masked_input_is_refused_once_the_stage_closed():
    session = make_session(G, threshold=2)
    server = SecAggServer(session)
    clients = {c: SecAggClient(c, session) for c in session.client_ids}
    inputs = random_inputs(session, 0)
    for step in ("advertise", "share_keys"):
        for cid, request in server.next_requests().items():  # type: ignore[union-attr]
            server.receive(cid, getattr(clients[cid], step)(request))
    masked = {
        cid: clients[cid].masked_input(request, inputs[cid])
        for cid, request in server.next_requests().items()  # type: ignore[union-attr]
    }
    first, late = session.client_ids[:R], session.client_ids[R:]
    for cid in first:  # the release: the first R, the stage closes with the next request
        server.receive(cid, masked[cid])
    unmask = server.next_requests()
    assert unmask is not None and set(unmask) == set(first)
    for cid in late:  # every member computed its masked input; the late ones are refused
        with pytest.raises(SecAggProtocolError, match=r"not a participant|expected"):
            server.receive(cid, masked[cid])
    for cid, request in unmask.items():
        server.receive(cid, clients[cid].unmask(request))
    result = server.finalize()
    assert result.survivors == frozenset(first)
    expected = plain_sum(inputs, frozenset(first), session.modulus_bits)
    assert [int(v) for v in result.total] == [int(v) for v in expected]
    for cid in late:  # nor after the sum: the session is over
        with pytest.raises(SecAggProtocolError):
            server.receive(cid, masked[cid])
