"""fedveil.benchmarks.bench_audit --cost-config default costs the audit of the job
`fedveil simulate` runs on its defaults: only how it runs (one process, no plots, CPU) may
differ from them. No figure is asserted (a default-job pair takes minutes; the figures are
in docs/benchmarks.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedveil.benchmarks.bench_audit import costs, default_cost_values
from fedveil.config import load_config


def test_default_cost_config_is_the_default_job(tmp_path: Path) -> None:
    costed = load_config(None, default_cost_values(tmp_path)).to_dict()
    defaults = load_config(None, {}).to_dict()
    assert costed["simulation"].pop("workers") == 1
    assert costed["simulation"].pop("plots") is False
    assert costed.pop("device") == "cpu"
    assert costed.pop("out") == str(tmp_path / "default-plain")
    for key in ("workers", "plots"):
        defaults["simulation"].pop(key)
    for key in ("device", "out"):
        defaults.pop(key)
    assert costed == defaults
    assert costed["data"]["dataset"] == "fashion-mnist" and costed["model"]["name"] == "cnn"
    assert costed["dp"]["mechanism"] == defaults["dp"]["mechanism"]


def test_unknown_cost_config_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cost config = 'large'"):
        costs(tmp_path, 10, secagg=False, repeat=1, config="large")
