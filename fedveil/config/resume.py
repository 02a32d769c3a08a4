"""Resuming a run: the config it continues under is the one it was started with.

A run directory's config.toml is the run's own record. `resume_config` reads it and
applies only the settings a resume may change (where the run lives, where it runs,
where it is tracked, and, without DP, how many rounds it has); any other setting given
that differs from the record conflicts with the checkpoint and is refused, naming it.
`check_resume` applies the same rule to a config built elsewhere (the Python API).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from fedveil.config.run import ConfigError, config_from_dict, load_config
from fedveil.config.run_schema import RunConfig

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

CONFIG_FILE = "config.toml"

# Settings that change neither the population, the data, the model nor the privacy plan.
RESUME_MAY_CHANGE = frozenset(
    {
        "out",
        "device",
        "simulation.workers",
        "simulation.plots",
        "simulation.ray_address",
        "tracking.tensorboard",
        "tracking.mlflow_uri",
        "tracking.mlflow_experiment",
    }
)
# More rounds (or fewer) are a new horizon for training, not for a DP plan calibrated
# to the planned rounds: allowed only without DP.
ROUNDS = "server.rounds"


def resume_config(out: str | Path, overrides: dict[str, Any]) -> RunConfig:
    """The run in `out` as recorded in its config.toml, with `overrides` that a resume
    may change; ConfigError naming every other override that differs from the record."""
    path = Path(out) / CONFIG_FILE
    if not path.is_file():
        raise ConfigError(f"--resume: no {CONFIG_FILE} in {out}; nothing to resume (check --out)")
    recorded = _recorded(path)
    cfg = load_config(path, {**overrides, "out": str(out)})
    check_resume(recorded, cfg, given=set(overrides))
    return cfg


def check_resume(recorded: RunConfig, cfg: RunConfig, given: set[str] | None = None) -> None:
    """Refuse `cfg` for resuming a run recorded as `recorded` where a setting conflicts
    with the checkpoint (every differing key, or only those in `given`)."""
    old, new = _flat(recorded.to_dict()), _flat(cfg.to_dict())
    keys = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    if given is not None:
        keys = [k for k in keys if k in given]
    allowed = set(RESUME_MAY_CHANGE)
    if recorded.dp.mechanism == "none" and cfg.dp.mechanism == "none":
        allowed.add(ROUNDS)
    conflicts = [k for k in keys if k not in allowed]
    if conflicts:
        shown = "; ".join(f"{k} = {new.get(k)!r}, the run has {old.get(k)!r}" for k in conflicts)
        hint = (
            " (a DP run's plan is calibrated to its planned rounds)"
            if ROUNDS in conflicts and recorded.dp.mechanism != "none"
            else ""
        )
        raise ConfigError(
            f"--resume: {shown}: these settings conflict with the checkpoint{hint}; "
            "resume with the run's own settings (leave these flags out), or start a new run "
            "in another --out"
        )


def _recorded(path: Path) -> RunConfig:
    try:
        return config_from_dict(tomllib.loads(path.read_text()))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"--resume: {path} is not valid TOML ({exc})") from None


def _flat(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flat(value, f"{name}."))
        else:
            out[name] = value
    return out
