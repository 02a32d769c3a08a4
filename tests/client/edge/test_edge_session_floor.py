"""A coordinator that weakens secure aggregation below the client's own run config: a
threshold t under the floor of the run's threat model, a semi-honest session in a
malicious-mode run, a plain train request in a secure-aggregation run. Played on the
device's real message path (`answer`: a Flower Message in and out) and on the
in-process path the simulation uses (`ClientRuntime.handle`), with the real server
state machine building the sessions."""

from __future__ import annotations

import hashlib

import deploy_task
import pytest
from test_edge_client import (  # noqa: F401  (task_identity: the autouse fixture)
    SETUP,
    N,
    run_config,
    task_identity,
    train_request,
)
from test_edge_plan import assert_refused, send

from fedveil.client.edge.device_app import EdgeClient, TaskSource
from fedveil.client.runtime import ClientRuntime
from fedveil.config import load_config
from fedveil.privacy.secagg import SecAggServer, SessionConfig, ThreatMode, flower_run_id
from fedveil.protocol.envelope import Envelope, MessageError
from fedveil.protocol.flower_codec import from_content
from fedveil.protocol.secagg_frame import wrap

RUN = 1
# N = 5 clients, complete graph k = 4: at adversarial_rate 0.4 two may be corrupt, so a
# semi-honest session needs t >= 3 (params.min_safe_threshold); t = 2 is structurally valid.
WEAK_RUN = {"secagg.enabled": True, "secagg.adversarial_rate": 0.4}


def advertise_requests(threshold: int, mode: ThreatMode) -> dict[int, Envelope]:
    session = SessionConfig(
        session_id=b"round-0001",
        client_ids=tuple(range(N)),
        modulus_bits=32,
        dimension=64,
        neighbors=N - 1,
        threshold=threshold,
        threat_mode=mode,
        graph_seed=hashlib.sha256(b"round-0001").digest(),
        run_id=flower_run_id(RUN),
        round=1,
    )
    out = {}
    for cid, request in SecAggServer(session).next_requests().items():  # type: ignore[union-attr]
        msg = wrap("secagg.advertise", 1, request)
        msg.config.update(SETUP)
        out[cid] = msg
    return out


def device_reply(cid: int, msg: Envelope, overrides: dict) -> tuple[bool, str]:
    """(answered, error reason) of a device holding the run config `overrides`."""
    reply = send(EdgeClient(TaskSource("deploy_task:make"), cid), msg, run_config(**overrides))
    if reply.has_error():
        assert_refused(reply)  # nothing leaves with the error
        return False, reply.error.reason
    return True, ""


def inprocess_reply(cid: int, msg: Envelope, overrides: dict) -> tuple[bool, str]:
    """The same through the simulation's path: the runtime holding the run's own config."""
    base = {
        "model.name": "mlp",
        "model.task": "deploy_task:make",
        "data.num_clients": N,
        "server.per_round": N,
    }
    cfg = load_config(None, {**base, **overrides})
    runtime = ClientRuntime(deploy_task.make(cfg), "cpu", run_id=flower_run_id(RUN), run_config=cfg)
    try:
        runtime.handle(cid, msg, {})
    except MessageError as exc:
        return False, str(exc)
    return True, ""


PATHS = {"device": device_reply, "in-process": inprocess_reply}


@pytest.mark.parametrize("path", list(PATHS))
def test_a_threshold_below_the_runs_floor_is_refused_before_any_key(path):
    reply = PATHS[path]
    for cid, msg in advertise_requests(2, ThreatMode.SEMI_HONEST).items():
        answered, reason = reply(cid, msg, WEAK_RUN)
        assert not answered
        for text in (
            "advertise_request.session.threshold = 2",
            "secagg.adversarial_rate = 0.4",
            "needs threshold >= 3",
        ):
            assert text in reason, reason
    # The floor itself is answered, and so is t = 2 where the run allows no corrupt client.
    for threshold, overrides in ((3, WEAK_RUN), (2, {"secagg.enabled": True})):
        cid, msg = next(iter(advertise_requests(threshold, ThreatMode.SEMI_HONEST).items()))
        answered, reason = reply(cid, msg, overrides)
        assert answered, reason


@pytest.mark.parametrize("path", list(PATHS))
def test_a_semi_honest_session_in_a_malicious_mode_run_is_refused(path):
    malicious = {"secagg.enabled": True, "secagg.threat": "malicious"}
    cid, msg = next(iter(advertise_requests(3, ThreatMode.SEMI_HONEST).items()))
    answered, reason = PATHS[path](cid, msg, malicious)
    assert not answered
    assert "advertise_request.session.threat_mode = 'semi_honest'" in reason, reason
    assert "secagg.threat = 'malicious'" in reason, reason


def test_a_plain_train_in_a_secure_aggregation_run_is_refused():
    """A device with no --require-secagg flag still holds its run's secure aggregation."""
    central = {"secagg.enabled": True, "dp.mechanism": "central", "dp.epsilon": 8.0}
    for overrides in ({"secagg.enabled": True}, central):
        edge = EdgeClient(TaskSource("deploy_task:make"), 0)
        reply = send(edge, train_request(), run_config(**overrides))
        assert_refused(reply, "secagg.enabled = true", "plain train request", "in the clear")
    edge = EdgeClient(TaskSource("deploy_task:make"), 0)
    ok = send(edge, train_request(), run_config())  # a run without secure aggregation trains
    assert not ok.has_error() and from_content(ok.content).config["num_examples"] > 0
