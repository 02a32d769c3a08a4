"""Privacy evidence: what the server holds looks uniform, and it never gets both share kinds.

Randomness is the deterministic test DRBG (conftest), so the p-values are fixed numbers and
the thresholds cannot flake.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest
from scipy.stats import chisquare
from secagg_helpers import make_session, plain_sum

from fedveil.privacy.secagg import (
    DropoutPattern,
    Message,
    SessionConfig,
    Stage,
    UnmaskShares,
    crypto,
    run_in_memory,
    shamir,
)
from fedveil.privacy.secagg.masking import MaskApplier

P_MIN = 1e-3


def _bucket_counts(vector: np.ndarray, bits: int) -> np.ndarray:
    """Histogram of the top 8 bits of each coordinate (uniform in Z_2^b => flat)."""
    top = (vector.astype(np.uint64) >> np.uint64(bits - 8)).astype(np.int64)
    return np.bincount(top, minlength=256)


def _structured_inputs(session: SessionConfig) -> dict[int, np.ndarray]:
    """Worst case for a distinguisher: constant and highly regular inputs."""
    dim, top = session.dimension, session.modulus_mask
    patterns = [
        np.zeros(dim, dtype=np.uint64),
        np.full(dim, top, dtype=np.uint64),
        np.arange(dim, dtype=np.uint64) % 7,
    ]
    return {
        cid: patterns[i % len(patterns)].astype(session.dtype)
        for i, cid in enumerate(session.client_ids)
    }


@pytest.mark.parametrize(("n", "k", "t", "bits"), [(12, 11, 8, 32), (40, 10, 6, 20)])
def test_every_vector_the_server_holds_is_uniform(n: int, k: int, t: int, bits: int) -> None:
    session = make_session(n, dimension=8192, bits=bits, neighbors=k, threshold=t)
    held: list[tuple[str, np.ndarray]] = []
    inputs = _structured_inputs(session)
    dropped = session.client_ids[:2]
    report = run_in_memory(
        session,
        inputs,
        dropouts=DropoutPattern.of(masked_input=dropped),
        observer=lambda kind, cid, vec: held.append((f"{kind}:{cid}", vec.copy())),
    )
    assert len(held) == n - 2 + 1  # every masked input, then the masked sum
    for label, vector in held:
        p = chisquare(_bucket_counts(vector, bits)).pvalue
        assert p > P_MIN, f"{label} is not uniform (p={p:.2e})"
    # Sanity: the same statistic does flag the raw, unmasked inputs.
    assert chisquare(_bucket_counts(inputs[session.client_ids[5]], bits)).pvalue < 1e-12
    assert (
        report.result.total.astype(np.uint64).tolist()
        == plain_sum(inputs, report.result.survivors, bits).tolist()
    )


def test_server_gets_only_one_share_kind_per_client_and_cannot_unmask_one_input() -> None:
    session = make_session(16, dimension=8192, bits=32, neighbors=8, threshold=5)
    inputs = _structured_inputs(session)
    vectors: dict[int, np.ndarray] = {}
    received: list[UnmaskShares] = []

    def keep(stage: Stage, cid: int, message: Message) -> list[Message]:
        if isinstance(message, UnmaskShares):
            received.append(message)
        return [message]

    dropped = set(session.client_ids[3:5])
    report = run_in_memory(
        session,
        inputs,
        dropouts=DropoutPattern.of(masked_input=dropped),
        observer=lambda kind, cid, vec: (
            vectors.__setitem__(cid, vec.copy()) if kind == "masked_input" else None
        ),
        tamper_up=keep,
    )
    survivors = report.result.survivors
    seed_points: dict[int, list[tuple[int, int]]] = defaultdict(list)
    key_counts: dict[int, int] = defaultdict(int)
    for message in received:
        x = session.share_x(message.client_id)
        for owner, share in zip(message.seed_owner_ids, message.seed_shares, strict=True):
            seed_points[owner].append((x, shamir.decode_share(share)))
        for owner in message.key_owner_ids:
            key_counts[owner] += 1
    for cid in session.client_ids:
        if cid in survivors:
            assert key_counts[cid] == 0, f"server got mask-key shares of survivor {cid}"
            assert len(seed_points[cid]) >= session.threshold
        else:
            assert cid not in seed_points, f"server got seed shares of dropped client {cid}"

    # Everything the server can do to one survivor alone: strip its self mask with the
    # reconstructed seed. The pairwise masks remain, so the result is still uniform noise.
    victim = sorted(survivors)[0]
    seed = shamir.int_to_secret(shamir.reconstruct(seed_points[victim], session.threshold))
    assert seed is not None
    partial = vectors[victim].copy()
    MaskApplier(session.dimension, session.dtype, session.modulus_bits).subtract(
        partial, crypto.self_mask_key(seed, session.digest, victim)
    )
    assert chisquare(_bucket_counts(partial, 32)).pvalue > P_MIN
    assert not np.array_equal(partial, inputs[victim])
