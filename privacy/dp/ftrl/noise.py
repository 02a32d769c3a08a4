"""The DP-FTRL noise generator: correlated noise for release t, state persisted first.

Release t (1-based, the ledger's release index) adds sigma x w_t to round t's sum of
clipped updates, where w = C^-1 xi and xi are fresh N(0, 1) vectors from the OS
CSPRNG (rng.secure_generator): the running model then carries B xi on its prefix
sums. The state the next release needs is small (banded: the last band - 1 w's; BLT:
one buffer per (omega, theta); tree: one node per set bit of t; identity: nothing).

Resume rule (it cannot leak): `next_noise` persists the state after release t, and
the one before it, durably (write, fsync, rename) before returning w_t, so before the
ledger entry and before anything is published. `restore` takes the ledger's count of
releases r: a state at r continues; a state at r + 1 means release r + 1 was drawn
but never charged nor published, so its draw is discarded and the state at r is used
with FRESH noise: a re-run round never reuses an index's noise with different data.
Anything else (state lost, behind, another factorisation, another T, another sigma or
dimension) is refused; so is a release beyond the planned T.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from ..rng import resolve_generator
from .factorizations import (
    BANDED,
    BLT,
    IDENTITY,
    TREE,
    BandedFactorization,
    BltFactorization,
    Factorization,
)

STATE_VERSION = 1


class NoiseStateError(RuntimeError):
    """The persisted noise state cannot continue this run (the message says why)."""


class FtrlNoise:
    """Stateful correlated noise for one run: `next_noise(index)` once per release."""

    def __init__(
        self,
        factorization: Factorization,
        sigma: float,
        dim: int,
        path: Path | None,
        *,
        rng: np.random.Generator | None = None,
    ) -> None:
        if not (np.isfinite(sigma) and sigma > 0):
            raise ValueError(f"FtrlNoise sigma={sigma!r} is invalid; allowed: a finite number > 0")
        if not (isinstance(dim, int) and dim >= 1):
            raise ValueError(f"FtrlNoise dim={dim!r} is invalid; allowed: an integer >= 1")
        self.factorization = factorization
        self.sigma = float(sigma)
        self.dim = dim
        self.path = path
        self._rng = rng  # tests only; production draws from the OS CSPRNG
        self.index = 0  # releases drawn so far
        self._state = self._initial_state()
        self._previous: dict[str, np.ndarray] | None = None

    # ------------------------------------------------------------------ release
    def next_noise(self, index: int) -> np.ndarray:
        """sigma x w_index (float64, length dim), its state persisted before returning."""
        if not (index == self.index + 1):
            raise NoiseStateError(
                f"release index {index} is invalid; allowed: {self.index + 1} (noise follows "
                "the ledger's release index: no index is skipped or drawn twice)"
            )
        if not (index <= self.factorization.rounds):
            raise NoiseStateError(
                f"release index {index} > planned rounds T={self.factorization.rounds}: "
                "extending T is refused (the factorisation and its accounting are for T)"
            )
        xi = resolve_generator(self._rng).standard_normal(self.dim)
        w, state = self._step(xi)
        self._previous, self._state = self._state, state
        self.index = index
        self._persist()
        return self.sigma * w

    def _initial_state(self) -> dict[str, np.ndarray]:
        f = self.factorization
        if f.kind == BANDED:
            assert isinstance(f, BandedFactorization)
            return {"history": np.zeros((f.band - 1, self.dim))}
        if f.kind == BLT:
            assert isinstance(f, BltFactorization)
            return {"buffers": np.zeros((len(f.omega), self.dim))}
        if f.kind == TREE:
            # one row per level: the noise of the node in the current cover, or 0
            return {"nodes": np.zeros((f.rounds.bit_length(), self.dim))}
        if f.kind == IDENTITY:
            return {}
        raise ValueError(f"factorization kind={f.kind!r} has no noise generator")

    def _step(self, xi: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        f = self.factorization
        if isinstance(f, BandedFactorization):
            # C w = xi, banded: w_t = (xi_t - sum_{i=1}^{band-1} c_i w_(t-i)) / c_0
            c = np.asarray(f.coefficients)
            history = self._state["history"]  # row i-1 holds w_(t-i)
            w = (xi - c[1:] @ history) / c[0] if len(c) > 1 else xi / c[0]
            return w, {"history": np.vstack([w[None, :], history[:-1]])}
        if isinstance(f, BltFactorization):
            # C w = xi, c_j = sum_i omega_i theta_i^(j-1);
            # buffer_i = sum_j theta_i^(j-1) w_(t-j)
            omega = np.asarray(f.omega)
            theta = np.asarray(f.theta)
            buffers = self._state["buffers"]
            w = xi - omega @ buffers
            return w, {"buffers": w[None, :] + theta[:, None] * buffers}
        if f.kind == TREE:
            # prefix noise P_t = sum of the nodes covering [0, t); w_t = P_t - P_(t-1)
            count = self.index + 1
            nodes = self._state["nodes"].copy()
            before = nodes.sum(axis=0)
            new_level = (count & -count).bit_length() - 1  # the block ending at round t
            nodes[:new_level] = 0.0  # its descendants leave the cover
            nodes[new_level] = xi
            return nodes.sum(axis=0) - before, {"nodes": nodes}
        return xi, {}

    # -------------------------------------------------------------- persistence
    def _fingerprint(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "factorization": self.factorization.to_dict(),
            "sigma": self.sigma,
            "dim": self.dim,
        }

    def _persist(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        arrays: dict[str, np.ndarray] = {f"state_{k}": v for k, v in self._state.items()}
        if self._previous is not None:
            arrays.update({f"previous_{k}": v for k, v in self._previous.items()})
        meta = {**self._fingerprint(), "index": self.index}
        arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "wb") as fh:
            np.savez(fh, **arrays)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)
        os.chmod(self.path, 0o600)  # the noise state is secret: it subtracts the noise

    def restore(self, ledger_releases: int) -> None:
        """Continue after `ledger_releases` charged releases (module docstring)."""
        if ledger_releases == 0 and (self.path is None or not self.path.exists()):
            return
        if self.path is None or not self.path.exists():
            raise NoiseStateError(
                f"the ledger holds {ledger_releases} DP-FTRL releases but the noise state "
                f"{self.path} is missing: the correlated noise cannot continue (refused)"
            )
        with np.load(self.path) as data:
            meta = json.loads(bytes(data["meta"]).decode())
            state = {k[6:]: data[k] for k in data.files if k.startswith("state_")}
            previous = {k[9:]: data[k] for k in data.files if k.startswith("previous_")}
        index = meta.pop("index")
        if meta != self._fingerprint():
            raise NoiseStateError(
                f"noise state {self.path} is for {meta}, this run is {self._fingerprint()}: "
                "refused (another factorisation, T, sigma or dimension)"
            )
        if index == ledger_releases:
            self._state, self._previous, self.index = state, None, index
        elif index == ledger_releases + 1 and (previous or not self._state):
            # Drawn, persisted, never charged nor published: discard that draw.
            self._state, self._previous, self.index = previous, None, ledger_releases
        else:
            raise NoiseStateError(
                f"noise state {self.path} is at release {index}, the ledger at "
                f"{ledger_releases}: refused (only {ledger_releases} or "
                f"{ledger_releases + 1} can continue)"
            )
