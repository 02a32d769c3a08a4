"""`server.toml`: where the service keeps its state, what it listens on, how it is secured.

Every value is checked when the file is read, and an error names the key and
the allowed range, as for run configs. Relative paths are resolved against
the file's directory, so a deployment folder can be moved as a whole.

  state_dir = "state"

  [api]        host, port, max_body_bytes           the HTTP API and dashboard
  [fleet]      host, port, max_body_bytes           the Fleet API gateway for SuperNodes
  [superlink]  port                                 Flower's SuperLink, loopback only
  [tls]        cert, key, ca, insecure              one certificate for API and Fleet
                                                    (the SuperLink gets its own, loopback only)
  [auth]       admin_token_file, client_auth        admin token, SuperNode authentication
  [runs]       max_active, max_attempts, allowed_tasks
  [secagg]     roster                               client identity keys, which runs with
                                                    secagg.threat = 'malicious' need
                                                    (fedveil identity roster)
"""

from __future__ import annotations

import ipaddress
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedveil.config import ConfigError

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

    @property
    def superlink_address(self) -> str:
        return f"127.0.0.1:{self.superlink_port}"

    @property
    def scheme(self) -> str:
        return "http" if self.tls.insecure else "https"


# section -> key -> (type, default, lo, hi)
_SCHEMA: dict[str, dict[str, tuple[type, Any, float | None, float | None]]] = {
    "": {"state_dir": (str, "state", None, None)},
    "api": {
        "host": (str, "127.0.0.1", None, None),
        "port": (int, 8443, 0, 65535),
        "max_body_bytes": (int, 1 << 20, 1024, 1 << 30),
    },
    "fleet": {
        "host": (str, "127.0.0.1", None, None),
        "port": (int, 9092, 0, 65535),
        # A model upload travels as several objects; one request carries one object.
        "max_body_bytes": (int, 64 << 20, 1024, 1 << 31),
    },
    "superlink": {"port": (int, 9091, 1, 65535)},
    "tls": {
        "cert": (str, None, None, None),
        "key": (str, None, None, None),
        "ca": (str, None, None, None),
        "insecure": (bool, False, None, None),
    },
    "auth": {
        "admin_token_file": (str, None, None, None),
        "client_auth": (bool, True, None, None),
    },
    "runs": {
        "max_active": (int, 1, 1, 64),
        "max_attempts": (int, 5, 1, 100),
        "allowed_tasks": (list, [], None, None),
    },
    "secagg": {"roster": (str, None, None, None)},
}


def _value(section: str, key: str, raw: dict[str, Any]) -> Any:
    kind, default, lo, hi = _SCHEMA[section][key]
    name = f"{section}.{key}" if section else key
    if key not in raw:
        return default
    value = raw[key]
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConfigError(f"{name} = {value!r}: must be an integer")
    if kind is bool and not isinstance(value, bool):
        raise ConfigError(f"{name} = {value!r}: must be true or false")
    if kind is str and not isinstance(value, str):
        raise ConfigError(f"{name} = {value!r}: must be a string")
    if kind is list and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
        raise ConfigError(f"{name} = {value!r}: must be a list of strings")
    if lo is not None and value < lo:
        raise ConfigError(f"{name} = {value!r}: must be >= {lo}")
    if hi is not None and value > hi:
        raise ConfigError(f"{name} = {value!r}: must be <= {hi}")
    return value


def _check_host(name: str, host: str) -> None:
    if not host or any(c in host for c in " /"):
        raise ConfigError(f"{name} = {host!r}: must be a host name or IP address")


def settings_from_dict(
    raw: dict[str, Any], base: Path, *, insecure: bool = False
) -> ServerSettings:
    for key, value in raw.items():
        if key not in _SCHEMA and key not in _SCHEMA[""]:
            known = ", ".join(sorted([*_SCHEMA[""], *(s for s in _SCHEMA if s)]))
            raise ConfigError(f"unknown key {key!r} in server settings; known: {known}")
        if key in _SCHEMA and key and not isinstance(value, dict):
            raise ConfigError(f"[{key}] must be a table")
    values: dict[str, dict[str, Any]] = {}
    for section, keys in _SCHEMA.items():
        table = raw if section == "" else raw.get(section, {})
        if section:
            unknown = sorted(set(table) - set(keys))
            if unknown:
                raise ConfigError(
                    f"unknown key {section}.{unknown[0]}; known keys in [{section}]: "
                    + ", ".join(sorted(keys))
                )
        values[section] = {k: _value(section, k, table) for k in keys}

    def path(v: str | None) -> Path | None:
        return None if v is None else (base / v).expanduser().resolve()

    t = values["tls"]
    tls = Tls(path(t["cert"]), path(t["key"]), path(t["ca"]), bool(t["insecure"]) or insecure)
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
    api = Listen(**values["api"])
    fleet = Listen(**values["fleet"])
    for name, listen in (("api", api), ("fleet", fleet)):
        _check_host(f"{name}.host", listen.host)
    sl_port = values["superlink"]["port"]
    ports = [p for p in (api.port, fleet.port, sl_port) if p]
    if len(set(ports)) != len(ports):
        raise ConfigError(
            f"api.port = {api.port}, fleet.port = {fleet.port}, superlink.port = {sl_port}: "
            "must all differ"
        )
    for ref in values["runs"]["allowed_tasks"]:
        if ref.count(":") != 1 or not all(ref.split(":")):
            raise ConfigError(
                f"runs.allowed_tasks: {ref!r} must look like 'package.module:function'"
            )
    roster = path(values["secagg"]["roster"])
    if roster is not None:
        from fedveil.privacy.secagg.identity_files import load_roster

        try:
            load_roster(roster, "secagg.roster =")  # a broken roster fails at start-up
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    a = values["auth"]
    client_auth = bool(a["client_auth"])
    if tls.insecure and client_auth:
        # Flower's SuperNode authentication signs requests but needs TLS around them.
        client_auth = False
    return ServerSettings(
        state_dir=path(values[""]["state_dir"]) or base,
        api=api,
        fleet=fleet,
        superlink_port=sl_port,
        tls=tls,
        admin_token_file=path(a["admin_token_file"]),
        client_auth=client_auth,
        max_active_runs=values["runs"]["max_active"],
        max_attempts=values["runs"]["max_attempts"],
        allowed_tasks=list(values["runs"]["allowed_tasks"]),
        secagg_roster=roster,
    )


def load_settings(path: str | Path, *, insecure: bool = False) -> ServerSettings:
    p = Path(path)
    try:
        raw = tomllib.loads(p.read_text())
    except FileNotFoundError:
        raise ConfigError(f"--config {p}: no such file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"--config {p}: not valid TOML ({exc})") from None
    settings = settings_from_dict(raw, p.resolve().parent, insecure=insecure)
    settings.source = p.resolve()
    return settings


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
