"""Which Ray cluster the Flower transport runs on, and which device each client trains on.

Ray runs every simulated client: on a fresh single-machine instance by default, or on an
existing (multi-node) cluster named by `simulation.ray_address` or RAY_ADDRESS. Each client
reserves `simulation.client_cpus` CPUs and `simulation.client_gpus` GPUs; a client with a GPU
share trains on the GPU Ray assigned it.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator, Sequence

from fedveil.config import RunConfig
from fedveil.config.ray_address import ENV, RayAddress, resolve_ray_address

PROBE_TIMEOUT_S = 5.0
# Ray's own default keeps a driver retrying a vanished GCS for 60 s; a run should say so sooner.
GCS_RECONNECT_TIMEOUT_S = "20"


class RayClusterUnreachable(ValueError):
    """The configured Ray cluster does not answer (the run fails before training).

    A ValueError: the user fixes it (the address, or a cluster to start), so the CLI
    says it in one `fedveil: error:` line, exit 2, as it does configuration errors."""


def client_resources(cfg: RunConfig) -> dict[str, float]:
    """What Ray reserves for each client (Flower's `client_resources`)."""
    return {"num_cpus": cfg.simulation.client_cpus, "num_gpus": cfg.simulation.client_gpus}


def client_device(
    client_gpus: float, gpu_ids: Sequence[int | str], visible_devices: str | None
) -> str:
    """The torch device of a client whose Ray worker was assigned `gpu_ids`.

    Ray sets CUDA_VISIBLE_DEVICES to the assigned GPUs, so the first of them is cuda:0 in
    the worker; where it did not (RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES), the
    assigned id is the device index itself.
    """
    if client_gpus <= 0:
        return "cpu"
    if not gpu_ids:
        raise RuntimeError(
            f"simulation.client_gpus = {client_gpus}: Ray assigned this client no GPU "
            "(does the cluster have any? `ray status` lists them)"
        )
    first = str(gpu_ids[0])
    visible = [d.strip() for d in (visible_devices or "").split(",") if d.strip()]
    if first in visible:
        return f"cuda:{visible.index(first)}"
    return f"cuda:{first}"


def ray_client_device(client_gpus: float) -> str:
    """`client_device` inside a Ray worker."""
    if client_gpus <= 0:
        return "cpu"
    import ray

    return client_device(client_gpus, ray.get_gpu_ids(), os.environ.get("CUDA_VISIBLE_DEVICES"))


def node_id() -> str:
    """The Ray node this process runs on ('' outside Ray)."""
    try:
        import ray

        return ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""
    except Exception:  # a debug record must never fail a client
        return ""


def _endpoint(address: RayAddress) -> tuple[str, int] | None:
    if address.text != "auto":
        return address.endpoint()
    from ray._private.services import canonicalize_bootstrap_address

    try:
        found = canonicalize_bootstrap_address("auto")
    except (ConnectionError, ValueError) as exc:
        raise RayClusterUnreachable(
            f"{address.source} = 'auto': no Ray cluster started with `ray start` on this "
            f"machine ({exc})"
        ) from None
    if found is None:
        return None
    host, _, port = found.rpartition(":")
    return host, int(port)


def probe(address: RayAddress, timeout: float = PROBE_TIMEOUT_S) -> None:
    """Fail at once, naming the address and where it came from, if nothing listens there.

    `ray.init` itself retries an unreachable GCS for many minutes (and holds off SIGTERM
    meanwhile), so the run checks the address first.
    """
    endpoint = _endpoint(address)
    if endpoint is None:
        return
    host, port = endpoint
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except OSError as exc:
        reason = "no answer" if isinstance(exc, TimeoutError) else str(exc)
        raise RayClusterUnreachable(
            f"{address.source} = {address.text!r}: cannot reach a Ray cluster at "
            f"{host}:{port} ({reason} within {timeout:g} s). Start one (`ray start --head`), "
            f"fix the address, or clear it (and {ENV}) to run on a fresh local instance"
        ) from None


@contextlib.contextmanager
def ray_environment(cfg: RunConfig) -> Iterator[RayAddress]:
    """The address in force, checked; RAY_ADDRESS set to it while Flower starts Ray.

    Ray itself prefers RAY_ADDRESS over any address passed to `ray.init`, so the configured
    address replaces it for the run (and the old value comes back afterwards).
    """
    address = resolve_ray_address(cfg.simulation.ray_address)
    probe(address)
    saved = {k: os.environ.get(k) for k in (ENV, "RAY_gcs_rpc_server_reconnect_timeout_s")}
    if address.joins:
        os.environ[ENV] = address.text
    else:
        os.environ.pop(ENV, None)
    os.environ.setdefault("RAY_gcs_rpc_server_reconnect_timeout_s", GCS_RECONNECT_TIMEOUT_S)
    try:
        yield address
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def init_ray(address: RayAddress, *, verbose: bool = False) -> None:
    """Start or join Ray for Flower's simulation engine (which then skips its own init).

    `ray.init` replaces the process's SIGTERM handler with one that raises SystemExit in
    whatever the main thread is doing; the run's own handler (a clean stop, exit 143) comes
    back right after. Flower's RayBackend would pass the same arguments.
    """
    import signal
    import sys
    import threading

    import ray

    if ray.is_initialized():
        return
    # Ray's workers import the task (and the tests' tiny task) from the driver's sys.path.
    pythonpath = os.pathsep.join([*sys.path, *filter(None, [os.environ.get("PYTHONPATH")])])
    os.environ["PYTHONPATH"] = pythonpath
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) if in_main else None
    try:
        ray.init(
            address=address.text if address.joins else "local",
            runtime_env={"env_vars": {"PYTHONPATH": pythonpath}},
            include_dashboard=False,
            log_to_driver=verbose,
            logging_level="info" if verbose else "error",
        )
    finally:
        if in_main and previous is not None:
            signal.signal(signal.SIGTERM, previous)
    _freeze_once()


_frozen = False


def _freeze_once() -> None:
    """Move what is alive now (chiefly the modules of torch, Ray, Flower and gRPC, which
    live as long as the process) out of the cyclic collector's sight, once per process.

    The interpreter's final collection walks every tracked object; with Ray loaded it took
    over 6 s on a busy 2-core machine, so a run stopped by SIGTERM outlived its 5 s. After
    the freeze exit takes about 1 s. Objects frozen here are still freed by reference
    counting; only cycles among them wait for process exit.
    """
    global _frozen
    if not _frozen:
        import gc

        gc.freeze()
        _frozen = True


def check_fits(cluster: dict[str, float], client_cpus: float, client_gpus: float) -> None:
    """Refuse a cluster on which no node could host even one client (Flower would fail
    later with "ActorPool is empty"). `cluster`: ray.cluster_resources()."""
    have_cpus, have_gpus = cluster.get("CPU", 0.0), cluster.get("GPU", 0.0)
    if client_gpus > 0 and have_gpus <= 0:
        raise RuntimeError(
            f"simulation.client_gpus = {client_gpus:g}: the Ray cluster has no GPU; "
            "set simulation.client_gpus = 0 or join a cluster with GPUs"
        )
    if client_cpus > have_cpus:
        raise RuntimeError(
            f"simulation.client_cpus = {client_cpus:g}: more than the Ray cluster's "
            f"{have_cpus:g} CPUs; must be <= {have_cpus:g}"
        )
