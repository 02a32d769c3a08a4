"""The coordinator's prediction service (`[serving]` in server.toml): `fedveil serve`'s
API on its own port, for the promoted version of each named model in the coordinator's
registry, following promotions while it runs.

Same rules as `fedveil serve`: the coordinator's TLS (or its --insecure), a prediction
token (`serving.token_file`, never the admin token: whoever predicts must not administer)
unless `serving.public`, and a warning when a public version has no DP guarantee.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from pathlib import Path

from fastapi import FastAPI

from fedveil.config.service_settings import ServingSection
from fedveil.ops.bearer import BearerToken, read_token_file
from fedveil.server.serving.app import ServeLimits, create_app
from fedveil.server.serving.versions import PromotedVersion

log = logging.getLogger("fedveil.serving")


def promoted_app(
    section: ServingSection,
    registry_root: Path,
    base: Path,
    *,
    recheck_s: float = 5.0,
    allowed_tasks: Collection[str] = (),
) -> FastAPI:
    """The prediction API over the promoted versions of `section.models` in the registry at
    `registry_root`; `base`: the directory server.toml's paths are relative to;
    `allowed_tasks`: the custom tasks a version may load (runs.allowed_tasks)."""
    token = None
    if not section.public:
        if section.token_file is None:  # service_config refuses this; kept for callers
            raise ValueError("serving: prediction needs serving.token_file, or serving.public")
        path = (base / section.token_file).expanduser().resolve()
        token = BearerToken(read_token_file(path, "serving.token_file"), str(path))
    splits = [
        PromotedVersion(
            registry_root,
            name,
            recheck_s=recheck_s,
            public=section.public,
            allowed_tasks=allowed_tasks,
        )
        for name in section.models
    ]
    for split in splits:
        if split.pick() is None:
            log.warning("serving %s: no promoted version yet (503 until one is)", split.name)
    limits = ServeLimits(section.max_batch, section.max_wait_ms, section.max_body_bytes)
    return create_app(splits, token=token, limits=limits)
