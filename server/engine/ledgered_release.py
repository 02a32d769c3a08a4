"""The ledger half every DP release mechanism shares, sync or asynchronous.

`LedgeredRelease` is the base of central_release.CentralDP / AsyncCentralDP and, through
them, distributed_release.DistributedDP / AsyncDistributedDP and ftrl_stage.FtrlDP. It
holds, set up once in `_open` (call it after `config` is set):

- the cohort key the secret cohorts (and secure-aggregation graph seeds) are drawn from,
  from the OS CSPRNG unless a resume passes the run's own; its SHA-256 commitment opens
  the ledger where cohorts are secret (`dp.seeded_cohorts` off);
- the signed ledger, opened before round 1 or the first dispatch (devices pin its key:
  ledger_opening.py), and the privacy budget rebuilt from its releases;
- the operator's private annex (the sink participation figures go to).

and does the same way for every mechanism: a charge (`_charge`: the budget check, then
the ledger entry, durably, the cohort commitment on the first one), the model version of
the last release (`last_round`), and the signed closing record (`close`). What differs
between mechanisms is declared: `_event` (one release's privacy event), the figures the
close writes to the private annex (`_closing_annex`), and the coordinator's figures
(`coordinator_bound`, `coordinator_epsilon`: None under central DP, whose coordinator is
a trusted curator).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypedDict

from fedveil.config import RunConfig
from fedveil.privacy.dp import DpConfig, Ledger, PrivacyBudget
from fedveil.privacy.dp.events import PrivacyEvent
from fedveil.privacy.dp.ledger import MODEL_SHA256
from fedveil.privacy.dp.signing import LedgerSigner
from fedveil.server.engine.dp_from_config import cohorts_are_secret
from fedveil.server.engine.ledger_opening import open_run_ledger
from fedveil.server.engine.sampling import cohort_commitment

# A private record sink: the run's operator-only annex (RunStore.append_private).
PrivateSink = Callable[[dict[str, Any]], None]


class LedgerArgs(TypedDict, total=False):
    """What a DP run's directory gives its mechanism (pipeline.private_run_args): the run
    id its ledger is bound to, the key that signs it, the operator's private annex, and
    the run's cohort key (None or absent: a fresh one from the OS CSPRNG)."""

    run_id: str | None
    signer: LedgerSigner | None
    private: PrivateSink | None
    cohort_key: bytes | None


class LedgeredRelease:
    """Cohort key, signed ledger, budget and private annex of a DP release mechanism."""

    config: DpConfig
    budget_against: str
    cohorts_secret: bool
    cohort_key: bytes
    cohort_commitment: str | None
    ledger: Ledger
    budget: PrivacyBudget
    private: PrivateSink | None

    def _open(self, cfg: RunConfig, ledger_path: Path, args: LedgerArgs) -> None:
        """Everything but `config` (the mechanism's own, set first): the cohort key and
        its commitment, the opened ledger, the budget from its releases, the annex."""
        self.cohorts_secret = cohorts_are_secret(cfg)
        # Kept only in the run's private directory; its commitment opens the ledger.
        key = args.get("cohort_key")
        self.cohort_key = key if key is not None else secrets.token_bytes(32)
        self.cohort_commitment = cohort_commitment(self.cohort_key) if self.cohorts_secret else None
        self.ledger = open_run_ledger(
            ledger_path,
            cfg,
            self.cohort_commitment,
            run_id=args.get("run_id"),
            signer=args.get("signer"),
        )
        self.budget = PrivacyBudget.from_ledger(self.config, self.ledger.releases)
        self.private = args.get("private")

    @property
    def last_round(self) -> int:
        """The training round (model version) of the last release; ledger rounds count
        releases."""
        releases = self.ledger.releases
        return int(releases[-1].get("training_round", releases[-1]["round"])) if releases else 0

    def _event(self) -> PrivacyEvent:
        """One release's privacy event (distributed DP: at its plan's noise)."""
        return self.config.round_event()

    def epsilon(self) -> float:
        """The observers' epsilon: what the published models and run files reveal."""
        return self.budget.spent()

    def admits_next_round(self) -> tuple[bool, float]:
        """(allowed, epsilon after one more release): checked BEFORE it is made."""
        eps = self.budget.epsilon_after(self._event())
        return eps <= self.config.budget_epsilon, eps

    def coordinator_epsilon(self) -> float | None:
        """None: under central DP nothing bounds what the coordinator learns."""
        return None

    def coordinator_bound(self) -> float | None:
        """None: under central DP nothing bounds what the coordinator learns."""
        return None

    def _charge(self, event: PrivacyEvent, clip: float, extra: Mapping[str, Any]) -> dict[str, Any]:
        """The budget check, then the release's signed ledger entry (fsync'd) with
        `extra`; raises BudgetExceededError (nothing written) past dp.epsilon."""
        fields = {"budget_against": self.budget_against, **extra}
        if not len(self.ledger) and self.cohort_commitment is not None:
            fields["cohort_commitment"] = self.cohort_commitment
        return self.budget.record_release(
            self.ledger,
            round_number=self.ledger.last_round + 1,
            event=event,
            clip_norm=clip,
            extra=fields,
        )

    def _closing_annex(self) -> dict[str, Any] | None:
        """The operator-only figures the close writes to the private annex (they count
        participation); None: none."""
        return None

    def close(
        self,
        kind: str,
        training_round: int,
        reason: str | None = None,
        *,
        model_sha256: str | None = None,
    ) -> None:
        """The ledger's signed closing record, 'final' or 'interrupted' (a resume goes
        on), binding the published model file's `model_sha256` where given, then the
        realised figures to the private annex."""
        if self.ledger.closed:
            return  # a finished run's ledger takes nothing more (a resume of a done run)
        fields: dict[str, Any] = {"training_round": training_round, "epsilon": self.epsilon()}
        bound = self.coordinator_bound()
        if bound is not None:  # public: the ledger's parameters alone give it
            fields["epsilon_coordinator_bound"] = bound
        if reason:
            fields["reason"] = reason
        if model_sha256 is not None:
            fields[MODEL_SHA256] = model_sha256
        entry = self.ledger.close(kind, fields)
        annex = self._closing_annex()
        if annex is not None and self.private is not None:
            self.private(
                {
                    "kind": "close",
                    "ledger_kind": kind,
                    "ledger_seq": entry.get("seq"),
                    "training_round": training_round,
                    **annex,
                }
            )
