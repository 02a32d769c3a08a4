"""One benchmark harness: the command line every benchmark shares.

A benchmark module declares what it measures and takes from here what every benchmark
does the same way. The contract of a benchmark module `fedveil.benchmarks.bench_X`:

- `SUMMARY`: what it measures (the `--help` description);
- `add_arguments(parser)`: its flags, defaults and constants, owned by the module;
- a run function `(args) -> int` that prints a table (to stderr under `--json`) and,
  with `--json`, one JSON object as the last line of stdout;
- `main(argv=None, prog=None) -> int`, built with `command_main`: the entry point of both
  `python -m fedveil.benchmarks.bench_X` and `fedveil bench X` (fedveil/cli/bench.py).

The flag types below (`int_list`, `float_list`, `name_list`) parse the comma lists
benchmarks take.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence


def int_list(text: str) -> list[int]:
    """'1000,10000' -> [1000, 10000]: positive integers, for sweeps."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected integers like 1000,10000") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected positive integers")
    return values


def float_list(text: str) -> list[float]:
    """'0.1,0.2' -> [0.1, 0.2]; the empty string is the empty list."""
    try:
        return [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected numbers like 0.1,0.2") from None


def name_list(text: str) -> list[str]:
    """'a, b' -> ['a', 'b']."""
    return [v.strip() for v in text.split(",") if v.strip()]


def command_main(
    argv: Sequence[str] | None,
    *,
    prog: str,
    description: str,
    add_arguments: Callable[[argparse.ArgumentParser], None],
    run: Callable[[argparse.Namespace], int],
) -> int:
    """Parse `argv` with the benchmark's own flags and run it. A refused setting
    (ValueError, naming the flag and the limit) is one line on stderr and exit status 2,
    as argparse's own refusals are."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    add_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)  # a no-op under `fedveil`, which set it up
    try:
        return int(run(args) or 0)
    except ValueError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
