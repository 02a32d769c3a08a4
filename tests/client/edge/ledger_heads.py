"""The head of a signed, opened ledger, as a coordinator's DP requests carry it.

A device refuses DP training without a head it can verify (issue 28, ledger_guard.py),
so tests of the device's other checks (the pinned plan, the DP-SGD cap, the noise floor)
attach one, made by the coordinator's own code: a real Ed25519-signed ledger with its
opening record. The ledger file itself is not needed afterwards."""

from __future__ import annotations

import json
import shutil
import tempfile
from functools import lru_cache
from pathlib import Path

from fedveil.config import load_config
from fedveil.privacy.dp import Ledger
from fedveil.privacy.dp.ledger import WITNESS_CONFIG_KEY
from fedveil.privacy.dp.signing import LedgerSigner
from fedveil.protocol.envelope import Envelope
from fedveil.server.engine.ledger_opening import open_ledger, request_head


@lru_cache(maxsize=1)
def ledger_head() -> str:
    """One opened ledger's head, as the request field carries it (JSON)."""
    folder = Path(tempfile.mkdtemp(prefix="fedveil-ledger-head-"))
    try:
        cfg = load_config(None, {"dp.mechanism": "central", "dp.epsilon": 8.0})
        ledger = Ledger(folder / "ledger.jsonl", run_id="run-head", signer=LedgerSigner.generate())
        open_ledger(ledger, cfg, None)
        return json.dumps(request_head(ledger), sort_keys=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def with_ledger_head(msg: Envelope) -> Envelope:
    """`msg` carrying a verifiable ledger head (unless it carries one already)."""
    msg.config.setdefault(WITNESS_CONFIG_KEY, ledger_head())
    return msg
