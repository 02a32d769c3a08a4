"""The service's settings (`server.toml`), declared and checked like run configs.

Values are taken as typed in the file (no "8443" for 8443). What needs the
file system or the DP layer (certificate files, the identity roster) is checked
by the coordinator when it resolves these settings (server/coordinator/settings.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fedveil.config.validator import ConfigError, build, spec


@dataclass
class ApiSection:
    """The HTTP API and dashboard."""

    host: str = spec("127.0.0.1", help="address the API listens on")
    port: int = spec(8443, lo=0, hi=65535, help="API port (0: any free port)")
    max_body_bytes: int = spec(1 << 20, lo=1024, hi=1 << 30, help="largest request body")


@dataclass
class FleetSection:
    """The Fleet API gateway for SuperNodes."""

    host: str = spec("127.0.0.1", help="address the gateway listens on")
    port: int = spec(9092, lo=0, hi=65535, help="Fleet API port (0: any free port)")
    # A model upload travels as several objects; one request carries one object.
    max_body_bytes: int = spec(64 << 20, lo=1024, hi=1 << 31, help="largest request body")


@dataclass
class SuperlinkSection:
    # Nothing listens on it: the SuperLink serves on state/superlink.sock, and this number
    # only names it in the URLs Flower's processes are given. Kept so older files load.
    port: int = spec(9091, lo=1, hi=65535, help="unused (the SuperLink is on a Unix socket)")


@dataclass
class TlsSection:
    cert: str | None = spec(None, help="server certificate (PEM), for API and Fleet")
    key: str | None = spec(None, help="its private key (PEM)")
    ca: str | None = spec(None, help="CA certificate (PEM), for reference")
    insecure: bool = spec(False, help="run without TLS")


@dataclass
class AuthSection:
    admin_token_file: str | None = spec(None, help="file holding the admin token")
    client_auth: bool = spec(True, help="SuperNode authentication (needs TLS)")


@dataclass
class RunsSection:
    max_active: int = spec(1, lo=1, hi=64, help="runs that execute at once")
    max_attempts: int = spec(5, lo=1, hi=100, help="failed attempts before a run fails")
    # spec gives a list default its own default_factory (a fresh list per instance).
    allowed_tasks: list[str] = spec(  # noqa: RUF009
        [], help="custom tasks ('module:function') runs may use"
    )


@dataclass
class ServiceSecAggSection:
    roster: str | None = spec(None, help="client identity roster (fedveil identity roster)")


@dataclass
class DriftSection:
    """Federated evaluation of a promoted model version on the devices, and retraining when
    its accuracy falls below `threshold` (server/coordinator/drift.py)."""

    enabled: bool = spec(False, help="evaluate the promoted version of `model` every interval")
    model: str = spec("", help="registry name of the model to watch (its promoted version)")
    interval_s: float = spec(
        86_400.0, lo=10.0, hi=366 * 86_400.0, help="seconds between drift evaluations"
    )
    threshold: float = spec(
        0.5, lo=0.0, hi=1.0, help="federated accuracy below which a retraining run is submitted"
    )
    clients: int = spec(10, lo=1, hi=1_000_000, help="devices that evaluate, per evaluation")
    holdout: float = spec(
        0.2, lo=0.0, lo_open=True, hi=0.9, help="share of each device's data it evaluates on"
    )
    # A version trained with DP is evaluated under secure aggregation with central Gaussian
    # noise, each evaluation charged to a budget per watched version (drift.py).
    epsilon: float = spec(
        1.0, lo=0.0, lo_open=True, hi=100.0, help="DP versions: epsilon of one evaluation"
    )
    delta: float = spec(
        1e-6, lo=0.0, lo_open=True, hi=1e-3, help="DP versions: delta of the evaluations"
    )
    budget: float = spec(
        4.0,
        lo=0.0,
        lo_open=True,
        hi=1000.0,
        help="DP versions: the most epsilon the evaluations of one version may compose to",
    )
    device_budget: float = spec(
        0.0,
        lo=0.0,
        hi=1000.0,
        help="DP versions: the most epsilon the drift evaluations that may ask one enrolled "
        "device compose to, across every version evaluated (a version registered again "
        "does not start it afresh); 0: drift.budget",
    )
    loss_cap: float = spec(
        5.0,
        lo=0.0,
        lo_open=True,
        hi=1000.0,
        help="DP versions: a device's loss is clipped to this before it is summed",
    )


@dataclass
class ServingSection:
    """The prediction service for promoted registry versions (`fedveil serve`'s API, on its
    own port, with the coordinator's TLS; server/serving/promoted.py)."""

    enabled: bool = spec(False, help="serve the promoted version of each of `models`")
    # spec gives a list default its own default_factory (a fresh list per instance).
    models: list[str] = spec(  # noqa: RUF009
        [], help="registry names whose promoted version is served (followed as promoted)"
    )
    host: str = spec("127.0.0.1", help="address the prediction API listens on")
    port: int = spec(8480, lo=0, hi=65535, help="prediction API port (0: any free port)")
    public: bool = spec(False, help="prediction without a token (warns for models without DP)")
    token_file: str | None = spec(None, help="file holding the prediction token")
    max_batch: int = spec(512, lo=1, hi=65536, help="rows per forward pass and per request")
    max_wait_ms: float = spec(2.0, lo=0.0, hi=10_000.0, help="longest wait to fill a batch")
    max_body_bytes: int = spec(32 << 20, lo=1024, hi=1 << 31, help="largest request body")


@dataclass
class ConnectionsSection:
    """Open connections and slow clients, for every port the coordinator serves."""

    max_per_listener: int = spec(
        512, lo=1, hi=1_000_000, help="open connections per port; more are closed at once"
    )
    max_per_peer: int = spec(
        32, lo=1, hi=1_000_000, help="open connections per port from one client address"
    )
    request_timeout_s: float = spec(
        120.0, lo=0.1, hi=3600.0, help="seconds to send a whole request (headers and body)"
    )


@dataclass
class ServiceConfig:
    """`server.toml` as written: paths still relative to the file's directory."""

    state_dir: str = spec("state", help="where the service keeps its runs")
    api: ApiSection = field(default_factory=ApiSection)
    fleet: FleetSection = field(default_factory=FleetSection)
    superlink: SuperlinkSection = field(default_factory=SuperlinkSection)
    tls: TlsSection = field(default_factory=TlsSection)
    auth: AuthSection = field(default_factory=AuthSection)
    runs: RunsSection = field(default_factory=RunsSection)
    secagg: ServiceSecAggSection = field(default_factory=ServiceSecAggSection)
    drift: DriftSection = field(default_factory=DriftSection)
    serving: ServingSection = field(default_factory=ServingSection)
    connections: ConnectionsSection = field(default_factory=ConnectionsSection)


SERVICE_SECTIONS: dict[str, type] = {
    "api": ApiSection,
    "fleet": FleetSection,
    "superlink": SuperlinkSection,
    "tls": TlsSection,
    "auth": AuthSection,
    "runs": RunsSection,
    "secagg": ServiceSecAggSection,
    "drift": DriftSection,
    "serving": ServingSection,
    "connections": ConnectionsSection,
}


def service_config(raw: dict[str, Any]) -> ServiceConfig:
    """Every key of `server.toml` typed and in range, and the limits between them."""
    cfg = build(ServiceConfig, raw, sections=SERVICE_SECTIONS, top="server settings", strict=True)
    for name, section in (("api", cfg.api), ("fleet", cfg.fleet)):
        _check_host(f"{name}.host", section.host)
    api, fleet = cfg.api.port, cfg.fleet.port
    if api and api == fleet:
        raise ConfigError(f"api.port = {api}, fleet.port = {fleet}: must differ")
    for ref in cfg.runs.allowed_tasks:
        if ref.count(":") != 1 or not all(ref.split(":")):
            raise ConfigError(
                f"runs.allowed_tasks: {ref!r} must look like 'package.module:function'"
            )
    if cfg.connections.max_per_peer > cfg.connections.max_per_listener:
        raise ConfigError(
            f"connections.max_per_peer = {cfg.connections.max_per_peer}: must be <= "
            f"connections.max_per_listener = {cfg.connections.max_per_listener}"
        )
    _check_host("serving.host", cfg.serving.host)
    if cfg.serving.enabled and not cfg.serving.models:
        raise ConfigError("serving.enabled = true needs serving.models (registry names)")
    if cfg.serving.enabled and not (cfg.serving.public or cfg.serving.token_file):
        raise ConfigError("serving: prediction needs serving.token_file, or serving.public = true")
    if cfg.drift.enabled and not cfg.drift.model:
        raise ConfigError(
            "drift.model = '': drift.enabled needs the registry name of the model to watch"
        )
    if cfg.drift.budget < cfg.drift.epsilon:
        raise ConfigError(
            f"drift.budget = {cfg.drift.budget:g}: must be >= drift.epsilon = "
            f"{cfg.drift.epsilon:g} (the budget must pay for one evaluation)"
        )
    if cfg.drift.device_budget and cfg.drift.device_budget < cfg.drift.epsilon:
        raise ConfigError(
            f"drift.device_budget = {cfg.drift.device_budget:g}: must be >= drift.epsilon = "
            f"{cfg.drift.epsilon:g} (a device's budget must pay for one evaluation)"
        )
    return cfg


def _check_host(name: str, host: str) -> None:
    if not host or any(c in host for c in " /"):
        raise ConfigError(f"{name} = {host!r}: must be a host name or IP address")
