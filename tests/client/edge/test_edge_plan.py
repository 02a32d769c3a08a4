"""A device enforces the distributed-DP plan of the run config it accepted, its own-share
epsilon cap, and its DP-SGD noise floor against non-numbers, through its real message path
(`answer`: a Flower Message in, a Flower Message out), with real secure-aggregation
sessions (the server's state machine, the devices' keys and masks)."""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Callable

import deploy_task
import pytest
from flwr.app import Message
from flwr.supercore.task_identity import TaskIdentity
from ledger_heads import with_ledger_head
from test_edge_client import DISTRIBUTED, SETUP, N, request_message, run_config, train_request

from fedveil.client.edge.device_app import (
    BAD_MESSAGE,
    MASKED_INPUTS_DIR,
    EdgeClient,
    TaskSource,
    answer,
    edge_from_node_config,
)
from fedveil.client.edge.edge import EdgeNode, EdgeOptions
from fedveil.client.edge.edge_policy import LocalPolicy
from fedveil.client.own_share import OwnShareAccount
from fedveil.client.runtime import ClientRuntime
from fedveil.config import load_config
from fedveil.privacy.dp.distributed_plan import DistributedDpPlan
from fedveil.privacy.secagg import (
    SecAggServer,
    SessionConfig,
    ThreatMode,
    decode_message,
    flower_run_id,
)
from fedveil.protocol import fields as F
from fedveil.protocol.envelope import Envelope, MessageError
from fedveil.protocol.flower_codec import from_content, to_content
from fedveil.protocol.secagg_frame import protocol_part, wrap
from fedveil.server.engine.dp_from_config import plan_distributed_dp

RUN = 1


@pytest.fixture(autouse=True)
def task_identity():
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 77, 0, 1


def device_plan(**extra) -> DistributedDpPlan:
    """The plan every device computes from the run config it accepted (and the server)."""
    cfg = load_config(
        None,
        {
            "model.name": "mlp",
            "model.task": "deploy_task:make",
            "data.num_clients": N,
            "server.per_round": N,
            **DISTRIBUTED,
            **extra,
        },
    )
    size = sum(p.numel() for p in deploy_task.make(cfg).model_fn().parameters())
    return plan_distributed_dp(cfg, size, N)


def send(edge: EdgeClient, msg: Envelope, config: dict) -> Message:
    # The coordinator's head rides on every request: what is tested here is the plan.
    msg = with_ledger_head(msg)
    return answer(edge, request_message(to_content(msg), msg.kind), RUN, config)


def honest_masked_input(request, plan: DistributedDpPlan, round_num: int = 1) -> Envelope:
    """The masked-input request of an honest distributed-DP round."""
    msg = wrap("secagg.masked_input", round_num, request)
    msg.config.update(train_request().config)
    msg.config.update(
        {
            F.CLIP_NORM: DISTRIBUTED["dp.clip"],
            F.WEIGHTING: F.WEIGHT_UNIFORM,
            F.ENC_KIND: "skellam",
            F.ENC_PARAMS: json.dumps(plan.params.to_dict()),
            F.ENC_ROTATION_SEED: 7,
        }
    )
    msg.arrays.update(train_request().arrays)
    return msg


def to_masked_input(
    edges: dict[int, EdgeClient], config: dict, round_num: int = 1, **extra
) -> tuple[SecAggServer, dict]:
    """A session of every device through its key stages (round `round_num`, the plan of
    DISTRIBUTED and `extra`); the server's masked-input requests."""
    plan = device_plan(**extra)
    name = b"round-%04d" % round_num
    session = SessionConfig(
        session_id=name,
        client_ids=tuple(range(N)),
        modulus_bits=plan.params.bits,
        dimension=plan.params.padded_dim,
        neighbors=N - 1,
        threshold=plan.min_survivors,
        threat_mode=ThreatMode.SEMI_HONEST,
        graph_seed=hashlib.sha256(name).digest(),
        run_id=flower_run_id(RUN),
        round=round_num,
    )
    server = SecAggServer(session)
    for _ in ("advertise", "share_keys"):
        for cid, request in server.next_requests().items():  # type: ignore[union-attr]
            msg = wrap(f"secagg.{request.STAGE.value}", round_num, request)
            msg.config.update(SETUP)
            reply = send(edges[cid], msg, config)
            assert not reply.has_error(), reply.error.reason
            server.receive(cid, decode_message(*protocol_part(from_content(reply.content))))
    return server, server.masked_input_requests()


def devices(policy: LocalPolicy | None = None) -> dict[int, EdgeClient]:
    return {cid: EdgeClient(TaskSource("deploy_task:make"), cid, policy) for cid in range(N)}


def assert_refused(reply: Message, *named: str) -> None:
    # An error reply carries no content: no update, loss or count leaves the device.
    assert reply.has_error() and reply.error.code == BAD_MESSAGE and not reply.has_content()
    for text in named:
        assert text in reply.error.reason, reply.error.reason


def _quantized(msg: Envelope) -> None:
    for key in (F.ENC_PARAMS, F.ENC_ROTATION_SEED):
        msg.config.pop(key)
    msg.config.update(
        {
            F.ENC_KIND: "quantized",
            F.ENC_CLIP_RANGE: 1.0,
            F.ENC_LEVELS: 4096,
            F.ENC_MAX_CLIENTS: N,
            F.ENC_MAX_WEIGHT: 1,
        }
    )


TAMPERS: dict[str, tuple[Callable[[Envelope], object], tuple[str, ...]]] = {
    "quantized": (_quantized, ("enc.kind = 'quantized' in the request", "plan says 'skellam'")),
    "no-clip": (lambda m: m.config.pop(F.CLIP_NORM), ("clip_norm = '(missing)'", "says 1.0")),
    "example-weighting": (
        lambda m: m.config.update({F.WEIGHTING: F.WEIGHT_BY_EXAMPLES}),
        ("weighting = 'examples' in the request", "says 'uniform'"),
    ),
    "evaluation": (
        lambda m: m.config.update({F.INPUT: F.INPUT_EVALUATION, F.EVAL_LOSS_CAP: 5.0}),
        ("input = 'evaluation' in the request", "masks only training updates"),
    ),
}


@pytest.mark.parametrize("name", list(TAMPERS))
def test_a_device_refuses_a_masked_input_that_is_not_its_plan(name):
    """The coordinator names `quantized`, omits the clip, asks for example weighting or
    sends a masked-input evaluation: every device refuses, naming what was asked and
    what its plan says; the same session's honest request is then answered."""
    config = run_config(**DISTRIBUTED)
    edges = devices()
    _, requests = to_masked_input(edges, config)
    plan = device_plan()
    tamper, named = TAMPERS[name]
    for cid, request in requests.items():
        msg = honest_masked_input(request, plan)
        tamper(msg)
        assert_refused(send(edges[cid], msg, config), *named)
        honest = send(edges[cid], honest_masked_input(request, plan), config)
        assert not honest.has_error(), honest.error.reason
        # Only the masked Skellam vector leaves: no loss, example count or weight beside it.
        sent = from_content(honest.content)
        assert all(key.startswith(F.SA) for key in [*sent.config, *sent.arrays]), sent.config


def test_a_device_refuses_masked_inputs_past_the_runs_rounds():
    """The run config says one round: a coordinator that runs a second secure round (past
    the run's end, or a second session in the same round) gets no second masked input,
    whose noise share would compose past the epsilon stated against the coordinator."""
    one_round = {"server.rounds": 1}
    config = run_config(**DISTRIBUTED, **one_round)
    edges = devices()
    plan = device_plan(**one_round)
    _, requests = to_masked_input(edges, config, 1, **one_round)
    for cid, request in requests.items():
        reply = send(edges[cid], honest_masked_input(request, plan), config)
        assert not reply.has_error(), reply.error.reason
    for round_num in (2, 1):  # past the run's end; a second session in round 1
        _, requests = to_masked_input(edges, config, round_num, **one_round)
        for cid, request in requests.items():
            reply = send(edges[cid], honest_masked_input(request, plan, round_num), config)
            assert_refused(reply, f"client {cid}'s participation 2", "server.rounds = 1")


def devices_with_state(state, how: str = "edge-node") -> dict[int, EdgeClient]:
    """Devices keeping their state in `state/<client>`, as `fedveil client --state-dir`
    builds them (its edge node) or as Flower's process isolation does (node config
    `state-dir`): a new call is each device restarted (a new process reads only what its
    state directory kept)."""
    if how == "node-config":
        return {
            cid: edge_from_node_config(
                {"client-id": cid, "task": "deploy_task:make", "state-dir": str(state / str(cid))}
            )
            for cid in range(N)
        }
    edges = devices()
    for cid, edge in edges.items():
        EdgeNode(EdgeOptions("127.0.0.1:9092", cid, state / str(cid), insecure=True), edge)
    return edges


@pytest.mark.parametrize("how", ["edge-node", "node-config"])
def test_a_restarted_device_still_refuses_masked_inputs_past_the_runs_rounds(tmp_path, how):
    """A device restarted in the middle of a one-round run has kept the count of masked
    inputs it sent: the coordinator gets no second one by restarting it (or waiting for a
    restart), whose noise share would compose past the stated epsilon."""
    one_round = {"server.rounds": 1}
    config = run_config(**DISTRIBUTED, **one_round)
    plan = device_plan(**one_round)
    edges = devices_with_state(tmp_path, how)
    _, requests = to_masked_input(edges, config, 1, **one_round)
    for cid, request in requests.items():
        reply = send(edges[cid], honest_masked_input(request, plan), config)
        assert not reply.has_error(), reply.error.reason
    kept = tmp_path / "0" / MASKED_INPUTS_DIR / f"{RUN}-0.json"
    assert oct(kept.stat().st_mode & 0o777) == "0o600"
    assert json.loads(kept.read_text())["masked_inputs"] == 1
    restarted = devices_with_state(tmp_path, how)
    _, requests = to_masked_input(restarted, config, 2, **one_round)
    for cid, request in requests.items():
        reply = send(restarted[cid], honest_masked_input(request, plan, 2), config)
        assert_refused(reply, f"client {cid}'s participation 2", "server.rounds = 1")


@pytest.mark.parametrize(
    "content",
    [
        b"{not json",
        b'{"client_id": 0, "masked_inputs": "one", "run": "1"}',
        b'{"client_id": 0, "masked_inputs": -1, "run": "1"}',
        b'{"client_id": 0, "run": "1"}',
        b'{"client_id": 0, "masked_inputs": 0, "run": "2"}',
    ],
    ids=["not-json", "string", "negative", "missing", "another-run"],
)
def test_a_count_file_it_cannot_trust_is_a_refusal_naming_it(tmp_path, content):
    """A corrupt, non-numeric or missing count is not a count of zero: the masked input
    is refused, naming the file; the other devices, whose files are sound, answer."""
    config = run_config(**DISTRIBUTED)
    plan = device_plan()
    edges = devices_with_state(tmp_path)
    bad = tmp_path / "0" / MASKED_INPUTS_DIR / f"{RUN}-0.json"
    bad.parent.mkdir(parents=True)
    bad.write_bytes(content)
    _, requests = to_masked_input(edges, config, 1)
    for cid, request in requests.items():
        reply = send(edges[cid], honest_masked_input(request, plan), config)
        if cid == 0:
            assert_refused(reply, str(bad), "rather than count from zero")
        else:
            assert not reply.has_error(), reply.error.reason


def test_a_device_refuses_a_plain_train_under_distributed_dp():
    """A plain train request would take the update in the clear, without a noise share."""
    assert_refused(
        send(
            EdgeClient(TaskSource("deploy_task:make"), 0),
            train_request(),
            run_config(**DISTRIBUTED),
        ),
        "dp.mechanism = 'distributed'",
        "plain train request",
        "in the clear",
    )


def test_the_issues_sybil_figures():
    """100 clients, 20 per round, epsilon 8: 17 honest shares at z = 4.92; a client in 12
    rounds is at 7.04 as stated and 43.8 with its own share alone (issue 28: 43.1 at
    fractional orders)."""
    cfg = load_config(
        None,
        {
            "data.num_clients": 100,
            "server.per_round": 20,
            "secagg.enabled": True,
            "dp.mechanism": "distributed",
            "dp.epsilon": 8.0,
        },
    )
    plan = plan_distributed_dp(cfg, 7850, 100)
    account = OwnShareAccount(plan, cfg.dp.delta, cap=None)
    assert plan.min_honest == 17 and plan.noise_multiplier == pytest.approx(4.92, abs=0.01)
    assert account.own_z == pytest.approx(plan.noise_multiplier / math.sqrt(17), rel=0.01)
    assert account.stated_epsilon(12) == pytest.approx(7.04, abs=0.01)
    # The issue's 43.1 was the Skellam bound at fractional Renyi orders; at the integer
    # orders it is proven for (skellam_rdp_integer) the own-share figure is 43.8.
    assert account.epsilon(12) == pytest.approx(43.8, abs=0.1)


def test_a_device_shows_and_caps_its_own_share_epsilon(caplog):
    """The device logs its own-share-only figures, and with --max-own-share-epsilon below
    what one more round would bring, refuses that masked input, naming the flag."""
    plan = device_plan()
    one = OwnShareAccount(plan, 1e-5, cap=None).epsilon(1)
    config = run_config(**DISTRIBUTED)
    capped = devices(LocalPolicy(max_own_share_epsilon=one * 0.9))
    _, requests = to_masked_input(capped, config)
    for cid, request in requests.items():
        assert_refused(
            send(capped[cid], honest_masked_input(request, plan), config),
            "own-share-only epsilon",
            f"{one:.4g} after 1 participations",
            "--max-own-share-epsilon",
        )
    roomy = devices(LocalPolicy(max_own_share_epsilon=one * 1.1))
    with caplog.at_level(logging.INFO, logger="fedveil.edge"):
        _, requests = to_masked_input(roomy, config)
        for cid, request in requests.items():
            assert not send(roomy[cid], honest_masked_input(request, plan), config).has_error()
    text = caplog.text
    assert "own-share-only" in text and "this device's own share alone is z = " in text
    assert f"after 1 participations: {one:.4g}" in text


@pytest.mark.parametrize(
    "noise", [float("nan"), float("inf"), None, "2.0"], ids=["nan", "inf", "missing", "string"]
)
def test_a_non_number_never_passes_the_dp_sgd_noise_floor(noise):
    """A device started with --min-dp-noise 1.0: dp_sgd_noise = NaN, inf, missing or a
    string is refused, naming the field; no update (private or not) is sent."""
    edge = EdgeClient(TaskSource("deploy_task:make"), 0, LocalPolicy(min_dp_noise=1.0))
    request = train_request(dp_sgd_clip=1.0)
    if noise is not None:
        request.config[F.DP_SGD_NOISE] = noise
    reply = send(edge, request, run_config())
    assert_refused(reply, "'dp_sgd_noise'", ">= 1", "--min-dp-noise")
    # The floor itself is met by a real number at or above it.
    request.config[F.DP_SGD_NOISE] = 1.0
    assert not send(edge, request, run_config()).has_error()


# A DP-SGD run (the run config every device accepted): noise 1.0, clip 1.0, batch 16, one
# epoch, as the honest request of train_request() asks.
DP_SGD = {
    "client.dp_sgd_noise": 1.0,
    "client.dp_sgd_clip": 1.0,
    "client.batch_size": 16,
    "client.local_epochs": 1,
    "dp.epsilon": 8.0,
}
DP_SGD_TAMPERS: dict[str, tuple[dict, tuple[str, ...]]] = {
    "off": ({F.DP_SGD_NOISE: 0.0}, ("'dp_sgd_noise' = 0.0", ">= 1")),
    "missing": ({F.DP_SGD_NOISE: None}, ("'dp_sgd_noise' is missing", ">= 1")),
    "lower": ({F.DP_SGD_NOISE: 0.5}, ("'dp_sgd_noise' = 0.5", ">= 1")),
    "nan": ({F.DP_SGD_NOISE: math.nan}, ("'dp_sgd_noise' = nan", ">= 1")),
    "larger-clip": ({F.DP_SGD_CLIP: 100.0}, ("'dp_sgd_clip' = 100.0", "<= 1")),
    "nan-clip": ({F.DP_SGD_CLIP: math.nan}, ("'dp_sgd_clip' = nan", "<= 1")),
    # A batch as large as the data for 3 epochs: epsilon 8.39 a round against 4.51 (a
    # batch of 48 for one epoch, 4.35, spends less and is answered).
    "larger-batch": (
        {F.BATCH_SIZE: 49, F.LOCAL_EPOCHS: 3},
        ("'batch_size' = 49", "'local_epochs' = 3", "client.batch_size = 16"),
    ),
    "more-epochs": ({F.LOCAL_EPOCHS: 9}, ("'local_epochs' = 9", "client.local_epochs = 1")),
}


def _dp_sgd_request(change: dict) -> Envelope:
    request = train_request(dp_sgd_noise=1.0, dp_sgd_clip=1.0, weighting=F.WEIGHT_UNIFORM)
    for key, value in change.items():
        if value is None:
            request.config.pop(key)
        else:
            request.config[key] = value
    return request


@pytest.mark.parametrize("name", list(DP_SGD_TAMPERS))
@pytest.mark.parametrize("path", ["device", "in-process"])
def test_a_client_trains_with_no_less_dp_sgd_than_its_run_config(name, path):
    """A DP-SGD run: a coordinator that switches DP-SGD off, lowers the noise, raises the
    clip, the batch (the sampling rate) or the epochs is refused by a device with no
    local flags and by the simulation's client runtime, naming the field, the value and
    the run config's limit; the honest request trains."""
    change, named = DP_SGD_TAMPERS[name]
    config = run_config(**DP_SGD)
    if path == "device":
        reply = send(EdgeClient(TaskSource("deploy_task:make"), 0), _dp_sgd_request(change), config)
        assert_refused(reply, *named)
        honest = send(EdgeClient(TaskSource("deploy_task:make"), 0), _dp_sgd_request({}), config)
        assert not honest.has_error(), honest.error.reason
        return
    cfg = load_config(
        None,
        {
            "model.name": "mlp",
            "model.task": "deploy_task:make",
            "data.num_clients": N,
            "server.per_round": N,
            **DP_SGD,
        },
    )
    runtime = ClientRuntime(deploy_task.make(cfg), "cpu", run_config=cfg)
    with pytest.raises(MessageError) as refused:
        runtime.handle(0, _dp_sgd_request(change), {})
    for text in named:
        assert text in str(refused.value), str(refused.value)
    assert runtime.handle(0, _dp_sgd_request({}), {}).config[F.NUM_EXAMPLES] == 1
