"""Each silo's own signed privacy ledger: what this silo saw in every round it applied.

With no coordinator there is no single ledger: every silo writes one, signed with its
Ed25519 identity (the key its peers verify its adverts with), so an auditor compares the
silos' ledgers entry by entry: the same members, attempts and sum hash in each, or a
silo that saw something else. The ledger format and chain are privacy/dp/ledger.py's;
entries carry, beyond its release fields, `silo`, `members` (the silo ids whose updates
are in the sum), `attempt`, `aborted_attempts` and `sum_sha256`.

An entry is written (fsync'd) before the silo applies the round: a release is never used
without its entry. When the silo's last round is applied, `close` writes the signed final
record (the run's epsilon), so a verifier tells a finished ledger from a truncated one.
`fedveil privacy verify` checks every silo's ledger against its key and that the silos
agree (privacy/dp/silo_verify.py).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedveil.privacy.dp.ledger import FINAL, Ledger
from fedveil.privacy.dp.signing import LedgerSigner


def sum_digest(total: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(total).tobytes()).hexdigest()


class SiloLedger:
    def __init__(self, path: Path, run_id: str, silo: int, identity: Ed25519PrivateKey) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.silo = silo
        self.ledger = Ledger(path, run_id=run_id, signer=LedgerSigner(identity))

    def record(
        self,
        release: dict[str, Any],
        *,
        members: tuple[int, ...],
        attempt: int,
        aborted: list[str],
        total: np.ndarray,
    ) -> dict[str, Any]:
        entry = {
            **release,
            "silo": self.silo,
            "members": list(members),
            "attempt": attempt,
            "aborted_attempts": len(aborted),
            "sum_sha256": sum_digest(total),
        }
        return self.ledger.record(entry)

    def close(self, training_round: int) -> dict[str, Any]:
        """The signed final record: the rounds trained and the last release's epsilon."""
        releases = self.ledger.releases
        epsilon = releases[-1]["epsilon"] if releases else 0.0
        return self.ledger.close(
            FINAL, {"training_round": training_round, "epsilon": epsilon, "silo": self.silo}
        )
