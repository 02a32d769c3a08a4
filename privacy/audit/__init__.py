"""Empirical privacy audits: what an adversary achieves against a run, next to what the
accountant claims.

Pure analysis (numpy/scipy, the accountants): the canary harness that produces the
statistics lives in `fedveil.simulations.audit`.

- `fdp`: the verdict. The one-run f-DP audit (Mahloujifar, Melis and Chaudhuri, ICML
  2025) against the trade-off curve of the accountant's own profile (`tradeoff`), at
  99%, with the ceiling the design reaches for the canary count.
- `lower_bound`: the one-run lower bound (Steinke, Nasr and Jagielski, NeurIPS 2023),
  its delta term included: a second, conservative line.
- `estimate`: one-shot empirical epsilon (Andrew et al., ICLR 2024). An estimate, not a
  bound.
- `canaries`: Dirac canaries (one coordinate each) and their statistic.
- `canary_sums`: the idealised simulation of the mechanism on the canaries' statistics.
"""

from fedveil.privacy.audit.canaries import dirac_coordinates, projection_sums, supported_canaries
from fedveil.privacy.audit.estimate import (
    EmpiricalEstimate,
    estimate_epsilon,
    gaussian_pair_epsilon,
    hockey_stick,
)
from fedveil.privacy.audit.fdp import (
    FdpAudit,
    ceiling_epsilon,
    correct_guesses,
    fdp_audit,
    tail_bound,
)
from fedveil.privacy.audit.lower_bound import (
    LowerBound,
    binomial_epsilon_bound,
    one_run_lower_bound,
    steinke_tail,
)
from fedveil.privacy.audit.tradeoff import TradeoffCurve, claimed_curve

__all__ = [
    "EmpiricalEstimate",
    "FdpAudit",
    "LowerBound",
    "TradeoffCurve",
    "binomial_epsilon_bound",
    "ceiling_epsilon",
    "claimed_curve",
    "correct_guesses",
    "dirac_coordinates",
    "estimate_epsilon",
    "fdp_audit",
    "gaussian_pair_epsilon",
    "hockey_stick",
    "one_run_lower_bound",
    "projection_sums",
    "steinke_tail",
    "supported_canaries",
    "tail_bound",
]
