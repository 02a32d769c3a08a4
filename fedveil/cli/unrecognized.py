"""Unrecognized command-line arguments, reported by the command they were given to.

argparse reports an unknown flag of a subcommand with the top-level usage
(`fedveil [-h] [-v] [--version] COMMAND ...`), which names none of that command's
options. Here the message names the command (`fedveil simulate`), the nearest option
when the flag looks like a typo of one, and where the full list is (`--help`); exit 2,
as argparse's own errors.
"""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Sequence

__all__ = ["command_parser", "unrecognized_message"]


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    # argparse keeps its subparsers as an action among the parser's actions.
    found: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found.update(action.choices)
    return found


def command_parser(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.ArgumentParser:
    """The innermost (sub)command parser that `argv` names (`fedveil privacy report`)."""
    for token in argv:
        if token.startswith("-"):
            continue
        subcommands = _subcommands(parser)
        if not subcommands:
            break
        if token not in subcommands:
            break
        parser = subcommands[token]
    return parser


def _options(parser: argparse.ArgumentParser) -> list[str]:
    return [name for action in parser._actions for name in action.option_strings]


def unrecognized_message(
    parser: argparse.ArgumentParser, argv: Sequence[str], extra: Sequence[str]
) -> str:
    """One line: which arguments `fedveil COMMAND` does not know, a near option, the next step."""
    command = command_parser(parser, argv)
    options = _options(command)
    hints: list[str] = []
    for token in extra:
        if not token.startswith("-"):
            continue
        flag = token.split("=", 1)[0]
        near = difflib.get_close_matches(flag, options, n=1)
        if near:
            hints.append(f"did you mean {near[0]} (not {flag})?")
    words = " ".join(extra)
    hint = " " + " ".join(hints) if hints else ""
    return (
        f"{command.prog}: error: unrecognized arguments: {words}.{hint} "
        f"`{command.prog} --help` lists every option"
    )
