"""The admin token: required for every mutating endpoint and the model download.

Where it comes from, first found wins: the FEDVEIL_ADMIN_TOKEN environment
variable, the file named by auth.admin_token_file, or a token generated at
first start into state_dir/admin.token (mode 0600). The token itself is never
logged or returned; only where it was read from is.

Requests carry it as `Authorization: Bearer <token>`: none -> 401, a wrong one
-> 403 (compared in constant time).
"""

from __future__ import annotations

import logging
import os
import secrets
import stat
from pathlib import Path

from fedveil.config import ConfigError
from fedveil.ops.bearer import MIN_TOKEN_CHARS, BearerToken  # noqa: F401 - MIN_TOKEN_CHARS re-exported
from fedveil.server.coordinator.settings import ServerSettings

log = logging.getLogger("fedveil.service")

TOKEN_ENV = "FEDVEIL_ADMIN_TOKEN"


class AdminToken(BearerToken):
    """The coordinator's admin token (the check is fedveil.ops.bearer's, shared with
    `fedveil serve`)."""

    WHAT = "admin token"


def load_admin_token(settings: ServerSettings) -> AdminToken:
    env = os.environ.get(TOKEN_ENV)
    if env:
        return AdminToken(env.strip(), f"${TOKEN_ENV}")
    path = settings.admin_token_file
    if path is not None:
        try:
            text = path.read_text().strip()
        except FileNotFoundError:
            raise ConfigError(f"auth.admin_token_file = {str(path)!r}: no such file") from None
        if path.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            log.warning("admin token file %s is readable by others; chmod 600 it", path)
        return AdminToken(text, str(path))
    generated = settings.state_dir / "admin.token"
    if not generated.exists():
        generated.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(generated, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(32) + "\n")
        log.warning("no admin token configured: generated one in %s (mode 600)", generated)
    return AdminToken(Path(generated).read_text().strip(), str(generated))
