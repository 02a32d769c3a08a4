"""One enrolled device lying in a drift evaluation of a version trained without DP: a
count of 1e12 with accuracy 0 made the summary 7.9e-11 and triggered retraining. Replies
out of range are refused, and each device's weight is capped at the median count, so a
lone liar among k devices moves the accuracy by at most 1/ceil(k/2)."""

from __future__ import annotations

import math

import pytest
import torch

from fedveil.config import load_config
from fedveil.protocol import fields as F
from fedveil.protocol.envelope import Envelope
from fedveil.protocol.kinds import Kind
from fedveil.server.coordinator.drift_run import evaluate_on_devices
from fedveil.server.engine.transport import ClientFailure, ReplySink

HONEST = 0.9


class Devices:
    """The Transport a drift evaluation talks to: honest devices answer HONEST accuracy
    on their counts; `lies` maps a device to the reply config it sends instead."""

    def __init__(self, counts: dict[int, int], lies: dict[int, dict]) -> None:
        self.counts, self.lies = counts, lies

    def exchange(
        self,
        requests: dict[int, Envelope],
        timeout: float | None,
        on_reply: ReplySink | None = None,
    ) -> dict[int, Envelope | ClientFailure]:
        out: dict[int, Envelope | ClientFailure] = {}
        for cid, req in requests.items():
            assert req.kind == Kind.EVALUATE
            config = self.lies.get(cid) or {
                F.NUM_EXAMPLES: self.counts[cid],
                F.ACCURACY: HONEST,
                F.LOSS: 0.3,
            }
            out[cid] = Envelope(Kind.EVALUATE, 0, dict(config), {})
        return out

    def close(self) -> None:
        pass


def evaluate(devices: Devices, k: int) -> dict:
    cfg = load_config(None, {"eval.federated_clients": k})
    return evaluate_on_devices(cfg, devices, list(range(k)), torch.zeros(3))


@pytest.mark.parametrize(
    "lie",
    [
        {F.NUM_EXAMPLES: 10**12, F.ACCURACY: 0.0, F.LOSS: 0.1},  # the attack reproduced
        {F.NUM_EXAMPLES: 10**7, F.ACCURACY: 0.0, F.LOSS: 0.1},  # the training bound
    ],
)
def test_one_lying_device_cannot_move_the_decision(lie: dict) -> None:
    k = 10
    counts = {cid: 40 + 5 * cid for cid in range(k)}
    summary = evaluate(Devices(counts, {3: lie}), k)
    bound = 1 / math.ceil(k / 2)
    assert summary["federated_accuracy"] >= HONEST - bound * HONEST
    assert summary["weight_cap"] <= max(counts.values())  # the liar weighs as an honest one
    # (on the old code: accuracy 9e-11 for 1e12, 2e-4 for 1e7)


def test_replies_out_of_range_are_refused_and_named(caplog: pytest.LogCaptureFixture) -> None:
    lies = {
        0: {F.NUM_EXAMPLES: 100, F.ACCURACY: -5.0, F.LOSS: 0.1},
        1: {F.NUM_EXAMPLES: 100, F.ACCURACY: float("nan"), F.LOSS: 0.1},
        2: {F.NUM_EXAMPLES: 0, F.ACCURACY: 0.5, F.LOSS: 0.1},
        3: {F.NUM_EXAMPLES: 100, F.ACCURACY: 0.5, F.LOSS: float("inf")},
        4: {F.ACCURACY: 0.5, F.LOSS: 0.1},
    }
    summary = evaluate(Devices(dict.fromkeys(range(8), 50), lies), 8)
    assert summary["clients_answered"] == 3 and summary["clients_refused"] == 5
    assert summary["federated_accuracy"] == pytest.approx(HONEST)
    assert "accuracy = -5.0: must be in [0, 1]" in caplog.text
    assert "num_examples = 0: must be an integer in [1, 10000000]" in caplog.text


def test_the_bound_holds_for_any_lie() -> None:
    """Whatever one device sends, the weighted mean stays within 1/ceil(k/2) of the
    honest devices' mean (here all HONEST, with unequal counts)."""
    from fedveil.server.coordinator.drift_run import robust_summary

    for k in (3, 4, 7, 20):
        honest = [
            (cid, {F.NUM_EXAMPLES: 10 + 7 * cid, F.ACCURACY: HONEST, F.LOSS: 0.2})
            for cid in range(1, k)
        ]
        for n in (1, 10, 10**4, 10**7):
            for acc in (0.0, 1.0):
                liar = (0, {F.NUM_EXAMPLES: n, F.ACCURACY: acc, F.LOSS: 0.0})
                got = robust_summary([liar, *honest])
                assert got is not None
                moved = abs(got["federated_accuracy"] - HONEST)
                assert moved <= 1 / math.ceil(k / 2) + 1e-12, (k, n, acc, moved)
