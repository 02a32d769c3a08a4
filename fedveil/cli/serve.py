"""`fedveil serve`: the prediction service for a trained model."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

SERVE_DESCRIPTION = (
    "Serve a trained model over HTTP: POST /v1/models/NAME/predict with JSON "
    '{"inputs": [[...], ...]} or an NPZ body (application/x-npz, array "inputs"); the reply '
    "holds the model's raw outputs. GET /models, /healthz, /readyz, /metrics (Prometheus). "
    "Concurrent requests are merged into batches of at most --max-batch rows, waiting at "
    "most --max-wait-ms. Prediction needs a bearer token (--token-file or "
    "$FEDVEIL_SERVE_TOKEN) unless --public: a served model answers membership-inference "
    "queries, and one without DP has no protection against them (--public warns)."
)


def add_serve(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve", help="serve a trained model (prediction API)", description=SERVE_DESCRIPTION
    )
    p.add_argument(
        "--model",
        required=True,
        metavar="RUN_DIR|FILE|NAME@VERSION",
        help="a run directory, a safetensors file, or a registry version (name@3, "
        "name@production, name@latest)",
    )
    p.add_argument(
        "--canary",
        metavar="RUN_DIR|FILE|NAME@VERSION",
        help="a second version served under the same name, taking --canary-share of requests",
    )
    p.add_argument(
        "--canary-share", type=float, default=0.1, help="the canary's share of requests [0.1]"
    )
    p.add_argument(
        "--task",
        help="for a FILE without fedveil metadata: MODEL, DATASET/MODEL or module:function; "
        "a custom task's model (file, run directory or registry version) loads only with "
        "its module:function named here (a model file never chooses code to import)",
    )
    p.add_argument("--name", help="the name to serve under [registry name, else the path's]")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on [127.0.0.1]")
    p.add_argument("--port", type=int, default=8480, help="port (0: any free one) [8480]")
    p.add_argument(
        "--insecure", action="store_true", help="plain HTTP, no TLS (loopback hosts only)"
    )
    p.add_argument(
        "--public",
        action="store_true",
        help="prediction without a token (warns when the model has no DP guarantee)",
    )
    p.add_argument("--token-file", type=Path, help="file holding the bearer token (mode 600)")
    p.add_argument("--tls-cert", type=Path, help="server certificate (PEM)")
    p.add_argument("--tls-key", type=Path, help="server private key (PEM)")
    p.add_argument(
        "--max-batch",
        type=int,
        default=512,
        help="most rows per forward pass (merged requests) and per request [512]",
    )
    p.add_argument(
        "--max-wait-ms",
        type=float,
        default=2.0,
        help="longest a batch that is not full waits for more requests [2]",
    )
    p.add_argument(
        "--max-body-bytes", type=int, default=32 * 1024 * 1024, help="largest request body [32 MiB]"
    )
    p.add_argument(
        "--max-connections",
        type=int,
        default=512,
        help="open connections at most; more are closed at once [512]",
    )
    p.add_argument(
        "--max-connections-per-peer",
        type=int,
        default=32,
        help="open connections from one client address at most [32]",
    )
    p.add_argument(
        "--request-timeout",
        type=float,
        default=60.0,
        help="seconds a client has to send a whole request, headers and body; a slower "
        "one is disconnected [60]",
    )
    p.add_argument(
        "--threads",
        type=int,
        help="torch threads per forward pass [one per core but one, at least 1: the HTTP side "
        "parses the next requests on the core left]",
    )
    p.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    # Before torch loads OpenMP: its threads then sleep between forward passes instead of
    # spinning, which took the cores the HTTP side and local clients need (measured: 5x
    # fewer requests/s for a small model on 2 cores). An explicit setting is kept.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from fedveil.server.serving.app import ServeLimits
    from fedveil.server.serving.connections import ConnectionLimits
    from fedveil.server.serving.prediction_server import ServeSettings, serve

    settings = ServeSettings(
        model=args.model,
        canary=args.canary,
        canary_share=args.canary_share,
        task=args.task,
        name=args.name,
        host=args.host,
        port=args.port,
        insecure=args.insecure,
        public=args.public,
        token_file=args.token_file,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        limits=ServeLimits(args.max_batch, args.max_wait_ms, args.max_body_bytes, args.threads),
        connections=ConnectionLimits(
            args.max_connections, args.max_connections_per_peer, args.request_timeout
        ),
    )
    return serve(settings)
