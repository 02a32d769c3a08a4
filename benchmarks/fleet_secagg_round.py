"""One secure-aggregation round of N emulated devices through a real coordinator,
compared with `fedveil simulate` of the same config and seed.

Each emulated device is a thread that does what a `fedveil client` does, on Flower's own
SuperNode connection (flwr.supernode.fleet_http_connection.http_request_response: TLS,
the device's enrolled key (CLIENT_CURVE) signing every request, ActivateNode, heartbeats,
Flower's retry invoker), without a SuperNode process: PullMessages (every 3 s when idle,
as flwr.supernode.start_client_internal sleeps), GetRun and GetFab once per run for the
run config, PullObject for each part of the message and ConfirmMessageReceived
(pull_and_inflate_object_from_tree), then fedveil's device logic (`answer` with an
EdgeClient built from the node config a device sets, `client-id`, holding the device's
own partition of the run's data), and the reply as the ClientApp runtime pushes it
(PushMessages with the reply's object tree, PushObject for every object the SuperLink
asks for). The coordinator's gateway and SuperLink see exactly a SuperNode's requests.
A failed pull or push of one message (a 500, which Flower's retry invoker does not
retry) loses that message and the device keeps polling, as the SuperNode's loop does; a
failed PullMessages ends the connection, which the device starts again (device_loop).

What is compared (round_verdict): the coordinator's per-client drop lines name who
dropped and whether its update is in the sum (a device that drops after its masked
input is summed); the deployed model is compared with `fedveil simulate` of the same
run in which exactly the devices left out of the sum never answer
(simulation.absent_clients), so both sides sum the same cohort. secagg_round_ok also
asks that at most dropped_allowed(N) devices (1%, at least one) dropped: a round that
loses more devices shows a coordinator that does not serve its fleet, whatever its sum.

The run: `synthetic` data, `logreg`, one round, every device sampled, `[secagg] enabled`.
Tolerance: secure aggregation rounds each client's weighted update (x_i * w_i / W) to a
grid of step s = 2 r / (L - 1) with stochastic rounding under a fresh OS-random key
(privacy/secagg/quantize.py), each error below one step, so the decoded weighted mean is
within N * s * W / sum(w) of the exact mean per coordinate; the simulation rounds with its
own fresh key, so the two models may differ by twice that (times server_lr; the first
FedAvgM step is the update itself), plus float slack. Training itself is deterministic:
without secure aggregation the two models are equal bit for bit (tests/coordinator).
"""

from __future__ import annotations

import math
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomllib
import torch
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from flwr.app import Message
from flwr.common.config import get_fused_config_from_fab
from flwr.supercore.inflatable.inflatable_object import (
    get_all_nested_objects,
    get_object_tree,
    no_object_id_recompute,
)
from flwr.supercore.inflatable.inflatable_utils import (
    pull_and_inflate_object_from_tree,
    push_objects,
)
from flwr.supernode import fleet_http_connection
from flwr.supernode.fleet_http_connection import http_request_response
from safetensors.torch import load, load_file

from fedveil.benchmarks.fleet_coordinator import Coordinator
from fedveil.client.edge.device_app import DataSource, EdgeClient, answer
from fedveil.config import config_from_dict
from fedveil.ops.certs import CLIENT_CURVE
from fedveil.server.engine.round_steps import SUMMED_NOTE
from fedveil.simulations.simulate_run import simulate
from fedveil.tasks import builtin_task

FLOAT_SLACK = 1e-6  # float32 rounding of the model (values of order 1) on either side
ROUND_TIMEOUT_S = 1800.0
MAX_DROPPED_SHARE = 0.01  # of the devices; at least one (dropped_allowed)
# round_steps.log_drops: "round 1: client 57 dropped: <reason>"
DROP_LINE = re.compile(r"round (?P<round>\d+): client (?P<client>\d+) dropped: (?P<reason>.*)$")
ACTIVATING_AT_ONCE = 16  # as bench_fleet's idle devices activate, 32 at a time on asyncio


def run_toml(devices: int, seed: int, max_weight: int = 0) -> str:
    """The run both sides execute: tiny model, one round, every device, secure sums.
    `max_weight`: the weight cap W, set explicitly so both sides quantise on the same grid
    (left at 0, the simulation takes its largest client and the coordinator, which holds
    no client data, 10,000)."""
    return f"""seed = {seed}
[model]
name = "logreg"
[data]
dataset = "synthetic"
num_clients = {devices}
[client]
local_epochs = 1
batch_size = 32
lr = 0.05
[server]
rounds = 1
per_round = {devices}
server_lr = 1.0
[secagg]
enabled = true
max_weight = {max_weight}
[deploy]
name = "fleet-secagg-{devices}"
wait_for_clients = {devices}
wait_timeout_s = 600
"""


@dataclass
class EmulatedDevice:
    """One device: its key, its data partition, and what its thread saw."""

    client_id: int
    key: ec.EllipticCurvePrivateKey
    data: Any
    answered: int = 0
    activations: int = 0
    restarts: int = 0  # connections started again after one ended
    messages_lost: int = 0  # pulled but not received, or answered but not sent
    errors: list[str] = field(default_factory=list)

    def lost(self, why: str) -> None:
        self.messages_lost += 1
        self.errors.append(why)

    def openssh(self) -> str:
        return (
            self.key.public_key()
            .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
            .decode()
        )


class SuperNodeExit(RuntimeError):
    """What would end a SuperNode process (Flower's `flwr_exit` on a failed connection)."""


def _supernode_exit(code: Any, message: str, *args: Any, **kwargs: Any) -> None:
    # Flower's flwr_exit ends the process (os._exit after a timeout): here it would end
    # every emulated device, so it ends only this device's connection, as the SuperNode
    # process of one `fedveil client` exits and its worker starts it again.
    raise SuperNodeExit(f"{code}: {message}")


def device_loop(
    dev: EmulatedDevice,
    address: str,
    ca_pem: bytes,
    stop: threading.Event,
    poll_s: float,
    connected: Callable[[], None],
    activating: threading.Semaphore,
) -> None:
    """One `fedveil client`: its SuperNode's connection, restarted with the worker's
    backoff (1 s doubling to 60 s, reset after a minute up; client/edge/edge.py) whenever
    it ends, as a SuperNode exits when a Fleet call fails for good (e.g. a SuperLink 500)."""
    edge = EdgeClient(DataSource(dev.data), dev.client_id)
    run_configs: dict[int, dict[str, Any]] = {}
    backoff = 1.0
    while not stop.is_set():
        began = time.monotonic()
        serve(dev, edge, run_configs, address, ca_pem, stop, poll_s, connected, activating)
        if stop.is_set():
            break
        dev.restarts += 1
        backoff = 1.0 if time.monotonic() - began > 60 else min(backoff * 2, 60.0)
        stop.wait(backoff)


def serve(
    dev: EmulatedDevice,
    edge: EdgeClient,
    run_configs: dict[int, dict[str, Any]],
    address: str,
    ca_pem: bytes,
    stop: threading.Event,
    poll_s: float,
    connected: Callable[[], None],
    activating: threading.Semaphore,
) -> None:
    """A SuperNode's connection and loop, answering with fedveil's device logic.
    `activating` bounds the devices activating at once: a fleet does not come up in one
    instant, and 200 simultaneous ActivateNodes only measure a thundering herd."""
    activating.acquire()
    held = True
    try:
        with http_request_response(address, False, ca_pem, (dev.key, dev.key.public_key())) as conn:
            activating.release()
            held = False
            if not dev.activations:
                connected()
            dev.activations += 1
            try:
                while not stop.is_set():
                    if not answer_one(dev, edge, run_configs, conn):
                        stop.wait(poll_s)
            except Exception as exc:  # Flower's connection logs it and closes; keep a count
                dev.errors.append(f"{type(exc).__name__}: {exc}")
                raise
    except SuperNodeExit as exc:
        dev.errors.append(str(exc))
    finally:
        if held:
            activating.release()


def answer_one(
    dev: EmulatedDevice, edge: EdgeClient, run_configs: dict[int, dict[str, Any]], conn: Any
) -> bool:
    """Pull one message and push its reply, as the SuperNode and the worker do; False if
    none was waiting."""
    _node_id, receive, send, get_run, get_fab, pull_object, push_object, confirm = conn
    got = receive()
    if got is None:
        return False
    head, tree = got
    run_id = head.metadata.run_id
    if run_id not in run_configs:
        run = get_run(run_id)
        fab = get_fab(run.fab_hash, run_id)
        run_configs[run_id] = dict(get_fused_config_from_fab(fab.content, run))
    started = time.perf_counter()
    try:
        message = pull_and_inflate_object_from_tree(
            tree,
            lambda oid: pull_object(run_id, oid),
            lambda oid: confirm(run_id, oid),
            return_type=Message,
        )
    except Exception as exc:
        # As flwr.supernode.start_client_internal._pull_and_store_message: a failed
        # PullObject (a 500 is not retried) loses the message, the SuperNode logs it,
        # keeps its connection and polls again after its idle sleep.
        dev.lost(f"pulling a message: {type(exc).__name__}: {exc}")
        return False
    message.metadata.__dict__["_message_id"] = tree.object_id
    reply = answer(edge, message, run_id, run_configs[run_id])
    # As flwr.supernode.runtime.run_clientapp.push_message sends a reply.
    reply.metadata.__dict__["_message_id"] = reply.object_id
    with no_object_id_recompute():
        reply_tree = get_object_tree(reply)
        objects = get_all_nested_objects(reply)
        try:
            to_push, session = send(reply, reply_tree, time.perf_counter() - started)
            push_objects(
                objects,
                lambda oid, content: push_object(run_id, session, oid, content),
                object_ids_to_push=to_push,
            )
        except Exception as exc:
            # As start_client_internal._push_messages: the reply is logged and dropped.
            dev.lost(f"pushing a reply: {type(exc).__name__}: {exc}")
            return True
    dev.answered += 1
    return True


def tolerance(cfg: Any, weights: list[int]) -> float:
    """Twice the quantisation bound on the weighted mean (see the module doc)."""
    s = cfg.secagg
    step = 2.0 * s.clip_range / (s.levels - 1)
    max_weight = s.max_weight  # set by run_toml: the same W on both sides
    # Weights above the cap are capped (privacy/encodings.py); the sum is of those sent.
    total = sum(min(w, max_weight) for w in weights)
    bound = len(weights) * step * max_weight / total
    return 2.0 * cfg.server.server_lr * bound + FLOAT_SLACK


def simulated_model(toml: str, out: Path, absent: Collection[int] = ()) -> dict[str, torch.Tensor]:
    """`fedveil simulate` of the run, with the `absent` devices never answering
    (simulation.absent_clients): the simulation of the cohort the deployment aggregated."""
    values = tomllib.loads(toml)
    values.pop("deploy")
    values["out"] = str(out)
    if absent:
        absent_ids = ",".join(str(c) for c in sorted(absent))
        values.setdefault("simulation", {})["absent_clients"] = absent_ids
    simulate(config_from_dict(values))
    return load_file(str(out / "model.safetensors"))


def dropped_allowed(devices: int) -> int:
    """The most devices a round may lose and still count as ok: 1% (at least one). A
    device that drops is left out of the sum and its masks are recovered, which the
    protocol is built for; a round that loses more measures a coordinator that cannot
    serve its fleet, whatever its sum."""
    return max(1, math.floor(devices * MAX_DROPPED_SHARE))


def coordinator_drops(run_log: str, round_num: int) -> dict[int, str]:
    """Who dropped from round `round_num`, and why: the engine's line per dropped client
    (round_steps.log_drops, at INFO in the run's server.log without DP). A reason ending
    in SUMMED_NOTE is a client whose update is in the sum (it dropped after its masked
    input); the others are left out of it (left_out)."""
    drops: dict[int, str] = {}
    for line in run_log.splitlines():
        m = DROP_LINE.search(line)
        if m is not None and int(m["round"]) == round_num:
            drops[int(m["client"])] = m["reason"]
    return drops


def left_out(drops: dict[int, str]) -> set[int]:
    """The dropped clients whose updates are not in the round's sum."""
    return {c for c, reason in drops.items() if not reason.endswith(SUMMED_NOTE)}


def max_abs_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float | None:
    """The largest coordinate difference of two models; None if their tensors differ."""
    if a.keys() != b.keys() or any(a[k].shape != b[k].shape for k in a):
        return None
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def round_verdict(
    deployed: dict[str, torch.Tensor] | None,
    reference: dict[str, torch.Tensor] | None,
    tol: float,
    record: dict[str, Any],
    drops: dict[int, str],
    devices: int,
) -> tuple[bool, str]:
    """secagg_round_ok and why: the round was applied; the coordinator's record and its
    per-client drop lines agree on who was aggregated; at most dropped_allowed(devices)
    dropped; and the deployed model equals `reference`, the simulation of exactly the
    aggregated cohort, within `tol`. Comparisons are written so NaN fails them."""
    if deployed is None or record.get("applied") is not True:
        return False, "the round's model was not applied"
    aggregated, dropped = record.get("cohort_aggregated"), record.get("dropped")
    absent = left_out(drops)
    if aggregated != devices - len(absent) or dropped != len(drops):
        return False, (
            f"the round record (cohort_aggregated {aggregated}, dropped {dropped}) does not "
            f"match the run's log ({len(drops)} dropped, {len(absent)} of them left out "
            "of the sum)"
        )
    allowed = dropped_allowed(devices)
    if not len(drops) <= allowed:
        return False, f"{len(drops)} of {devices} devices dropped, more than the {allowed} allowed"
    if reference is None:
        return False, "no simulation of the aggregated cohort to compare with"
    diff = max_abs_diff(deployed, reference)
    if diff is None:
        return False, "the deployed model's tensors are not the simulation's"
    if not diff <= tol:
        return False, (
            f"max |deployed - simulated| = {diff:.3g} over the {aggregated} aggregated "
            f"devices exceeds the tolerance {tol:.3g}"
        )
    return True, (
        f"{aggregated} of {devices} aggregated ({len(drops)} dropped, at most {allowed} "
        f"allowed); max |deployed - simulated| = {diff:.3g} <= {tol:.3g}"
    )


def keep_logs(root: Path, rid: str | None, logs: Path) -> list[Path]:
    """Copy the coordinator's logs out of its (temporary) directory into `logs`: its own
    server.log, the SuperLink child's output (state/logs/superlink.log and its rotated
    files: Flower's and uvicorn's tracebacks, e.g. the cause of a 500) and the run's
    ServerApp log (who dropped and why). Returns the files copied."""
    logs.mkdir(parents=True, exist_ok=True)
    sources = [(root / "server.log", "server.log")]
    sources += [(f, f.name) for f in sorted((root / "state" / "logs").glob("*.log*"))]
    if rid is not None:
        sources.append((root / "state" / "runs" / rid / "server.log", "run-server.log"))
    kept = []
    for source, name in sources:
        if source.is_file():
            shutil.copyfile(source, logs / name)
            kept.append(logs / name)
    return kept


def _wait_run(coord: Coordinator, rid: str, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = coord.http.get(f"/runs/{rid}").json()
        if run["status"] in ("completed", "failed", "stopped"):
            return run
        time.sleep(1.0)
    raise RuntimeError(f"run {rid} not finished within {timeout:.0f} s")


def secagg_round(
    devices: int,
    *,
    seed: int = 0,
    poll_s: float = 3.0,
    workdir: Path | None = None,
    logs: Path | None = None,
    log: Any = None,
) -> dict[str, Any]:
    """Run the round; the `secagg_round_*` keys of `fedveil bench fleet --json`.
    `logs`: a folder that keeps the coordinator's logs after the round (keep_logs); the
    coordinator's own directory is temporary (a pytest path is too long for the
    SuperLink's socket)."""
    if devices < 3:
        raise ValueError(f"--secagg-round {devices}: secure aggregation needs >= 3 devices")
    torch.set_num_threads(1)  # hundreds of device threads each train a tiny model
    fleet_http_connection.flwr_exit = _supernode_exit  # type: ignore[attr-defined]
    values = tomllib.loads(run_toml(devices, seed))
    values.pop("deploy")
    task = builtin_task(config_from_dict(values))  # the partition: no secagg key affects it
    emulated = [
        EmulatedDevice(cid, ec.generate_private_key(CLIENT_CURVE), task.client_data(cid))
        for cid in range(devices)
    ]
    weights = [len(d.data) for d in emulated]
    toml = run_toml(devices, seed, max(weights))
    values = tomllib.loads(toml)
    values.pop("deploy")
    cfg = config_from_dict(values)

    def say(text: str) -> None:
        if log is not None:
            print(text, file=log, flush=True)

    with tempfile.TemporaryDirectory(prefix="fv-secagg-", dir=workdir) as tmp:
        coord = Coordinator(Path(tmp))
        stop = threading.Event()
        threads: list[threading.Thread] = []
        rid: str | None = None
        up = [0]
        lock = threading.Lock()
        activating = threading.Semaphore(ACTIVATING_AT_ONCE)

        def connected() -> None:
            with lock:
                up[0] += 1

        try:
            coord.start()
            for d in emulated:
                coord.enroll(d.client_id, d.openssh())
            ca_pem = coord.ca.read_bytes()
            for d in emulated:
                t = threading.Thread(
                    target=device_loop,
                    args=(d, coord.fleet_address, ca_pem, stop, poll_s, connected, activating),
                    name=f"device-{d.client_id}",
                    daemon=True,
                )
                t.start()
                threads.append(t)
            deadline = time.monotonic() + 300
            while up[0] < devices and time.monotonic() < deadline:
                time.sleep(0.5)
            say(f"secagg round: {up[0]}/{devices} devices activated")
            start, cpu_before = time.perf_counter(), coord.sample().cpu_s
            r = coord.http.post("/runs", content=toml, headers={"Content-Type": "application/toml"})
            if r.status_code != 201:
                raise RuntimeError(f"submitting the run: {r.status_code} {r.text}")
            rid = r.json()["id"]
            run = _wait_run(coord, rid, ROUND_TIMEOUT_S)
            elapsed = time.perf_counter() - start
            # The coordinator's processes (gateway, SuperLink, the run's ServerApp) over
            # the run: what one secure round of N costs it, whatever the machine's load.
            cpu_s = coord.sample().cpu_s - cpu_before
            say(f"secagg round: run {rid} {run['status']} in {elapsed:.1f} s")
            deployed: dict[str, torch.Tensor] | None = None
            if run["status"] == "completed":
                m = coord.http.get(f"/runs/{rid}/model")
                if m.status_code == 200:
                    deployed = load(m.content)
            rounds = coord.http.get(f"/runs/{rid}/rounds").json()
            run_log = Path(tmp, "state", "runs", rid, "server.log")
            drops = coordinator_drops(
                run_log.read_text(errors="replace") if run_log.exists() else "", 1
            )
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=60)
            coord.stop()
            if logs is not None:
                keep_logs(Path(tmp), rid, logs)
                say(f"secagg round: the coordinator's logs are in {logs}")
        # The simulation of exactly the cohort the coordinator aggregated; not run
        # where the round cannot be ok anyway (too many left out of the sum).
        simulated: dict[str, torch.Tensor] | None = None
        if deployed is not None and len(left_out(drops)) <= dropped_allowed(devices):
            try:
                simulated = simulated_model(toml, Path(tmp) / "sim", left_out(drops))
            except Exception as exc:  # e.g. too few survivors for the simulation's protocol
                say(f"secagg round: the simulation of the aggregated cohort failed: {exc}")
    survivors = [c for c in range(devices) if c not in left_out(drops)]
    tol = tolerance(cfg, [weights[c] for c in survivors]) if survivors else math.nan
    last = rounds[-1] if rounds else {}
    ok, verdict = round_verdict(deployed, simulated, tol, last, drops, devices)
    diff = None if deployed is None or simulated is None else max_abs_diff(deployed, simulated)
    changed = diff is not None and diff > 0.0
    errors: dict[str, int] = {}
    for d in emulated:
        for e in d.errors:
            errors[e[:120]] = errors.get(e[:120], 0) + 1
    say(f"secagg round: {'ok' if ok else 'NOT ok'}: {verdict}")
    return {
        "secagg_round_ok": ok,
        "secagg_round_verdict": verdict,
        "secagg_round_devices": devices,
        "secagg_round_status": run["status"],
        "secagg_round_s": round(elapsed, 2),
        "secagg_round_coordinator_cpu_s": round(cpu_s, 2),
        "secagg_round_tolerance": tol if tol == tol else None,  # NaN: nobody aggregated
        "secagg_round_max_abs_diff": diff,
        "secagg_round_models_differ": changed,  # fresh rounding keys: they should
        "secagg_round_cohort_aggregated": last.get("cohort_aggregated"),
        "secagg_round_aggregated": last.get("cohort_aggregated"),
        "secagg_round_dropped": last.get("dropped"),
        "secagg_round_dropped_devices": {str(c): r for c, r in sorted(drops.items())},
        "secagg_round_dropped_allowed": dropped_allowed(devices),
        "secagg_round_messages_answered": sum(d.answered for d in emulated),
        "secagg_round_connection_restarts": sum(d.restarts for d in emulated),
        "secagg_round_messages_lost": sum(d.messages_lost for d in emulated),
        "secagg_round_device_errors": errors,
        "secagg_round_logs": None if logs is None else str(logs),
        "secagg_round_note": (
            "ok: the round was applied, at most secagg_round_dropped_allowed devices "
            "(1%, at least one) dropped, and the model equals `fedveil simulate` of the "
            "aggregated cohort (the dropped devices absent) within tolerance = 2 * "
            "server_lr * N * step * W / sum(w) + float slack over the N aggregated: each "
            "side's stochastic rounding (fresh OS-random key) moves each client's weighted "
            "update by under one step 2r/(L-1) per coordinate"
        ),
    }
