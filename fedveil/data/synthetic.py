"""FedProx's Synthetic(alpha, beta) federated dataset (Li et al., MLSys 2020).

Client k draws its own softmax-regression model and its own feature mean:

    u_k ~ N(0, alpha),  W_k ~ N(u_k, 1) (F x C),  b_k ~ N(u_k, 1) (C)
    B_k ~ N(0, beta),   v_k ~ N(B_k, 1) (F),      x ~ N(v_k, Sigma),  Sigma_jj = j^-1.2
    y = argmax(softmax(x W_k + b_k))

alpha controls how much the local *models* differ, beta how much the local *data*
differ. As in the reference generator (``generate_niid.py``), alpha and beta are
used as standard deviations, client sizes are ``int(lognormal(4, 2)) + 50`` and
each client keeps 90% of its samples for training.

Note (a property of the published definition, kept for comparability): u_k is
added to *every* entry of W_k and b_k, i.e. the same amount to every class
logit, so it cancels in the argmax and alpha does not change the labels. Model
heterogeneity comes from the unit-variance noise of W_k, b_k; beta drives
feature heterogeneity (and, through it, label skew). ``iid=True`` gives
Synthetic-IID: one shared W, b ~ N(0, 1) and v = 0 for every client.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

__all__ = ["SyntheticData", "generate_synthetic"]


class SyntheticData(NamedTuple):
    x_train: np.ndarray  # float32, N_train x F (clients concatenated in order)
    y_train: np.ndarray  # int64
    x_test: np.ndarray
    y_test: np.ndarray
    train_partition: list[np.ndarray]  # train indices of each client
    test_partition: list[np.ndarray]  # test indices of each client


def _check(name: str, value: float, ok: bool, limit: str) -> None:
    if not ok:
        raise ValueError(f"synthetic: {name}={value!r} must be {limit}")


# Bytes held per feature value while generating: each client's float64 draw, then the
# float32 concatenation (the lists are freed only after it).
_BYTES_PER_VALUE = 12


def available_memory() -> int | None:
    """MemAvailable from /proc/meminfo in bytes (None where there is none to read)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _check_fits(num_clients: int, samples: int, num_features: int, budget: int | None) -> None:
    budget = available_memory() if budget is None else budget
    need = samples * num_features * _BYTES_PER_VALUE
    if budget is not None and need > budget:
        raise ValueError(
            f"synthetic: num_clients={num_clients} draws {samples:,} samples, about "
            f"{need / 2**30:.1f} GiB to generate, more than the {budget / 2**30:.1f} GiB "
            "available; use fewer clients (data.num_clients), or a custom task (model.task) "
            "whose clients' data is generated when they train"
        )


def generate_synthetic(
    *,
    num_clients: int = 30,
    alpha: float = 1.0,
    beta: float = 1.0,
    iid: bool = False,
    seed: int = 0,
    num_features: int = 60,
    num_classes: int = 10,
    size_mean: float = 4.0,
    size_sigma: float = 2.0,
    min_samples: int = 50,
    max_samples: int | None = None,
    test_fraction: float = 0.1,
    memory_budget: int | None = None,
) -> SyntheticData:
    """Generate the dataset; identical output for identical arguments.

    The whole dataset is held in memory (about 450 samples a client at the published
    sizes). A population whose data would not fit in `memory_budget` bytes (None: the
    memory available now) is refused before anything is generated."""
    _check("num_clients", num_clients, isinstance(num_clients, int) and num_clients >= 1, ">= 1")
    for name, value in (("alpha", alpha), ("beta", beta), ("size_sigma", size_sigma)):
        _check(name, value, math.isfinite(value) and value >= 0, "finite and >= 0")
    _check("num_features", num_features, num_features >= 1, ">= 1")
    _check("num_classes", num_classes, num_classes >= 2, ">= 2")
    _check("min_samples", min_samples, min_samples >= 2, ">= 2 (one train, one test)")
    if max_samples is not None:
        ok = max_samples >= min_samples
        _check("max_samples", max_samples, ok, f">= min_samples={min_samples}")
    _check("test_fraction", test_fraction, 0.0 <= test_fraction < 1.0, "in [0, 1)")

    rng = np.random.default_rng(seed)
    sizes = rng.lognormal(size_mean, size_sigma, num_clients).astype(np.int64) + min_samples
    if max_samples is not None:
        sizes = np.minimum(sizes, max_samples)  # the lognormal tail can reach 10^5 per client
    _check_fits(num_clients, int(sizes.sum()), num_features, memory_budget)
    u = rng.normal(0.0, alpha, num_clients)
    big_b = rng.normal(0.0, beta, num_clients)
    std_x = np.arange(1, num_features + 1, dtype=np.float64) ** -0.6  # sqrt(j^-1.2)
    if iid:
        shared_w = rng.normal(0.0, 1.0, (num_features, num_classes))
        shared_b = rng.normal(0.0, 1.0, num_classes)

    xs_tr, ys_tr, xs_te, ys_te = [], [], [], []
    for k in range(num_clients):
        if iid:
            v, w, b = np.zeros(num_features), shared_w, shared_b
        else:
            v = rng.normal(big_b[k], 1.0, num_features)
            w = rng.normal(u[k], 1.0, (num_features, num_classes))
            b = rng.normal(u[k], 1.0, num_classes)
        x = v + std_x * rng.standard_normal((int(sizes[k]), num_features))  # diagonal Sigma
        y = np.argmax(x @ w + b, axis=1)  # argmax of softmax == argmax of logits
        n_test = 0 if test_fraction == 0 else min(len(x) - 1, max(1, round(len(x) * test_fraction)))
        n_train = len(x) - n_test
        xs_tr.append(x[:n_train])
        ys_tr.append(y[:n_train])
        xs_te.append(x[n_train:])
        ys_te.append(y[n_train:])

    def offsets(parts: list[np.ndarray]) -> list[np.ndarray]:
        ends = np.cumsum([len(p) for p in parts])
        return [np.arange(e - len(p), e, dtype=np.int64) for p, e in zip(parts, ends, strict=True)]

    return SyntheticData(
        x_train=np.concatenate(xs_tr).astype(np.float32),
        y_train=np.concatenate(ys_tr).astype(np.int64),
        x_test=np.concatenate(xs_te).astype(np.float32),
        y_test=np.concatenate(ys_te).astype(np.int64),
        train_partition=offsets(ys_tr),
        test_partition=offsets(ys_te),
    )
