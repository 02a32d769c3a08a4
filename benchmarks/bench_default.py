"""`fedveil bench default`: the default job against the bare torch loop, side by side.

Ours is `fedveil simulate` on its defaults (the in-process engine, its workers, its
server optimizer, a central evaluation after every round). The bare loop is plain
torch FedAvg on the same model, data split and local hyper-parameters (Dirichlet
split over the same clients, the same cohort size, local epochs, batch size and SGD
learning rate, momentum and weight decay): one process, one torch thread, the
cohort's clients one after another, the plain weighted mean applied as the next
model (server learning rate 1, no server momentum), every round to the end (no
time cap).

Each contender runs in a fresh child process, one after the other. Times count from
the child's launch (start-up included) to the end of the first round whose test
accuracy reaches the target. The bare loop's clock stops while it evaluates
(evaluation is only there to find that round), ours does not: the comparison leans
towards the bare loop. `time_to_85_ratio` is ours over bare; None where a contender
never reached the target.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from fedveil.benchmarks import run_directory
from fedveil.benchmarks.harness import command_main, print_report, run_contender, since_launch
from fedveil.config.run import parse_set

if TYPE_CHECKING:
    from fedveil.config import RunConfig
    from fedveil.tasks import Task

TARGET = 0.85


def default_config(overrides: dict[str, Any], out: str) -> RunConfig:
    """`fedveil simulate`'s config for these overrides: the built-in dataset's own
    defaults for what is left unset, as the command applies them."""
    from fedveil.config import load_config
    from fedveil.tasks import dataset_defaults

    cfg = load_config(None, overrides)
    extra = dataset_defaults(cfg.data.dataset, set(overrides))
    return load_config(None, {**extra, **overrides, "out": out, "simulation.plots": False})


# -- children: one contender each (default_contender.py) ----------------------
def run_ours(overrides: dict[str, Any]) -> dict[str, Any]:
    """The default job as `fedveil simulate` runs it, into a temporary run directory."""
    from fedveil.simulations.simulate_run import simulate

    times: list[float] = []
    accuracy: list[float | None] = []

    def on_round(record: Any) -> None:
        times.append(since_launch())
        accuracy.append(record.test_accuracy)

    with run_directory(None) as out:
        cfg = default_config(overrides, str(out))
        simulate(cfg, on_round=on_round)
    return {"time_s": times, "accuracy": accuracy, "config": _hyper(cfg)}


def _hyper(cfg: RunConfig) -> dict[str, Any]:
    return {
        "model": cfg.model.name,
        "rounds": cfg.server.rounds,
        "per_round": cfg.server.per_round,
        "clients": cfg.data.num_clients,
        "local_epochs": cfg.client.local_epochs,
        "batch_size": cfg.client.batch_size,
        "lr": cfg.client.lr,
        "momentum": cfg.client.momentum,
        "weight_decay": cfg.client.weight_decay,
        "server_optimizer": cfg.server.optimizer,
        "server_lr": cfg.server.server_lr,
        "server_momentum": cfg.server.server_momentum,
    }


def run_bare(overrides: dict[str, Any]) -> dict[str, Any]:
    """Plain torch FedAvg on the default job's model, split and local hyper-parameters."""
    import numpy as np
    import torch
    from torch.nn import functional

    from fedveil.tasks import make_task

    torch.set_num_threads(1)
    with run_directory(None) as out:
        cfg = default_config(overrides, str(out))
    task = make_task(cfg)
    torch.manual_seed(cfg.seed)
    model = task.model_fn()
    params = list(model.parameters())
    global_params = [p.detach().clone() for p in params]
    rng = np.random.default_rng(cfg.seed)
    c = cfg.client
    times: list[float] = []
    accuracy: list[float | None] = []
    paused = 0.0
    for round_num in range(1, cfg.server.rounds + 1):
        cohort = rng.choice(task.num_clients, size=cfg.server.per_round, replace=False)
        sums = [torch.zeros_like(p) for p in params]
        total = 0
        for cid in cohort:
            d = task.client_data(int(cid))
            with torch.no_grad():
                for p, g in zip(params, global_params, strict=True):
                    p.copy_(g)
            opt = torch.optim.SGD(params, lr=c.lr, momentum=c.momentum, weight_decay=c.weight_decay)
            gen = torch.Generator().manual_seed(cfg.seed * 7919 + round_num * 1_000_003 + int(cid))
            model.train()
            n = len(d)
            for _ in range(c.local_epochs):
                order = torch.randperm(n, generator=gen)
                for start in range(0, n, c.batch_size):
                    idx = order[start : start + c.batch_size]
                    opt.zero_grad(set_to_none=True)
                    functional.cross_entropy(model(d.x[idx]), d.y[idx]).backward()
                    opt.step()
            with torch.no_grad():
                for s, p, g in zip(sums, params, global_params, strict=True):
                    s.add_(p - g, alpha=n)
            total += n
        with torch.no_grad():
            for g, s in zip(global_params, sums, strict=True):
                g.add_(s, alpha=1.0 / total)
        times.append(since_launch() - paused)
        stopped = time.time()
        accuracy.append(_test_accuracy(model, global_params, task, cfg.eval.batch_size))
        paused += time.time() - stopped
    # The bare loop applies the plain weighted mean, whatever the job's server optimizer.
    plain = {"server_optimizer": "fedavg", "server_lr": 1.0, "server_momentum": 0.0}
    return {"time_s": times, "accuracy": accuracy, "config": {**_hyper(cfg), **plain}}


def _test_accuracy(model: Any, weights: list[Any], task: Task, batch: int) -> float:
    import torch

    assert task.test_data is not None
    x, y = task.test_data
    correct = 0
    with torch.no_grad():
        for p, g in zip(model.parameters(), weights, strict=True):
            p.copy_(g)
        model.eval()
        for start in range(0, len(y), batch):
            logits = model(x[start : start + batch])
            correct += int((logits.argmax(dim=1) == y[start : start + batch]).sum())
    return correct / len(y)


def contender(spec: dict[str, Any]) -> dict[str, Any]:
    """A contender's process (default_contender.py): spec {"role": "ours" | "bare",
    "overrides": {config key: value}}."""
    role, overrides = spec["role"], spec["overrides"]
    if role not in ("ours", "bare"):
        raise ValueError(f"role = {role!r}: must be 'ours' or 'bare'")
    return run_ours(overrides) if role == "ours" else run_bare(overrides)


# -- the parent ------------------------------------------------------------------
def measure(role: str, overrides: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """One contender in a fresh process: its result, end to end from its launch, and the
    peak memory of its process tree."""
    with run_directory(None) as work:
        result = run_contender(
            "fedveil.benchmarks.default_contender",
            {"role": role, "overrides": overrides},
            work,
            timeout_s=timeout_s,
            watch_memory=True,
        )
    result["end_to_end_s"] = result["process_wall_s"]
    return result


def time_to(result: dict[str, Any], target: float) -> tuple[float | None, int | None]:
    """When (seconds since launch) and in which round the test accuracy first reached
    `target`; (None, None) if it never did. A NaN accuracy never reaches it."""
    for i, (t, acc) in enumerate(zip(result["time_s"], result["accuracy"], strict=True)):
        if acc is not None and acc >= target:
            return t, i + 1
    return None, None


def bench(overrides: dict[str, Any] | None = None, *, timeout_s: float = 7200) -> dict[str, Any]:
    from fedveil.benchmarks.bench_simulation import load_average

    overrides = dict(overrides or {})
    load_before = load_average()
    bare = measure("bare", overrides, timeout_s)
    ours = measure("ours", overrides, timeout_s)
    bare_t, bare_round = time_to(bare, TARGET)
    ours_t, ours_round = time_to(ours, TARGET)
    ratio = None if bare_t is None or ours_t is None else ours_t / bare_t
    return {
        "target_accuracy": TARGET,
        "bare_final_accuracy": bare["accuracy"][-1],
        "ours_final_accuracy": ours["accuracy"][-1],
        "bare_time_to_85_s": bare_t,
        "ours_time_to_85_s": ours_t,
        "bare_round_to_85": bare_round,
        "ours_round_to_85": ours_round,
        "time_to_85_ratio": ratio,
        "bare_end_to_end_s": bare["end_to_end_s"],
        "ours_end_to_end_s": ours["end_to_end_s"],
        "bare_accuracy": bare["accuracy"],
        "ours_accuracy": ours["accuracy"],
        "bare_config": bare["config"],
        "ours_config": ours["config"],
        "overrides": overrides,
        "load_average": f"before {load_before}; after {load_average()}",
    }


def format_report(s: dict[str, Any]) -> str:
    def secs(v: float | None) -> str:
        return "never" if v is None else f"{v:.1f} s"

    ratio = s["time_to_85_ratio"]
    lines = [
        "the default job (fedveil simulate) against the bare torch FedAvg loop",
        f"  ours: {s['ours_config']}",
        f"  bare: {s['bare_config']}",
        f"  final test accuracy  bare {s['bare_final_accuracy']:.4f}  "
        f"ours {s['ours_final_accuracy']:.4f}",
        f"  time to {TARGET:.0%}          bare {secs(s['bare_time_to_85_s'])} "
        f"(round {s['bare_round_to_85']})  ours {secs(s['ours_time_to_85_s'])} "
        f"(round {s['ours_round_to_85']})",
        f"  ratio (ours / bare)  {'n/a' if ratio is None else f'{ratio:.2f}'}",
        f"  load average         {s['load_average']}",
    ]
    return "\n".join(lines)


DEFAULT_SUMMARY = (
    "`fedveil bench default`: `fedveil simulate` on its defaults against plain torch FedAvg "
    "on the same model, data split and local hyper-parameters (one process, one torch "
    "thread, clients one after another, no time cap), each in a fresh process: final test "
    "accuracy and the wall time (from launch) to 85% test accuracy; the bare loop's clock "
    "stops while it evaluates. --json prints bare_final_accuracy, ours_final_accuracy, "
    "bare_time_to_85_s, ours_time_to_85_s and time_to_85_ratio (ours over bare) as the last "
    "line of stdout."
)


def add_default_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of `fedveil bench default`."""
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config override for both contenders (as fedveil simulate --set), e.g. "
        "server.rounds=30",
    )
    p.add_argument("--json", action="store_true", help="print a JSON summary as the last line")


def cmd_bench_default(args: argparse.Namespace) -> int:
    summary = bench(parse_set(args.set))
    print_report(summary, format_report(summary), args.json)
    return 0


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """`fedveil bench default` and `python -m fedveil.benchmarks.bench_default`."""
    return command_main(
        argv,
        prog=prog or "python -m fedveil.benchmarks.bench_default",
        description=DEFAULT_SUMMARY,
        add_arguments=add_default_arguments,
        run=cmd_bench_default,
    )


if __name__ == "__main__":
    sys.exit(main())
