"""Factorisations A = B C of the prefix-sum matrix, and their sensitivity under a schema.

C (the encoder) is lower-triangular (or, for the tree, streaming: a node is released
when its last round is done), so the noise for round t depends only on rounds <= t, as
adaptive inputs need. Sensitivity is for one client's contribution of L2 norm <= 1 in
each round it takes part (zero-out adjacency; accounting.py doubles it for replace-one):

- identity: C = I (DP-FedAvg without amplification): sqrt(k);
- tree (binary-tree aggregation, plain decoder: the dyadic nodes of [1, t]; C holds the
  one node completed at each round, the only ones that decoder reads): sensitivity^2
  is the maximum over allowed patterns of sum_v n_v^2 (n_v: participations under node v).
  Single participation: the number of nodes over one leaf, the tree's depth. Several:
  a max-plus dynamic programme over the tree that caps each node's count at what fits
  in its span at separation b (ceil(span / b)) and at k; it relaxes only the separation
  across a node's two halves, so it is an upper bound, exact for single participation;
- banded Toeplitz (band w): sqrt(k) x the largest column norm, valid only when w <= b
  (columns b apart then have disjoint supports);
- BLT (buffered linear Toeplitz, c_0 = 1, c_j = sum_i omega_i theta_i^(j-1)): the
  columns overlap; for nonnegative, non-increasing coefficients the worst pattern is
  every b rounds from round 1 (McMahan, Xu and Zhang 2024), so the sensitivity is the
  norm of the sum of those k columns.

`sensitivity` is what `privacy verify` recomputes from the ledger's recorded
factorisation and schema; the recorded figure is only compared with it.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .schema import ParticipationSchema
from .toeplitz import decoder_coefficients, toeplitz_matrix

IDENTITY = "identity"
TREE = "tree"
BANDED = "banded"
BLT = "blt"
FACTORIZATIONS = (TREE, BANDED, BLT)  # what dp.ftrl.factorization accepts
MAX_ROUNDS = 100_000  # bounded work: matrices are at most O(T^2)


class Factorization(ABC):
    """A = B C for `rounds` releases; figures are for unit clip norm and unit noise."""

    kind: str
    rounds: int

    @abstractmethod
    def encoder(self) -> np.ndarray:
        """C: rows are the noised linear queries, columns the rounds."""

    @abstractmethod
    def decoder(self) -> np.ndarray:
        """B: T x rows(C), with B C = A."""

    @abstractmethod
    def sensitivity(self, schema: ParticipationSchema) -> float:
        """max over allowed participation patterns of ||C u||, u the pattern's 0/1 vector."""

    @abstractmethod
    def truncated(self, rounds: int) -> Factorization:
        """The same mechanism seen after its first `rounds` releases."""

    @abstractmethod
    def to_dict(self) -> dict[str, Any]:
        """What the ledger records: enough to rebuild C exactly."""

    def prefix_noise_std(self, round_index: int | None = None) -> float:
        """Std of the (unit) noise on the prefix sum after `round_index` releases (last: T)."""
        t = self.rounds if round_index is None else round_index
        return float(np.linalg.norm(self.decoder()[t - 1]))

    def prefix_noise_rmse(self) -> float:
        """RMS over t of the prefix-sum noise std (the papers' mean-error objective)."""
        return float(np.sqrt(np.mean(np.sum(self.decoder() ** 2, axis=1))))


def _check_rounds(rounds: object) -> int:
    if not (isinstance(rounds, int) and not isinstance(rounds, bool)) or not (
        1 <= rounds <= MAX_ROUNDS
    ):
        raise ValueError(
            f"dp.ftrl rounds={rounds!r} is invalid; allowed: an integer in [1, {MAX_ROUNDS}]"
        )
    return rounds


@dataclass(frozen=True)
class IdentityFactorization(Factorization):
    """C = I, B = A: independent noise per round (DP-FedAvg, no amplification)."""

    rounds: int
    kind: str = IDENTITY

    def __post_init__(self) -> None:
        _check_rounds(self.rounds)

    def encoder(self) -> np.ndarray:
        return np.eye(self.rounds)

    def decoder(self) -> np.ndarray:
        return np.tril(np.ones((self.rounds, self.rounds)))

    def sensitivity(self, schema: ParticipationSchema) -> float:
        return math.sqrt(schema.effective_participations(self.rounds))

    def truncated(self, rounds: int) -> IdentityFactorization:
        return IdentityFactorization(rounds)

    def prefix_noise_std(self, round_index: int | None = None) -> float:
        return math.sqrt(self.rounds if round_index is None else round_index)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": IDENTITY, "rounds": self.rounds}


@dataclass(frozen=True)
class TreeFactorization(Factorization):
    """Binary-tree aggregation over T rounds (a forest of complete dyadic blocks)."""

    rounds: int
    kind: str = TREE

    def __post_init__(self) -> None:
        _check_rounds(self.rounds)

    def nodes(self) -> list[tuple[int, int]]:
        """(level, start) of the node released at each round: the dyadic block ending
        there, of the largest size that fits (one per release, the blocks the plain
        decoder uses; the others would add noise to queries nobody reads)."""
        found = []
        for count in range(1, self.rounds + 1):
            level = (count & -count).bit_length() - 1
            found.append((level, count - 2**level))
        return found

    def encoder(self) -> np.ndarray:
        nodes = self.nodes()
        c = np.zeros((len(nodes), self.rounds))
        for row, (level, start) in enumerate(nodes):
            c[row, start : start + 2**level] = 1.0
        return c

    def decoder(self) -> np.ndarray:
        index = {node: row for row, node in enumerate(self.nodes())}
        b = np.zeros((self.rounds, len(index)))
        for t in range(self.rounds):
            for node in dyadic_cover(t + 1):
                b[t, index[node]] = 1.0
        return b

    def depth(self) -> int:
        """Nodes over one leaf: the levels of the largest complete block."""
        return self.rounds.bit_length()

    def sensitivity(self, schema: ParticipationSchema) -> float:
        if schema.single:
            return math.sqrt(self.depth())
        return math.sqrt(_tree_max_sum_squares(self.rounds, schema))

    def truncated(self, rounds: int) -> TreeFactorization:
        return TreeFactorization(rounds)

    def prefix_noise_std(self, round_index: int | None = None) -> float:
        t = self.rounds if round_index is None else round_index
        return math.sqrt(bin(t).count("1"))

    def to_dict(self) -> dict[str, Any]:
        return {"kind": TREE, "rounds": self.rounds}


def dyadic_cover(count: int) -> list[tuple[int, int]]:
    """The dyadic blocks (level, start) whose union is rounds [0, count): one per set bit."""
    cover = []
    start = 0
    for level in range(count.bit_length() - 1, -1, -1):
        if count & (1 << level):
            cover.append((level, start))
            start += 1 << level
    return cover


def _tree_max_sum_squares(rounds: int, schema: ParticipationSchema) -> float:
    """Upper bound on max over patterns of sum_v n_v^2 (module docstring)."""
    k = schema.effective_participations(rounds)
    b = schema.separation(rounds)
    neg = -math.inf

    def capacity(span: int) -> int:
        return min(k, math.ceil(span / b))

    def node(level: int) -> np.ndarray:
        # f[c]: the best sum of n_v^2 over the subtree with c participations in it
        # (all blocks of a level are alike: computed once per level).
        if level == 0:
            return np.array([0.0, 1.0])
        child = memo[level - 1]
        cap = capacity(2**level)
        merged = np.full(cap + 1, neg)
        for c1, f1 in enumerate(child):
            for c2, f2 in enumerate(child):
                if c1 + c2 <= cap:
                    merged[c1 + c2] = max(merged[c1 + c2], f1 + f2)
        return merged + np.arange(cap + 1) ** 2

    memo: list[np.ndarray] = []
    for level in range(rounds.bit_length()):
        memo.append(node(level))
    # The forest: the complete blocks of the binary expansion of T, combined (no root).
    total = np.array([0.0])
    for level, _start in dyadic_cover(rounds):
        tree = memo[level]
        merged = np.full(min(k, len(total) + len(tree) - 2) + 1, neg)
        for c1, f1 in enumerate(total):
            for c2, f2 in enumerate(tree):
                if c1 + c2 < len(merged):
                    merged[c1 + c2] = max(merged[c1 + c2], f1 + f2)
        total = merged
    return float(np.max(total))


@dataclass(frozen=True)
class BandedFactorization(Factorization):
    """Banded lower-triangular Toeplitz C with `len(coefficients)` = band nonzero diagonals."""

    rounds: int
    coefficients: tuple[float, ...]
    kind: str = BANDED

    def __post_init__(self) -> None:
        _check_rounds(self.rounds)
        _check_coefficients(self.coefficients)

    @property
    def band(self) -> int:
        return len(self.coefficients)

    def encoder(self) -> np.ndarray:
        return toeplitz_matrix(np.asarray(self.coefficients), self.rounds)

    def decoder(self) -> np.ndarray:
        s = decoder_coefficients(np.asarray(self.coefficients), self.rounds)
        return toeplitz_matrix(s, self.rounds)

    def sensitivity(self, schema: ParticipationSchema) -> float:
        b = schema.separation(self.rounds)
        k = schema.effective_participations(self.rounds)
        if k > 1 and not (self.band <= b):
            raise ValueError(
                f"dp.ftrl banded band={self.band} > min_separation={b}: the sensitivity "
                "sqrt(k) x max column norm holds only for band <= min_separation"
            )
        # The first column is the longest; later ones are truncated copies of it.
        column = np.asarray(self.coefficients[: self.rounds])
        return math.sqrt(k) * float(np.linalg.norm(column))

    def truncated(self, rounds: int) -> BandedFactorization:
        return BandedFactorization(rounds, self.coefficients)

    def prefix_noise_std(self, round_index: int | None = None) -> float:
        t = self.rounds if round_index is None else round_index
        s = decoder_coefficients(np.asarray(self.coefficients), t)
        return float(np.linalg.norm(s))

    def to_dict(self) -> dict[str, Any]:
        return {"kind": BANDED, "rounds": self.rounds, "coefficients": list(self.coefficients)}


@dataclass(frozen=True)
class BltFactorization(Factorization):
    """BLT: c_0 = 1, c_j = sum_i omega_i theta_i^(j-1) (Dvijotham et al. 2024)."""

    rounds: int
    omega: tuple[float, ...]
    theta: tuple[float, ...]
    kind: str = BLT

    def __post_init__(self) -> None:
        _check_rounds(self.rounds)
        if not (len(self.omega) == len(self.theta) >= 1):
            raise ValueError(
                f"dp.ftrl blt omega/theta lengths {len(self.omega)}/{len(self.theta)} "
                "are invalid; allowed: equal, >= 1"
            )
        for name, values in (("omega", self.omega), ("theta", self.theta)):
            for value in values:
                if not (isinstance(value, float | int) and 0 <= value < 1):
                    raise ValueError(
                        f"dp.ftrl blt {name} value {value!r} is invalid; allowed: [0, 1)"
                    )
        # Non-increasing from c_0 = 1 to c_1 = sum(omega): the every-b pattern is the
        # worst one only for nonnegative, non-increasing coefficients.
        if not (sum(self.omega) <= 1.0):
            raise ValueError(
                f"dp.ftrl blt sum(omega)={sum(self.omega)!r} is invalid; allowed: <= 1 "
                "(non-increasing coefficients)"
            )

    def coefficients(self, rounds: int | None = None) -> np.ndarray:
        t = self.rounds if rounds is None else rounds
        j = np.arange(1, t)
        omega = np.asarray(self.omega)[:, None]
        theta = np.asarray(self.theta)[:, None]
        return np.concatenate([[1.0], np.sum(omega * theta ** (j - 1), axis=0)])

    def encoder(self) -> np.ndarray:
        return toeplitz_matrix(self.coefficients(), self.rounds)

    def decoder(self) -> np.ndarray:
        return toeplitz_matrix(decoder_coefficients(self.coefficients(), self.rounds), self.rounds)

    def sensitivity(self, schema: ParticipationSchema) -> float:
        b = schema.separation(self.rounds)
        k = schema.effective_participations(self.rounds)
        c = self.coefficients()
        total = np.zeros(self.rounds)
        for i in range(k):
            total[i * b :] += c[: self.rounds - i * b]
        return float(np.linalg.norm(total))

    def truncated(self, rounds: int) -> BltFactorization:
        return BltFactorization(rounds, self.omega, self.theta)

    def prefix_noise_std(self, round_index: int | None = None) -> float:
        t = self.rounds if round_index is None else round_index
        return float(np.linalg.norm(decoder_coefficients(self.coefficients(t), t)))

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": BLT,
            "rounds": self.rounds,
            "omega": list(self.omega),
            "theta": list(self.theta),
        }


def _check_coefficients(coefficients: tuple[float, ...]) -> None:
    if not (1 <= len(coefficients) <= MAX_ROUNDS):
        raise ValueError(
            f"dp.ftrl banded band={len(coefficients)} is invalid; allowed: [1, {MAX_ROUNDS}]"
        )
    for i, value in enumerate(coefficients):
        if not (isinstance(value, float | int) and math.isfinite(value)):
            raise ValueError(
                f"dp.ftrl banded coefficient {i}={value!r} is invalid; allowed: finite"
            )
    if not (coefficients[0] > 0):
        raise ValueError(
            f"dp.ftrl banded coefficient 0={coefficients[0]!r} is invalid; allowed: > 0"
        )


def factorization_from_dict(data: Mapping[str, Any]) -> Factorization:
    """Rebuild a recorded factorisation (the ledger's); unknown kinds and fields refused."""
    kind = data.get("kind")
    rounds = data.get("rounds")
    if kind == IDENTITY:
        return IdentityFactorization(_check_rounds(rounds))
    if kind == TREE:
        return TreeFactorization(_check_rounds(rounds))
    if kind == BANDED:
        return BandedFactorization(
            _check_rounds(rounds), tuple(_floats(data.get("coefficients"), "coefficients"))
        )
    if kind == BLT:
        return BltFactorization(
            _check_rounds(rounds),
            tuple(_floats(data.get("omega"), "omega")),
            tuple(_floats(data.get("theta"), "theta")),
        )
    raise ValueError(
        f"dp.ftrl factorization kind={kind!r} is invalid; allowed: {(IDENTITY, *FACTORIZATIONS)}"
    )


def _floats(values: object, name: str) -> list[float]:
    if not isinstance(values, list) or not values:
        raise ValueError(f"dp.ftrl factorization {name}={values!r} is invalid; allowed: a list")
    out = []
    for value in values:
        if isinstance(value, bool) or not isinstance(value, float | int):
            raise ValueError(f"dp.ftrl factorization {name} value {value!r} is not a number")
        out.append(float(value))
    return out
