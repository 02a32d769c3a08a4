"""Sample-level DP on a client: DP-SGD through Opacus, accounted per client.

Poisson sampling draws empty batches now and then (with probability (1 - q)^n). The
accountant counts every batch as a step that adds noise, so an empty batch must still
take a noise-only step (`dp_sgd_step`): skipping it would make the number of steps, and
so the released model, depend on whether the batches happened to be empty.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fedveil.protocol.dp_rules import ADD_REMOVE, AUTO, DP_SGD, POISSON, default_accountant

from .accounting import compute_epsilon
from .events import PrivacyEvent


@dataclass
class DpSgdSession:
    """What `make_private_dp_sgd` returns: the wrapped objects and the accounting."""

    module: Any
    optimizer: Any
    data_loader: Any
    privacy_engine: Any
    noise_multiplier: float
    max_grad_norm: float
    sample_rate: float
    accountant: str

    @property
    def steps(self) -> int:
        """Noised optimizer steps taken so far (read from Opacus' own step counter)."""
        return int(sum(steps for _, _, steps in self.privacy_engine.accountant.history))

    def event(self) -> PrivacyEvent | None:
        if self.steps == 0:
            return None
        return PrivacyEvent(
            self.noise_multiplier, self.sample_rate, self.steps, POISSON, ADD_REMOVE
        )

    def epsilon(self, delta: float) -> float:
        """This client's example-level epsilon at `delta` for all steps so far."""
        event = self.event()
        return 0.0 if event is None else compute_epsilon([event], delta, self.accountant)


def dp_sgd_step(
    session: DpSgdSession,
    loss_fn: Callable[[Any, Any], Any],
    features: Any,
    labels: Any,
) -> float | None:
    """One DP-SGD step on one Poisson batch: the batch's loss, or None if it was empty.

    An empty batch still steps: its clipped gradient sum is zero and Opacus adds the full
    noise N(0, (z · max_grad_norm)^2), as the accountant assumes of every step. The loss
    `0 · sum(output)` keeps Opacus' per-sample gradient hooks on the graph (with zero
    samples) without asking `loss_fn` for the mean of nothing (NaN).
    """
    session.optimizer.zero_grad(set_to_none=True)
    output = session.module(features)
    empty = len(labels) == 0
    loss = output.sum() * 0.0 if empty else loss_fn(output, labels)
    loss.backward()
    session.optimizer.step()
    return None if empty else float(loss.detach())


def make_private_dp_sgd(
    module: Any,
    optimizer: Any,
    dataset: Any,
    *,
    noise_multiplier: float,
    max_grad_norm: float,
    sample_rate: float,
    accountant: str = AUTO,
    noise_seed: int | None = None,
    **make_private_kwargs: Any,
) -> DpSgdSession:
    """Wrap model/optimizer for DP-SGD with Poisson sampling at exactly `sample_rate`.

    Takes the DATASET (not a loader): Opacus derives the rate from 1/len(loader),
    so we build the Poisson loader ourselves to account with the true rate. The
    noise generator is seeded from os.urandom unless a test passes `noise_seed`.
    """
    import torch
    from opacus import PrivacyEngine
    from opacus.data_loader import DPDataLoader

    if not 0 < sample_rate <= 1:
        raise ValueError(f"sample_rate={sample_rate!r} is invalid; allowed: (0, 1]")
    if accountant == AUTO:
        accountant = default_accountant(DP_SGD, POISSON, ADD_REMOVE)
    noise_generator = torch.Generator().manual_seed(_seed(noise_seed, 0))
    sampling_generator = torch.Generator().manual_seed(_seed(noise_seed, 1))
    loader = DPDataLoader(dataset, sample_rate=sample_rate, generator=sampling_generator)
    engine = PrivacyEngine(accountant="rdp")  # its history only counts steps for us
    module, optimizer, loader = engine.make_private(
        module=module,
        optimizer=optimizer,
        data_loader=loader,
        noise_multiplier=noise_multiplier,
        max_grad_norm=max_grad_norm,
        poisson_sampling=False,  # the loader above already samples with rate q
        noise_generator=noise_generator,
        **make_private_kwargs,
    )
    return DpSgdSession(
        module,
        optimizer,
        loader,
        engine,
        float(noise_multiplier),
        float(max_grad_norm),
        float(sample_rate),
        accountant,
    )


def _seed(test_seed: int | None, stream: int) -> int:
    # Production: an independent 63-bit seed from the OS CSPRNG per generator.
    if test_seed is None:
        return int.from_bytes(os.urandom(8), "little") >> 1
    return test_seed * 2 + stream
