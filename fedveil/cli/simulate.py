"""`fedveil simulate`: its flags, and what the command line adds around a run.

Settings named on the command line are passed on, so a custom task that cannot honour
one (--dataset with --task) is refused rather than silently ignored; a built-in
dataset gets its own defaults for what the user left unset (tasks.DATASET_DEFAULTS);
SIGTERM stops a run as Ctrl-C does, leaving its last round's model and summary.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fedveil.config import ConfigError, RunConfig, load_config
from fedveil.config.resume import resume_config
from fedveil.config.run import parse_set
from fedveil.dataset_defaults import per_key

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

# Command-line flag -> dotted config key. Every flag overrides the TOML file.
SIMULATE_FLAGS: list[tuple[str, str, type, str]] = [
    ("--dataset", "data.dataset", str, "fashion-mnist, digits or synthetic"),
    ("--data-dir", "data.data_dir", str, "directory holding the dataset files"),
    ("--clients", "data.num_clients", int, "population size"),
    ("--partition", "data.partition", str, "iid, dirichlet, shards, lognormal or writer"),
    ("--alpha", "data.alpha", float, "Dirichlet concentration (label skew)"),
    ("--model", "model.name", str, "logreg, mlp or cnn"),
    ("--task", "model.task", str, "custom task as 'module:function'"),
    ("--rounds", "server.rounds", int, "number of rounds"),
    ("--per-round", "server.per_round", int, "cohort size (fixed sampling)"),
    ("--sampling", "server.sampling", str, "fixed or poisson"),
    ("--sample-rate", "server.sample_rate", float, "Poisson rate q"),
    ("--optimizer", "server.optimizer", str, "fedavg, fedavgm, fedadam or fedyogi"),
    ("--server-lr", "server.server_lr", float, "server learning rate"),
    ("--aggregation", "server.aggregation", str, "coordinator, allreduce or gossip (no server)"),
    ("--mode", "server.mode", str, "sync, async (FedBuff) or ssp (stale-synchronous)"),
    ("--concurrency", "server.concurrency", int, "async/ssp: clients in flight C"),
    ("--buffer", "server.buffer", int, "async/ssp: client updates K per server update"),
    ("--topology", "gossip.topology", str, "gossip: ring, torus, exponential, random-regular"),
    ("--degree", "gossip.degree", int, "gossip: neighbours per client; 0: the topology's"),
    (
        "--gossip-active",
        "gossip.active",
        int,
        "gossip: clients that wake, train and mix each round; 0: all",
    ),
    (
        "--gossip-momentum",
        "gossip.momentum",
        float,
        "gossip: quasi-global momentum beta in [0, 0.99]; 0: none",
    ),
    ("--local-epochs", "client.local_epochs", int, "local epochs per round"),
    ("--local-steps", "client.local_steps", int, "local steps per round (overrides epochs)"),
    ("--batch-size", "client.batch_size", int, "local batch size"),
    ("--lr", "client.lr", float, "local learning rate"),
    ("--momentum", "client.momentum", float, "local SGD momentum"),
    ("--prox-mu", "client.prox_mu", float, "FedProx mu"),
    (
        "--dp",
        "dp.mechanism",
        str,
        "differential privacy: none, central, distributed or ftrl (DP-FTRL)",
    ),
    ("--clip", "dp.clip_norm", float, "L2 clip norm of a client update"),
    ("--noise-multiplier", "dp.noise_multiplier", float, "noise std / clip; 0: from --epsilon"),
    ("--epsilon", "dp.epsilon", float, "privacy budget epsilon"),
    ("--delta", "dp.delta", float, "privacy budget delta"),
    ("--seed", "seed", int, "seed for data split, model init and sampling"),
    ("--transport", "transport", str, "inprocess or flower"),
    ("--device", "device", str, "auto, cpu or cuda"),
    ("--out", "out", str, "run directory"),
    ("--tensorboard", "tracking.tensorboard", str, "write TensorBoard event files to DIR"),
    ("--mlflow", "tracking.mlflow_uri", str, "log to MLflow: a directory (file store) or URI"),
]


def _flat_defaults() -> dict[str, Any]:
    """'section.key' -> the schema's default, for --help (a built-in dataset's own
    defaults, e.g. digits' MLP, are said when a run uses them)."""
    flat: dict[str, Any] = {}
    # The schema's defaults as declared, not validated: validation imports the model
    # registry (torch), and every command builds this parser (`fedveil server` too).
    for section, values in RunConfig().to_dict().items():
        if isinstance(values, dict):
            flat.update({f"{section}.{k}": v for k, v in values.items()})
        else:
            flat[section] = values
    return flat


def add_simulate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "simulate",
        help="run many clients on this machine",
        description="Simulate a federated run on this machine and write a run directory "
        "(config.toml, metrics.jsonl, model.safetensors, summary.json). Defaults: "
        "Fashion-MNIST, 100 clients with Dirichlet(0.5) label skew, 20 per round, small CNN; "
        "each built-in dataset brings its own defaults for what is left unset (Fashion-MNIST: "
        "--lr 0.1, --optimizer fedavgm with server_momentum 0.7; digits: the MLP on 20 "
        "clients; synthetic: the MLP).",
    )
    p.add_argument("--config", help="TOML file; flags below override it")
    defaults = _flat_defaults()
    by_dataset = per_key()
    for flag, key, kind, text in SIMULATE_FLAGS:
        shown = defaults.get(key)
        default = "" if shown in (None, "") else f", default {shown}"
        # The default job is Fashion-MNIST's: its own defaults are what a bare run uses.
        default += "".join(f"; {d}: {v}" for d, v in by_dataset.get(key, {}).items())
        p.add_argument(flag, dest=key, type=kind, default=None, help=f"{text} [{key}{default}]")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override any config key, e.g. --set client.momentum=0.9",
    )
    p.add_argument(
        "--secagg",
        action="store_const",
        const=True,
        dest="secagg.enabled",
        help="secure aggregation: the server learns only the sum [secagg.enabled]",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --out from its checkpoint, under the run's own config.toml "
        "(flags that conflict with it are refused)",
    )
    p.add_argument(
        "--init-model",
        metavar="REF|FILE",
        help="start from a registered version (name@version) or a model.safetensors "
        "instead of the seed's initialisation; recorded in lineage.json, so the registered "
        "run carries its parent",
    )
    p.add_argument("--registry", metavar="DIR", help="the model registry --init-model refers to")
    p.add_argument(
        "--json", action="store_true", help="print the summary as the last line of stdout"
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_simulate)


def _finished_rounds(out: Path, planned: int) -> int | None:
    """The rounds a run directory's summary says it completed, when it ended (not
    interrupted) with at least `planned` of them; None when a resume has work to do."""
    try:
        summary = json.loads((out / "summary.json").read_text())
    except (OSError, ValueError):
        return None  # no summary: the run was killed hard, its checkpoint is the truth
    if not isinstance(summary, dict) or summary.get("interrupted"):
        return None
    rounds = summary.get("rounds")
    if not isinstance(rounds, int) or not rounds >= planned:
        return None
    return rounds


def cmd_simulate(args: argparse.Namespace) -> int:
    overrides, given = command_line_settings(args)
    if args.resume:  # the run's own config.toml, never the defaults
        from fedveil.simulations.simulate_run import require_checkpoint

        out = _resume_dir(args.config, overrides)
        require_checkpoint(Path(out))
        cfg = resume_config(out, overrides)
        finished = _finished_rounds(Path(out), cfg.server.rounds)
        if finished is not None:  # resuming would rewrite its summary with nothing trained
            print(
                f"fedveil: {out} already finished its {finished} rounds (summary.json); "
                f"nothing to resume. To train further: --rounds N with N > {finished} (without "
                "DP), or start a new run from its model with --init-model "
                f"{shlex.quote(str(Path(out) / 'model.safetensors'))}",
                file=sys.stderr,
            )
            return 0
    else:
        cfg = resolve_config(args.config, overrides)
    _check_privacy_plan(cfg)
    from fedveil.server.engine.tracking import check_tracking_available

    check_tracking_available(cfg.tracking)  # a missing extra: exit 2 before any data loads
    lock = lock_run_dir(Path(cfg.out))  # after the refusals, which write nothing
    try:
        return _simulate_locked(args, cfg, given)
    finally:
        os.close(lock)


def lock_run_dir(out: Path) -> int:
    """One `fedveil simulate` per run directory: a second one (a --resume typed while the
    run still trains) would interleave its rounds with the first's in the same files.
    The lock goes with the process, even on SIGKILL."""
    from fedveil.ops.dir_lock import hold_lock

    out.mkdir(parents=True, exist_ok=True)
    fd = hold_lock(out / ".lock")
    if fd is None:
        raise ConfigError(
            f"--out {out}: another fedveil simulate is writing this run directory; wait for "
            "it to end or stop it (Ctrl-C keeps its last round: then --resume), or give "
            "another --out"
        )
    return fd


def _simulate_locked(args: argparse.Namespace, cfg: RunConfig, given: dict[str, str]) -> int:
    from fedveil.cli.progress import RoundProgress
    from fedveil.simulations.failures import RunFailed
    from fedveil.simulations.simulate_run import simulate

    init_model, init_ref = _init_model(args.init_model, args.registry)
    progress = RoundProgress(cfg.server.rounds, disable=args.quiet)
    try:
        with sigterm_as_interrupt():
            summary = simulate(
                cfg,
                on_round=progress.update,
                on_clients=progress.clients,
                resume=args.resume,
                given=given,
                init_model=init_model,
                init_ref=init_ref,
            )
    except RunFailed as exc:  # the run directory is written; the exit status says it failed
        progress.close()
        print(f"fedveil: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        progress.close()
        if (Path(cfg.out) / "checkpoint" / "state.pt").exists():
            print(
                f"fedveil: to continue: fedveil simulate --resume --out {shlex.quote(cfg.out)}",
                file=sys.stderr,
            )
        else:
            print(
                "fedveil: stopped before its first round completed: nothing to resume; "
                "run the same command again to start over",
                file=sys.stderr,
            )
        raise
    finally:
        progress.close()
    if summary.get("stopped_reason"):
        print(f"fedveil: {summary['stopped_reason']}", file=sys.stderr)
    acc = summary.get("test_accuracy")
    print(
        f"done: {summary['rounds']} rounds, test accuracy "
        f"{'n/a' if acc is None else f'{acc:.4f}'}, {summary['wall_s']:.1f} s -> {cfg.out}",
        file=sys.stderr,
    )
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    return 0


def _resume_dir(config: str | None, overrides: dict[str, Any]) -> str:
    """Where the run to resume lives: --out, else the --config file's out, else the
    default run directory."""
    if "out" in overrides:
        return str(overrides["out"])
    return load_config(config).out


def _init_model(given: str | None, registry: str | None) -> tuple[Path | None, str | None]:
    """--init-model: a model file as given, else a registry reference's model copy."""
    if given is None:
        return None, None
    if Path(given).is_file():
        return Path(given), None
    from fedveil.cli.models import open_registry

    version = open_registry(registry).resolve(given)
    return version.checked_model_path(), version.ref


def _check_privacy_plan(cfg: RunConfig) -> None:
    """Before any data is loaded: refuse secure aggregation that cannot reach its threshold
    (ConfigError -> exit 2), and warn with the numbers when DP noise dominates the update."""
    from fedveil.server.engine.dp_from_config import check_secagg_feasible, noise_to_signal

    check_secagg_feasible(cfg, cfg.data.num_clients)
    signal = noise_to_signal(cfg, cfg.data.num_clients)
    if signal is not None:
        warning = signal.warning()
        print(
            f"fedveil: {'warning: ' + warning if warning else signal.describe()}", file=sys.stderr
        )


def command_line_settings(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, str]]:
    """The overrides (dotted key -> value) and, for [data] and model.name, how each was
    given ('--clients 50', '--set data.alpha=0.1'): a custom task must honour those."""
    overrides = parse_set(args.set)
    given = {k: f"--set {k}={v}" for k, v in overrides.items()}
    for flag, key, _, _ in SIMULATE_FLAGS:
        value = getattr(args, key)
        if value is not None:
            overrides[key] = value
            given[key] = f"{flag} {value}"
    if args.__dict__.get("secagg.enabled") is not None:
        overrides["secagg.enabled"] = True
    task_keys = {k: v for k, v in given.items() if k.startswith("data.") or k == "model.name"}
    return overrides, task_keys


def resolve_config(path: str | None, overrides: dict[str, Any]) -> RunConfig:
    """The config, with the built-in dataset's own defaults for what neither the file nor
    the command line set (e.g. `--dataset digits` alone runs the MLP on 20 clients)."""
    from fedveil.tasks import dataset_defaults

    cfg = load_config(path, overrides)
    if cfg.model.task is not None:
        return cfg
    extra = dataset_defaults(cfg.data.dataset, set(overrides) | _file_keys(path))
    if not extra:
        return cfg
    shown = ", ".join(f"{k} = {v!r}" for k, v in extra.items())
    print(f"fedveil: dataset {cfg.data.dataset}: {shown} (its defaults)", file=sys.stderr)
    return load_config(path, {**extra, **overrides})


def _file_keys(path: str | None) -> set[str]:
    if path is None:
        return set()
    values = tomllib.loads(Path(path).read_text())  # load_config has read it already
    return {
        f"{section}.{key}" if isinstance(table, dict) else section
        for section, table in values.items()
        for key in (table if isinstance(table, dict) else [None])
    }


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the run is, so it stops as on Ctrl-C (exit 143)."""

    signum = signal.SIGTERM


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """While the run is on, SIGTERM raises Terminated: the engine closes a DP ledger as
    interrupted, the workers are stopped, and the model and summary are written."""

    def handler(signum: int, frame: object) -> None:
        raise Terminated

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
