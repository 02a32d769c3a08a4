"""The `fedveil` command line."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from fedveil.config import ConfigError, RunConfig, load_config

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
    ("--local-epochs", "client.local_epochs", int, "local epochs per round"),
    ("--local-steps", "client.local_steps", int, "local steps per round (overrides epochs)"),
    ("--batch-size", "client.batch_size", int, "local batch size"),
    ("--lr", "client.lr", float, "local learning rate"),
    ("--momentum", "client.momentum", float, "local SGD momentum"),
    ("--prox-mu", "client.prox_mu", float, "FedProx mu"),
    ("--dp", "dp.mechanism", str, "differential privacy: none, central or distributed"),
    ("--clip", "dp.clip", float, "L2 clip norm of a client update"),
    ("--noise-multiplier", "dp.noise_multiplier", float, "noise std / clip; 0: from --epsilon"),
    ("--epsilon", "dp.epsilon", float, "privacy budget epsilon"),
    ("--delta", "dp.delta", float, "privacy budget delta"),
    ("--seed", "seed", int, "seed for data split, model init and sampling"),
    ("--transport", "transport", str, "inprocess or flower"),
    ("--device", "device", str, "auto, cpu or cuda"),
    ("--out", "out", str, "run directory"),
]


def _parse_set(items: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. client.lr=0.1")
        out[key.strip()] = value.strip()
    return out


def add_simulate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "simulate",
        help="run many clients on this machine",
        description="Simulate a federated run on this machine and write a run directory "
        "(config.toml, metrics.jsonl, model.safetensors, summary.json). Defaults: "
        "Fashion-MNIST, 100 clients with Dirichlet(0.5) label skew, 20 per round, small CNN.",
    )
    p.add_argument("--config", help="TOML file; flags below override it")
    for flag, key, kind, text in SIMULATE_FLAGS:
        p.add_argument(flag, dest=key, type=kind, default=None, help=f"{text} [{key}]")
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
        "--resume", action="store_true", help="continue the run in --out from its checkpoint"
    )
    p.add_argument(
        "--json", action="store_true", help="print the summary as the last line of stdout"
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_simulate)


def cmd_simulate(args: argparse.Namespace) -> int:
    overrides = _parse_set(args.set)
    for key in [k for _, k, _, _ in SIMULATE_FLAGS] + ["secagg.enabled"]:
        value = getattr(args, key)
        if value is not None:
            overrides[key] = value
    cfg = load_config(args.config, overrides)
    _check_privacy_plan(cfg)

    from fedveil.cli.progress import RoundProgress
    from fedveil.simulations.run import simulate

    progress = RoundProgress(cfg.server.rounds, disable=args.quiet)
    try:
        summary = simulate(
            cfg, on_round=progress.update, on_clients=progress.clients, resume=args.resume
        )
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


def _check_privacy_plan(cfg: RunConfig) -> None:
    """Before any data is loaded: refuse secure aggregation that cannot reach its threshold
    (ConfigError -> exit 2), and warn with the numbers when DP noise dominates the update."""
    from fedveil.privacy.dp.signal import noise_to_signal
    from fedveil.privacy.secagg.feasibility import check_secagg_feasible

    check_secagg_feasible(cfg, cfg.data.num_clients)
    signal = noise_to_signal(cfg, cfg.data.num_clients)
    if signal is not None:
        warning = signal.warning()
        print(
            f"fedveil: {'warning: ' + warning if warning else signal.describe()}", file=sys.stderr
        )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fedveil",
        description="Federated learning with secure aggregation and differential privacy.",
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_simulate(sub)
    for register in _subcommands():
        register(sub)
    return parser


def _subcommands() -> list:
    """Each further command lives in its own module and registers itself here."""
    from fedveil.cli.bench import add_bench
    from fedveil.cli.data import add_data
    from fedveil.cli.deploy import (
        add_certs,
        add_client,
        add_clients,
        add_ready,
        add_run,
        add_server,
    )
    from fedveil.cli.identity import add_identity
    from fedveil.cli.privacy import add_privacy

    return [
        add_data,
        add_privacy,
        add_bench,
        add_server,
        add_ready,
        add_client,
        add_run,
        add_clients,
        add_identity,
        add_certs,
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except (ConfigError, ValueError, FileNotFoundError) as exc:
        print(f"fedveil: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `fedveil data report | head`
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silence the flush at exit
        return 0
    except KeyboardInterrupt:
        print("fedveil: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
