"""One benchmark harness: what every benchmark does the same way.

A benchmark module (`fedveil.benchmarks.bench_X`, one per experiment) declares only its
contenders and what it measures; it takes the rest from here:

- the command line: `command_main` (its module's `main(argv, prog)`, the entry point of
  both `python -m fedveil.benchmarks.bench_X` and `fedveil bench X`), and the flag types
  `int_list`, `float_list`, `name_list` for comma lists;
- the contender runner: `run_contender` starts `python -m MODULE SPEC RESULT` in a fresh
  process and returns its result with the CPU seconds of its whole process tree (the
  OS's count, from wait4), its wall time and launch time, optionally the tree's peak
  memory (memwatch.PeakWatcher) and a time limit; the contender's module ends in
  `contender_main(run)`, and times itself from its launch with `since_launch()`;
- seeds and medians: `run_seeds` runs every contender for every seed in turn (progress
  to stderr and to a JSON file, so an interrupted benchmark keeps what it measured),
  `medians` takes each contender's medians over seeds, `median_or_none` and `ratio`
  read a missing figure (a contender that never reached its target) as such;
- the output: `print_report` prints the human table (to stderr under `--json`) and,
  with `--json`, one JSON object as the last line of stdout.

docs/development.md ("Writing a benchmark") shows a benchmark built on it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from fedveil.benchmarks import child_env
from fedveil.benchmarks.memwatch import PeakWatcher

# The parent's time.time() when it launched the contender: its clock starts there.
LAUNCHED_ENV = "FEDVEIL_BENCH_LAUNCHED"
MB = 1024 * 1024


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


# -- the contender runner ---------------------------------------------------------------


class ContenderFailed(RuntimeError):
    """A contender's process exited non-zero; the message ends in its log's tail."""


def run_contender(
    module: str,
    spec: Mapping[str, Any],
    work: Path,
    *,
    timeout_s: float | None = None,
    watch_memory: bool = False,
) -> dict[str, Any]:
    """Run `python -m module SPEC RESULT` in a fresh process: SPEC is `spec` as JSON, the
    contender writes its result as JSON to RESULT (`contender_main`). Returns that result
    with `cpu_s` (user + system seconds of the process and its children, from wait4),
    `process_wall_s` (launch to exit) and `launched_at` (time.time() at the launch, which
    the contender reads as `since_launch()`); with `watch_memory` also `peak_rss_mb` and
    `processes`, the peak RSS and size of its process tree (sampled every 0.1 s). Past
    `timeout_s` the contender is killed (ContenderFailed). Its output goes to
    work/contender.log."""
    work.mkdir(parents=True, exist_ok=True)
    spec_path, result_path = work / "spec.json", work / "result.json"
    spec_path.write_text(json.dumps(spec))
    cmd = [sys.executable, "-m", module, str(spec_path), str(result_path)]
    env = child_env()
    launched = time.time()
    env[LAUNCHED_ENV] = repr(launched)
    timed_out = threading.Event()
    start = time.perf_counter()
    with open(work / "contender.log", "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)

        def kill() -> None:
            timed_out.set()
            proc.kill()

        killer = threading.Timer(timeout_s, kill) if timeout_s is not None else None
        watch = PeakWatcher(proc.pid) if watch_memory else None
        with watch if watch is not None else contextlib.nullcontext():
            if killer is not None:
                killer.start()
            try:
                _, status, usage = os.wait4(proc.pid, 0)
            finally:
                if killer is not None:
                    killer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - start
    if timed_out.is_set():
        raise ContenderFailed(f"contender {work}: no result within {timeout_s} s")
    if proc.returncode != 0:
        tail = (work / "contender.log").read_text()[-3000:]
        raise ContenderFailed(f"contender {work} exited {proc.returncode}:\n{tail}")
    done = json.loads(result_path.read_text())
    done["cpu_s"] = usage.ru_utime + usage.ru_stime
    done["process_wall_s"] = wall
    done["launched_at"] = launched
    if watch is not None:
        done.update(peak_rss_mb=watch.peak_rss / MB, processes=watch.max_processes)
    return done


def since_launch() -> float:
    """In a contender's process: seconds since the parent launched it (its start-up
    included), from the launch time run_contender gives it."""
    return time.time() - float(os.environ[LAUNCHED_ENV])


def contender_main(run: Callable[[dict[str, Any]], dict[str, Any]], argv: Sequence[str]) -> int:
    """The body of a contender's process: `argv` is [SPEC, RESULT] (see run_contender)."""
    spec_path, result_path = Path(argv[0]), Path(argv[1])
    result = run(json.loads(spec_path.read_text()))
    result_path.write_text(json.dumps(result) + "\n")
    return 0


# -- seeds and medians ------------------------------------------------------------------


def run_seeds(
    seeds: Sequence[int],
    names: Sequence[str],
    measure: Callable[[str, int], dict[str, Any]],
    *,
    progress: Path | None = None,
    log: TextIO | None = None,
) -> list[dict[str, Any]]:
    """Every contender (`names`, in turn) for every seed: one row per seed,
    {"seed": seed, name: measure(name, seed), ...}. Each measurement is logged as it
    comes (to stderr unless `log`), and the rows so far are written to `progress`."""
    log = sys.stderr if log is None else log
    per_seed: list[dict[str, Any]] = []
    for seed in seeds:
        row: dict[str, Any] = {"seed": seed}
        for name in names:
            row[name] = measure(name, seed)
            print(f"seed {seed} {name}: {json.dumps(row[name])}", file=log, flush=True)
            if progress is not None:
                progress.write_text(json.dumps([*per_seed, row]) + "\n")
        per_seed.append(row)
    return per_seed


def median_or_none(values: Sequence[float | None]) -> float | None:
    """The median over seeds; a missing figure (a seed that never reached the target)
    counts as infinitely large, and a median that is missing is None."""
    if not values:
        return None
    m = statistics.median([float("inf") if v is None else v for v in values])
    return None if m == float("inf") else m


def medians(
    per_seed: Sequence[Mapping[str, Any]], names: Sequence[str], keys: Sequence[str]
) -> dict[str, dict[str, float | None]]:
    """{contender: {key: its median over the seeds (median_or_none)}}."""
    return {
        name: {
            key: median_or_none([seed[name][key] for seed in per_seed if name in seed])
            for key in keys
        }
        for name in names
    }


def ratio(num: float | None, den: float | None) -> float | None:
    """num / den, or None where either is missing or den is not positive."""
    return None if num is None or den is None or not den > 0 else num / den


# -- output -----------------------------------------------------------------------------


def print_report(
    summary: Mapping[str, Any], table: str, as_json: bool, *, sort_keys: bool = True
) -> None:
    """The human table (stdout, or stderr under --json), then with --json the summary as
    one JSON object on the last line of stdout."""
    print(table, file=sys.stderr if as_json else sys.stdout)
    if as_json:
        sys.stdout.flush()
        print(json.dumps(summary, sort_keys=sort_keys))
