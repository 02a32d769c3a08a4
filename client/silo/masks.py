"""The sum of a silo's pairwise masks: + for each peer above it, - for each below, so the
masks of all members cancel in the sum modulo 2^b (AES-CTR streams: privacy/secagg/masking).

Masks depend only on the attempt's keys, not on the update: a silo may expand them while
it trains, and adding them to the quantised update is one vector addition
(signed_wire.mask_into)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from fedveil.privacy.secagg.masking import MaskApplier


def mask_total(
    silo: int, keys: Mapping[int, bytes], dimension: int, dtype: type[np.unsignedinteger], bits: int
) -> np.ndarray:
    """Σ_{peer > silo} PRG(k) - Σ_{peer < silo} PRG(k) in Z_(2^bits)."""
    applier = MaskApplier(dimension, dtype, bits)
    total = np.zeros(dimension, dtype=dtype)
    for peer, key in sorted(keys.items()):
        if peer > silo:
            applier.add(total, key)
        else:
            applier.subtract(total, key)
    applier.reduce(total)
    return total
