"""What the server can still check on a securely aggregated sum (`secagg.sum_check`, issue 22).

Under secure aggregation the server sees only the unmasked sum. The clip (per coordinate to
[-r, r], and under DP to the L2 norm C) runs on the clients (client/secagg_stages.py), so a
malicious client can send any value modulo 2^b, its weight and count coordinates included,
and nothing in the protocol stops it. What the server can check is that the sum is one that
honest clients could have produced:

- weight: each honest client encodes a weight in [0, W] (W: the encoding's max_weight), so n
  of them sum to at most n * W;
- range: each honest client's quantized coordinate lies in [0, L - 1], so n of them sum to at
  most n * (L - 1) per coordinate (the modulus has room for exactly that, never more);
- norm (when the round's requests carry a clip C): each honest client's dequantized update,
  scaled by W / w_i, has L2 norm <= C with certainty (the quantizer's conditional rounding),
  so the dequantized sum of the model part has norm <= (sum of w_i / W) * C; with DP's unit
  weights (W = 1) that is n * C.

A sum outside these bounds cannot come from n honest clients: the round is rejected (raises
SumRejected, a SecAggAborted, so the channel records an abort after unmasking with the
reason). Honest rounds never trip it. It bounds what an attacker can do, it does not stop
one: a sum within the bounds passes whatever its source (one attacker may still steer the
mean update anywhere within norm C, or lie about its weight within [0, W]).
Distributed DP (Skellam) sums carry noise and are not checked here.
"""

from __future__ import annotations

import math

import numpy as np

from fedveil.privacy.encodings import QuantizedEncoding
from fedveil.privacy.secagg import SecAggAborted
from fedveil.privacy.secagg.quantize import WEIGHT_COORDINATES, unpack

# Float64 slack on the norm: the dequantized sum is exact to ~1e-15 relative.
NORM_SLACK = 1e-9


class SumRejected(SecAggAborted):
    """The unmasked sum is outside what the round's honest clients can produce."""


def check_quantized_sum(
    total: np.ndarray,
    encoding: QuantizedEncoding,
    contributors: int,
    model_size: int,
    clip_norm: float | None,
) -> float | None:
    """Raise SumRejected when `total` (the unmasked integer sum of `contributors` quantized
    inputs) is outside what that many honest clients can produce; else the model part's
    dequantized L2 norm (None without a clip, where the norm is not checked)."""
    q = encoding.quantizer(encoding.max_clients)
    n = contributors
    body, (weight_sum, _count) = unpack(np.asarray(total), WEIGHT_COORDINATES)
    most_weight = n * q.max_weight
    if weight_sum > most_weight:
        raise SumRejected(
            f"sum check: the total weight {weight_sum} exceeds {n} contributors x "
            f"max_weight {q.max_weight} = {most_weight}; a client sent a weight outside "
            f"[0, {q.max_weight}]"
        )
    if body.size:
        top = int(body.max())
        most = n * (q.levels - 1)
        if top > most:
            where = int(body.argmax())
            raise SumRejected(
                f"sum check: coordinate {where} of the sum is {top}, above {n} contributors x "
                f"(levels - 1 = {q.levels - 1}) = {most}; a client sent values outside the "
                f"quantizer's range [-{q.clip_range:g}, {q.clip_range:g}]"
            )
    if not clip_norm:
        return None
    model = q.dequantize_sum(body[:model_size], n)
    norm = math.sqrt(float(np.dot(model, model)))
    bound = weight_sum / q.max_weight * float(clip_norm)
    if norm > bound * (1.0 + NORM_SLACK) + NORM_SLACK:
        raise SumRejected(
            f"sum check: the sum's L2 norm {norm:.6g} exceeds what {n} contributors clipped to "
            f"clip_norm {float(clip_norm):g} can produce with total weight {weight_sum} "
            f"(max_weight {q.max_weight}): {bound:.6g}"
        )
    return norm
