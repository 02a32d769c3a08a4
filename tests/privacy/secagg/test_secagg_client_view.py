"""Semi-honest mode: a client learns its neighbourhood, never the cohort.

The test plays a curious cohort member: it records every byte the server sends each client,
in every stage, and looks for any client id outside that client's neighbourhood.
"""

from __future__ import annotations

import secrets
from typing import Any

import numpy as np
import pytest
from secagg_helpers import plain_sum

from fedveil.privacy.secagg import (
    AdvertiseRequest,
    DropoutPattern,
    Message,
    SecAggClient,
    SessionConfig,
    Stage,
    ThreatModel,
    UnmaskRequest,
    run_in_memory,
)
from fedveil.privacy.secagg.view import SessionView, session_from_bytes


def _session(n: int = 30) -> SessionConfig:
    # Random 63-bit ids: any one of them showing up in a message is no coincidence.
    ids = sorted({secrets.randbits(63) for _ in range(n)})
    return SessionConfig.create(
        ids,
        dimension=8,
        modulus_bits=24,
        run_id=b"test-run",
        round=1,
        threat=ThreatModel(0.0, 0.1),
        neighbors=8,
        threshold=5,
    )


def _values(config: dict[str, Any], arrays: dict[str, np.ndarray]) -> tuple[set[int], bytes]:
    """Every integer a message carries, and all its bytes (to search for encoded ids)."""
    ints: set[int] = set()
    blobs = []
    for value in config.values():
        items = value if isinstance(value, list) else [value]
        for item in items:
            if isinstance(item, bytes):
                blobs.append(item)
            elif isinstance(item, int):
                ints.add(item)
    for array in arrays.values():
        ints.update(int(v) for v in array.astype(np.uint64).tolist())
        blobs.append(array.tobytes())
    return ints, b"|".join(blobs)


@pytest.mark.real_randomness
def test_a_semi_honest_client_receives_no_id_outside_its_neighbourhood() -> None:
    session = _session()
    received: dict[int, list[Message]] = {c: [] for c in session.client_ids}

    def record(stage: Stage, cid: int, message: Message) -> Message:
        received[cid].append(message)
        return message

    dropouts = DropoutPattern.of(masked_input=session.client_ids[3:5])
    inputs = {c: np.arange(8, dtype=np.uint32) * (i + 1) for i, c in enumerate(session.client_ids)}
    report = run_in_memory(session, inputs, dropouts=dropouts, tamper_down=record)
    assert report.result.total.tolist() == plain_sum(inputs, report.result.survivors, 24).tolist()
    stages_seen = set()
    for cid, messages in received.items():
        hood = session.neighbours_of(cid) | {cid}
        strangers = set(session.client_ids) - hood
        assert len(strangers) >= len(session.client_ids) - 9
        for message in messages:
            stages_seen.add(message.STAGE)
            ints, blob = _values(*message.to_wire())
            assert not ints & strangers, f"{message.KIND} to {cid} names strangers"
            for stranger in strangers:
                for order in ("big", "little"):
                    assert stranger.to_bytes(8, order) not in blob, message.KIND
            if isinstance(message, AdvertiseRequest):
                assert isinstance(message.session, SessionView)
                assert message.session.digest == session.digest  # keys bind the full session
            if isinstance(message, UnmaskRequest):
                assert message.survivor_count == len(report.result.survivors)
    assert stages_seen == {Stage.ADVERTISE, Stage.SHARE_KEYS, Stage.MASKED_INPUT, Stage.UNMASK}


def test_a_view_round_trips_and_keeps_the_sessions_keys() -> None:
    session = _session(12)
    cid = session.client_ids[5]
    view = SessionView.of(session, cid, session.neighbours_of(cid))
    assert session_from_bytes(view.to_bytes()) == view
    assert SessionView.from_wire(*view.to_wire()) == view
    assert view.share_xs(list(view.neighbourhood_ids)) == session.share_xs(
        list(view.neighbourhood_ids)
    )
    with pytest.raises(ValueError, match="session view is client"):
        SecAggClient(session.client_ids[0], view)
    # A client given the full session accepts the server's view of it as the same session.
    client = SecAggClient(cid, session)
    client.advertise(AdvertiseRequest(session.session_id, cid, view))
