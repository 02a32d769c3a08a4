"""A small client of the coordinator's HTTP API for the CLI (stdlib only).

Where to reach it and how to authenticate, flags first, then environment:
  --api URL          FEDVEIL_API            (default https://127.0.0.1:8443)
  --ca FILE          FEDVEIL_CA             CA certificate to verify the server
  --token-file FILE  FEDVEIL_ADMIN_TOKEN_FILE, or the token in FEDVEIL_ADMIN_TOKEN
"""

from __future__ import annotations

import argparse
import json
import os
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

DEFAULT_API = "https://127.0.0.1:8443"


class ApiCallError(RuntimeError):
    def __init__(self, status: int, detail: str, field: str | None = None) -> None:
        super().__init__(f"HTTP {status}: {detail}")
        self.status, self.detail, self.field = status, detail, field


def add_api_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--api", default=None, help=f"coordinator API URL [$FEDVEIL_API, {DEFAULT_API}]")
    p.add_argument("--ca", default=None, help="CA certificate of the coordinator [$FEDVEIL_CA]")
    p.add_argument(
        "--token-file",
        default=None,
        help="file with the admin token [$FEDVEIL_ADMIN_TOKEN_FILE; or $FEDVEIL_ADMIN_TOKEN]",
    )


class ApiClient:
    def __init__(
        self,
        base: str,
        ca: str | None,
        token: str | None,
        timeout: float = 30.0,
        token_file: str | None = None,
    ) -> None:
        self.base = base.rstrip("/")
        self.token, self.timeout = token, timeout
        # Read when an admin call needs it: a script may export the path before the
        # coordinator has generated the file (and unauthenticated calls never need it).
        self.token_file = token_file
        self.ctx: ssl.SSLContext | None = None
        if self.base.startswith("https://"):
            self.ctx = ssl.create_default_context(cafile=ca) if ca else ssl.create_default_context()

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ApiClient:
        base = args.api or os.environ.get("FEDVEIL_API") or DEFAULT_API
        ca = args.ca or os.environ.get("FEDVEIL_CA")
        token = os.environ.get("FEDVEIL_ADMIN_TOKEN")
        token_file = args.token_file or os.environ.get("FEDVEIL_ADMIN_TOKEN_FILE")
        return cls(base, ca, None if token_file else token, token_file=token_file)

    def admin_token(self) -> str | None:
        if self.token is None and self.token_file:
            try:
                self.token = Path(self.token_file).read_text().strip()
            except FileNotFoundError:
                raise ValueError(
                    f"--token-file {self.token_file}: no such file (the coordinator writes "
                    "state/admin.token at its first start: `fedveil ready` waits for it)"
                ) from None
        return self.token

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        content_type: str = "application/json",
        admin: bool = False,
    ) -> tuple[int, bytes]:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        if admin:
            if not self.admin_token():
                raise ValueError(
                    "this command needs the admin token: --token-file, $FEDVEIL_ADMIN_TOKEN_FILE "
                    "or $FEDVEIL_ADMIN_TOKEN"
                )
            headers["Authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(self.base + path, data=body, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout, context=self.ctx) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                err = json.loads(raw)
                detail = err.get("detail") or raw.decode(errors="replace")[:500]
                raise ApiCallError(exc.code, str(detail), err.get("field")) from None
            except (json.JSONDecodeError, AttributeError):
                raise ApiCallError(exc.code, raw.decode(errors="replace")[:500]) from None
        except urllib.error.URLError as exc:
            raise ApiCallError(0, f"cannot reach {self.base}: {exc.reason}") from None

    def json(self, method: str, path: str, payload: Any = None, admin: bool = False) -> Any:
        body = None if payload is None else json.dumps(payload).encode()
        _, raw = self.request(method, path, body, admin=admin)
        return json.loads(raw) if raw else None
