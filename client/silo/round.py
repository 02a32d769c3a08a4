"""One silo round: encode the update, take the secure sum, decode the mean, account.

Two encodings, both the secure-aggregation code's own:

* quantised (no DP): `Quantizer.encode_weighted` (stochastic rounding, weight and count
  carried in the vector), the mean weighted by examples;
* distributed DP: the update clipped to C, then `SkellamEncoder` (rotation, conditional
  rounding, a Skellam noise share from the OS CSPRNG). The sum of the members' shares
  carries the calibrated noise when at least `min_clients` silos are in it (the silos
  refuse smaller sums: `SiloSettings.min_silos`). Accounting is the centralised round's:
  `skellam_rdp_integer` over PrivacyEvents with the Gaussian-equivalent z of the sum
  actually released (`noise_multiplier_for(len(members), replace_one)`), every silo in
  every round (fixed sampling of the whole population, rate 1). Before contributing, a
  silo checks that the round cannot take its epsilon over the budget, at the least noise
  the round could release (min_clients members); else it refuses (fails closed).

The rotation seed is public and shared: derived from the run id and round.
"""

from __future__ import annotations

import hashlib
import math
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedveil.privacy.dp.accounting import compute_epsilon
from fedveil.privacy.dp.clipping import clip_l2
from fedveil.privacy.dp.events import PrivacyEvent
from fedveil.privacy.dp.skellam import SkellamEncoder, SkellamParams
from fedveil.privacy.secagg import Quantizer
from fedveil.privacy.secagg.quantize import WEIGHT_COORDINATES
from fedveil.protocol.dp_rules import (
    DISTRIBUTED_SKELLAM,
    FIXED,
    REPLACE_ONE,
    SKELLAM_RDP_INTEGER,
    USER,
)

from .allreduce import Encoder, Prepared, SecureAllReduce, SecureSum
from .silo_ledger import SiloLedger


class SiloBudgetExceeded(RuntimeError):
    """The round could take this silo's epsilon over the budget: it does not contribute."""


@dataclass(frozen=True)
class SiloDp:
    params: SkellamParams
    epsilon_budget: float
    delta: float

    def __post_init__(self) -> None:
        if not (self.epsilon_budget > 0 and math.isfinite(self.epsilon_budget)):
            raise ValueError(f"dp.epsilon = {self.epsilon_budget!r}: must be finite and > 0")
        if not (0 < self.delta < 1):
            raise ValueError(f"dp.delta = {self.delta!r}: must be in (0, 1)")


@dataclass
class RoundResult:
    mean: np.ndarray  # float32, the model update to apply
    members: tuple[int, ...]
    attempt: int
    aborted: list[str]
    epsilon: float | None
    seconds: dict[str, float] = field(default_factory=dict)


def weighted_encoder(q: Quantizer, vector: np.ndarray, weight: int) -> Encoder:
    """`q.encode_weighted(vector, weight)`, masked, piece by piece for the all-reduce: the
    update's coordinates are `quantize(x · w / W)` (what encode_weighted does to the
    whole), the last two [w, 1]. Each piece is one fused sweep
    (`Quantizer.quantize_masked_into`) with the rounding randomness the attempt drew ahead
    from the OS CSPRNG (`SecureAllReduce.prepare`)."""
    size = int(vector.size)
    if not 0 <= weight <= q.max_weight:
        raise ValueError(f"weight {weight} outside [0, max_weight={q.max_weight}]")
    scale = weight / q.max_weight
    extras = np.array([weight, 1], dtype=q.dtype)

    def encode_masked(
        lo: int, hi: int, offsets: np.ndarray | None, masks: np.ndarray, out: np.ndarray
    ) -> None:
        assert offsets is not None  # prepare draws them for an encoder with `rounding`
        unsigned = out.view(np.uint32 if out.dtype.itemsize == 4 else np.uint64)
        body = min(hi, size) - lo
        if body > 0:
            q.quantize_masked_into(
                vector[lo : lo + body], offsets[:body], masks[:body], unsigned[:body], scale=scale
            )
        if hi > size:  # the weight coordinates [w, 1], masked the same way
            first = max(lo, size)
            tail = np.add(extras[first - size : hi - size], masks[first - lo :])
            np.bitwise_and(tail, tail.dtype.type((1 << q.bits) - 1), out=tail)
            unsigned[first - lo :] = tail

    return Encoder(size + WEIGHT_COORDINATES, encode_masked, rounding=q)


def rotation_seed(run_id: str, round_num: int) -> int:
    digest = hashlib.sha256(f"fedveil/silo-rotation/{run_id}/{round_num}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


class SiloRound:
    """A silo's rounds: `quantizer` without DP, `dp` with distributed DP (one of them)."""

    def __init__(
        self,
        allreduce: SecureAllReduce,
        *,
        quantizer: Quantizer | None = None,
        dp: SiloDp | None = None,
        ledger: SiloLedger | None = None,
    ) -> None:
        if (quantizer is None) == (dp is None):
            raise ValueError("a silo round needs exactly one of quantizer (no DP) or dp")
        if dp is not None and ledger is None:
            raise ValueError("distributed DP needs the silo's ledger")
        if dp is not None and allreduce.settings.min_silos < dp.params.min_clients:
            raise ValueError(
                f"min_silos = {allreduce.settings.min_silos} < the {dp.params.min_clients} "
                "silos whose noise shares reach the calibrated noise"
            )
        self.allreduce, self.quantizer, self.dp, self.ledger = allreduce, quantizer, dp, ledger
        self.events: list[PrivacyEvent] = []
        self._ahead: tuple[int, int, Future[Prepared]] | None = None

    def prepare(self, round_num: int, size: int) -> Future[Prepared] | None:
        """Start the round's first attempt (join, group, keys, masks, rounding randomness,
        wire buffer) on a background thread while the silo trains an update of `size`
        values; `run` of this round then uses it. Without DP only: under distributed DP the
        encoded vector's length and randomness come from the Skellam encoder when the
        update is ready (None: nothing started)."""
        if self.quantizer is None:
            return None
        q = self.quantizer
        future = self.allreduce.prepare_ahead(round_num, size + WEIGHT_COORDINATES, q.bits, q)
        self._ahead = (round_num, size, future)
        return future

    def _take_ahead(self, round_num: int, size: int) -> Future[Prepared] | None:
        ahead, self._ahead = self._ahead, None
        if ahead is None:
            return None
        if ahead[:2] != (round_num, size):
            raise ValueError(
                f"round {round_num} ({size} values) run after prepare of round {ahead[0]} "
                f"({ahead[1]} values)"
            )
        return ahead[2]

    def _event(self, members: int) -> PrivacyEvent:
        assert self.dp is not None
        z = self.dp.params.noise_multiplier_for(members, REPLACE_ONE)
        world = self.allreduce.settings.world
        return PrivacyEvent(z, 1.0, 1, FIXED, REPLACE_ONE, population_size=world)

    def _epsilon(self, events: list[PrivacyEvent]) -> float:
        assert self.dp is not None
        return compute_epsilon(
            events, self.dp.delta, SKELLAM_RDP_INTEGER, mechanism=DISTRIBUTED_SKELLAM
        )

    def run(self, round_num: int, update: np.ndarray, weight: int) -> RoundResult:
        """The members' mean update for this round (float32, the update's shape)."""
        s = self.allreduce.settings
        vector = np.asarray(update, dtype=np.float32).ravel()
        if self.dp is None:
            assert self.quantizer is not None
            q = self.quantizer
            encoder = weighted_encoder(q, vector, min(int(weight), q.max_weight))
            ahead = self._take_ahead(round_num, vector.size)
            secure = self.allreduce.sum(round_num, encoder, q.bits, ahead)
            mean = np.empty(vector.size, np.float32)
            _, count = q.decode_weighted_mean_into(secure.total, mean)
            if count != len(secure.members):
                raise RuntimeError(f"sum counts {count} silos, {len(secure.members)} took part")
            return self._result(secure, mean, None)
        dp = self.dp
        worst = self._epsilon([*self.events, self._event(dp.params.min_clients)])
        if not (worst <= dp.epsilon_budget):
            raise SiloBudgetExceeded(
                f"round {round_num}: epsilon could reach {worst:.4g} > dp.epsilon = "
                f"{dp.epsilon_budget:g}; this silo does not contribute"
            )
        seed = rotation_seed(s.run_id, round_num)
        clipped = clip_l2(vector.astype(np.float64), dp.params.clip_norm)
        encoded = SkellamEncoder(dp.params, seed).encode(clipped)
        secure = self.allreduce.sum(round_num, encoded, dp.params.bits)
        members = len(secure.members)
        if members < dp.params.min_clients:
            raise RuntimeError(f"{members} silos < min_clients {dp.params.min_clients}")
        event = self._event(members)
        epsilon = self._epsilon([*self.events, event])
        assert self.ledger is not None
        self.ledger.record(
            self._release(round_num, event, epsilon, members),
            members=secure.members,
            attempt=secure.attempt,
            aborted=secure.aborted,
            total=secure.total,
        )
        self.events.append(event)
        noised = SkellamEncoder(dp.params, seed).decode(secure.total, members)
        return self._result(secure, (noised / members).astype(np.float32), epsilon)

    def _release(
        self, round_num: int, event: PrivacyEvent, epsilon: float, members: int
    ) -> dict[str, Any]:
        assert self.dp is not None
        return {
            "round": round_num,
            "mechanism": DISTRIBUTED_SKELLAM,
            "noise_multiplier": event.noise_multiplier,
            # What a verifier recomputes z from: every member's noise share is in the sum.
            "skellam": self.dp.params.to_dict(),
            "noise_shares": members,
            "clip_norm": self.dp.params.clip_norm,
            "sampling_rate": 1.0,
            "sampling": FIXED,
            "neighbouring": REPLACE_ONE,
            "privacy_unit": USER,
            "population_size": event.population_size,
            "steps": event.steps,
            "delta": self.dp.delta,
            "epsilon": epsilon,
            "accountant": SKELLAM_RDP_INTEGER,
            "budget_epsilon": self.dp.epsilon_budget,
        }

    @staticmethod
    def _result(secure: SecureSum, mean: np.ndarray, epsilon: float | None) -> RoundResult:
        return RoundResult(
            mean, secure.members, secure.attempt, secure.aborted, epsilon, secure.seconds
        )
