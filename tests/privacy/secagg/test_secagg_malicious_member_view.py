"""Malicious mode: what a cohort member sees (docs/explanation/ledger-witnesses.md).

Unlike semi-honest mode (test_secagg_client_view.py: its neighbourhood only), a member
in malicious mode receives the whole cohort list and the graph seed at the advertise
stage, and the survivor set it co-signs as a bitmap over that cohort: the consistency
check signs one survivor set, which needs one ordering of the cohort that every member
shares. The docs state exactly this; the test pins it so code and docs cannot drift.
"""

from __future__ import annotations

from secagg_helpers import identity_keys, make_session, plain_sum, random_inputs

from fedveil.privacy.secagg import (
    AdvertiseRequest,
    DropoutPattern,
    Message,
    SessionConfig,
    Stage,
    ThreatMode,
    run_in_memory,
)
from fedveil.privacy.secagg.messages import ConsistencyRequest


def test_a_malicious_mode_member_sees_the_cohort_and_the_survivor_set_it_signs() -> None:
    session = make_session(12, neighbors=6, mode=ThreatMode.MALICIOUS, bits=24)
    received: dict[int, list[Message]] = {c: [] for c in session.client_ids}

    def record(stage: Stage, cid: int, message: Message) -> Message:
        received[cid].append(message)
        return message

    inputs = random_inputs(session, 1)
    dropouts = DropoutPattern.of(masked_input=session.client_ids[:1])
    report = run_in_memory(
        session,
        inputs,
        dropouts=dropouts,
        identity_keys=identity_keys(session),
        tamper_down=record,
    )
    survivors = report.result.survivors
    assert report.result.total.tolist() == plain_sum(inputs, survivors, 24).tolist()
    for cid, messages in received.items():
        advert = next(m for m in messages if isinstance(m, AdvertiseRequest))
        # The whole cohort and the graph seed (so every member's neighbours), not a view.
        assert isinstance(advert.session, SessionConfig)
        assert advert.session.client_ids == session.client_ids
        assert advert.session.graph_seed == session.graph_seed
        if cid in survivors:
            consistency = next(m for m in messages if isinstance(m, ConsistencyRequest))
            assert consistency.STAGE is Stage.CONSISTENCY
