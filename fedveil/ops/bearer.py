"""What fedveil's HTTP services share for access control: the bearer-token check and the
loopback test behind `--insecure`.

A token is never logged or returned; only where it was read from is. Requests carry it as
`Authorization: Bearer <token>`: none -> 401, a wrong one -> 403 (compared in constant time).
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import stat
from pathlib import Path

from fedveil.config import ConfigError

log = logging.getLogger("fedveil.ops")

MIN_TOKEN_CHARS = 16


class BearerToken:
    """A shared secret a request must carry; `WHAT` names it in errors."""

    WHAT = "token"

    def __init__(self, token: str, source: str) -> None:
        if len(token) < MIN_TOKEN_CHARS:
            raise ConfigError(
                f"{self.WHAT} from {source} is too short: use at least {MIN_TOKEN_CHARS} characters"
            )
        self._token = token.encode()
        self.source = source

    def __repr__(self) -> str:  # never show the secret, even in a traceback
        return f"{type(self).__name__}(source={self.source!r})"

    def check(self, header: str | None) -> int:
        """200 if `header` carries the token, else the HTTP status to answer (401 or 403)."""
        if not header:
            return 401
        scheme, _, value = header.partition(" ")
        if scheme.lower() != "bearer" or not value.strip():
            return 401
        return 200 if hmac.compare_digest(value.strip().encode(), self._token) else 403


def read_token_file(path: Path, setting: str) -> str:
    """A token file's text (stripped); a missing file is named by `setting`, and a file
    others may read is warned about."""
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        raise ConfigError(f"{setting} = {str(path)!r}: no such file") from None
    if path.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("token file %s is readable by others; chmod 600 it", path)
    return text


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
