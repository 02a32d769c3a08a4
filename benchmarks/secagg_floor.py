"""The primitive floor of one secure-aggregation round: what its cryptography alone costs.

A round of our protocol makes a fixed number of calls to its primitives (X25519 key
generation and agreement, HKDF, AES-GCM sealing and opening, Shamir splitting and
reconstruction, AES-CTR mask streams added into a vector, and the server's sum of the
inputs). `primitive_floor` counts those calls from the round's neighbour graph and dropout set,
times each primitive in a tight loop (hot caches, no protocol logic, the cheapest of a few
batches) and returns count x cost, summed. No implementation of the same protocol can do the
same round in less; how far a measured round sits above it is what Python, message checks
and cold caches cost. Quantization is left out: it is not a cryptographic primitive, and
the benchmark reports it as its own stage.

`instrumented_primitives` counts and times the same calls inside a real round, so a round's
compute splits into its primitives as called there (in situ) and the protocol logic around
them.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedveil.privacy.secagg import SessionConfig, crypto, shamir
from fedveil.privacy.secagg.masking import MaskApplier

CLOCK = time.process_time


def _per_call(fn: Callable[[], Any], calls: int, batches: int = 5) -> float:
    """CPU seconds of one call of `fn`: the cheapest of `batches` batches of `calls`."""
    fn()  # first-call costs (imports, allocations) are not the primitive's
    best = float("inf")
    for _ in range(batches):
        started = CLOCK()
        for _ in range(calls):
            fn()
        best = min(best, (CLOCK() - started) / calls)
    return best


def primitive_costs(session: SessionConfig) -> dict[str, float]:
    """Seconds per call of each primitive at this session's vector size and threshold."""
    digest, t = session.digest, session.threshold
    mine, peer = crypto.KeyPair(), crypto.KeyPair()
    shared = mine.agree(peer.public_bytes)
    key = crypto.pairwise_mask_key(shared, digest, 1, 2)
    plaintext = os.urandom(2 * shamir.SHARE_BYTES)
    associated = crypto.share_associated_data(digest, 1, 2)
    sealed = crypto.seal(key, plaintext, associated)
    xs = list(range(1, session.neighbors + 2))
    secret = shamir.secret_to_int(os.urandom(shamir.SECRET_BYTES))
    points = list(zip(xs, shamir.split(secret, t, xs), strict=True))[:t]
    applier = MaskApplier(session.dimension, session.dtype, session.modulus_bits)
    vector = np.zeros(session.dimension, dtype=session.dtype)
    other = np.ones(session.dimension, dtype=session.dtype)
    return {
        "x25519_keygen": _per_call(crypto.KeyPair, 100),
        "x25519_agree": _per_call(lambda: mine.agree(peer.public_bytes), 100),
        "hkdf": _per_call(lambda: crypto.pairwise_mask_key(shared, digest, 1, 2), 200),
        "seal": _per_call(lambda: crypto.seal(key, plaintext, associated), 200),
        "open": _per_call(lambda: crypto.open_sealed(key, sealed, associated), 200),
        "shamir_split": _per_call(lambda: shamir.split(secret, t, xs), 50),
        "shamir_reconstruct": _per_call(lambda: shamir.reconstruct(points, t), 50),
        "mask_stream": _per_call(lambda: applier.add(vector, key), 10),
        "vector_add": _per_call(lambda: np.add(vector, other, out=vector), 10),
    }


def primitive_counts(session: SessionConfig, dropped: Collection[int]) -> dict[str, int]:
    """How many times a round calls each primitive, when `dropped` vanish after sharing keys
    (before sending their masked input) and everyone else completes."""
    graph, gone = session.graph, frozenset(dropped)
    degree = {cid: len(graph.neighbours(cid)) for cid in session.client_ids}
    survivors = [cid for cid in session.client_ids if cid not in gone]
    # The server strips a dropped client's pairwise masks with its surviving neighbours only.
    recovered = sum(len(graph.neighbours(d) - gone) for d in gone)
    clients = len(session.client_ids)
    every_degree = sum(degree.values())
    survivor_degree = sum(degree[s] for s in survivors)
    return {
        # Clients: two key pairs each; at share_keys two agreements, a channel-key and a
        # mask-key derivation and one sealed share pair per neighbour, and two secrets split.
        "x25519_keygen": 2 * clients + len(gone),  # + the server's check of rebuilt keys
        "x25519_agree": 2 * every_degree + recovered,
        "hkdf": 2 * every_degree + 2 * len(survivors) + recovered,  # + self-mask keys
        "seal": every_degree,
        "open": survivor_degree,
        "shamir_split": 2 * clients,
        "shamir_reconstruct": len(survivors) + len(gone),
        # A survivor's self mask and one mask per neighbour; the server strips each
        # survivor's self mask and the recovered pairwise masks.
        "mask_stream": survivor_degree + 2 * len(survivors) + recovered,
        "vector_add": len(survivors),  # the server's running sum of masked inputs
    }


def client_primitive_counts(degree: int) -> dict[str, int]:
    """The primitive calls of one surviving client with `degree` neighbours (its part of
    `primitive_counts`): two key pairs, two agreements, a channel-key and a mask-key
    derivation and one sealed share pair per neighbour, its self-mask key, two secrets
    split, the shares it receives opened, and a mask stream per neighbour plus its self
    mask. Unmasking adds no primitive call (it forwards the shares it holds)."""
    return {
        "x25519_keygen": 2,
        "x25519_agree": 2 * degree,
        "hkdf": 2 * degree + 1,
        "seal": degree,
        "open": degree,
        "shamir_split": 2,
        "mask_stream": degree + 1,
    }


def client_floor_s(costs: dict[str, float], degree: int) -> float:
    """One surviving client's primitive floor (seconds), from `primitive_costs`."""
    return sum(n * costs[name] for name, n in client_primitive_counts(degree).items())


def primitive_floor(session: SessionConfig, dropped: Collection[int]) -> dict[str, Any]:
    """{"total_s": the round's primitive floor, "by_primitive": {name: {calls, us, s}}}."""
    costs, counts = primitive_costs(session), primitive_counts(session, dropped)
    by_primitive = {
        name: {"calls": counts[name], "us": costs[name] * 1e6, "s": counts[name] * costs[name]}
        for name in counts
    }
    return {
        "total_s": sum(row["s"] for row in by_primitive.values()),
        "by_primitive": by_primitive,
        "costs": costs,
    }


# Where each primitive is called through: the protocol code calls these attributes, so
# wrapping them sees every call (nested helpers such as crypto.derive_keys are not wrapped).
def _call_sites() -> dict[str, list[tuple[Any, str]]]:
    return {
        "x25519_keygen": [(crypto.KeyPair, "__init__")],
        "x25519_agree": [(crypto.KeyPair, "agree")],
        "hkdf": [
            (crypto, "pairwise_mask_key"),
            (crypto, "self_mask_key"),
            (crypto, "share_channel_keys"),
        ],
        "seal": [(crypto, "seal")],
        "open": [(crypto, "open_sealed")],
        "shamir_split": [(shamir, "split")],
        "shamir_reconstruct": [(shamir, "reconstruct")],
        "mask_stream": [(MaskApplier, "add"), (MaskApplier, "subtract"), (MaskApplier, "fresh")],
    }


@dataclass
class PrimitiveLog:
    """Calls and CPU seconds per primitive; `overhead_s`: what the wrapper adds to one call
    (two clock reads), so `in_situ_s` can take it out again."""

    calls: Counter[str] = field(default_factory=Counter)
    seconds: Counter[str] = field(default_factory=Counter)
    overhead_s: float = 0.0

    def in_situ_s(self, name: str | None = None) -> float:
        names = [name] if name is not None else list(self.calls)
        return sum(max(0.0, self.seconds[n] - self.calls[n] * self.overhead_s) for n in names)


def _timed(log: PrimitiveLog, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    def timed(*args: Any, **kwargs: Any) -> Any:
        started = CLOCK()
        try:
            return original(*args, **kwargs)
        finally:
            log.seconds[name] += CLOCK() - started
            log.calls[name] += 1

    return timed


def _wrapper_overhead() -> float:
    probe = PrimitiveLog()

    def noop() -> None:
        return None

    return max(0.0, _per_call(_timed(probe, "noop", noop), 2000) - _per_call(noop, 2000))


@contextlib.contextmanager
def instrumented_primitives() -> Iterator[PrimitiveLog]:
    """Count and time every primitive call made inside the block (the calls still happen).

    Patches module and class attributes: for benchmarks and tests, one thread at a time.
    """
    log = PrimitiveLog(overhead_s=_wrapper_overhead())
    patched: list[tuple[Any, str, Any]] = []
    try:
        for name, sites in _call_sites().items():
            for owner, attribute in sites:
                original = owner.__dict__[attribute]
                patched.append((owner, attribute, original))
                setattr(owner, attribute, _timed(log, name, original))
        yield log
    finally:
        for owner, attribute, original in reversed(patched):
            setattr(owner, attribute, original)
