"""Malicious server: lying about who dropped is detected and yields at most one share kind."""

from __future__ import annotations

import dataclasses

import pytest
from secagg_helpers import identity_keys, make_session, random_inputs

from fedveil.privacy.secagg import (
    ConsistencyRequest,
    Message,
    SecAggAborted,
    SecAggClient,
    SecAggError,
    SecAggServer,
    Stage,
    ThreatMode,
    UnmaskRequest,
    crypto,
    run_in_memory,
)
from fedveil.privacy.secagg.wire import encode_members


def test_equivocating_about_a_survivor_never_yields_both_share_kinds() -> None:
    """The server tells group A that victim v survived and group B that v dropped."""
    session = make_session(7, mode=ThreatMode.MALICIOUS)  # complete graph, t = 5
    t = session.threshold
    keys = identity_keys(session)
    public = {c: k.public_key() for c, k in keys.items()}
    server = SecAggServer(session, identity_public_keys=public)
    clients = {
        c: SecAggClient(c, session, identity_key=keys[c], identity_public_keys=public)
        for c in session.client_ids
    }
    inputs = random_inputs(session, 0)
    for step in ("advertise", "share_keys", "masked_input"):
        for cid, request in server.next_requests().items():  # type: ignore[union-attr]
            method = getattr(clients[cid], step)
            server.receive(
                cid, method(request, inputs[cid]) if step == "masked_input" else method(request)
            )

    ids = session.client_ids
    victim = ids[0]
    view_alive = encode_members(set(ids), session.ids_array)
    view_dropped = encode_members(set(ids) - {victim}, session.ids_array)
    for split in range(1, len(ids) - 1):
        group_a = set(ids[: split + 1])  # the victim is in A, the rest form B
        views = {c: view_alive if c in group_a else view_dropped for c in ids}
        # Fresh copies of the clients (same state) for every split the server tries.
        trial = {
            c: SecAggClient.from_state(
                clients[c].to_state(), identity_key=keys[c], identity_public_keys=public
            )
            for c in ids
        }
        signatures = {
            c: trial[c].consistency(ConsistencyRequest(session.session_id, c, views[c])).signature
            for c in ids
        }
        seed_shares_of_victim = key_shares_of_victim = 0
        for c in ids:
            same_view = sorted(s for s in ids if s != c and views[s] == views[c])
            for cosigners in (same_view, [s for s in ids if s != c]):
                request = UnmaskRequest(
                    session.session_id,
                    c,
                    len(ids) - (views[c] == view_dropped),
                    views[c],
                    tuple(cosigners),
                    tuple(signatures[s] for s in cosigners),
                )
                try:
                    reply = SecAggClient.from_state(
                        trial[c].to_state(), identity_key=keys[c], identity_public_keys=public
                    ).unmask(request)
                except SecAggError:
                    continue
                seed_shares_of_victim += victim in reply.seed_owner_ids
                key_shares_of_victim += victim in reply.key_owner_ids
                break
        # Either kind alone is harmless: the mask key without the seed leaves the self mask.
        assert not (seed_shares_of_victim >= t and key_shares_of_victim >= t), split


def test_unmask_request_with_another_survivor_set_is_detected() -> None:
    session = make_session(6, mode=ThreatMode.MALICIOUS)
    victim, target = session.client_ids[2], session.client_ids[4]

    def lie(stage: Stage, cid: int, message: Message) -> Message:
        if isinstance(message, UnmaskRequest) and cid == target:
            fake = encode_members(set(session.client_ids) - {victim}, session.ids_array)
            return dataclasses.replace(message, survivors=fake)
        return message

    report = run_in_memory(
        session, random_inputs(session, 1), identity_keys=identity_keys(session), tamper_down=lie
    )
    assert "differs from the set this client signed" in report.client_errors[target]
    assert victim in report.result.survivors


def test_too_many_lied_to_clients_abort_the_round() -> None:
    session = make_session(6, mode=ThreatMode.MALICIOUS)
    victim = session.client_ids[2]
    lied_to = set(session.client_ids[3:])

    def lie(stage: Stage, cid: int, message: Message) -> Message:
        if isinstance(message, UnmaskRequest) and cid in lied_to:
            fake = encode_members(set(session.client_ids) - {victim}, session.ids_array)
            return dataclasses.replace(message, survivors=fake)
        return message

    with pytest.raises(SecAggAborted, match="shares"):
        run_in_memory(
            session,
            random_inputs(session, 1),
            identity_keys=identity_keys(session),
            tamper_down=lie,
        )


def test_server_checks_consistency_signatures_against_the_set_it_sent() -> None:
    session = make_session(7, mode=ThreatMode.MALICIOUS)
    liar_target = session.client_ids[1]

    def lie(stage: Stage, cid: int, message: Message) -> Message:
        if isinstance(message, ConsistencyRequest) and cid == liar_target:
            fake = encode_members(
                set(session.client_ids) - {session.client_ids[0]}, session.ids_array
            )
            return dataclasses.replace(message, survivors=fake)
        return message

    report = run_in_memory(
        session, random_inputs(session, 2), identity_keys=identity_keys(session), tamper_down=lie
    )
    assert any("not a signature on this survivor set" in r for r in report.server_rejections)
    # The target's vector is still in the sum (it did send it); it just did not unmask.
    assert liar_target in report.result.survivors


def test_signed_advertisements_bind_the_session() -> None:
    a = make_session(5, mode=ThreatMode.MALICIOUS, session_id=b"round-aaaa")
    b = make_session(5, mode=ThreatMode.MALICIOUS, session_id=b"round-bbbb")
    keys = identity_keys(a)
    public = {c: k.public_key() for c, k in keys.items()}
    cid = a.client_ids[0]
    advert = SecAggClient(cid, a, identity_key=keys[cid], identity_public_keys=public).advertise()
    transcript = crypto.advert_transcript(
        b.digest, cid, advert.mask_public_key, advert.encryption_public_key, advert.seed_commitment
    )
    assert not crypto.verify(public[cid], advert.signature, transcript)
