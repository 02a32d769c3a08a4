"""The client's half of secure aggregation, over Envelopes.

The first stage ("secagg.advertise") starts a session: the client makes its
keys, keeps its protocol state in its state store (client.sessions.SecAggSessions,
which also says how long a session lives: into the next round, for the
pipelined key stages), and answers with its public keys; later stages restore
the SecAggClient from there, and a session ends with its unmask stage. The
masked-input stage ("secagg.masked_input") carries the training request: the
client trains, encodes its update into Z_(2^b) (quantized with its weight, or
Skellam distributed-DP noise shares) and sends it masked in the same reply,
so the plain vector is never stored between messages. The runtime's callable decides
what is masked: a training update, or, for a request with fields.INPUT = evaluation
(a DP drift evaluation), the client's bounded evaluation of the request's model.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from fedveil.client.sessions import SecAggSessions
from fedveil.privacy.dp import SkellamParams
from fedveil.privacy.encodings import (
    QuantizedEncoding,
    SkellamEncoding,
    encoding_name,
    is_skellam,
)
from fedveil.privacy.secagg import (
    SIMULATION_RUN_ID,
    SecAggClient,
    SecAggError,
    SessionConfig,
    decode_message,
)
from fedveil.privacy.secagg.identity_keys import ClientIdentity
from fedveil.privacy.secagg.session_floor import SessionFloor
from fedveil.privacy.secagg.view import SessionView, session_from_bytes
from fedveil.protocol.envelope import Envelope, MessageError
from fedveil.protocol.fields import CLIP_NORM
from fedveil.protocol.kinds import TRAINING_STAGE, Stage, stage_of
from fedveil.protocol.secagg_frame import protocol_part, wrap


def check_skellam_params(received: SkellamParams, expected: SkellamParams | None) -> None:
    """Refuse distributed-DP parameters other than the ones this client holds for the run.

    Floats are compared to 1e-9 relative: both sides compute them with the same code from
    the same config, but a device's maths library may differ from the server's in the
    last bit."""
    if expected is None:
        raise MessageError(
            "distributed-DP parameters: this client holds none for this run (it was given no "
            "run config for distributed DP), so it does not take them from the server"
        )
    for name in SkellamParams.__dataclass_fields__:
        got, mine = getattr(received, name), getattr(expected, name)
        same = (
            math.isclose(got, mine, rel_tol=1e-9, abs_tol=0.0)
            if isinstance(mine, float)
            else got == mine
        )
        if not same:
            raise MessageError(
                f"distributed-DP parameters differ from this client's: field {name} = {got!r} "
                f"in the request, {mine!r} in this client's plan for the run"
            )


def checked_skellam_params(msg: Envelope, expected: SkellamParams | None) -> SkellamParams:
    """The client's own distributed-DP parameters, once the request's match them (the
    client encodes with its own, never with what the server sent)."""
    params = SkellamEncoding.requested_params(msg)
    check_skellam_params(params, expected)
    assert expected is not None
    return expected


def encode_update(
    msg: Envelope,
    reply: dict[str, Any],
    delta: torch.Tensor,
    expected_skellam: SkellamParams | None = None,
) -> np.ndarray:
    """The client's integer input vector for this round's encoding. `expected_skellam`: the
    distributed-DP parameters the client holds for the run; a request with others is
    refused (the server never sets them)."""
    kind = encoding_name(msg)
    vector = delta.detach().cpu().numpy()
    if kind == QuantizedEncoding.NAME:
        encoding = QuantizedEncoding.from_request(msg)
        return encoding.encode(vector, reply, l2_bound=msg.config.get(CLIP_NORM) or None)
    if kind == SkellamEncoding.NAME:
        params = checked_skellam_params(msg, expected_skellam)
        return SkellamEncoding.from_request(msg, params).encode(vector)
    raise MessageError(f"{msg.kind} message: unknown encoding {kind!r}")


def _saved_session(saved: dict[str, Any]) -> SessionConfig | SessionView:
    try:
        return session_from_bytes(saved["session"])
    except (KeyError, TypeError, ValueError) as exc:
        raise MessageError(f"secure aggregation: saved session unreadable: {exc}") from None


def identity_for(
    session: SessionConfig | SessionView, client_id: int, identity: ClientIdentity | None
) -> dict[str, Any]:
    """SecAggClient's identity arguments for `session`, or a refusal naming why."""
    if identity is not None and identity.client_id != client_id:
        raise MessageError(
            f"secure aggregation: this device's identity key is client {identity.client_id}'s, "
            f"the request is for client {client_id}"
        )
    if not session.malicious:
        if identity is not None:
            raise MessageError(
                "local policy: this device has an identity key and roster, so it runs "
                "secure aggregation only in malicious-server mode; the server asked for "
                f"advertise_request.session.threat_mode = {session.threat_mode.value!r}"
            )
        return {}
    assert isinstance(session, SessionConfig)  # a malicious-mode client gets the full session
    if identity is None:
        raise MessageError(
            "secure aggregation in malicious-server mode needs this client's identity key "
            "and the operator's roster (fedveil client --identity-key ... --roster ...)"
        )
    return {
        "identity_key": identity.key,
        "identity_public_keys": identity.peer_keys(session.client_ids),
    }


def handle_secagg(
    client_id: int,
    msg: Envelope,
    state: dict[str, Any],
    train: Callable[[int, Envelope], tuple[dict[str, Any], torch.Tensor]],
    identity: ClientIdentity | None = None,
    run_id: bytes = SIMULATION_RUN_ID,
    min_survivors: int = 0,
    expected_skellam: SkellamParams | None = None,
    floor: SessionFloor | None = None,
) -> Envelope:
    """The reply to one stage's request. `run_id`: the run this client serves, from its own
    context; a session of another run, or of a round other than `msg.round`, is refused.
    `min_survivors`: the client's own floor on the survivor set it unmasks for;
    `expected_skellam`: the distributed-DP parameters it holds for the run; `floor`: its
    threat model, which the session's mode, degree and threshold must meet (all from its
    own run config, see ClientRuntime)."""
    stage = stage_of(msg.kind)
    config, arrays = protocol_part(msg)
    sessions = SecAggSessions(state)
    try:
        request = decode_message(config, arrays)
        if stage is Stage.ADVERTISE:
            sessions.open(msg.round)
            request.session.check_binding(run_id, msg.round, "advertise_request.session")
            if floor is not None:  # before any key is made
                floor.check(request.session, "advertise_request.session")
            keys = identity_for(request.session, client_id, identity)
            client = SecAggClient(client_id, request.session, min_survivors=min_survivors, **keys)
        else:
            saved = sessions.restore(msg.round)
            if not saved:
                raise MessageError(f"{msg.kind}: no secure-aggregation session in progress")
            keys = {}
            if identity is not None:  # the advertise stage checked the session already
                keys = identity_for(_saved_session(saved), client_id, identity)
            client = SecAggClient.from_state(saved, min_survivors=min_survivors, **keys)
            client.session.check_binding(run_id, msg.round, "saved session")
        vector = None
        if stage is TRAINING_STAGE:
            client.check_masked_input(request)  # a stale or foreign request costs no training
            if is_skellam(msg):  # nor do parameters we refuse
                checked_skellam_params(msg, expected_skellam)
            reply, delta = train(client_id, msg)
            vector = encode_update(msg, reply, delta, expected_skellam)
        # The encoded vector exists for this reply only: mask it in place.
        answer = client.respond(request, vector=vector, overwrite_input=True)
    except SecAggError as exc:
        raise MessageError(f"{msg.kind}: {exc}") from None
    if stage is Stage.UNMASK:  # after unmasking the session is over: nothing to keep
        sessions.end(msg.round)
    else:
        sessions.save(msg.round, client.to_state())
    return wrap(msg.kind, msg.round, answer)
