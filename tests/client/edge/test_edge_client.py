"""A device's answers: the same update whatever the data source, local policy enforced,
and no request — however wrong — raises out of the ClientApp."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from deploy_task import arrays, write_client_file
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from fedveil.builtin_models import build_model
from fedveil.client.edge.device_app import (
    BAD_MESSAGE,
    CLIENT_FAILURE,
    CONFIG_KEY,
    DataSource,
    EdgeClient,
    TaskSource,
    answer,
)
from fedveil.client.edge.edge_data import load_local_data
from fedveil.client.edge.edge_policy import LocalPolicy, PolicyRefusal
from fedveil.config import device_toml, load_config
from fedveil.flat_model import FlatModel
from fedveil.protocol.envelope import Envelope, MessageError
from fedveil.protocol.flower_codec import from_content, message_type, to_content
from fedveil.protocol.piggyback import attach
from fedveil.server.engine.drops import drop_check

pytestmark = pytest.mark.procs  # starts processes: not in make test-fast

N = 5
SETUP = {"run_num_classes": 3, "run_input_shape": [8]}  # what DeployTransport adds


@pytest.fixture(autouse=True)
def task_identity():
    # Flower stamps messages with the task they belong to; the worker sets it per task.
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 77, 0, 1


def run_config(**extra):
    overrides = {
        "model.name": "mlp",
        "model.task": "deploy_task:make",
        "data.num_clients": N,
        "server.per_round": N,
    }
    overrides.update(extra)
    cfg = load_config(None, overrides)
    return {CONFIG_KEY: device_toml(cfg)}


def train_request(round_num=1, **config):
    torch.manual_seed(0)  # the same global model in every request
    model = FlatModel(build_model("mlp", (8,), 3))
    base = {
        "seed": 3,
        "local_epochs": 1,
        "local_steps": 0,
        "batch_size": 16,
        "lr": 0.1,
        "momentum": 0.0,
        "weight_decay": 0.0,
        "prox_mu": 0.0,
        "run_num_classes": 3,
        "run_input_shape": [8],
    }
    base.update(config)
    return Envelope("train", round_num, base, {"model": model.get()})


def evaluate_request(round_num=1):
    """A plain federated-evaluation request, as the round engine sends it (SETUP added)."""
    return Envelope("evaluate", round_num, dict(SETUP), {"model": train_request().arrays["model"]})


def test_task_and_local_files_give_the_same_update(tmp_path):
    by_task = EdgeClient(TaskSource("deploy_task:make"), 2)
    by_file = EdgeClient(DataSource(load_local_data(write_client_file(tmp_path, N, 2, "csv"))), 2)
    a = by_task.handle(1, run_config(), train_request())
    b = by_file.handle(1, run_config(), train_request())
    assert a.config["num_examples"] == b.config["num_examples"] == len(arrays(N)[0][2][1])
    torch.testing.assert_close(
        torch.as_tensor(a.arrays["delta"]), torch.as_tensor(b.arrays["delta"])
    )
    hello = by_file.handle(
        1, run_config(), Envelope("hello", 0, {"run_num_classes": 3, "run_input_shape": [8]})
    )
    assert hello.config == {"client_id": 2, "size": FlatModel(build_model("mlp", (8,), 3)).size}


def test_policy_caps_and_refusals(tmp_path):
    data = DataSource(load_local_data(write_client_file(tmp_path, N, 1, "npz")))
    capped = EdgeClient(data, 1, LocalPolicy(max_local_steps=2))
    reply = capped.handle(1, run_config(), train_request())
    assert reply.config["steps"] == 2 and reply.config["capped"] is True
    epochs = EdgeClient(data, 1, LocalPolicy(max_local_epochs=1))
    reply = epochs.handle(1, run_config(), train_request(local_epochs=5))
    assert reply.config["steps"] == -(-len(data.data) // 16) and reply.config["capped"] is True

    timed = EdgeClient(data, 1, LocalPolicy(max_train_seconds=0.5))
    timed.seconds_per_step = 0.1  # as measured on an earlier round
    assert timed.handle(1, run_config(), train_request(local_steps=50)).config["steps"] == 5

    secagg = EdgeClient(data, 1, LocalPolicy(require_secagg=True))
    with pytest.raises(PolicyRefusal, match="secure aggregation"):
        secagg.handle(1, run_config(), train_request())
    # Under secure aggregation, training rides on the masked-input stage: allowed,
    # and capped like any training request.
    plain = train_request(local_steps=40)
    masked_input = Envelope("secagg.masked_input", 1, plain.config, plain.arrays)
    both = LocalPolicy(require_secagg=True, max_local_steps=3)
    masked, capped = both.apply(masked_input, 100, None)
    assert capped and masked.kind == "secagg.masked_input" and masked.config["local_steps"] == 3
    clip = EdgeClient(data, 1, LocalPolicy(max_clip_norm=1.0))
    for unbounded in (train_request(), train_request(clip_norm=5.0)):
        with pytest.raises(PolicyRefusal, match="clipped"):
            clip.handle(1, run_config(), unbounded)
    bounded = clip.handle(1, run_config(), train_request(clip_norm=0.5))
    assert float(torch.linalg.vector_norm(torch.as_tensor(bounded.arrays["delta"]))) <= 0.5
    dp = EdgeClient(data, 1, LocalPolicy(min_dp_noise=1.0))
    with pytest.raises(PolicyRefusal, match="noise"):
        dp.handle(1, run_config(), train_request(dp_sgd_noise=0.5, dp_sgd_clip=1.0))
    # The training caps do not touch a plain evaluation; --require-secagg refuses it
    # (test_a_device_requiring_secagg_never_evaluates_in_the_clear).
    assert clip.handle(1, run_config(), evaluate_request()).config["num_examples"] > 0
    with pytest.raises(PolicyRefusal, match="in the clear"):
        secagg.handle(1, run_config(), evaluate_request())


def test_an_evaluation_under_secure_aggregation_is_not_a_training_request():
    """A DP drift evaluation asks for the device's bounded evaluation in the masked-input
    stage: no training checks apply (the device clamps what it sends itself), while the
    same stage asking for an update is still held to them."""
    strict = LocalPolicy(require_secagg=True, max_clip_norm=1.0, min_dp_noise=1.0)
    model = train_request().arrays
    evaluation = Envelope(
        "secagg.masked_input", 1, {"input": "evaluation", "eval_loss_cap": 5.0}, model
    )
    assert strict.apply(evaluation, 100, None) == (evaluation, False)
    update = Envelope(
        "secagg.masked_input", 1, {**train_request().config, "input": "update"}, model
    )
    with pytest.raises(PolicyRefusal, match="clipped"):
        strict.apply(update, 100, None)


def test_the_device_decides_what_it_runs(tmp_path):
    task = EdgeClient(TaskSource("deploy_task:make"), 0)
    with pytest.raises(MessageError, match="runs task 'deploy_task:make'"):
        task.handle(1, run_config(**{"model.task": "tiny_task:make"}), train_request())
    x, y = arrays(N)[0][0]
    np.savez(tmp_path / "wide.npz", x=np.hstack([x, x]), y=y)
    wide = EdgeClient(DataSource(load_local_data(tmp_path / "wide.npz")), 0)
    with pytest.raises(MessageError, match=r"shape \(8,\).*\(16,\)"):
        wide.handle(1, run_config(), train_request())
    np.savez(tmp_path / "labels.npz", x=x, y=y + 5)
    many = EdgeClient(DataSource(load_local_data(tmp_path / "labels.npz")), 0)
    with pytest.raises(MessageError, match="3 classes"):
        many.handle(1, run_config(), train_request())
    pinned = EdgeClient(DataSource(load_local_data(tmp_path / "wide.npz"), model="logreg"), 0)
    with pytest.raises(MessageError, match="trains model 'logreg'"):
        pinned.handle(1, run_config(), train_request())
    with pytest.raises(MessageError, match="not a fedveil run"):
        task.handle(2, {}, train_request())
    with pytest.raises(MessageError, match="invalid"):
        task.handle(3, {CONFIG_KEY: "[server]\nrounds = -1\n"}, train_request())


def request_message(content: RecordDict, kind: str = "train") -> Message:
    return Message(content, 5, message_type(kind))


def test_answer_never_raises(tmp_path):
    edge = EdgeClient(TaskSource("deploy_task:make"), 0)
    ok = answer(edge, request_message(to_content(train_request())), 1, run_config())
    assert not ok.has_error() and from_content(ok.content).config["num_examples"] > 0
    garbage = [
        RecordDict({"junk": ConfigRecord({"a": 1})}),  # not a fedveil message at all
        to_content(Envelope("train", 1, {"seed": 3})),  # fields missing
        to_content(train_request(lr=-1.0)),  # out of range
        to_content(Envelope("launch-missiles", 1, {})),  # unknown kind
    ]
    nan = train_request()
    nan.arrays["model"] = torch.full_like(nan.arrays["model"], float("nan"))
    short = train_request()
    short.arrays["model"] = short.arrays["model"][:10]
    garbage += [to_content(nan), to_content(short)]
    for content in garbage:
        reply = answer(edge, request_message(content), 1, run_config())
        assert reply.has_error() and reply.error.code == BAD_MESSAGE, reply.error.reason
    # and the device still trains afterwards
    again = answer(edge, request_message(to_content(train_request(round_num=2))), 1, run_config())
    assert not again.has_error()


def test_a_nan_update_is_refused_in_one_log_line_without_a_traceback(caplog):
    # A DP run whose noised model overflowed: the device refuses to clip its NaN update.
    # Without a rider this logged a 20-line traceback (with one, a line): a device's log
    # read as if it had crashed on what is a refusal.
    edge = EdgeClient(TaskSource("deploy_task:make"), 0)
    overflowing = train_request(clip_norm=1.0)
    overflowing.arrays["model"] = torch.full_like(overflowing.arrays["model"], 3e38)
    with caplog.at_level("INFO", logger="fedveil.edge"):
        reply = answer(edge, request_message(to_content(overflowing)), 1, run_config())
    assert reply.has_error() and "contains NaN or Inf" in reply.error.reason
    failed = [r for r in caplog.records if "failed" in r.getMessage()]
    assert len(failed) == 1 and failed[0].exc_info is None, caplog.text
    assert failed[0].levelname == "WARNING"
    assert failed[0].getMessage() == f"run 1: train request failed: {reply.error.reason}"


# -- plain evaluation: the coordinator that skips its own config checks ----------------
DISTRIBUTED = {
    "secagg.enabled": True,
    "dp.mechanism": "distributed",
    "dp.epsilon": 8.0,
    "dp.clip": 1.0,
}


def clear_evaluation_replies(edge, config):
    """The device's replies, through its real message path (answer), to a plain evaluate
    request and to one riding on a key-stage message."""
    plain = answer(edge, request_message(to_content(evaluate_request()), "evaluate"), 1, config)
    advertise = Envelope("secagg.advertise", 1, dict(SETUP))
    riding = attach(advertise, evaluate_request(round_num=2))
    ridden = answer(edge, request_message(to_content(riding), "secagg.advertise"), 1, config)
    return plain, ridden


def assert_nothing_left(reply):
    # An error reply carries no content: no accuracy, loss or example count.
    assert reply.has_error() and reply.error.code == BAD_MESSAGE and not reply.has_content()


def test_a_device_requiring_secagg_never_evaluates_in_the_clear():
    edge = EdgeClient(TaskSource("deploy_task:make"), 0, LocalPolicy(require_secagg=True))
    plain, ridden = clear_evaluation_replies(edge, run_config())
    assert_nothing_left(plain)
    assert "--require-secagg" in plain.error.reason and "in the clear" in plain.error.reason
    assert_nothing_left(ridden)
    assert "'evaluate' rider" in ridden.error.reason
    # The secure path stays open: an evaluation as a masked input passes the policy.
    secure = Envelope("secagg.masked_input", 1, {"input": "evaluation", "eval_loss_cap": 5.0}, {})
    assert edge.policy.apply(secure, 10, None) == (secure, False)
    # A stock Flower evaluate says why too.
    assert "accuracy and loss in the clear" in edge.policy.stock_refusal("evaluate")


def test_under_distributed_dp_every_device_refuses_a_plain_evaluation():
    """Without --require-secagg: the run config the device accepted says distributed DP,
    so the coordinator would see this device's accuracy un-noised; refused."""
    edge = EdgeClient(TaskSource("deploy_task:make"), 0)
    plain, ridden = clear_evaluation_replies(edge, run_config(**DISTRIBUTED))
    assert_nothing_left(plain)
    assert "dp.mechanism = 'distributed'" in plain.error.reason
    assert "in the clear" in plain.error.reason
    assert_nothing_left(ridden)
    # The same device in a run without distributed DP answers the evaluation.
    other = EdgeClient(TaskSource("deploy_task:make"), 0)
    central = run_config(**{**DISTRIBUTED, "dp.mechanism": "central"})
    ok = answer(other, request_message(to_content(evaluate_request()), "evaluate"), 1, central)
    assert not ok.has_error()
    assert from_content(ok.content).config["num_examples"] > 0


def _rss() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith("VmRSS:"))


def test_a_request_cannot_make_the_device_build_a_huge_model(tmp_path):
    """run_num_classes = 1e6 once raised a device's RSS by ~1 GB on one message, and the
    runtime stayed cached. It is refused against the device's limit before anything is
    built; nothing is kept, and the run's next honest request is served."""
    data = DataSource(load_local_data(write_client_file(tmp_path, N, 1, "npz")))
    edge = EdgeClient(data, 1)
    before = _rss()
    huge = train_request(run_num_classes=1_000_000)
    with pytest.raises(MessageError, match="has 129001152 parameters; this device accepts at most"):
        edge.handle(1, run_config(), huge)
    with pytest.raises(MessageError, match=r"run_num_classes = 10000000000000: .* 1 to 20000000"):
        edge.handle(1, run_config(), train_request(run_num_classes=10**13))
    assert _rss() - before < 64 << 20
    small = EdgeClient(data, 1, LocalPolicy(max_model_parameters=100))
    with pytest.raises(MessageError, match="accepts at most 100 "):
        small.handle(1, run_config(), train_request())
    reply = edge.handle(1, run_config(), train_request())
    assert reply.kind == "train" and reply.arrays


# -- a device whose training diverges ----------------------------------------------
@pytest.mark.parametrize("clip", [0.0, 1.0], ids=["plain", "clipped"])
def test_a_diverged_update_is_refused_by_name_never_sent(caplog, clip):
    # Before: the plain reply carried the NaN update and loss to the coordinator, and a
    # clipped one failed in the clipper with a traceback in the device's log.
    import tiny_task

    edge = EdgeClient(TaskSource("tiny_task:make_nan"), 0)  # features all NaN
    config = run_config(**{"model.task": "tiny_task:make_nan"})
    request = train_request(clip_norm=clip)
    tiny = tiny_task.make(load_config(None, {"data.num_clients": N, "server.per_round": N}))
    request.arrays["model"] = FlatModel(tiny.model_fn()).get()
    with caplog.at_level("INFO", logger="fedveil.edge"):
        reply = answer(edge, request_message(to_content(request)), 1, config)
    assert reply.has_error() and reply.error.code == CLIENT_FAILURE, reply
    reason = reply.error.reason
    assert reason.startswith("array 'delta' contains NaN or Inf (195 of 195 values) after")
    assert reason.endswith("in round 1: update refused, not sent")
    assert drop_check(reason) == "NaN or Inf in the update"  # the coordinator's count
    failed = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(failed) == 1 and failed[0].exc_info is None  # one line, no traceback
    assert failed[0].getMessage() == f"run 1: train request failed: {reason}"
