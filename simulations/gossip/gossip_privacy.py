"""What a gossip run's privacy report may say (privacy/gossip.json in the run directory).

Contract. Gossip has no coordinator and no sum: every neighbour receives a client's
whole model each round, and mixing carries it on to every other client. So
- secure aggregation's guarantee does not apply (the config refuses secagg);
- central and distributed DP do not apply (refused too);
- the only figure offered is DP-SGD on each client (client.dp_sgd_noise > 0):
  example-level (epsilon, delta) of the client's own data, accounted per client
  from its own example count (sampling rate batch_size / n_i, the steps its
  epochs plan, every round composed), with the accountant DP-SGD sessions use.
  It holds against anyone who sees any of the client's models (a neighbour,
  every other client, whoever gets the consensus model): post-processing.
- without DP-SGD the report says that nothing holds against a neighbour.
The network-DP amplification of noisy gossip (Cyffers et al. 2022, "Muffliato")
is described with its assumptions but never reported as a figure: it holds only
against non-neighbours who see nothing but their own incoming messages, and only
when the noise is added to the gossiped values themselves.
"""

from __future__ import annotations

import statistics
from typing import Any

from fedveil.client.training import LocalTraining, dp_sgd_plan
from fedveil.config import RunConfig
from fedveil.privacy.dp.accounting import compute_epsilon
from fedveil.privacy.dp.events import PrivacyEvent
from fedveil.protocol.dp_rules import ADD_REMOVE, DP_SGD, POISSON, default_accountant

NO_SECAGG = (
    "does not apply: each neighbour receives this client's whole model every round, in "
    "the clear, and mixing passes it on to every other client; there is no sum to hide it in"
)
NO_NEIGHBOUR_GUARANTEE = (
    "none: without DP-SGD a neighbour receives the model trained on the client's data as "
    "it is (update inversion and membership attacks apply to it)"
)
MUFFLIATO = (
    "not reported. Muffliato (Cyffers et al. 2022) bounds what a NON-neighbour learns "
    "from noisy gossip, assuming the noise is added to every gossiped value, that the "
    "attacker sees only the messages it receives itself (no collusion with the client's "
    "neighbours), and a known graph and number of steps. fedveil's DP-SGD noise is added "
    "to gradients, not to gossiped values, and a neighbour is always an observer: no "
    "figure of it is given here"
)


def client_epsilons(cfg: RunConfig, sizes: list[int], rounds: int) -> list[float]:
    """Each client's example-level epsilon after `rounds` DP-SGD rounds (delta = dp.delta)."""
    c = cfg.client
    hp = LocalTraining(
        local_epochs=c.local_epochs,
        local_steps=c.local_steps,
        batch_size=c.batch_size,
        lr=c.lr,
        momentum=c.momentum,
        weight_decay=c.weight_decay,
    )
    accountant = default_accountant(DP_SGD, POISSON, ADD_REMOVE)
    cache: dict[tuple[float, int], float] = {}
    out = []
    for n in sizes:
        rate, steps = dp_sgd_plan(hp, n)
        key = (rate, steps)
        if key not in cache:
            event = PrivacyEvent(c.dp_sgd_noise, rate, steps * rounds)
            cache[key] = compute_epsilon([event], cfg.dp.delta, accountant)
        out.append(cache[key])
    return out


def gossip_privacy_report(
    cfg: RunConfig, sizes: list[int], rounds: int, degrees: list[int]
) -> dict[str, Any]:
    """The report: who sees what, and the one guarantee that holds (if any)."""
    report: dict[str, Any] = {
        "aggregation": "gossip",
        "topology": cfg.gossip.topology,
        "neighbours_per_client": {"min": min(degrees), "max": max(degrees)},
        "rounds": rounds,
        "who_sees_what": {
            "each neighbour": "this client's whole model after its local training, every round",
            "every other client": "models that mix this client's in (after a few rounds)",
            "whoever gets the consensus model": "the average of every client's model",
            "a coordinator": "none exists",
        },
        "secure_aggregation": NO_SECAGG,
        "central_or_distributed_dp": "does not apply: no coordinator releases a noised sum",
        "network_dp": MUFFLIATO,
    }
    if not cfg.client.dp_sgd_noise > 0:
        report["client_dp_sgd"] = None
        report["against_a_neighbour"] = NO_NEIGHBOUR_GUARANTEE
        return report
    eps = client_epsilons(cfg, sizes, rounds)
    report["client_dp_sgd"] = {
        "unit": "one training example of the client's own data (add/remove)",
        "noise_multiplier": cfg.client.dp_sgd_noise,
        "clip": cfg.client.dp_sgd_clip,
        "delta": cfg.dp.delta,
        "accountant": default_accountant(DP_SGD, POISSON, ADD_REMOVE),
        "epsilon_per_client": {
            "min": min(eps),
            "median": statistics.median(eps),
            "max": max(eps),
        },
        "accounted_from": "each client's own example count: sampling rate batch_size / n, "
        "the steps its epochs plan (an upper bound on those run), all rounds composed (with "
        "gossip.active a client trains only in the rounds it wakes: an upper bound too; no "
        "amplification by the random wake-ups is claimed)",
    }
    report["against_a_neighbour"] = (
        f"example-level ({max(eps):.4g}, {cfg.dp.delta:g})-DP for every client (the largest "
        "client epsilon): DP-SGD protects each model the client sends, and anything "
        "computed from it"
    )
    return report
