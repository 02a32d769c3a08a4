"""A small seeded fuzzing harness shared by the fuzz tests (issue 18).

Each test feeds `count` inputs (random and mutated valid messages) to a decoder and checks
that it either returns or raises one of the module's declared error types, within a time
bound per call. The count comes from FEDVEIL_FUZZ_MESSAGES (default: small, for CI), the
seed from FEDVEIL_FUZZ_SEED or else the OS CSPRNG; both are printed, recorded as test
properties, reported as a FuzzReport warning (visible in pytest's default summary) and
named in every failure, so a failure replays with FEDVEIL_FUZZ_SEED=<seed>.
"""

from __future__ import annotations

import math
import os
import random
import secrets
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

COUNT_ENV = "FEDVEIL_FUZZ_MESSAGES"
SEED_ENV = "FEDVEIL_FUZZ_SEED"
# Per-call bound: a decoder that takes longer on one message hangs as far as a server cares.
# It is CPU time, so that a busy shared machine cannot make a fast decoder look slow.
CALL_LIMIT_S = 2.0


class FuzzReport(UserWarning):
    """Counts and seed of one fuzz run (shown in pytest's warnings summary)."""


def fuzz_count(default: int) -> int:
    raw = os.environ.get(COUNT_ENV)
    if raw is None:
        return default
    count = int(raw)
    if count < 1:
        raise ValueError(f"{COUNT_ENV}={raw!r}: must be a positive integer")
    return count


def fuzz_seed() -> int:
    raw = os.environ.get(SEED_ENV)
    return int(raw, 0) if raw else secrets.randbits(63)


@dataclass
class FuzzRun:
    """One fuzz campaign: its seed, a seeded RNG, and what was seen."""

    family: str
    count: int
    seed: int
    record: Callable[[str, object], None]
    rng: random.Random = field(init=False)
    outcomes: dict[str, int] = field(default_factory=dict)
    slowest_s: float = 0.0
    started: float = field(default_factory=time.perf_counter)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        print(f"[fuzz {self.family}] {self.count} messages, seed {self.seed}")

    def replay_hint(self, index: int) -> str:
        return (
            f"[fuzz {self.family}] seed {self.seed}, message #{index}: replay with "
            f"{SEED_ENV}={self.seed} {COUNT_ENV}={self.count}"
        )

    def feed(
        self,
        index: int,
        call: Callable[[], Any],
        allowed: tuple[type[BaseException], ...],
        shown: Callable[[], str],
        limit_s: float = CALL_LIMIT_S,
    ) -> Any:
        """Run `call`; fail (naming the seed) on an undeclared exception or a slow call."""
        started = time.process_time()
        result: Any = None
        try:
            result = call()
            outcome = "accepted"
        except allowed as exc:
            if not str(exc):
                pytest.fail(f"{self.replay_hint(index)}: {type(exc).__name__} with no message")
            outcome = type(exc).__name__
        except Exception as exc:  # the point: anything else is a crash
            pytest.fail(
                f"{self.replay_hint(index)}: crashed with {type(exc).__name__}: {exc}\n"
                f"input: {shown()[:600]}\n{traceback.format_exc()}"
            )
        elapsed = time.process_time() - started
        self.slowest_s = max(self.slowest_s, elapsed)
        if elapsed > limit_s:
            pytest.fail(f"{self.replay_hint(index)}: took {elapsed:.2f} s of CPU > {limit_s} s")
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
        return result

    def report(self, messages: int | None = None) -> str:
        """Print, record and warn the totals; `messages` when a message is fed more than once
        (to a decoder, then to the party that consumes it)."""
        elapsed = time.perf_counter() - self.started
        fed = sum(self.outcomes.values()) if messages is None else messages
        line = (
            f"[fuzz {self.family}] {fed} messages, seed {self.seed}, {elapsed:.1f} s, "
            f"slowest call {self.slowest_s * 1000:.1f} ms, "
            f"outcomes {dict(sorted(self.outcomes.items()))}"
        )
        print(line)
        self.record(f"fuzz_{self.family}_messages", fed)
        self.record(f"fuzz_{self.family}_seed", self.seed)
        self.record(f"fuzz_{self.family}_outcomes", dict(self.outcomes))
        warnings.warn(line, FuzzReport, stacklevel=2)
        return line


# -- mutations ---------------------------------------------------------------------------------

HUGE_INTS = (-1, 0, 1, 2**31, 2**32, 2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), 10**30)
ODD_FLOATS = (math.nan, math.inf, -math.inf, -0.0, 1e308, 5e-324)
WEIRD_DTYPES = ("float64", "float16", "int8", "uint8", "uint16", "int64", ">u8", ">f4", "bool")


def random_bytes(rng: random.Random, max_len: int = 96) -> bytes:
    return rng.randbytes(rng.choice((0, 1, 7, 8, 32, 33, 64, rng.randrange(max_len + 1))))


def mutate_bytes(rng: random.Random, raw: bytes) -> bytes:
    """A bit flip, truncation, extension, byte overwrite or splice of `raw`."""
    data = bytearray(raw)
    op = rng.randrange(6)
    if op == 0 and data:
        i = rng.randrange(len(data))
        data[i] ^= 1 << rng.randrange(8)
    elif op == 1:
        del data[rng.randrange(len(data) + 1) :]
    elif op == 2:
        data += rng.randbytes(rng.choice((1, 8, 33, rng.randrange(200))))
    elif op == 3 and data:
        for _ in range(rng.randrange(1, 5)):
            data[rng.randrange(len(data))] = rng.randrange(256)
    elif op == 4 and data:
        i = rng.randrange(len(data))
        data[i:i] = data[: rng.randrange(len(data) + 1)]
    else:
        data = bytearray(rng.randbytes(len(data)))
    return bytes(data)


def random_scalar(rng: random.Random) -> Any:
    """Any value a Flower ConfigRecord may carry, with the awkward ones favoured."""
    choice = rng.randrange(9)
    if choice == 0:
        return rng.choice(HUGE_INTS)
    if choice == 1:
        return rng.choice(ODD_FLOATS)
    if choice == 2:
        return rng.choice((True, False))
    if choice == 3:
        return random_bytes(rng)
    if choice == 4:
        return rng.choice(("", "x", "advertise", "masked_input", "\x00", "é" * 50))
    if choice == 5:
        return [rng.choice(HUGE_INTS) for _ in range(rng.randrange(5))]
    if choice == 6:
        return [random_bytes(rng, 40) for _ in range(rng.randrange(4))]
    if choice == 7:
        return [rng.choice(ODD_FLOATS) for _ in range(rng.randrange(3))]
    return rng.randrange(-(2**70), 2**70)


def random_array(rng: random.Random) -> np.ndarray:
    shape = rng.choice(((), (0,), (1,), (3,), (2, 2), (rng.randrange(1, 40),), (1, 0, 3)))
    dtype = np.dtype(rng.choice((*WEIRD_DTYPES, "float32", "uint32", "uint64")))
    raw = np.frombuffer(rng.randbytes(int(np.prod(shape)) * dtype.itemsize), dtype=np.uint8)
    return raw.view(dtype).reshape(shape).copy()


def mutate_value(rng: random.Random, value: Any) -> Any:
    """A change of one field's value: type swap, bit flips, huge numbers, NaN/Inf, shapes."""
    if isinstance(value, np.ndarray):
        op = rng.randrange(6)
        if op == 0:
            return random_array(rng)
        if op == 1 and value.size:
            flat = value.reshape(-1).view(np.uint8).copy()
            flat[rng.randrange(flat.size)] ^= 1 << rng.randrange(8)
            return flat.view(value.dtype).reshape(value.shape)
        if op == 2:
            return value[: rng.randrange(value.shape[0] + 1)] if value.ndim else value
        if op == 3:
            return np.concatenate([value.reshape(-1), value.reshape(-1)[:3]])
        if op == 4:
            with np.errstate(all="ignore"):
                return value.astype(rng.choice(WEIRD_DTYPES), copy=True)
        return value.reshape(1, -1) if value.size else value.reshape(0, 1)
    if isinstance(value, bytes) and rng.random() < 0.7:
        return mutate_bytes(rng, value)
    if isinstance(value, bool):
        return rng.choice((not value, int(value), random_scalar(rng)))
    if isinstance(value, int) and rng.random() < 0.7:
        return rng.choice((*HUGE_INTS, value + 1, value - 1, -value, float(value), bool(value)))
    if isinstance(value, float) and rng.random() < 0.7:
        return rng.choice((*ODD_FLOATS, int(value) if math.isfinite(value) else 0))
    if isinstance(value, list) and value and rng.random() < 0.7:
        op = rng.randrange(4)
        if op == 0:
            return value[: rng.randrange(len(value))]
        if op == 1:
            return [*value, value[0]]
        if op == 2:
            return list(reversed(value))
        copy = list(value)
        copy[rng.randrange(len(copy))] = mutate_value(rng, copy[0])
        return copy
    return random_scalar(rng) if rng.random() < 0.8 else random_array(rng)


def mutate_dict(rng: random.Random, fields: dict[str, Any], values: Callable[[], Any]) -> None:
    """In place: change, drop, add, swap or rename fields (1 to 3 edits)."""
    for _ in range(rng.randrange(1, 4)):
        keys = list(fields)
        op = rng.randrange(6)
        if op <= 1 and keys:
            key = rng.choice(keys)
            fields[key] = mutate_value(rng, fields[key])
        elif op == 2 and keys:
            del fields[rng.choice(keys)]
        elif op == 3:
            name = rng.choice(keys) + rng.choice(("", "x", ".")) if keys else "x"
            fields[name] = values()
        elif op == 4 and len(keys) >= 2:
            a, b = rng.sample(keys, 2)
            fields[a], fields[b] = fields[b], fields[a]
        elif keys:
            key = rng.choice(keys)
            fields[mutate_bytes(rng, key.encode()).decode("latin-1")] = fields.pop(key)


def mutated_messages(
    run: FuzzRun,
    valid: list[tuple[dict[str, Any], dict[str, np.ndarray]]],
) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """`run.count` (config, arrays) pairs: about a tenth random, the rest mutations of a valid
    message (fields changed, dropped, added, swapped, renamed, or moved between the dicts)."""
    rng = run.rng
    for _ in range(run.count):
        if rng.random() < 0.1:
            config = {
                rng.choice(("msg", "stage", "client_id", "x", "session.x")): random_scalar(rng)
                for _ in range(rng.randrange(6))
            }
            arrays = {rng.choice(("masked_vector", "x")): random_array(rng)}
            yield config, arrays
            continue
        base_config, base_arrays = rng.choice(valid)
        config, arrays = dict(base_config), dict(base_arrays)
        target = config if not arrays or rng.random() < 0.75 else arrays
        mutate_dict(rng, target, lambda: random_scalar(rng))
        if rng.random() < 0.05 and config:
            key = rng.choice(list(config))
            arrays[key] = config.pop(key)  # a config field sent as an array
        yield config, arrays
