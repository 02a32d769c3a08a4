"""Deployment commands: `fedveil server`, `fedveil ready`, `fedveil client`, `fedveil run`,
`fedveil clients`, `fedveil certs`."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

from fedveil.config import ConfigError
from fedveil.ops.api_client import ApiCallError, ApiClient, add_api_args


def _service_logging(state_dir: Path | None, name: str) -> None:
    """INFO for fedveil's own loggers (the service narrates runs), secrets never among them."""
    logger = logging.getLogger("fedveil")
    if logger.level == logging.NOTSET or logger.level > logging.INFO:
        logger.setLevel(logging.INFO)
    if not logging.getLogger().handlers:
        logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:
        handler.setLevel(logging.INFO)
    if state_dir is not None:
        (state_dir / "logs").mkdir(parents=True, exist_ok=True)
        fh = logging.FileHandler(state_dir / "logs" / f"{name}.log")
        fh.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logger.addHandler(fh)


# -- fedveil server ----------------------------------------------------------------
def add_server(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "server",
        help="run the coordinator (SuperLink, Fleet API, HTTP API, dashboard)",
        description="Start the coordinator as a long-running service: Flower's SuperLink "
        "(state on disk), the Fleet API gateway for devices, and the HTTP API with the "
        "dashboard. TLS is on by default (see `fedveil certs`). SIGTERM stops it; runs resume "
        "from their last completed round at the next start.",
    )
    p.add_argument("--config", required=True, help="server.toml")
    p.add_argument(
        "--state-dir",
        help="where runs, logs and the registry live, instead of server.toml's state_dir "
        "(the container image passes its volume, /var/lib/fedveil)",
    )
    p.add_argument(
        "--insecure",
        action="store_true",
        help="no TLS and no SuperNode authentication (warns; trusted test networks only)",
    )
    p.set_defaults(func=cmd_server)


def cmd_server(args: argparse.Namespace) -> int:
    from fedveil.server.coordinator.launch import serve
    from fedveil.server.coordinator.service import secure_state_dir
    from fedveil.server.coordinator.settings import load_settings

    settings = load_settings(args.config, insecure=args.insecure, state_dir=args.state_dir)
    secure_state_dir(settings.state_dir)  # umask 077 before the first log file exists
    _service_logging(settings.state_dir, "service")
    return serve(settings)


def add_ready(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "ready",
        help="wait until a coordinator answers /readyz (for scripts after `fedveil server &`)",
        description="Poll the coordinator's GET /readyz until it is ready (SuperLink up, "
        "runs supervised; the admin token file exists by then) or --wait seconds pass. "
        "Exit 0 when ready, 1 when not.",
    )
    p.add_argument(
        "--wait", type=float, default=60.0, help="seconds to keep trying (default 60; 0: once)"
    )
    add_api_args(p)
    p.set_defaults(func=cmd_ready)


def cmd_ready(args: argparse.Namespace) -> int:
    if not 0 <= args.wait <= 3600:
        raise ValueError(f"--wait {args.wait:g}: must be within [0, 3600] seconds")
    api = ApiClient.from_args(args)
    api.timeout = 5.0
    deadline = time.monotonic() + args.wait
    last = "no answer"
    while True:
        try:
            api.request("GET", "/readyz")
            print(f"ready: {api.base}")
            return 0
        except ApiCallError as exc:
            # 0: nothing listening yet (or TLS/CA trouble, said in the detail); 503: starting.
            last = exc.detail if exc.status == 0 else f"HTTP {exc.status}: {exc.detail}"
        if time.monotonic() >= deadline:
            print(f"fedveil: not ready after {args.wait:g} s: {last}", file=sys.stderr)
            return 1
        time.sleep(0.5)


# -- fedveil client ----------------------------------------------------------------
def add_client(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "client",
        help="run this device as a client (a SuperNode with fedveil's client)",
        description="Join a coordinator's federation as client --client-id: a Flower SuperNode "
        "plus fedveil's worker, training on local data (--data: .npz, .csv or IDX files) with "
        "the run's built-in model, or on a task installed here (--task module:function). "
        "Reconnects with backoff; the local policy flags bind whatever the server asks.",
    )
    p.add_argument("--server", required=True, help="the coordinator's Fleet API, HOST:PORT")
    p.add_argument(
        "--client-id", type=int, required=True, help="this device's id (from enrollment)"
    )
    p.add_argument(
        "--data", help="local data: .npz, .csv, or IDX files (a directory or the images file)"
    )
    p.add_argument(
        "--task",
        help="NAME: train only this built-in model (logreg, mlp, cnn) on --data; "
        "module:function: a task installed on this device (its own data and model)",
    )
    p.add_argument("--ca", help="CA certificate to verify the coordinator (default: system CAs)")
    p.add_argument("--key", help="this device's private key for SuperNode authentication")
    p.add_argument("--insecure", action="store_true", help="no TLS (warns; test networks only)")
    p.add_argument(
        "--state-dir", default=None, help="where the client keeps its files [~/.fedveil/client]"
    )
    p.add_argument(
        "--download-stall-seconds",
        type=float,
        default=60.0,
        metavar="S",
        help="give a message up when nothing of its download from the coordinator has "
        "arrived for S seconds (a slow link that still makes progress is waited for); the "
        "device then serves the next one. In (0, 7200] [60]",
    )
    _add_policy_args(p.add_argument_group("local policy (the server cannot override it)"))
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where to train")
    p.set_defaults(func=cmd_client)


def _add_policy_args(g: argparse._ArgumentGroup) -> None:
    """The device's own limits: whatever a run asks, these bind."""
    g.add_argument(
        "--require-secagg",
        action="store_true",
        help="refuse rounds without secure aggregation: no update and no evaluation "
        "(accuracy, loss) leaves this device in the clear",
    )
    g.add_argument(
        "--max-clip-norm",
        type=float,
        default=0.0,
        help="send only updates clipped to at most this L2 norm (DP rounds); refuse others",
    )
    g.add_argument(
        "--min-dp-noise", type=float, default=0.0, help="refuse rounds with less local DP noise"
    )
    g.add_argument(
        "--max-dp-epsilon",
        type=float,
        default=0.0,
        help="cap this device's own example-level DP-SGD epsilon, accounted here from what "
        "it trained (its own example count, the batch size, epochs and noise of each round) "
        "and kept in --state-dir across runs and restarts: refuse a round that would exceed "
        "it, and any training without DP-SGD noise (0: no cap; the figure is still logged)",
    )
    g.add_argument(
        "--dp-delta",
        type=float,
        default=1e-5,
        help="the delta at which --max-dp-epsilon and the logged DP-SGD epsilon are stated",
    )
    g.add_argument(
        "--max-own-share-epsilon",
        type=float,
        default=0.0,
        help="under distributed DP, refuse rounds that would bring this device's "
        "own-share-only epsilon against the coordinator (its own noise share alone: the "
        "figure if every other cohort member is the coordinator's) above this (0: no cap; "
        "the figure is logged either way)",
    )
    g.add_argument(
        "--max-local-epochs", type=int, default=0, help="cap local epochs per round (0: none)"
    )
    g.add_argument(
        "--max-local-steps", type=int, default=0, help="cap local steps per round (0: none)"
    )
    g.add_argument(
        "--max-train-seconds", type=float, default=0.0, help="cap training time per round"
    )
    g.add_argument(
        "--max-model-parameters",
        type=int,
        default=20_000_000,
        help="refuse runs whose built-in model would have more parameters (counted "
        "before it is built; default 20,000,000)",
    )
    g.add_argument(
        "--allow-app",
        action="append",
        default=[],
        metavar="PUBLISHER/NAME",
        help="also take part in runs of this Flower app (FAB id; repeatable); by default "
        "only the coordinator's own (fedveil/fedveil-service). The device still answers "
        "with its own installed ClientApp",
    )
    g.add_argument(
        "--identity-key",
        help="this device's Ed25519 identity key (fedveil identity keygen); with --roster, "
        "secure aggregation runs only in malicious-server mode and --require-secagg holds",
    )
    g.add_argument(
        "--roster",
        help="the operator's roster of client identity keys (fedveil identity roster); "
        "peers are checked against this copy, never against the coordinator's; a new "
        "version of the file (renamed over it) is taken at the next request, no restart",
    )


def cmd_client(args: argparse.Namespace) -> int:
    from fedveil.client.dpsgd_budget import DpSgdLedger
    from fedveil.client.edge.device_app import DP_SGD_DIR, DataSource, EdgeClient, TaskSource
    from fedveil.client.edge.edge import EdgeNode, EdgeOptions
    from fedveil.client.edge.edge_data import load_local_data
    from fedveil.client.edge.edge_policy import LocalPolicy

    if args.client_id < 0:
        raise ValueError(f"--client-id {args.client_id}: must be >= 0")
    state = Path(args.state_dir or Path.home() / ".fedveil" / "client").expanduser()
    opts = EdgeOptions(
        server=args.server,
        client_id=args.client_id,
        state_dir=state,
        ca=Path(args.ca) if args.ca else None,
        key=Path(args.key) if args.key else None,
        insecure=args.insecure,
        task_pull_stall_s=args.download_stall_seconds,
    )
    opts.check()  # before any data or key is loaded
    identity, fingerprint = None, ""
    if bool(args.identity_key) != bool(args.roster):
        raise ValueError("--identity-key and --roster go together: give both or neither")
    if args.identity_key:
        from fedveil.privacy.secagg.identity_files import load_client_identity

        identity = load_client_identity(args.client_id, Path(args.identity_key), Path(args.roster))
        fingerprint = identity.roster.fingerprint()
    task = args.task
    if task and ":" in task:
        if args.data:
            raise ValueError("--task module:function brings its own data; drop --data")
        from fedveil.tasks import load_task_function

        load_task_function(task)  # fail now if it does not import
        source: DataSource | TaskSource = TaskSource(task)
    elif args.data:
        from fedveil.builtin_models import MODELS

        if task and task not in MODELS:
            raise ValueError(f"--task {task!r}: not a built-in model ({', '.join(sorted(MODELS))})")
        source = DataSource(load_local_data(args.data), task)
    else:
        raise ValueError("give --data PATH (local data files) or --task module:function")
    policy = LocalPolicy(
        # A device that guards against a lying server does not send updates in the clear.
        require_secagg=args.require_secagg or identity is not None,
        max_clip_norm=args.max_clip_norm,
        min_dp_noise=args.min_dp_noise,
        max_dp_epsilon=args.max_dp_epsilon,
        dp_delta=args.dp_delta,
        max_local_epochs=args.max_local_epochs,
        max_local_steps=args.max_local_steps,
        max_train_seconds=args.max_train_seconds,
        allow_apps=tuple(args.allow_app),
        max_model_parameters=args.max_model_parameters,
        max_own_share_epsilon=args.max_own_share_epsilon,
    )
    _service_logging(None, "client")
    log = logging.getLogger("fedveil.edge")
    if args.insecure:
        log.warning("--insecure: no TLS to the coordinator; for trusted test networks only")
    ledger = DpSgdLedger(state / DP_SGD_DIR, policy.max_dp_epsilon, policy.dp_delta)
    edge = EdgeClient(source, args.client_id, policy, args.device, identity, dp_sgd_ledger=ledger)
    n = len(source.data) if isinstance(source, DataSource) else "task"
    log.info("client %d: data %s, local policy: %s", args.client_id, n, policy.describe())
    if ledger.events():
        log.info(
            "client %d: DP-SGD epsilon spent so far on this device's data: %.4g at delta %g",
            args.client_id,
            ledger.spent(),
            ledger.delta,
        )
    if identity is not None:
        log.info(
            "client %d: secure aggregation in malicious-server mode only; roster of %d "
            "clients, fingerprint %s",
            args.client_id,
            len(identity.roster),
            fingerprint,
        )
    return EdgeNode(opts, edge).run()


# -- fedveil run -------------------------------------------------------------------
def add_run(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="submit, list, follow and stop runs on a coordinator")
    rsub = p.add_subparsers(dest="run_command", required=True, metavar="ACTION")
    s = rsub.add_parser(
        "submit", help="submit a run config (TOML, with an optional [deploy] table)"
    )
    s.add_argument("file", help="run.toml")
    s.add_argument("--wait", action="store_true", help="follow the run until it ends")
    s.set_defaults(func=cmd_run_submit)
    ls = rsub.add_parser("list", help="all runs")
    ls.set_defaults(func=cmd_run_list)
    st = rsub.add_parser("status", help="one run")
    st.add_argument("run_id")
    st.add_argument("--wait", action="store_true", help="follow the run until it ends")
    st.set_defaults(func=cmd_run_status)
    sp = rsub.add_parser("stop", help="stop a run")
    sp.add_argument("run_id")
    sp.set_defaults(func=cmd_run_stop)
    m = rsub.add_parser("model", help="download a run's global model (safetensors)")
    m.add_argument("run_id")
    m.add_argument("-o", "--out", required=True, help="file to write")
    m.set_defaults(func=cmd_run_model)
    lg = rsub.add_parser("logs", help="a run's server log (admin token), as `flwr log` shows")
    lg.add_argument("run_id")
    lg.add_argument(
        "--tail", type=int, default=200, metavar="N", help="the last N lines (default 200)"
    )
    lg.add_argument(
        "--follow", action="store_true", help="keep printing new lines until the run ends"
    )
    lg.set_defaults(func=cmd_run_logs)
    for q in (s, ls, st, sp, m, lg):
        add_api_args(q)
        q.add_argument("--json", action="store_true", help="print JSON")


def _api_call(fn):  # noqa: ANN001, ANN202 - decorator for CLI handlers
    def wrapped(args: argparse.Namespace) -> int:
        try:
            return fn(args, ApiClient.from_args(args))
        except ApiCallError as exc:
            where = f" (field {exc.field})" if exc.field else ""
            print(f"fedveil: {exc.detail}{where} [HTTP {exc.status}]", file=sys.stderr)
            return 1

    return wrapped


def _line(run: dict) -> str:
    done, total = run.get("rounds_completed", 0), run.get("rounds", 0)
    aborted = f", {run['rounds_aborted']} aborted" if run.get("rounds_aborted") else ""
    extra = f" ({run['phase']})" if run.get("phase") else ""
    err = f" error: {run['error']}" if run.get("error") else ""
    return (
        f"{run['id']}  {run['status']:<9} {done}/{total} rounds{aborted}{extra}  "
        f"{run.get('name', '')}{err}"
    )


def outcome_lines(run: dict) -> list[str]:
    """What an ended run came to, after its status line: aborted rounds, the server's
    own evaluation, the registered model and any warning on it (what the dashboard shows)."""
    lines = []
    if run.get("rounds_aborted"):
        lines.append(
            f"{run['rounds_aborted']} of {run.get('rounds_completed', 0)} rounds aborted "
            f"and released nothing (GET /runs/{run['id']}/rounds and the dashboard list them)"
        )
    summary = run.get("summary") or {}
    if isinstance(summary.get("test_accuracy"), (int, float)):
        lines.append(f"test accuracy {summary['test_accuracy']:.4f} (the server's own test set)")
    if run.get("model_version"):
        lines.append(f"model registered as {run['model_version']}")
    if run.get("model_version_warning"):
        lines.append(f"warning: {run.get('model_version')}: {run['model_version_warning']}")
    if run.get("model_version_error"):
        lines.append(f"warning: model not registered: {run['model_version_error']}")
    return lines


def _follow(api: ApiClient, run_id: str, as_json: bool) -> int:
    last = None
    while True:
        run = api.json("GET", f"/runs/{run_id}")
        line = _line(run)
        if line != last and not as_json:
            print(line, file=sys.stderr)
            last = line
        if run["status"] in ("completed", "failed", "stopped"):
            if as_json:
                print(json.dumps(run))
            for outcome in [] if as_json else outcome_lines(run):
                print(outcome, file=sys.stderr)
            return 0 if run["status"] == "completed" else 1
        time.sleep(2)


@_api_call
def cmd_run_submit(args: argparse.Namespace, api: ApiClient) -> int:
    path = Path(args.file)
    try:
        body = path.read_bytes()
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file") from None
    _, raw = api.request("POST", "/runs", body, "application/toml", admin=True)
    run = json.loads(raw)
    print(json.dumps(run) if args.json else f"submitted run {run['id']}")
    for warning in [] if args.json else run.get("warnings") or []:
        print(f"warning: {warning}", file=sys.stderr)  # e.g. DP noise that swamps the update
    if args.wait:
        return _follow(api, run["id"], args.json)
    return 0


@_api_call
def cmd_run_list(args: argparse.Namespace, api: ApiClient) -> int:
    runs = api.json("GET", "/runs")
    if args.json:
        print(json.dumps(runs))
    for run in [] if args.json else runs:
        print(_line(run))
    return 0


@_api_call
def cmd_run_status(args: argparse.Namespace, api: ApiClient) -> int:
    if args.wait:
        return _follow(api, args.run_id, args.json)
    run = api.json("GET", f"/runs/{args.run_id}")
    print(json.dumps(run, indent=None if args.json else 2))
    return 0


@_api_call
def cmd_run_stop(args: argparse.Namespace, api: ApiClient) -> int:
    run = api.json("POST", f"/runs/{args.run_id}/stop", admin=True)
    print(json.dumps(run) if args.json else _line(run))
    return 0


@_api_call
def cmd_run_model(args: argparse.Namespace, api: ApiClient) -> int:
    _, raw = api.request("GET", f"/runs/{args.run_id}/model", admin=True)
    Path(args.out).write_bytes(raw)
    print(f"wrote {len(raw)} bytes to {args.out}", file=sys.stderr)
    return 0


@_api_call
def cmd_run_logs(args: argparse.Namespace, api: ApiClient) -> int:
    path = f"/runs/{args.run_id}/logs?tail={args.tail}"
    _, raw = api.request("GET", path, admin=True)
    text = raw.decode("utf-8", "replace")
    sys.stdout.write(text)
    seen = text.splitlines()
    while args.follow:
        run = api.json("GET", f"/runs/{args.run_id}")
        time.sleep(0 if run["status"] in ("completed", "failed", "stopped") else 2)
        _, raw = api.request("GET", path, admin=True)
        lines = raw.decode("utf-8", "replace").splitlines()
        new = _after(seen, lines)
        if new:
            sys.stdout.write("\n".join(new) + "\n")
            sys.stdout.flush()
        seen = lines
        if run["status"] in ("completed", "failed", "stopped"):
            break
    return 0


def _after(seen: list[str], lines: list[str]) -> list[str]:
    """The lines of a later tail that follow what was already printed."""
    if not seen:
        return lines
    last = seen[-1]
    for i in range(len(lines) - 1, -1, -1):
        if lines[i] == last:
            return lines[i + 1 :]
    return lines


# -- fedveil clients ---------------------------------------------------------------
def add_clients(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("clients", help="enroll, revoke and list client keys (SuperNode auth)")
    csub = p.add_subparsers(dest="clients_command", required=True, metavar="ACTION")
    kg = csub.add_parser("keygen", help="make a key pair for a device (run it on the device)")
    kg.add_argument("--name", required=True, help="key name, e.g. client-3")
    kg.add_argument("--out", default=".", help="directory for NAME.key and NAME.pub")
    kg.add_argument("--force", action="store_true", help="replace existing files")
    kg.set_defaults(func=cmd_clients_keygen)
    en = csub.add_parser("enroll", help="allow a device's public key as client --id")
    en.add_argument("public_key", help="NAME.pub (OpenSSH ECDSA public key)")
    en.add_argument("--id", dest="client_id", type=int, required=True, help="the client's id")
    en.add_argument("--name", help="a label for listings")
    en.set_defaults(func=cmd_clients_enroll)
    rv = csub.add_parser(
        "revoke", help="revoke a client's key: the coordinator refuses it from now on"
    )
    rv.add_argument("client_id", type=int)
    rv.set_defaults(func=cmd_clients_revoke)
    ls = csub.add_parser("list", help="enrolled clients")
    ls.set_defaults(func=cmd_clients_list)
    for q in (en, rv, ls):
        add_api_args(q)
        q.add_argument("--json", action="store_true", help="print JSON")


def cmd_clients_keygen(args: argparse.Namespace) -> int:
    from fedveil.ops.certs import create_client_key

    key, pub = create_client_key(Path(args.out), args.name, force=args.force)
    print(f"private key {key} (stays on the device), public key {pub} (enroll it)")
    return 0


@_api_call
def cmd_clients_enroll(args: argparse.Namespace, api: ApiClient) -> int:
    try:
        text = Path(args.public_key).read_text()
    except FileNotFoundError:
        raise ValueError(f"{args.public_key}: no such file") from None
    payload = {"client_id": args.client_id, "public_key": text, "name": args.name}
    r = api.json("POST", "/clients", payload, admin=True)
    print(
        json.dumps(r)
        if args.json
        else f"enrolled client {r['client_id']} ({r['name']}, key {r['fingerprint']})"
    )
    return 0


@_api_call
def cmd_clients_revoke(args: argparse.Namespace, api: ApiClient) -> int:
    r = api.json("DELETE", f"/clients/{args.client_id}", admin=True)
    print(json.dumps(r) if args.json else f"revoked client {r['client_id']} ({r['name']})")
    return 0


@_api_call
def cmd_clients_list(args: argparse.Namespace, api: ApiClient) -> int:
    rows = api.json("GET", "/clients", admin=True)
    if args.json:
        print(json.dumps(rows))
        return 0
    for r in rows:
        state = "revoked" if r.get("revoked_at") else ("online" if r["online"] else "offline")
        print(f"{r['client_id']:>6}  {state:<8} {r['fingerprint']}  {r['name']}")
    return 0


# -- fedveil certs -----------------------------------------------------------------
def add_certs(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "certs",
        help="make a CA, a server certificate and client keys for a test deployment",
        description="Write ca.pem/ca.key, server.pem/server.key (for --host names and IPs) "
        "and, with --clients N, SuperNode keys clients/client-<i>.key|.pub, all with "
        "`cryptography`. Private keys are mode 600. For production, use your own PKI.",
    )
    p.add_argument("--out", default="certs", help="directory [certs]")
    p.add_argument(
        "--host",
        action="append",
        default=None,
        help="DNS name or IP the server is reached at (repeatable) [localhost, 127.0.0.1, ::1]",
    )
    p.add_argument("--clients", type=int, default=0, help="also make N client key pairs")
    p.add_argument("--days", type=int, default=365, help="validity [365]")
    p.add_argument("--force", action="store_true", help="replace existing files")
    p.set_defaults(func=cmd_certs)


def cmd_certs(args: argparse.Namespace) -> int:
    from fedveil.ops.certs import DEFAULT_HOSTS, CertError, create_test_deployment

    if not 0 <= args.clients <= 10_000:
        raise ConfigError(f"--clients {args.clients}: must be in [0, 10000]")
    if not 1 <= args.days <= 3650:
        raise ConfigError(f"--days {args.days}: must be in [1, 3650]")
    try:
        files = create_test_deployment(
            Path(args.out),
            args.host or list(DEFAULT_HOSTS),
            args.clients,
            days=args.days,
            force=args.force,
        )
    except CertError as exc:
        raise ValueError(str(exc)) from None
    for name, path in files.items():
        mode = oct(os.stat(path).st_mode & 0o777)
        print(f"{name:>16}  {path}  ({mode})")
    return 0
