"""The Flower transport on a Ray cluster: a configured address, per-client resources and
devices, a real two-node cluster on loopback, and an address nobody answers at."""

from __future__ import annotations

import os
import time
from collections import defaultdict
from pathlib import Path

import pytest
import torch
from loopback_ports import free_port
from safetensors.torch import load_file

from fedveil.config import ConfigError, load_config
from fedveil.config.ray_address import resolve_ray_address
from fedveil.simulations.ray_cluster import RayClusterUnreachable, client_device, client_resources
from fedveil.simulations.simulate_run import simulate

TINY = {
    "model.task": "tiny_task:make",
    "data.num_clients": 6,
    "server.per_round": 6,
    "server.rounds": 2,
    "simulation.plots": False,
}


@pytest.mark.parametrize(
    ("key", "value", "needle"),
    [
        ("simulation.ray_address", "no-port-here", "simulation.ray_address = 'no-port-here'"),
        ("simulation.ray_address", "10.0.0.1:99999", "1..65535"),
        ("simulation.client_cpus", 0, "simulation.client_cpus"),
        ("simulation.client_gpus", -0.5, "simulation.client_gpus"),
        ("simulation.client_gpus", 65, "simulation.client_gpus"),
    ],
)
def test_bad_cluster_settings_are_refused_by_name(key, value, needle):
    with pytest.raises(ConfigError) as err:
        load_config(None, {key: value})
    assert needle in str(err.value)


def test_cuda_under_flower_without_a_gpu_share_is_refused_not_run_on_cpu():
    with pytest.raises(ConfigError, match=r"simulation.client_gpus > 0"):
        load_config(None, {"transport": "flower", "device": "cuda"})
    load_config(None, {"transport": "flower", "device": "cuda", "simulation.client_gpus": 0.5})


def test_client_resources_come_from_the_config():
    cfg = load_config(None, {"simulation.client_cpus": 2.5, "simulation.client_gpus": 0.25})
    assert client_resources(cfg) == {"num_cpus": 2.5, "num_gpus": 0.25}
    assert client_resources(load_config(None, {})) == {"num_cpus": 1.0, "num_gpus": 0.0}


def test_ray_address_config_wins_and_ray_address_env_is_the_fallback():
    env = {"RAY_ADDRESS": "10.1.2.3:6379"}
    assert resolve_ray_address("", env).text == "10.1.2.3:6379"
    assert resolve_ray_address("", env).source == "RAY_ADDRESS"
    assert resolve_ray_address("local", env).text == "local"
    assert not resolve_ray_address("local", env).joins
    assert resolve_ray_address("", {}).text == "" and not resolve_ray_address("", {}).joins


# Placement logic only: this machine has no GPU, so the device a GPU client would use is
# checked from the assignment Ray hands its worker (ray.get_gpu_ids, CUDA_VISIBLE_DEVICES).
@pytest.mark.parametrize(
    ("gpus", "ids", "visible", "device"),
    [
        (0.0, [], None, "cpu"),
        (0.0, [3], "3", "cpu"),
        (1.0, [3], "3", "cuda:0"),  # Ray narrowed CUDA_VISIBLE_DEVICES to the assigned GPU
        (0.5, ["2"], "5,2", "cuda:1"),
        (1.0, [2], None, "cuda:2"),  # RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES
    ],
)
def test_a_client_with_a_gpu_share_trains_on_its_assigned_gpu(gpus, ids, visible, device):
    assert client_device(gpus, ids, visible) == device


def test_a_gpu_share_without_an_assigned_gpu_says_so():
    with pytest.raises(RuntimeError, match=r"client_gpus = 0\.5: Ray assigned this client no GPU"):
        client_device(0.5, [], None)


@pytest.mark.procs
@pytest.mark.flower
@pytest.mark.parametrize("via_env", [False, True])
def test_an_unreachable_cluster_fails_fast_and_says_where(tmp_path, monkeypatch, via_env):
    address = f"127.0.0.1:{free_port()}"  # nothing listens: a stale cluster's address
    overrides = {**TINY, "transport": "flower", "out": str(tmp_path / "run")}
    if via_env:
        monkeypatch.setenv("RAY_ADDRESS", address)
    else:
        overrides["simulation.ray_address"] = address
    start = time.monotonic()
    with pytest.raises(RayClusterUnreachable) as err:
        simulate(load_config(None, overrides))
    assert time.monotonic() - start < 30
    source = "RAY_ADDRESS" if via_env else "simulation.ray_address"
    assert f"{source} = '{address}': cannot reach a Ray cluster" in str(err.value)


@pytest.mark.procs
@pytest.mark.flower
@pytest.mark.slow
def test_two_node_cluster_trains_the_in_process_model_bit_for_bit(tmp_path, monkeypatch):
    from ray.cluster_utils import Cluster

    node_log = tmp_path / "nodes.txt"
    monkeypatch.setenv("FEDVEIL_RAY_NODE_LOG", str(node_log))
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        flower = load_config(
            None,
            {
                **TINY,
                "transport": "flower",
                "out": str(tmp_path / "flower"),
                "simulation.ray_address": cluster.address,
            },
        )
        simulate(flower)
    finally:
        cluster.shutdown()
    inproc = load_config(
        None,
        {
            **TINY,
            "out": str(tmp_path / "inprocess"),
            "simulation.workers": 1,
            "simulation.vmap_clients": 1,
        },
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in each Ray worker (one CPU each): same float reductions
    try:
        simulate(inproc)
    finally:
        torch.set_num_threads(threads)

    nodes: dict[str, set[int]] = defaultdict(set)
    for line in node_log.read_text().splitlines():
        cid, _round, node = line.split()
        nodes[node].add(int(cid))
    assert len(nodes) == 2 and all(nodes), nodes  # clients ran on both nodes
    assert set().union(*nodes.values()) == set(range(6))
    a = load_file(Path(flower.out, "model.safetensors"))
    b = load_file(Path(inproc.out, "model.safetensors"))
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


@pytest.mark.procs
def test_a_configured_address_replaces_ray_address_while_the_run_starts_ray(monkeypatch):
    # Ray itself prefers RAY_ADDRESS to the address it is given; the config must win.
    from fedveil.simulations.ray_cluster import ray_environment

    monkeypatch.setenv("RAY_ADDRESS", "10.9.9.9:6379")
    with ray_environment(load_config(None, {"simulation.ray_address": "local"})) as address:
        assert address.text == "local" and "RAY_ADDRESS" not in os.environ
    assert os.environ["RAY_ADDRESS"] == "10.9.9.9:6379"


@pytest.mark.procs
def test_a_cluster_that_cannot_host_one_client_is_refused_by_name():
    from fedveil.simulations.ray_cluster import check_fits

    check_fits({"CPU": 4.0, "GPU": 1.0}, 2.0, 0.5)
    with pytest.raises(RuntimeError, match=r"client_gpus = 0\.5: the Ray cluster has no GPU"):
        check_fits({"CPU": 4.0}, 1.0, 0.5)
    with pytest.raises(RuntimeError, match=r"client_cpus = 8: more than the Ray cluster's 4"):
        check_fits({"CPU": 4.0}, 8.0, 0.0)
