"""The `fedveil` command line."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from fedveil.cli.completion import add_completion
from fedveil.cli.simulate import SIMULATE_FLAGS, add_simulate
from fedveil.cli.unrecognized import unrecognized_message
from fedveil.config import ConfigError

__all__ = ["SIMULATE_FLAGS", "build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fedveil",
        description="Federated learning with secure aggregation and differential privacy.",
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_simulate(sub)
    for register in _subcommands():
        register(sub)
    add_completion(sub, parser)  # last: it completes every command above
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
    from fedveil.cli.export import add_export
    from fedveil.cli.identity import add_identity
    from fedveil.cli.models import add_models
    from fedveil.cli.privacy import add_privacy
    from fedveil.cli.serve import add_serve
    from fedveil.cli.silo import add_silo

    return [
        add_data,
        add_privacy,
        add_models,
        add_bench,
        add_server,
        add_serve,
        add_ready,
        add_client,
        add_run,
        add_clients,
        add_identity,
        add_certs,
        add_export,
        add_silo,
    ]


def _version() -> str:
    """The installed distribution's version (the package's own when run from a checkout)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fedveil")
    except PackageNotFoundError:
        from fedveil import __version__

        return __version__


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    given = list(sys.argv[1:] if argv is None else argv)
    args, extra = parser.parse_known_args(given)
    if extra:  # argparse would show the top-level usage, naming none of the command's flags
        print(unrecognized_message(parser, given, extra), file=sys.stderr)
        return 2
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
    except KeyboardInterrupt as exc:
        print("fedveil: interrupted", file=sys.stderr)
        # 128 + the signal: 130 for Ctrl-C, 143 for SIGTERM (see cli/simulate.py).
        return 128 + int(getattr(exc, "signum", 2))


if __name__ == "__main__":
    sys.exit(main())
