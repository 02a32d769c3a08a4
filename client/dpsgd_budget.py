"""A device's own DP-SGD accounting: the example-level epsilon of what it actually trained.

A noise floor alone (`--min-dp-noise`) does not bound a device's epsilon: the coordinator
also sets the batch size (so the sampling rate batch / n) and the epochs (so the steps).
So the device accounts every DP-SGD round itself, from its own example count n, with the
project's accountant (the one DP-SGD sessions resolve to: `privacy/dp/accounting.py`),
and refuses a round that would take the composition past its cap (`--max-dp-epsilon`).

Contract:
- `DpSgdLedger(directory, max_epsilon, delta)` keeps one JSON line per trained round in
  `directory/<run>.jsonl` (directory 700, files 600, fsynced), so the figure holds across
  requests, runs and device restarts. The cap bounds the composition over every run in
  the directory: the runs train on the same examples, and a new run must not reset it.
- `ledger.for_run(run)` is the `DpSgdBudget` a client runtime charges:
  `admit(noise, rate, steps)` computes the epsilon after the round, refuses it
  (`DpSgdBudgetExceeded`, a MessageError naming the cap and the figure) when it is not
  <= the cap, and otherwise writes the round to disk before any training, so a crash
  never forgets a round whose update may have left. `check_ran(steps)` refuses to
  answer when the trainer ran more steps than were charged.
- max_epsilon 0: no cap; the figure is still accounted and logged.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import threading
from pathlib import Path

from fedveil.privacy.dp.accounting import compute_epsilon
from fedveil.privacy.dp.events import PrivacyEvent
from fedveil.protocol.dp_rules import ADD_REMOVE, DP_SGD, POISSON, default_accountant
from fedveil.protocol.envelope import MessageError

log = logging.getLogger("fedveil.edge")

DEFAULT_DELTA = 1e-5
_RUN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class DpSgdBudgetExceeded(MessageError):
    """A DP-SGD round would take this device past its epsilon cap."""


class DpSgdLedger:
    """Every DP-SGD round this device trained, on disk, and its cap (see module doc)."""

    def __init__(
        self, directory: str | os.PathLike[str], max_epsilon: float, delta: float = DEFAULT_DELTA
    ) -> None:
        if not (math.isfinite(max_epsilon) and max_epsilon >= 0):
            raise ValueError(f"max_dp_epsilon = {max_epsilon!r}: must be a finite number >= 0")
        if not (0 < delta < 1):
            raise ValueError(f"dp_delta = {delta!r}: must be in (0, 1)")
        self.directory = Path(directory)
        self.max_epsilon = max_epsilon
        self.delta = delta
        self.accountant = default_accountant(DP_SGD, POISSON, ADD_REMOVE)
        self._lock = threading.Lock()

    def for_run(self, run: str) -> DpSgdBudget:
        if not _RUN_NAME.match(run):
            raise ValueError(f"run {run!r}: not a plain file name")
        return DpSgdBudget(self, run)

    def events(self, run: str | None = None) -> list[PrivacyEvent]:
        """The rounds on disk: of `run`, or of every run (None)."""
        if not self.directory.is_dir():
            return []
        paths = (
            [self.directory / f"{run}.jsonl"]
            if run is not None
            else sorted(self.directory.glob("*.jsonl"))
        )
        events = []
        for path in paths:
            if not path.exists():
                continue
            for line in path.read_text().splitlines():
                if line.strip():
                    row = json.loads(line)
                    events.append(
                        PrivacyEvent(
                            float(row["noise_multiplier"]),
                            float(row["sample_rate"]),
                            int(row["steps"]),
                        )
                    )
        return events

    def epsilon(self, events: list[PrivacyEvent]) -> float:
        return compute_epsilon(events, self.delta, self.accountant) if events else 0.0

    def spent(self) -> float:
        """This device's example-level epsilon over every run so far."""
        return self.epsilon(self.events())

    def charge(self, run: str, round_num: int, noise: float, rate: float, steps: int) -> float:
        """Write one DP-SGD round of `run` to disk unless it takes the composition over
        every run past the cap; the epsilon after it."""
        try:
            event = PrivacyEvent(noise, rate, steps)
        except ValueError as exc:
            raise MessageError(f"DP-SGD round: {exc}") from None
        with self._lock:
            before = self.events()
            after = self.epsilon([*before, event])
            cap = self.max_epsilon
            if cap > 0 and not (after <= cap):
                spent = self.epsilon(before)
                log.warning(
                    "run %s round %d: DP-SGD refused: this device's epsilon would be %.4g > "
                    "cap %g (delta %g; %.4g spent)",
                    run,
                    round_num,
                    after,
                    cap,
                    self.delta,
                    spent,
                )
                raise DpSgdBudgetExceeded(
                    f"local policy: this DP-SGD round (dp_sgd_noise = {noise:g}, sampling "
                    f"rate {rate:.4g} from batch_size, {steps} steps from the epochs) would "
                    f"take this device's example-level epsilon to {after:.4g} at delta "
                    f"{self.delta:g}, above its cap --max-dp-epsilon {cap:g} (spent so far: "
                    f"{spent:.4g})"
                )
            row = {"round": round_num, "noise_multiplier": noise, "sample_rate": rate}
            self._append(run, row | {"steps": steps})
        this_run = self.epsilon(self.events(run))
        log.info(
            "run %s round %d: DP-SGD epsilon of this device %.4g at delta %g (this run %.4g; "
            "cap %s)",
            run,
            round_num,
            after,
            self.delta,
            this_run,
            f"{cap:g}" if cap > 0 else "none",
        )
        return after

    def _append(self, run: str, row: dict[str, float | int]) -> None:
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.directory, 0o700)  # mkdir's mode is masked by the umask
        path = self.directory / f"{run}.jsonl"
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, (json.dumps(row, sort_keys=True) + "\n").encode("ascii"))
            os.fsync(fd)  # charged before the update can leave
        finally:
            os.close(fd)


class DpSgdBudget:
    """One run's view of the device's DpSgdLedger: what a ClientRuntime charges."""

    def __init__(self, ledger: DpSgdLedger, run: str) -> None:
        self.ledger, self.run = ledger, run
        self._charged_steps = 0

    def admit(self, round_num: int, noise: float, rate: float, steps: int) -> float:
        """Charge one DP-SGD round of `steps` steps at Poisson rate `rate` and noise
        multiplier `noise`; the device's epsilon after it. Refused past the cap."""
        after = self.ledger.charge(self.run, round_num, noise, rate, steps)
        self._charged_steps = steps
        return after

    def check_ran(self, steps: int) -> None:
        """Refuse to answer when training ran more noised steps than were charged."""
        if not (steps <= self._charged_steps):
            raise MessageError(
                f"DP-SGD ran {steps} steps, {self._charged_steps} were accounted: the "
                "update is not sent"
            )
