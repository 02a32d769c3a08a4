"""`fedveil completion SHELL`: a shell completion script, generated from the parser."""

from __future__ import annotations

import argparse
import functools

SHELLS = ("bash", "zsh", "tcsh")


def add_completion(sub: argparse._SubParsersAction, root: argparse.ArgumentParser) -> None:
    """`completion`, completing `root`: the whole command line, handed in by its builder
    (cli/main.py) rather than rebuilt here, so this module does not import main."""
    p = sub.add_parser(
        "completion",
        help="print a shell completion script",
        description="Print a completion script for SHELL, generated from fedveil's own "
        "parser (shtab). Install, e.g.: fedveil completion bash > "
        "~/.local/share/bash-completion/completions/fedveil  (zsh: into a directory on "
        "$fpath as _fedveil).",
    )
    p.add_argument("shell", choices=SHELLS, help="the shell to complete in")
    p.set_defaults(func=functools.partial(cmd_completion, root))


def cmd_completion(root: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    import shtab

    print(shtab.complete(root, shell=args.shell))
    return 0
