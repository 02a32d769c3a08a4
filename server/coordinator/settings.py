"""`server.toml`: where the service keeps its state, what it listens on, how it is secured.

Every value is checked when the file is read, by the same validator as run
configs (fields and limits: fedveil/config/service_settings.py), and an error names the
key, the value and the allowed range. Relative paths are resolved against
the file's directory, so a deployment folder can be moved as a whole.

  state_dir = "state"

  [api]        host, port, max_body_bytes           the HTTP API and dashboard
  [fleet]      host, port, max_body_bytes           the Fleet API gateway for SuperNodes
  [superlink]  port                                 unused: Flower's SuperLink listens on
                                                    state/superlink.sock (owner-only)
  [tls]        cert, key, ca, insecure              one certificate for API and Fleet
                                                    (the SuperLink gets its own, internal)
  [auth]       admin_token_file, client_auth        admin token, SuperNode authentication
  [runs]       max_active, max_attempts, allowed_tasks
  [secagg]     roster                               client identity keys, which runs with
                                                    secagg.threat = 'malicious' need
                                                    (fedveil identity roster)
  [connections] max_per_listener, max_per_peer,     open connections per port and per
               request_timeout_s                    client address; seconds to send a request
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedveil.config import ConfigError
from fedveil.config.service_settings import (
    ConnectionsSection,
    DriftSection,
    ServingSection,
    service_config,
)
from fedveil.ops.bearer import is_loopback  # noqa: F401 - re-exported for launch.py

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


@dataclass
class Listen:
    host: str
    port: int
    max_body_bytes: int

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclass
class Tls:
    cert: Path | None = None
    key: Path | None = None
    ca: Path | None = None
    insecure: bool = False


@dataclass
class ServerSettings:
    state_dir: Path
    api: Listen
    fleet: Listen
    superlink_port: int
    tls: Tls
    admin_token_file: Path | None = None
    client_auth: bool = True
    max_active_runs: int = 1
    max_attempts: int = 5
    allowed_tasks: list[str] = field(default_factory=list)
    secagg_roster: Path | None = None
    source: Path | None = None
    # [drift]: retraining on drift (drift.py); enabled=False leaves the coordinator as it was
    drift: DriftSection = field(default_factory=DriftSection)
    # [serving]: the prediction service for promoted versions (serving/promoted.py)
    serving: ServingSection = field(default_factory=ServingSection)
    # [connections]: open connections per port and per peer, request deadline
    connections: ConnectionsSection = field(default_factory=ConnectionsSection)

    @property
    def superlink_address(self) -> str:
        return f"127.0.0.1:{self.superlink_port}"

    @property
    def scheme(self) -> str:
        return "http" if self.tls.insecure else "https"


def settings_from_dict(
    raw: dict[str, Any], base: Path, *, insecure: bool = False
) -> ServerSettings:
    """The settings of `server.toml` (fields and limits: fedveil.config.service_settings), with
    paths resolved against `base` and the files they name checked."""
    values = service_config(raw)

    def path(v: str | None) -> Path | None:
        return None if v is None else (base / v).expanduser().resolve()

    t = values.tls
    tls = Tls(path(t.cert), path(t.key), path(t.ca), t.insecure or insecure)
    if not tls.insecure:
        for key in ("cert", "key", "ca"):
            p = getattr(tls, key)
            if p is None and key == "ca":
                continue  # only for reference: the SuperLink has its own loopback CA
            if p is None:
                raise ConfigError(
                    f"tls.{key} is required: TLS is on by default (make certificates with "
                    "`fedveil certs`, or pass --insecure to run without TLS)"
                )
            if not p.is_file():
                raise ConfigError(f"tls.{key} = {str(p)!r}: no such file")
    api = Listen(values.api.host, values.api.port, values.api.max_body_bytes)
    fleet = Listen(values.fleet.host, values.fleet.port, values.fleet.max_body_bytes)
    roster = path(values.secagg.roster)
    if roster is not None:
        from fedveil.privacy.secagg.identity_files import load_roster

        try:
            load_roster(roster, "secagg.roster =")  # a broken roster fails at start-up
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    client_auth = values.auth.client_auth
    if tls.insecure and client_auth:
        # Flower's SuperNode authentication signs requests but needs TLS around them.
        client_auth = False
    return ServerSettings(
        state_dir=path(values.state_dir) or base,
        api=api,
        fleet=fleet,
        superlink_port=values.superlink.port,
        tls=tls,
        admin_token_file=path(values.auth.admin_token_file),
        client_auth=client_auth,
        max_active_runs=values.runs.max_active,
        max_attempts=values.runs.max_attempts,
        allowed_tasks=list(values.runs.allowed_tasks),
        secagg_roster=roster,
        drift=values.drift,
        serving=values.serving,
        connections=values.connections,
    )


def load_settings(
    path: str | Path, *, insecure: bool = False, state_dir: str | Path | None = None
) -> ServerSettings:
    """server.toml at `path`; `state_dir` (fedveil server --state-dir) replaces its
    state_dir, which is otherwise relative to the file's folder."""
    p = Path(path)
    try:
        raw = tomllib.loads(p.read_text())
    except FileNotFoundError:
        raise ConfigError(f"--config {p}: no such file") from None
    except ValueError as exc:  # TOML errors, non-UTF-8 bytes, an int of 4,300+ digits
        raise ConfigError(f"--config {p}: not valid TOML ({exc})") from None
    settings = settings_from_dict(raw, p.resolve().parent, insecure=insecure)
    settings.source = p.resolve()
    if state_dir:
        settings.state_dir = Path(state_dir).expanduser().resolve()
    return settings
