"""What a client whose run config has DP-SGD trains with, whatever a request says.

A run config with `client.dp_sgd_noise > 0` is a run whose updates carry example-level
DP-SGD noise. The coordinator sends the noise, the clip and the hyper-parameters with
each training request (server/engine/requests.py), so without a check of its own a
client would train with whatever arrived: a request without `dp_sgd_noise` (or with 0)
would switch DP-SGD off and send the update, the example count and the exact loss; a
lower noise multiplier, a larger clip, a larger batch (rate batch / n) or more steps
would each spend more epsilon than the run states. A client holding such a run config
therefore trains only when the request is at least as private as its own config:

- `dp_sgd_noise` >= client.dp_sgd_noise and `dp_sgd_clip` in (0, client.dp_sgd_clip];
- the sampling rate and the noised steps the request implies on this client's own data
  (client/training.py's `dp_sgd_plan`) spend no more epsilon in the round, at the run
  config's noise, than the batch size and epochs of its run config (at most both: no
  accounting needed; else the two rounds' epsilons are compared, with the accountant a
  device charges its DP-SGD with: client/dpsgd_budget.py).

A device's own flags (`--min-dp-noise`, `--max-dp-epsilon`) still apply on top. Each
check is written so that a NaN, an infinity, a string or a missing field fails it
(fedveil/protocol/numbers.py), and each refusal names the field, the value and the
run config's limit, before any training.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedveil.client.training import LocalTraining, dp_sgd_plan
from fedveil.privacy.dp.accounting import compute_epsilon
from fedveil.privacy.dp.events import PrivacyEvent
from fedveil.protocol import fields as F
from fedveil.protocol.dp_rules import ADD_REMOVE, DP_SGD, POISSON, default_accountant
from fedveil.protocol.envelope import Envelope, MessageError
from fedveil.protocol.numbers import request_number

if TYPE_CHECKING:
    from fedveil.config import RunConfig


class DpSgdRefusal(MessageError):
    """A training request less private than the DP-SGD of the client's own run config."""


def check_dp_sgd_request(
    cfg: RunConfig, msg: Envelope, hp: LocalTraining, num_examples: int
) -> None:
    """Refuse `msg` (whose hyper-parameters parse to `hp`) if it trains with less DP-SGD
    than `cfg` states on this client's `num_examples`; nothing to check without DP-SGD."""
    c = cfg.client
    if not (c.dp_sgd_noise > 0):
        return
    where = f"{msg.kind} message"
    why = (
        f"this client's run config has DP-SGD (client.dp_sgd_noise = {c.dp_sgd_noise:g}, "
        f"client.dp_sgd_clip = {c.dp_sgd_clip:g}): it trains with no less"
    )
    try:
        request_number(msg.config, F.DP_SGD_NOISE, at_least=c.dp_sgd_noise, where=where)
        request_number(msg.config, F.DP_SGD_CLIP, above=0.0, at_most=c.dp_sgd_clip, where=where)
    except MessageError as exc:
        raise DpSgdRefusal(f"{exc}: {why}") from None
    planned = LocalTraining(
        local_epochs=c.local_epochs, local_steps=c.local_steps, batch_size=c.batch_size
    )
    rate, steps = dp_sgd_plan(hp, num_examples)
    own_rate, own_steps = dp_sgd_plan(planned, num_examples)
    if rate <= own_rate and steps <= own_steps:
        return  # no more than the run config on either count (the honest request)
    # A smaller batch with more steps (or the reverse) may still spend no more: compare
    # the round's epsilon with the one the run config states, at its noise.
    delta = cfg.dp.delta
    asked = _round_epsilon(c.dp_sgd_noise, rate, steps, delta)
    allowed = _round_epsilon(c.dp_sgd_noise, own_rate, own_steps, delta)
    if not (asked <= allowed):
        raise DpSgdRefusal(
            f"{where}: fields {F.BATCH_SIZE!r} = {hp.batch_size}, {F.LOCAL_EPOCHS!r} = "
            f"{hp.local_epochs} and {F.LOCAL_STEPS!r} = {hp.local_steps} give {steps} DP-SGD "
            f"steps at sampling rate {rate:.4g} on this client's data, epsilon {asked:.4g} "
            f"per round at delta {delta:g}; its run config (client.batch_size = "
            f"{c.batch_size}, client.local_epochs = {c.local_epochs}, client.local_steps = "
            f"{c.local_steps}) gives {allowed:.4g}, the most it spends per round"
        )


def _round_epsilon(noise: float, rate: float, steps: int, delta: float) -> float:
    """One round's example-level DP-SGD epsilon, with the accountant a device charges."""
    event = PrivacyEvent(noise, rate, steps)
    return compute_epsilon([event], delta, default_accountant(DP_SGD, POISSON, ADD_REMOVE))
