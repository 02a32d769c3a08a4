"""Misbehaving peers and traffic: replays, forgeries, duplicates, bad vectors, bad shares."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from secagg_helpers import identity_keys, make_session, plain_sum, random_inputs

from fedveil.privacy.secagg import (
    AdvertiseKeys,
    DropoutPattern,
    MaskedInput,
    MaskedInputRequest,
    Message,
    SecAggAborted,
    SecAggClient,
    SecAggProtocolError,
    SecAggServer,
    SessionConfig,
    ShareKeys,
    ShareKeysRequest,
    Stage,
    ThreatMode,
    UnmaskShares,
    crypto,
    run_in_memory,
    shamir,
)
from fedveil.privacy.secagg.in_memory import RoundReport


def _assert_exact(
    session: SessionConfig, inputs: dict[int, np.ndarray], report: RoundReport
) -> None:
    expected = plain_sum(inputs, report.result.survivors, session.modulus_bits)
    assert report.result.total.astype(np.uint64).tolist() == expected.tolist()


def _flip(raw: bytes, index: int = -1) -> bytes:
    out = bytearray(raw)
    out[index] ^= 0x01
    return bytes(out)


def _replace_up(stage: Stage, victim: int, change):
    def tamper(s: Stage, cid: int, message: Message) -> list[Message]:
        return [change(message)] if s is stage and cid == victim else [message]

    return tamper


def test_replayed_message_from_another_round_is_rejected() -> None:
    old = make_session(6, session_id=b"round-0001")
    new = make_session(6, session_id=b"round-0002")
    old_client = SecAggClient(old.client_ids[0], old)
    stale = old_client.advertise()
    server = SecAggServer(new)
    server.advertise_requests()
    with pytest.raises(SecAggProtocolError, match=r"client 1000 rejected.*session_id"):
        server.receive(stale.client_id, stale)
    assert server.rejections[0].client_id == stale.client_id
    # A client ignores a request of another round without aborting.
    client = SecAggClient(new.client_ids[1], new)
    requests = SecAggServer(old).advertise_requests()
    with pytest.raises(SecAggProtocolError, match="not this session"):
        client.advertise(requests[new.client_ids[1]])
    assert client.stage.value == "new"


def test_wrong_stage_wrong_sender_unknown_client_and_late_messages() -> None:
    session = make_session(5)
    server = SecAggServer(session)
    clients = {cid: SecAggClient(cid, session) for cid in session.client_ids}
    requests = server.advertise_requests()
    adverts = {cid: clients[cid].advertise(requests[cid]) for cid in session.client_ids}
    a, b = session.client_ids[:2]
    with pytest.raises(SecAggProtocolError, match="claims sender"):
        server.receive(a, adverts[b])
    with pytest.raises(SecAggProtocolError, match="not a participant"):
        server.receive(99, adverts[b])
    for cid in session.client_ids[1:]:
        server.receive(cid, adverts[cid])
    share_requests = server.share_keys_requests()
    with pytest.raises(SecAggProtocolError, match="expected share_keys"):
        server.receive(b, adverts[b])
    assert a not in share_requests  # its only message was rejected: dropped
    with pytest.raises(SecAggProtocolError, match="not a participant"):
        server.receive(a, adverts[a])


def test_forged_share_ciphertext_is_reported_and_round_stays_exact() -> None:
    session = make_session(8, threshold=4)
    inputs = random_inputs(session, 1)
    victim, forger = session.client_ids[2], session.client_ids[5]

    def forge(stage: Stage, cid: int, message: Message) -> Message:
        if isinstance(message, MaskedInputRequest) and cid == victim:
            i = message.sender_ids.index(forger)
            cts = list(message.ciphertexts)
            cts[i] = _flip(cts[i])  # breaks the GCM tag
            return dataclasses.replace(message, ciphertexts=tuple(cts))
        return message

    captured: list[MaskedInput] = []
    report = run_in_memory(
        session,
        inputs,
        dropouts=DropoutPattern.of(masked_input=[forger]),
        tamper_down=forge,
        tamper_up=lambda s, c, m: (
            (captured.append(m) if c == victim and s is Stage.MASKED_INPUT else None) or [m]
        ),
    )
    assert captured[0].invalid_share_senders == (forger,)
    assert forger not in report.result.survivors
    _assert_exact(session, inputs, report)


def test_forged_ciphertexts_can_make_a_secret_unrecoverable_which_aborts_cleanly() -> None:
    session = make_session(6, threshold=5)
    inputs = random_inputs(session, 2)
    forger = session.client_ids[0]

    def forge(stage: Stage, cid: int, message: Message) -> Message:
        if isinstance(message, MaskedInputRequest) and forger in message.sender_ids and cid % 2:
            i = message.sender_ids.index(forger)
            cts = list(message.ciphertexts)
            cts[i] = _flip(cts[i], 0)
            return dataclasses.replace(message, ciphertexts=tuple(cts))
        return message

    with pytest.raises(SecAggAborted, match=f"seed of survivor {forger}"):
        run_in_memory(session, inputs, tamper_down=forge)


def test_bad_advertisement_signature_drops_the_client() -> None:
    session = make_session(7, mode=ThreatMode.MALICIOUS)
    inputs = random_inputs(session, 3)
    victim = session.client_ids[4]
    report = run_in_memory(
        session,
        inputs,
        identity_keys=identity_keys(session),
        tamper_up=_replace_up(
            Stage.ADVERTISE,
            victim,
            lambda m: dataclasses.replace(m, signature=_flip(m.signature)),
        ),
    )
    assert any("signature" in r and str(victim) in r for r in report.server_rejections)
    assert victim not in report.result.survivors
    _assert_exact(session, inputs, report)


def test_substituted_key_in_forwarded_advert_is_caught_by_the_client() -> None:
    session = make_session(7, threshold=5, mode=ThreatMode.MALICIOUS)
    inputs = random_inputs(session, 4)
    victim = session.client_ids[1]
    impostor_key = crypto.KeyPair().public_bytes

    def swap(stage: Stage, cid: int, message: Message) -> Message:
        if isinstance(message, ShareKeysRequest) and cid == victim:
            keys = (impostor_key, *message.mask_public_keys[1:])
            return dataclasses.replace(message, mask_public_keys=keys)
        return message

    report = run_in_memory(session, inputs, identity_keys=identity_keys(session), tamper_down=swap)
    assert "not signed by its identity key" in report.client_errors[victim]
    assert victim not in report.result.survivors  # it aborted; the others finish without it
    _assert_exact(session, inputs, report)


def test_duplicate_replies_are_rejected_and_the_first_one_stands() -> None:
    session = make_session(6)
    inputs = random_inputs(session, 5)
    report = run_in_memory(
        session, inputs, tamper_up=lambda stage, cid, message: [message, message]
    )
    assert len(report.server_rejections) == 4 * 6
    assert all("duplicate" in r for r in report.server_rejections)
    assert report.result.survivors == frozenset(session.client_ids)
    _assert_exact(session, inputs, report)
    with pytest.raises(ValueError, match="sorted and unique"):
        dataclasses.replace(session, client_ids=(1, 1, 2, 3))


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda v: v[:-1], "expected uint32"),
        (lambda v: v.astype(np.uint64), "expected uint32"),
        (lambda v: np.full_like(v, 1 << 20), "values >= 2^20"),
    ],
)
def test_bad_masked_vectors_drop_their_sender(change, reason: str) -> None:
    session = make_session(6, dimension=10, bits=20, threshold=4)
    inputs = random_inputs(session, 6)
    victim = session.client_ids[3]
    report = run_in_memory(
        session,
        inputs,
        tamper_up=_replace_up(
            Stage.MASKED_INPUT,
            victim,
            lambda m: dataclasses.replace(m, masked_vector=change(m.masked_vector)),
        ),
    )
    assert any(reason in r for r in report.server_rejections)
    assert victim not in report.result.survivors
    _assert_exact(session, inputs, report)


def test_wrong_unmask_shares_are_corrected_and_their_sender_named() -> None:
    session = make_session(9, threshold=4)
    inputs = random_inputs(session, 7)
    liar = session.client_ids[0]

    def corrupt(message: UnmaskShares) -> UnmaskShares:
        bad = tuple(
            shamir.encode_share((shamir.decode_share(s) + 1) % shamir.PRIME)
            for s in message.seed_shares
        )
        return dataclasses.replace(message, seed_shares=bad)

    report = run_in_memory(
        session,
        inputs,
        dropouts=DropoutPattern.of(masked_input=[session.client_ids[8]]),
        tamper_up=_replace_up(Stage.UNMASK, liar, corrupt),
    )
    assert report.result.bad_share_holders == frozenset({liar})
    _assert_exact(session, inputs, report)


def test_shares_that_cannot_be_corrected_abort_without_releasing_a_sum() -> None:
    session = make_session(5, threshold=4)
    inputs = random_inputs(session, 8)
    liars = set(session.client_ids[:2])

    def corrupt(stage: Stage, cid: int, message: Message) -> list[Message]:
        if isinstance(message, UnmaskShares) and cid in liars:
            bad = tuple(shamir.encode_share(7) for _ in message.seed_shares)
            message = dataclasses.replace(message, seed_shares=bad)
        return [message]

    with pytest.raises(SecAggAborted, match="does not reconstruct"):
        run_in_memory(session, inputs, tamper_up=corrupt)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (
            lambda m: dataclasses.replace(m, seed_shares=(b"\xff" * 33, *m.seed_shares[1:])),
            "not a field element",
        ),
        (
            lambda m: dataclasses.replace(
                m, seed_owner_ids=m.seed_owner_ids[:-1], seed_shares=m.seed_shares[:-1]
            ),
            "not exactly the surviving peers",
        ),
        (
            lambda m: dataclasses.replace(
                m, key_owner_ids=(m.seed_owner_ids[-1],), key_shares=(m.seed_shares[-1],)
            ),
            "reveals both share kinds",
        ),
    ],
)
def test_malformed_unmask_replies_are_rejected(change, reason: str) -> None:
    session = make_session(7, threshold=4)
    inputs = random_inputs(session, 9)
    victim = session.client_ids[2]
    report = run_in_memory(session, inputs, tamper_up=_replace_up(Stage.UNMASK, victim, change))
    assert any(reason in r and f"client {victim}" in r for r in report.server_rejections)
    _assert_exact(session, inputs, report)


def test_share_keys_to_wrong_recipients_is_rejected() -> None:
    session = make_session(6, threshold=3)
    inputs = random_inputs(session, 10)
    victim = session.client_ids[0]

    def drop_one(message: ShareKeys) -> ShareKeys:
        return dataclasses.replace(
            message, recipient_ids=message.recipient_ids[1:], ciphertexts=message.ciphertexts[1:]
        )

    report = run_in_memory(
        session, inputs, tamper_up=_replace_up(Stage.SHARE_KEYS, victim, drop_one)
    )
    assert any("exactly the advertised neighbours" in r for r in report.server_rejections)
    assert victim not in report.result.survivors
    _assert_exact(session, inputs, report)


def test_reused_public_keys_are_rejected() -> None:
    session = make_session(5)
    server = SecAggServer(session)
    server.advertise_requests()
    first = SecAggClient(session.client_ids[0], session).advertise()
    server.receive(first.client_id, first)
    copy = AdvertiseKeys(
        session_id=session.session_id,
        client_id=session.client_ids[1],
        mask_public_key=first.mask_public_key,
        encryption_public_key=first.encryption_public_key,
        seed_commitment=first.seed_commitment,
        signature=b"",
    )
    with pytest.raises(SecAggProtocolError, match="already used"):
        server.receive(copy.client_id, copy)


@pytest.mark.parametrize("field", ["mask_public_key", "encryption_public_key"])
@pytest.mark.parametrize("u", [0, 1, 2**255 - 20], ids=["u=0", "u=1", "u=p-1"])
def test_a_small_order_public_key_drops_its_sender_not_its_neighbours(field: str, u: int) -> None:
    # Without the server's check every neighbour would abort on agreeing with this key.
    session = make_session(7)
    inputs = random_inputs(session, 5)
    victim = session.client_ids[2]
    report = run_in_memory(
        session,
        inputs,
        tamper_up=_replace_up(
            Stage.ADVERTISE,
            victim,
            lambda m: dataclasses.replace(m, **{field: u.to_bytes(32, "little")}),
        ),
    )
    assert any(
        "not a usable X25519 point" in r and str(victim) in r for r in report.server_rejections
    )
    assert not report.client_errors
    assert set(report.result.survivors) == set(session.client_ids) - {victim}
    _assert_exact(session, inputs, report)
