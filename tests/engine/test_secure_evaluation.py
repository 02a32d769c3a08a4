"""A DP federated evaluation (the drift evaluation of a DP model) with the real secure-
aggregation channel and the real client runtime, in process, the coordinator played as the
adversary: everything it receives is recorded, and none of it gives a device's accuracy;
the unmasked sum does, the release is that sum plus noise of the stated scale, the signed
ledger verifies, and past the budget nothing is unmasked."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pytest
import torch

from fedveil.config import SecAggSection, load_config
from fedveil.privacy.dp import Ledger, compute_epsilon, verify_ledger
from fedveil.privacy.dp.evaluation import ACCOUNTANT, SENSITIVITY, EvaluationPlan
from fedveil.privacy.dp.signing import load_or_create_signer
from fedveil.privacy.secagg import SIMULATION_RUN_ID, decode_message
from fedveil.privacy.secagg.identity_keys import DerivedIdentities
from fedveil.privacy.secagg.quantize import Quantizer
from fedveil.protocol import fields as F
from fedveil.protocol.envelope import Envelope
from fedveil.protocol.kinds import Kind
from fedveil.protocol.secagg_frame import protocol_part
from fedveil.server.engine.rounds import initial_model
from fedveil.server.engine.secure_evaluation import evaluate_securely
from fedveil.server.engine.transport import ClientFailure, ReplySink
from fedveil.simulations.inprocess import InProcessTransport
from fedveil.tasks import Task, make_task

DEVICES = 40
DELTA = 1e-5
Z = 0.6  # noise std 0.6 sqrt(3) on each sum: the mean of 40 devices to within ~0.03


class Recording:
    """A transport that keeps every request the coordinator sent and reply it received."""

    def __init__(self, inner: InProcessTransport) -> None:
        self.inner = inner
        self.sent: list[dict[int, Envelope]] = []
        self.received: list[dict[int, Envelope | ClientFailure]] = []

    def client_ids(self) -> Sequence[int]:
        return self.inner.client_ids()

    def exchange(
        self,
        requests: Mapping[int, Envelope],
        timeout_s: float | None,
        on_reply: ReplySink | None = None,
    ) -> dict[int, Envelope | ClientFailure]:
        self.sent.append(dict(requests))
        replies = self.inner.exchange(requests, timeout_s)
        self.received.append(dict(replies))
        return replies

    def close(self) -> None:
        self.inner.close()


@pytest.fixture(scope="module")
def task() -> Task:
    overrides = {"model.task": "tiny_task:make", "data.num_clients": DEVICES, "seed": 3}
    return make_task(load_config(None, overrides))


def plan_for(z: float) -> EvaluationPlan:
    """The plan whose epsilon is exactly what the accountant gives for `z` (no calibration)."""
    plan = EvaluationPlan(1.0, DELTA, z, 4.0)
    return EvaluationPlan(compute_epsilon([plan.event()], DELTA, ACCOUNTANT), DELTA, z, 4.0)


def device_accuracies(task: Task, weights: torch.Tensor) -> dict[int, float]:
    """Each device's accuracy on its own held-out examples, computed from its data."""
    model = task.model_fn()
    torch.nn.utils.vector_to_parameters(weights, model.parameters())
    out = {}
    with torch.no_grad():
        for cid in range(DEVICES):
            data = task.client_data(cid)
            pred = model.eval()(data.x_eval).argmax(1)
            out[cid] = float((pred == data.y_eval).float().mean())
    return out


def run(
    task: Task,
    tmp: Path,
    plan: EvaluationPlan,
    *,
    prior: list,
    budget: float,
    identities: DerivedIdentities | None = None,
) -> tuple[dict, dict, Recording, Path, torch.Tensor]:
    """One evaluation; with `identities`, secure aggregation against a malicious server."""
    weights = initial_model(task, 3)
    weights = torch.nn.utils.parameters_to_vector(weights.parameters()).detach()
    ledger_path = tmp / "ledger.jsonl"
    ledger = Ledger(ledger_path, run_id="eval-run", signer=load_or_create_signer())
    threat = "semi_honest" if identities is None else "malicious"
    transport = Recording(InProcessTransport(task, workers=1, identities=identities))
    try:
        result = evaluate_securely(
            transport,
            range(DEVICES),
            weights,
            plan,
            SecAggSection(enabled=True, threat=threat),
            ledger,
            prior=prior,
            budget=budget,
            roster=None if identities is None else identities.roster,
            run_id=SIMULATION_RUN_ID,
        )
    finally:
        transport.close()
    return result.public, result.private, transport, ledger_path, weights


def test_the_coordinator_sees_masked_inputs_and_releases_a_noised_mean(task, tmp_path):
    plan = plan_for(Z)
    public, private, seen, ledger_path, weights = run(
        task, tmp_path, plan, prior=[], budget=plan.epsilon
    )
    truth = device_accuracies(task, weights)
    true_mean = float(np.mean(list(truth.values())))

    # What the coordinator held: requests asking for an evaluation, replies that are
    # protocol messages only; each device's masked input, read as its plain encoding would
    # be, is not its accuracy.
    masked_stage = [
        (sent, got)
        for sent, got in zip(seen.sent, seen.received, strict=True)
        if next(iter(sent.values())).kind == Kind.SECAGG_MASKED_INPUT
    ]
    assert len(masked_stage) == 1
    sent, got = masked_stage[0]
    assert all(env.config[F.INPUT] == F.INPUT_EVALUATION for env in sent.values())
    quantizer = Quantizer(1.0, SecAggSection().levels, DEVICES, 1)
    for replies in seen.received:
        for reply in replies.values():
            assert isinstance(reply, Envelope)
            assert not {F.ACCURACY, F.LOSS, F.NUM_EXAMPLES} & set(reply.config)
    for cid, reply in got.items():
        config, arrays = protocol_part(reply)
        vector = decode_message(config, arrays).masked_vector
        as_plain = quantizer.dequantize_sum(vector[:1].astype(np.int64), 1)[0]
        assert abs(as_plain - truth[cid]) > 1e-4, (cid, as_plain, truth[cid])

    # The unmasked sum is the devices' own (up to one rounding step each) ...
    assert private["clients_answered"] == DEVICES
    assert private["exact_accuracy"] == pytest.approx(true_mean, abs=1e-4)
    # ... and what is published is that sum with noise of the stated scale: within 4 std of
    # the truth (std of the mean ~ sigma sqrt(1 + a^2) / n), and not the exact figure.
    std = plan.noise_std * np.sqrt(1 + true_mean**2) / DEVICES
    assert public["released"] is True
    assert abs(public["federated_accuracy"] - true_mean) < 4 * std
    assert public["federated_accuracy"] != private["exact_accuracy"]
    assert 0.0 <= public["federated_loss"] <= plan.loss_cap
    assert public["noise_std"] == pytest.approx(Z * SENSITIVITY)
    assert not {"clients_asked", "clients_answered", "survivors", "sums"} & set(public)

    result = verify_ledger(ledger_path)
    assert result.ok, result.message
    assert result.releases == 1 and result.final_epsilon == pytest.approx(plan.epsilon)
    entry = Ledger(ledger_path).releases[0]
    assert entry["release"] == "drift_evaluation" and entry["sampling_rate"] == 1.0
    assert entry["clip_norm"] == pytest.approx(np.sqrt(3)) and entry["privacy_unit"] == "user"


def test_past_the_budget_nothing_is_unmasked_or_charged(task, tmp_path):
    plan = plan_for(Z)
    # One evaluation of the version was charged already; a second composes above the budget.
    public, private, seen, ledger_path, _ = run(
        task, tmp_path, plan, prior=[plan.event()], budget=plan.epsilon * 1.2
    )
    assert public["released"] is False and public["aborted"] == "before_unmask"
    assert "budget" in private["aborted"] and public["epsilon"] == 0.0
    kinds = {env.kind for sent in seen.sent for env in sent.values()}
    assert Kind.SECAGG_UNMASK not in kinds and Kind.SECAGG_MASKED_INPUT in kinds
    result = verify_ledger(ledger_path)
    assert result.ok and result.releases == 0 and result.final_epsilon == 0.0


def test_against_a_malicious_server_the_survivors_cosign_before_the_charge(task, tmp_path):
    """The version's threat mode carries over: signed adverts checked against the roster
    and the consistency stage run before unmasking; the release and ledger are as before."""
    plan = plan_for(Z)
    public, private, seen, ledger_path, weights = run(
        task, tmp_path, plan, prior=[], budget=plan.epsilon, identities=DerivedIdentities()
    )
    kinds = [next(iter(sent.values())).kind for sent in seen.sent]
    assert kinds.index(Kind.SECAGG_CONSISTENCY) < kinds.index(Kind.SECAGG_UNMASK)
    true_mean = float(np.mean(list(device_accuracies(task, weights).values())))
    assert public["released"] is True
    assert private["exact_accuracy"] == pytest.approx(true_mean, abs=1e-4)
    assert verify_ledger(ledger_path).ok
