"""Helpers shared by the secure-aggregation tests."""

from __future__ import annotations

import hashlib

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedveil.privacy.secagg import SessionConfig, ThreatMode


def make_session(
    n: int,
    *,
    dimension: int = 16,
    bits: int = 32,
    neighbors: int | None = None,
    threshold: int | None = None,
    mode: ThreatMode = ThreatMode.SEMI_HONEST,
    first_id: int = 1000,
    session_id: bytes = b"round-0001",
    run_id: bytes = b"test-run",
    round_num: int = 1,
) -> SessionConfig:
    """Session with explicit k, t (defaults: complete graph, t = about 2n/3)."""
    k = n - 1 if neighbors is None else neighbors
    t = threshold if threshold is not None else max(2, (2 * (k + 1)) // 3)
    if mode is ThreatMode.MALICIOUS:
        t = max(t, (k + 1) // 2 + 1)
    return SessionConfig(
        session_id=session_id,
        client_ids=tuple(range(first_id, first_id + n)),
        modulus_bits=bits,
        dimension=dimension,
        neighbors=k,
        threshold=t,
        threat_mode=mode,
        graph_seed=hashlib.sha256(session_id).digest(),
        run_id=run_id,
        round=round_num,
    )


def random_inputs(session: SessionConfig, seed: int) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(seed)
    high = 1 << session.modulus_bits
    return {
        cid: rng.integers(0, high, session.dimension, dtype=np.uint64).astype(session.dtype)
        for cid in session.client_ids
    }


def plain_sum(inputs: dict[int, np.ndarray], members: frozenset[int], bits: int) -> np.ndarray:
    total = [0] * len(next(iter(inputs.values())))
    for cid in members:
        for i, v in enumerate(inputs[cid].tolist()):
            total[i] += v
    return np.array([v % (1 << bits) for v in total], dtype=np.uint64)


def identity_keys(session: SessionConfig) -> dict[int, Ed25519PrivateKey]:
    return {
        cid: Ed25519PrivateKey.from_private_bytes(hashlib.sha256(b"id%d" % cid).digest())
        for cid in session.client_ids
    }
