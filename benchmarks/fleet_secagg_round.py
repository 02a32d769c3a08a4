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

import contextlib
import tempfile
import threading
import time
from collections.abc import Callable
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
from fedveil.simulations.simulate_run import simulate
from fedveil.tasks import builtin_task

FLOAT_SLACK = 1e-6  # float32 rounding of the model (values of order 1) on either side
ROUND_TIMEOUT_S = 1800.0
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
    errors: list[str] = field(default_factory=list)

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
    message = pull_and_inflate_object_from_tree(
        tree,
        lambda oid: pull_object(run_id, oid),
        lambda oid: confirm(run_id, oid),
        return_type=Message,
    )
    message.metadata.__dict__["_message_id"] = tree.object_id
    reply = answer(edge, message, run_id, run_configs[run_id])
    # As flwr.supernode.runtime.run_clientapp.push_message sends a reply.
    reply.metadata.__dict__["_message_id"] = reply.object_id
    with no_object_id_recompute():
        reply_tree = get_object_tree(reply)
        objects = get_all_nested_objects(reply)
        to_push, session = send(reply, reply_tree, time.perf_counter() - started)
        push_objects(
            objects,
            lambda oid, content: push_object(run_id, session, oid, content),
            object_ids_to_push=to_push,
        )
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


def simulated_model(toml: str, out: Path) -> dict[str, torch.Tensor]:
    values = tomllib.loads(toml)
    values.pop("deploy")
    values["out"] = str(out)
    simulate(config_from_dict(values))
    return load_file(str(out / "model.safetensors"))


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
    log: Any = None,
) -> dict[str, Any]:
    """Run the round; the `secagg_round_*` keys of `fedveil bench fleet --json`."""
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
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=60)
            coord.stop()
        simulated = simulated_model(toml, Path(tmp) / "sim")
    tol = tolerance(cfg, weights)
    diff: float | None = None
    if deployed is not None and deployed.keys() == simulated.keys():
        diff = max(float((deployed[k] - simulated[k]).abs().max()) for k in deployed)
    changed = deployed is not None and any(
        not torch.equal(deployed[k], simulated[k]) for k in deployed
    )
    errors: dict[str, int] = {}
    for d in emulated:
        for e in d.errors:
            errors[e[:120]] = errors.get(e[:120], 0) + 1
    last = rounds[-1] if rounds else {}
    with contextlib.suppress(TypeError, KeyError):
        say(f"secagg round: max |deployed - simulated| = {diff:.3g} (tolerance {tol:.3g})")
    return {
        "secagg_round_ok": diff is not None and diff <= tol and last.get("applied") is True,
        "secagg_round_devices": devices,
        "secagg_round_status": run["status"],
        "secagg_round_s": round(elapsed, 2),
        "secagg_round_coordinator_cpu_s": round(cpu_s, 2),
        "secagg_round_tolerance": tol,
        "secagg_round_max_abs_diff": diff,
        "secagg_round_models_differ": changed,  # fresh rounding keys: they should
        "secagg_round_cohort_aggregated": last.get("cohort_aggregated"),
        "secagg_round_dropped": last.get("dropped"),
        "secagg_round_messages_answered": sum(d.answered for d in emulated),
        "secagg_round_connection_restarts": sum(d.restarts for d in emulated),
        "secagg_round_device_errors": errors,
        "secagg_round_note": (
            "tolerance = 2 * server_lr * N * step * W / sum(w) + float slack: each side's "
            "stochastic rounding (fresh OS-random key) moves each client's weighted update "
            "by under one step 2r/(L-1) per coordinate"
        ),
    }
