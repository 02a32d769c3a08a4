"""`fedveil completion SHELL`: a shell completion script, generated from the parser."""

from __future__ import annotations

import argparse

SHELLS = ("bash", "zsh", "tcsh")


def add_completion(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "completion",
        help="print a shell completion script",
        description="Print a completion script for SHELL, generated from fedveil's own "
        "parser (shtab). Install, e.g.: fedveil completion bash > "
        "~/.local/share/bash-completion/completions/fedveil  (zsh: into a directory on "
        "$fpath as _fedveil).",
    )
    p.add_argument("shell", choices=SHELLS, help="the shell to complete in")
    p.set_defaults(func=cmd_completion)


def cmd_completion(args: argparse.Namespace) -> int:
    import shtab

    from fedveil.cli.main import build_parser

    print(shtab.complete(build_parser(), shell=args.shell))
    return 0
