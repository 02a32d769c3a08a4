"""The client mod around a stock Flower strategy holds its own plan (client/flower_secagg_plan.py).

Sessions come from the server's own parameter finder and state machine (SessionConfig.create,
SecAggServer) and reach the mod as real Flower Messages, stage by stage, as a SuperNode
delivers them; the app's train function runs behind the mod. The plan is the app's run config
(`Context.run_config`), as fedveil's own Flower client reads it.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.common import Metadata

from fedveil.client.flower_secagg_mod import fedveil_secagg_mod
from fedveil.privacy.encodings import QuantizedEncoding
from fedveil.privacy.secagg import (
    SecAggServer,
    SessionConfig,
    ThreatModel,
    decode_message,
    flower_run_id,
)
from fedveil.protocol import flower_secagg_codec as codec
from fedveil.protocol.envelope import Envelope
from fedveil.protocol.kinds import ErrorCode
from fedveil.protocol.secagg_frame import protocol_part, wrap
from fedveil.server.engine.requests import encoding_config

RUN = 41
N = 5
ROUND = 1
MODEL = ArrayRecord({"w": Array(np.zeros(3, dtype=np.float32))})
ENCODING = QuantizedEncoding(clip_range=8.0, levels=2**16, max_weight=1)
# The client's plan: 5 clients, all of them each round, a third of them possibly corrupt.
PLAN = {
    "data.num_clients": N,
    "server.per_round": N,
    "server.sampling": "fixed",
    "secagg.enabled": True,
    "secagg.adversarial_rate": 0.4,
    "secagg.dropout_rate": 0.0,
}


def app_train(msg: Message, context: Context) -> Message:
    """The app's @app.train(): a stock update of +0.1 on every weight."""
    arrays = ArrayRecord({"w": Array(msg.content["arrays"]["w"].numpy() + 0.1)})
    return Message(RecordDict({"arrays": arrays, "metrics": MetricRecord({})}), reply_to=msg)


def delivered(content: RecordDict, node_id: int) -> Message:
    """A train message as a SuperNode delivers it to the ClientApp."""
    metadata = Metadata(
        run_id=RUN,
        message_id=f"m{node_id}-{time.monotonic_ns()}",
        src_node_id=0,
        dst_node_id=node_id,
        reply_to_message_id="",
        group_id="",
        created_at=time.time(),
        ttl=60.0,
        message_type="train",
    )
    return Message(content=content, metadata=metadata)


class Nodes:
    """N nodes running the mod, each with its Context (its state kept between stages)."""

    def __init__(self, run_config: dict[str, Any]) -> None:
        self.contexts = {
            cid: Context(RUN, cid, {"partition-id": cid}, RecordDict(), run_config)
            for cid in range(N)
        }

    def send(self, cid: int, env: Envelope, content: RecordDict | None = None) -> Message:
        msg = delivered(codec.pack(env, content), cid)
        return fedveil_secagg_mod(msg, self.contexts[cid], app_train)


def session(server_threat: ThreatModel) -> SessionConfig:
    """A session the server's own parameter finder sizes for `server_threat`."""
    return SessionConfig.create(
        range(N),
        dimension=ENCODING.dimension(MODEL["w"].numpy().size),
        modulus_bits=ENCODING.bits(N),
        run_id=flower_run_id(RUN),
        round=ROUND,
        threat=server_threat,
    )


def key_stages(nodes: Nodes, server: SecAggServer) -> None:
    for _ in ("advertise", "share_keys"):
        for cid, request in server.next_requests().items():  # type: ignore[union-attr]
            reply = nodes.send(cid, wrap(f"secagg.{request.STAGE.value}", ROUND, request))
            assert not reply.has_error(), reply.error.reason
            server.receive(cid, decoded(reply))


def decoded(reply: Message) -> Any:
    return decode_message(*protocol_part(codec.unpack(reply.content)))


def masked_input(request: Any) -> tuple[Envelope, RecordDict]:
    """The masked-input stage as fedveil.flower.secure sends it: the strategy's message
    beside the stage's records."""
    env = wrap("secagg.masked_input", ROUND, request)
    env.config.update(
        {
            codec.PURPOSE: codec.TRAIN,
            codec.WEIGHT_KEY: "",
            codec.METRIC_RANGE: 100.0,
            **encoding_config(ENCODING.request_fields(N)),
        }
    )
    app = RecordDict({"arrays": MODEL, "config": ConfigRecord({"server-round": ROUND})})
    return env, app


def assert_refused(reply: Message, *named: str) -> None:
    assert reply.has_error() and reply.error.code == ErrorCode.BAD_MESSAGE.value
    for text in named:
        assert text in reply.error.reason, reply.error.reason


def test_a_session_below_the_plans_floor_is_refused_before_any_key():
    """The server sizes its session for adversarial rate 0.05 (t = 2 of 5); the client's
    plan allows 0.4 corrupt, whose floor is t >= 3: every node refuses at advertise."""
    weak = session(ThreatModel(0.05, 0.0))
    assert weak.threshold == 2
    server = SecAggServer(weak)
    nodes = Nodes(PLAN)
    for cid, request in server.next_requests().items():  # type: ignore[union-attr]
        reply = nodes.send(cid, wrap("secagg.advertise", ROUND, request))
        assert_refused(
            reply,
            "advertise_request.session.threshold = 2",
            "secagg.adversarial_rate = 0.4",
            "needs threshold >= 3",
        )


def test_without_a_plan_a_default_session_unmasks_with_its_threshold():
    """A stock app's run config names no fedveil key: the floor is fedveil's default
    threat model's (the one fedveil.flower.secure sizes for by default), and the survivor
    floor is the session's threshold, so the server's default session serves a round with
    one node dropped (the plan's survivor floor below refuses the same round)."""
    run_round(Nodes({"num-server-rounds": 3}), ThreatModel(0.05, 0.1), refused=())


def test_survivors_below_the_plans_floor_get_no_unmasking_share():
    """The plan's cohort is all 5 with no dropouts expected: a server that unmasks a sum of
    4 (it dropped one node's masked input) gets no share from any survivor."""
    run_round(Nodes(PLAN), ThreatModel(0.4, 0.0), refused=("4 survivors < 5", "no share revealed"))


def run_round(nodes: Nodes, server_threat: ThreatModel, refused: tuple[str, ...]) -> None:
    """One secure round in which the server drops the last node's masked input; with
    `refused`, every survivor's unmask reply must be a refusal naming those words, else
    the server must recover the four updates' sum."""
    server = SecAggServer(session(server_threat))
    key_stages(nodes, server)
    for cid, request in server.masked_input_requests().items():
        if cid == N - 1:
            continue  # the server drops this one's masked input
        env, app = masked_input(request)
        reply = nodes.send(cid, env, app)
        assert not reply.has_error(), reply.error.reason
        server.receive(cid, decoded(reply))
    requests = server.next_requests()
    assert requests
    for cid, request in requests.items():
        reply = nodes.send(cid, wrap(f"secagg.{request.STAGE.value}", ROUND, request))
        if refused:
            assert_refused(reply, *refused)
        else:
            assert not reply.has_error(), reply.error.reason
            server.receive(cid, decoded(reply))
    if not refused:
        assert len(server.finalize().survivors) == N - 1


@pytest.mark.parametrize(
    ("run_config", "named"),
    [
        ({**PLAN, "dp.mechanism": "distributed"}, "dp.mechanism = 'distributed'"),
        ({"fedveil-config": "/nonexistent/fedveil.toml"}, "/nonexistent/fedveil.toml"),
        ({**PLAN, "secagg.adversarial_rate": "high"}, "adversarial_rate"),
    ],
    ids=["distributed-dp", "missing-file", "bad-value"],
)
def test_a_plan_it_cannot_keep_is_refused_by_name(run_config, named):
    """Never the defaults instead: a plan this path cannot keep, or cannot load."""
    server = SecAggServer(session(ThreatModel(0.4, 0.0)))
    nodes = Nodes(run_config)
    cid, request = next(iter(server.next_requests().items()))  # type: ignore[union-attr]
    assert_refused(nodes.send(cid, wrap("secagg.advertise", ROUND, request)), named)
