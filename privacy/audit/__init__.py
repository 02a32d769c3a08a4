"""Empirical privacy audits: what an adversary achieves against a run, next to what the
accountant claims.

Pure analysis (numpy/scipy): the canary harness that produces the scores lives in
`fedveil.simulations.audit`.

- `estimate`: one-shot empirical epsilon (Andrew et al., ICLR 2024, "One-shot Empirical
  Privacy Estimation for Federated Learning"). An estimate, not a bound.
- `lower_bound`: the one-run lower bound (Steinke, Nasr and Jagielski, NeurIPS 2023,
  "Privacy Auditing with One (1) Training Run"). Sound at its confidence, but loose.
- `canaries`: canary directions and the cosine scores both methods consume.
"""

from fedveil.privacy.audit.canaries import canary_directions, cosine_scores, max_round_scores
from fedveil.privacy.audit.estimate import (
    EmpiricalEstimate,
    estimate_epsilon,
    gaussian_pair_epsilon,
    hockey_stick,
)
from fedveil.privacy.audit.lower_bound import (
    LowerBound,
    binomial_epsilon_bound,
    one_run_lower_bound,
)

__all__ = [
    "EmpiricalEstimate",
    "LowerBound",
    "binomial_epsilon_bound",
    "canary_directions",
    "cosine_scores",
    "estimate_epsilon",
    "gaussian_pair_epsilon",
    "hockey_stick",
    "max_round_scores",
    "one_run_lower_bound",
]
