"""The device refuses to be the coordinator's unwitnessed party.

For every request of a run, before anything else runs on the device:

- A DP training request (a `train` or a training masked input, in a run whose accepted
  config has a release mechanism or DP-SGD, or any request naming `dp_sgd_noise`)
  without a ledger head is refused.
- A head that is present is checked (privacy/dp/ledger_head.py): on the run's first
  head the device pins the ledger key from the signed opening record, and logs
  "pinned ledger key ..."; every head after that must verify under that key, chain to
  that opening, and never roll back or fork. Otherwise the request is refused.
- Each head that passes is kept in the witness store (witness.py), which the auditor
  checks with `fedveil privacy verify --witness`.

Pins are per Flower run. With a witness store they are also written to
`<witness dir>/pins/<flower run>.json` (600), so a device restarted within a run keeps
the key it pinned and the highest seq it saw (rolled-back heads stay refused).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path

from fedveil.client.edge.witness import WitnessStore, _append_private
from fedveil.config import RunConfig
from fedveil.privacy.dp.ledger import WITNESS_CONFIG_KEY, canonical_json
from fedveil.privacy.dp.ledger_head import (
    LedgerPin,
    check_head,
    is_dp_run,
    parse_head_message,
    pin_opening,
)
from fedveil.protocol.envelope import Envelope, MessageError
from fedveil.protocol.fields import DP_SGD_NOISE
from fedveil.protocol.kinds import trains

log = logging.getLogger("fedveil.edge")


class LedgerRefusal(MessageError):
    """The request's ledger head is missing, forged, rolled back or under another key."""


class LedgerGuard:
    """Pins each run's ledger key and checks every request's head (module doc)."""

    def __init__(self, store: WitnessStore | None = None) -> None:
        self.store = store
        self._pins: dict[int, LedgerPin] = {}  # Flower run id -> pin
        self._seen: dict[str, dict[int, str]] = {}  # ledger run id -> {seq: hash}
        self._lock = threading.Lock()

    def pin(self, flower_run: int) -> LedgerPin | None:
        """The ledger pinned for a Flower run, if any (loaded from the store if kept)."""
        if flower_run not in self._pins and self.store is not None:
            path = self._pin_path(flower_run)
            if path.exists():
                self._pins[flower_run] = pin_opening(json.loads(path.read_text()))
        return self._pins.get(flower_run)

    def check(self, flower_run: int, cfg: RunConfig, request: Envelope) -> None:
        """Raise LedgerRefusal unless `request` may go on (module doc)."""
        raw = request.config.get(WITNESS_CONFIG_KEY)
        if raw is None:
            if is_dp_request(cfg, request):
                raise LedgerRefusal(
                    f"{request.kind} request of a DP run carries no {WITNESS_CONFIG_KEY}: "
                    "this device trains for a DP run only against a signed ledger head it "
                    "can verify and keep (the coordinator's release would go unwitnessed)"
                )
            return
        try:
            with self._lock:
                self._check_head(flower_run, parse_head_message(raw))
        except ValueError as error:  # HeadRefused, and the witness store's own checks
            raise LedgerRefusal(f"{request.kind} request refused: {error}") from None

    def _check_head(self, flower_run: int, head: dict) -> None:
        pin = self.pin(flower_run)
        if pin is None:
            pin = pin_opening(head["opening"])
            self._keep_pin(flower_run, pin)
            log.info(
                "run %d: pinned ledger key %s (ledger run %s, opening %s): every DP request "
                "of this run must carry a head signed by it, chaining to that opening",
                flower_run,
                pin.key_id,
                pin.run_id,
                pin.opening_hash[:16],
            )
        seen = self._seen_for(pin.run_id)
        witness = check_head(pin, head, seen)
        if self.store is not None:
            self.store.record(canonical_json(witness))
        seen[int(witness["seq"])] = str(witness["hash"])

    def _seen_for(self, run_id: str) -> dict[int, str]:
        if run_id not in self._seen:
            kept = self.store.heads(run_id) if self.store is not None else []
            self._seen[run_id] = {int(h["seq"]): str(h["hash"]) for h in kept}
        return self._seen[run_id]

    def _pin_path(self, flower_run: int) -> Path:
        assert self.store is not None
        return self.store.directory / "pins" / f"{int(flower_run)}.json"

    def _keep_pin(self, flower_run: int, pin: LedgerPin) -> None:
        self._pins[flower_run] = pin
        if self.store is not None:
            path = self._pin_path(flower_run)
            if not path.exists():
                self.store.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
                os.chmod(self.store.directory, 0o700)
                _append_private(path.parent, path, canonical_json(pin.opening) + "\n")


def is_dp_request(cfg: RunConfig, request: Envelope) -> bool:
    """A training request of a DP run, or one that names DP-SGD noise whatever the run."""
    if not trains(request.kind, request.config):
        return False
    return is_dp_run(cfg) or DP_SGD_NOISE in request.config
