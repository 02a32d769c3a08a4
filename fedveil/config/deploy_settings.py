"""A submitted run's `[deploy]` table: settings of the deployment, not of the training.

The coordinator takes it out of the run config before validating the rest, and
keeps it apart (deploy.json in the run directory); devices never receive it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from fedveil.config.validator import ConfigError, build, spec

NAME_LIMIT = 100


@dataclass
class DeploySettings:
    """The [deploy] table of a submitted run config."""

    name: str = spec("", help=f"the run's name (at most {NAME_LIMIT} characters)")
    wait_for_clients: int = spec(
        0, lo=0, hi=1_000_000, help="devices to wait for before round 1; 0: server.min_clients"
    )
    wait_timeout_s: float = spec(
        600.0, lo=1, hi=7 * 86400, help="how long to wait for them, in seconds"
    )

    @classmethod
    def from_dict(cls, raw: Any) -> DeploySettings:
        if raw is None:
            return cls()
        if not isinstance(raw, dict):
            raise ConfigError("[deploy] must be a table")
        out = build(cls, raw, prefix="deploy.", strict=True)
        if len(out.name) > NAME_LIMIT or any(ord(c) < 32 for c in out.name):
            raise ConfigError(
                f"deploy.name = {out.name!r}: must be a string of at most {NAME_LIMIT} characters"
            )
        return out

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
