"""`fedveil serve`: load the model versions, check how they may be reached, run uvicorn.

TLS by default (a certificate and key, as the coordinator's API); `--insecure` serves
plain HTTP and is refused off loopback, since the token (and every prediction) would
travel in the clear. Prediction needs a token unless `--public`; a public model without
a DP guarantee is warned about at start-up, in the log and on the start-up line.
"""

from __future__ import annotations

import logging
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path

from fedveil.config import ConfigError
from fedveil.ops.bearer import BearerToken, is_loopback, read_token_file
from fedveil.ops.listening import listening_socket
from fedveil.server.serving.app import ServeLimits, create_app
from fedveil.server.serving.connections import ConnectionLimits, guarded_http
from fedveil.server.serving.prediction_metrics import ServingMetrics
from fedveil.server.serving.versions import (
    NO_DP_WARNING,
    ServedVersion,
    TrafficSplit,
    load_version,
)

log = logging.getLogger("fedveil.serving")

TOKEN_ENV = "FEDVEIL_SERVE_TOKEN"


@dataclass
class ServeSettings:
    model: str  # RUN_DIR, FILE or name@version
    canary: str | None = None
    canary_share: float = 0.1
    task: str | None = None  # for a FILE without metadata
    name: str | None = None  # serve under this name instead of the model's own
    host: str = "127.0.0.1"
    port: int = 8480
    insecure: bool = False
    public: bool = False
    token_file: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    limits: ServeLimits = field(default_factory=ServeLimits)
    connections: ConnectionLimits = field(default_factory=ConnectionLimits)

    def check(self) -> None:
        if self.insecure and not is_loopback(self.host):
            raise ConfigError(
                f"--insecure with --host {self.host}: plain HTTP is only served on loopback "
                "(127.0.0.1, ::1, localhost); give --tls-cert/--tls-key to listen there"
            )
        if not self.insecure and (self.tls_cert is None or self.tls_key is None):
            raise ConfigError(
                "TLS needs --tls-cert and --tls-key (make them with `fedveil certs`), or "
                "--insecure for plain HTTP on loopback"
            )
        for flag, path in (("--tls-cert", self.tls_cert), ("--tls-key", self.tls_key)):
            if not self.insecure and path is not None and not path.is_file():
                raise ConfigError(f"{flag} {str(path)!r}: no such file")
        if self.canary is not None and not 0 < self.canary_share < 1:
            raise ConfigError(f"--canary-share = {self.canary_share}: must be in (0, 1)")
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"--port = {self.port}: must be in [0, 65535]")

    @property
    def scheme(self) -> str:
        return "http" if self.insecure else "https"


def load_token(settings: ServeSettings) -> BearerToken | None:
    """The prediction token: --token-file, else $FEDVEIL_SERVE_TOKEN; None when public."""
    if settings.public:
        return None
    if settings.token_file is not None:
        return BearerToken(read_token_file(settings.token_file, "--token-file"), "--token-file")
    env = os.environ.get(TOKEN_ENV)
    if env:
        return BearerToken(env.strip(), f"${TOKEN_ENV}")
    raise ConfigError(
        f"prediction needs a token: give --token-file FILE (or set {TOKEN_ENV}), or serve "
        "with --public (anyone may query the model)"
    )


def load_split(settings: ServeSettings) -> TrafficSplit:
    primary = load_version(settings.model, task=settings.task, name=settings.name)
    if settings.canary is None:
        return TrafficSplit([(primary, 1.0)])
    canary = load_version(settings.canary, task=settings.task, name=primary.name)
    share = settings.canary_share
    return TrafficSplit([(primary, 1 - share), (canary, share)])


def privacy_warnings(split: TrafficSplit, public: bool) -> list[str]:
    """One warning per public version without a DP guarantee."""
    if not public:
        return []
    return [NO_DP_WARNING.format(ref=_ref(v)) for v, _ in split.versions if v.guarantee is None]


def _ref(v: ServedVersion) -> str:
    return f"{v.name}@{v.version} ({v.source})"


def serve(settings: ServeSettings) -> int:
    """Serve until SIGTERM/SIGINT; the exit code."""
    import uvicorn

    settings.check()
    token = load_token(settings)
    split = load_split(settings)
    warnings = privacy_warnings(split, settings.public)
    for warning in warnings:
        log.warning("%s", warning)
    if settings.insecure:
        log.warning("--insecure: plain HTTP on loopback; tokens and predictions are not encrypted")
    app = create_app([split], token=token, limits=settings.limits, metrics=ServingMetrics())
    sock = listening_socket(settings.host, settings.port)
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app,
        lifespan="on",
        log_level="warning",
        access_log=False,
        ssl_certfile=None if settings.insecure else str(settings.tls_cert),
        ssl_keyfile=None if settings.insecure else str(settings.tls_key),
        timeout_graceful_shutdown=2,
        # Connections bounded per listener and per peer, requests given a deadline.
        http=guarded_http(settings.connections),
    )
    server = uvicorn.Server(config)
    versions = ", ".join(f"{v.version} ({share:.0%})" for v, share in split.versions)
    access = (
        "PUBLIC (no token)" + (" WITHOUT a DP guarantee" if warnings else "")
        if token is None
        else f"token from {token.source}"
    )
    # The start-up line: tests and scripts read the address from it.
    print(
        f"fedveil serve: {split.name} [{versions}] on {settings.scheme}://"
        f"{_url_host(settings.host)}:{port}/v1/models/{split.name}/predict; {access}",
        flush=True,
    )
    # uvicorn re-raises the stop signal to the handler installed before it: a no-op, so
    # a requested stop exits with status 0 (as the coordinator).
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
    return 0


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
