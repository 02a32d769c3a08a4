"""What a run's public views may show: under DP, only what the engine may publish.

Cohort sizes, drop counts and drop reasons reveal who took part in a DP run
(docs/explanation/trust-model.md). The engine writes them to the private annex only;
the API, /metrics and the dashboard filter again here, so a record that ever carried
more is still not served publicly.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from fedveil.server.engine.round_record import PUBLIC_UNDER_DP

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def run_is_dp(run_dir: Path) -> bool:
    """Whether the run's resolved config has DP on (DP-SGD included), or the run has a
    privacy ledger (a DP drift evaluation trains nothing, so its config has no [dp]); True
    when the config cannot be read (fail closed: a public view then shows too little)."""
    if (Path(run_dir) / "privacy" / "ledger.jsonl").exists():
        return True
    try:
        values = tomllib.loads((Path(run_dir) / "config.toml").read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return True
    dp = values.get("dp")
    mechanism = dp.get("mechanism", "none") if isinstance(dp, dict) else "none"
    client = values.get("client")
    dp_sgd = client.get("dp_sgd_noise", 0.0) if isinstance(client, dict) else 0.0
    # DP-SGD alone publishes like any DP run (not == 0: a NaN or a string counts as DP).
    return mechanism != "none" or not (dp_sgd == 0 and not isinstance(dp_sgd, bool))


def public_record(record: dict[str, Any], dp: bool) -> dict[str, Any]:
    """A round record as anyone may read it."""
    return {k: v for k, v in record.items() if k in PUBLIC_UNDER_DP} if dp else record
