"""A client holding a distributed-DP plan enforces it, whatever the coordinator asks.

The coordinator is played through the real message path of a simulation: the round
engine with a privacy pipeline, the in-process transport and the client runtime, where
the clients hold the run's distributed-DP config and the coordinator either runs
another pipeline (plain secure aggregation: names `quantized`, no clip, example
weighting) or tampers with the honest masked-input requests."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import pytest

import tiny_task
from fedveil.config import load_config
from fedveil.protocol import fields as F
from fedveil.protocol.envelope import Envelope
from fedveil.protocol.kinds import Kind
from fedveil.server.engine.pipeline import make_privacy_pipeline
from fedveil.server.engine.rounds import RoundEngine
from fedveil.server.engine.transport import ClientFailure, ReplySink
from fedveil.simulations.inprocess import InProcessTransport

DISTRIBUTED = {
    "secagg.enabled": True,
    "dp.mechanism": "distributed",
    "dp.epsilon": 8.0,
    "dp.clip": 1.0,
}


def config(tmp_path, **overrides):
    values = {
        "model.task": "tiny_task:make",
        "data.num_clients": 10,
        "server.per_round": 8,
        "server.rounds": 2,
        "out": str(tmp_path / "run"),
        **overrides,
    }
    return load_config(None, values)


Tamper = Callable[[Envelope], None]


class CoordinatorsWire(InProcessTransport):
    """The in-process transport, with the coordinator's hand on each masked-input request
    (`tamper` edits it in place), keeping the clients' answers to those requests."""

    def __init__(self, *args, tamper: Tamper | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.tamper = tamper
        self.masked_input_replies: dict[int, Envelope | ClientFailure] = {}

    def exchange(
        self,
        requests: Mapping[int, Envelope],
        timeout_s: float | None,
        on_reply: ReplySink | None = None,
    ):
        masked = {cid for cid, msg in requests.items() if msg.kind == Kind.SECAGG_MASKED_INPUT}
        if self.tamper is not None:
            for cid in masked:
                self.tamper(requests[cid])
        replies = super().exchange(requests, timeout_s)
        self.masked_input_replies.update({cid: replies[cid] for cid in masked})
        return replies


def one_round(server_cfg, client_cfg, tmp_path, tamper: Tamper | None = None):
    """One round of the server's pipeline against clients holding `client_cfg`."""
    task = tiny_task.make(client_cfg)
    privacy, channel = make_privacy_pipeline(server_cfg, task, tmp_path / "ledger.jsonl")
    wire = CoordinatorsWire(task, run_config=client_cfg, tamper=tamper)
    engine = RoundEngine(server_cfg, task, wire, channel=channel, privacy=privacy)
    return engine.run_round(), wire


def refusals(wire: CoordinatorsWire) -> list[str]:
    replies = wire.masked_input_replies
    assert replies, "the round reached no masked-input stage"
    assert all(isinstance(r, ClientFailure) for r in replies.values()), replies
    return [r.reason for r in replies.values()]  # type: ignore[union-attr]


def test_a_coordinator_running_plain_secure_aggregation_gets_nothing(tmp_path):
    """The issue's downgrade: the clients accepted distributed DP at epsilon 8; the
    coordinator runs plain secure aggregation, whose masked-input requests name the
    `quantized` encoding (the sum without noise, with the mean loss), no clip and
    example weighting. Every client refuses, naming what was asked and its plan."""
    held = config(tmp_path, **DISTRIBUTED)
    downgraded = config(tmp_path, **{"secagg.enabled": True})
    record, wire = one_round(downgraded, held, tmp_path)
    for reason in refusals(wire):
        assert "enc.kind = 'quantized' in the request" in reason
        assert "plan says 'skellam'" in reason
    assert record.cohort_aggregated == 0 and not record.applied


def _quantized(msg: Envelope) -> None:
    msg.config.update(
        {
            F.ENC_KIND: "quantized",
            F.ENC_CLIP_RANGE: 1.0,
            F.ENC_LEVELS: 1 << 12,
            F.ENC_MAX_CLIENTS: 8,
            F.ENC_MAX_WEIGHT: 1,
        }
    )


def _evaluation(msg: Envelope) -> None:
    msg.config.update({F.INPUT: F.INPUT_EVALUATION, F.EVAL_LOSS_CAP: 5.0})


@pytest.mark.parametrize(
    ("tamper", "named"),
    [
        (
            _quantized,
            "enc.kind = 'quantized' in the request; this client's distributed-DP "
            "plan says 'skellam'",
        ),
        (lambda m: m.config.pop(F.CLIP_NORM), "clip_norm = '(missing)' in the request"),
        (lambda m: m.config.update({F.CLIP_NORM: 50.0}), "clip_norm = 50.0 in the request"),
        (lambda m: m.config.update({F.CLIP_NORM: float("nan")}), "clip_norm = nan in the"),
        (
            lambda m: m.config.update({F.WEIGHTING: F.WEIGHT_BY_EXAMPLES}),
            "weighting = 'examples' in the request; this client's distributed-DP plan says "
            "'uniform'",
        ),
        (_evaluation, "input = 'evaluation' in the request"),
    ],
    ids=["quantized", "no-clip", "other-clip", "nan-clip", "example-weighting", "evaluation"],
)
def test_a_masked_input_that_is_not_the_plan_is_refused(tmp_path, tamper, named):
    """The honest distributed-DP pipeline, with one field of its masked-input requests
    changed on the way: every client refuses before training, and nothing is unmasked."""
    cfg = config(tmp_path, **DISTRIBUTED)
    record, wire = one_round(cfg, cfg, tmp_path, tamper)
    for reason in refusals(wire):
        assert named in reason
    assert record.cohort_aggregated == 0 and not record.applied


def test_the_honest_plan_is_answered(tmp_path):
    """The same harness untouched: the round aggregates (the refusals above are the plan's)."""
    cfg = config(tmp_path, **DISTRIBUTED)
    record, wire = one_round(cfg, cfg, tmp_path)
    assert all(isinstance(r, Envelope) for r in wire.masked_input_replies.values())
    assert record.cohort_aggregated == 8 and record.applied
