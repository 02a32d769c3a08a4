"""Differential privacy: clipping, mechanisms, accountants, budget, ledger, reports.

Pure logic, no transport: nothing here imports Flower or FastAPI or knows the run
directory layout; files are passed in as paths or file objects.
"""

from fedveil.protocol.dp_rules import sound_accountants, supported_accountants

from .accounting import compute_epsilon, individual_epsilon
from .adaptive_clipping import (
    clip_indicator,
    next_clip_norm,
    noised_count,
    total_noise_multiplier,
    update_noise_multiplier,
)
from .budget import BudgetExceededError, PrivacyBudget, entry_fields
from .calibration import calibrate_noise_multiplier
from .central import add_gaussian_noise
from .clipping import Clipped, check_l2_bound, clip_l2, clip_update, l2_norm
from .config import DpConfig
from .dpsgd import DpSgdSession, make_private_dp_sgd
from .events import PrivacyEvent, event_from_entry, group_events
from .html_report import render_html
from .individual import coordinator_epsilon_after, individual_epsilon_summary, individual_epsilons
from .ledger import GENESIS_HASH, Ledger, LedgerCorruptError, canonical_json, entry_hash
from .report import build_report
from .rng import secure_generator
from .skellam import SkellamEncoder, SkellamParams
from .verify import VerifyResult, verify_ledger

__all__ = [
    "GENESIS_HASH",
    "BudgetExceededError",
    "Clipped",
    "DpConfig",
    "DpSgdSession",
    "Ledger",
    "LedgerCorruptError",
    "PrivacyBudget",
    "PrivacyEvent",
    "SkellamEncoder",
    "SkellamParams",
    "VerifyResult",
    "add_gaussian_noise",
    "build_report",
    "calibrate_noise_multiplier",
    "canonical_json",
    "check_l2_bound",
    "clip_indicator",
    "clip_l2",
    "clip_update",
    "compute_epsilon",
    "coordinator_epsilon_after",
    "entry_fields",
    "entry_hash",
    "event_from_entry",
    "group_events",
    "individual_epsilon",
    "individual_epsilon_summary",
    "individual_epsilons",
    "l2_norm",
    "make_private_dp_sgd",
    "next_clip_norm",
    "noised_count",
    "render_html",
    "secure_generator",
    "sound_accountants",
    "supported_accountants",
    "total_noise_multiplier",
    "update_noise_multiplier",
    "verify_ledger",
]
