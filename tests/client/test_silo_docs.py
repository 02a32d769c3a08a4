"""The secure all-reduce how-to's config is a valid run config (issue 34)."""

from __future__ import annotations

import sys

from docs_pages import code_blocks, section

from fedveil.config import load_config

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def test_the_how_tos_silo_config_loads(tmp_path):
    (block,) = code_blocks(
        section("how-to/secure-allreduce.md", "Run the silos as processes"), "toml"
    )
    path = tmp_path / "run.toml"
    path.write_text(block)
    cfg = load_config(path)
    assert cfg.server.aggregation == "allreduce"
    assert cfg.data.num_clients == cfg.server.per_round == 4
    assert tomllib.loads(block)["server"]["aggregation"] == "allreduce"
