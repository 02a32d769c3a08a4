"""Update inversion: recover a client's training images from an update (or a sum).

- `analytic_first_layer`: for a fully connected first layer, each unit's weight update
  is (its bias update) x (the input), summed over the samples and steps behind it, so
  dW1[i] / db1[i] is the image exactly when one image is behind it.
- `optimisation_attack`: Geiping et al. 2020, "Inverting Gradients": Adam on a dummy
  input to maximise the cosine between its gradient and the observed one, with a total
  variation prior; the label comes from the last layer's bias (Zhao et al. 2020, iDLG).
- `cocktail_party`: Kariyappa et al. 2023: the first layer's weight update of a sum is
  a linear mixture of the images (one row per unit), so ICA unmixes up to as many
  images as the layer has units. The bias column, appended as one more "pixel", fixes
  each source's scale and sign: it is 1 in every true source.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedveil.flat_model import FlatModel


def first_linear(model: FlatModel) -> tuple[str, str]:
    """Names of the first fully connected layer's weight and bias in the flat vector."""
    for name, module in model.module.named_modules():
        if isinstance(module, nn.Linear) and module.bias is not None:
            return f"{name}.weight", f"{name}.bias"
    raise ValueError("model has no fully connected layer with a bias; allowed: an MLP")


def _last_bias(model: FlatModel) -> str:
    names = [e.name for e in model.entries if e.name.endswith(".bias")]
    if not names:
        raise ValueError("model has no bias; iDLG label inference needs one")
    return names[-1]


def first_layer_update(model: FlatModel, update: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """(dW1, db1) of the first fully connected layer, as float64 numpy arrays."""
    w_name, b_name = first_linear(model)
    tensors = model.named_tensors(update.detach().cpu())
    return tensors[w_name].double().numpy(), tensors[b_name].double().numpy()


def analytic_first_layer(model: FlatModel, update: torch.Tensor, count: int = 1) -> torch.Tensor:
    """`count` candidate inputs dW1[i] / db1[i], from the units with the largest |db1[i]|
    (a unit no sample activated has db1 = 0 and says nothing). count x input_dim."""
    dw, db = first_layer_update(model, update)
    order = np.argsort(-np.abs(db))[: max(1, count)]
    rows = [dw[i] / db[i] if db[i] != 0 else np.zeros(dw.shape[1]) for i in order]
    return torch.from_numpy(np.stack(rows)).float()


def infer_label(model: FlatModel, update: torch.Tensor) -> int:
    """iDLG: the last bias's gradient is softmax - onehot, negative only at the true
    label, so the update (minus lr times it) is largest there."""
    return int(torch.argmax(model.named_tensors(update.detach().cpu())[_last_bias(model)]))


def _total_variation(x: torch.Tensor) -> torch.Tensor:
    return (x[..., 1:, :] - x[..., :-1, :]).abs().mean() + (
        x[..., :, 1:] - x[..., :, :-1]
    ).abs().mean()


def optimisation_attack(
    model: FlatModel,
    global_vector: torch.Tensor,
    update: torch.Tensor,
    image_shape: tuple[int, ...],
    *,
    pixel_range: tuple[float, float],
    label: int | None = None,
    iterations: int = 300,
    step_size: float = 0.1,
    tv_weight: float = 1e-4,
    seed: int = 0,
) -> torch.Tensor:
    """Geiping et al.: one image whose gradient at `global_vector` points the way the
    observed update does (cosine, scale-free: the learning rate need not be known).
    Returns 1 x image_shape, inside `pixel_range` (the box the data lives in)."""
    if iterations < 1:
        raise ValueError(f"iterations={iterations!r} is invalid; allowed: >= 1")
    label = infer_label(model, update) if label is None else label
    model.set(global_vector)
    module = model.module
    module.eval()
    params = [p for p in module.parameters() if p.requires_grad]
    # The update is minus lr times the (summed) gradient.
    target = [-t for t in _split_like(model, update, params)]
    target_norm = torch.sqrt(sum((t * t).sum() for t in target))
    gen = torch.Generator().manual_seed(seed)
    lo, hi = pixel_range
    dummy = (torch.randn((1, *image_shape), generator=gen) * 0.5).clamp(lo, hi)
    dummy.requires_grad_(True)
    y = torch.tensor([label])
    opt = torch.optim.Adam([dummy], lr=step_size)
    sched = torch.optim.lr_scheduler.MultiStepLR(
        opt, milestones=[int(iterations * f) for f in (0.375, 0.625, 0.875)], gamma=0.1
    )
    for _ in range(iterations):
        opt.zero_grad()
        grads = torch.autograd.grad(F.cross_entropy(module(dummy), y), params, create_graph=True)
        dot = sum((g * t).sum() for g, t in zip(grads, target, strict=True))
        norm = torch.sqrt(sum((g * g).sum() for g in grads)) + 1e-12
        loss = 1 - dot / (norm * target_norm) + tv_weight * _total_variation(dummy)
        loss.backward()
        dummy.grad.sign_()  # signed Adam steps, as Geiping et al.
        opt.step()
        sched.step()
        with torch.no_grad():
            dummy.clamp_(lo, hi)
    return dummy.detach()


def _split_like(
    model: FlatModel, update: torch.Tensor, params: list[torch.Tensor]
) -> list[torch.Tensor]:
    named = model.named_tensors(update.detach().cpu())
    by_id = {id(p): n for n, p in model.module.named_parameters()}
    return [named[by_id[id(p)]] for p in params]


def cocktail_party(
    model: FlatModel,
    update: torch.Tensor,
    sources: int,
    image_hw: tuple[int, int],
    *,
    seed: int = 0,
    steps: int = 500,
    step_size: float = 3e-2,
    tv_weight: float = 0.5,
    independence_weight: float = 0.1,
) -> torch.Tensor:
    """Kariyappa et al.: unmix the first layer's weight update of a sum of `sources`
    images. Whitening (PCA to `sources` components), then an unmixing matrix trained by
    Adam on the paper's objective: negentropy (log-cosh) + total variation (a mixture of
    images has more edges than one image) + a mutual-independence penalty on the
    unmixing vectors. At most as many images as the layer has active units come back.
    Each source's scale and sign come from the bias update: it is 1 in every true
    source. m x input_dim, in the model's input space."""
    if sources < 1:
        raise ValueError(f"sources={sources!r} is invalid; allowed: >= 1")
    dw, db = first_layer_update(model, update)
    active = np.linalg.norm(dw, axis=1) > 0
    dw, db = dw[active], db[active]
    m = min(sources, dw.shape[0])
    pixels = dw.shape[1]
    u, sing, vt = np.linalg.svd(dw - dw.mean(axis=1, keepdims=True), full_matrices=False)
    white = torch.from_numpy(vt[:m] * np.sqrt(pixels)).float()  # m x pixels, unit variance
    gen = torch.Generator().manual_seed(seed)
    unmix = torch.linalg.qr(torch.randn(m, m, generator=gen))[0].clone().requires_grad_(True)
    gauss_ref = torch.log(torch.cosh(torch.randn(100_000, generator=gen))).mean()
    off_diagonal = ~torch.eye(m, dtype=torch.bool)
    opt = torch.optim.Adam([unmix], lr=step_size)
    for _ in range(steps):
        rows = unmix / unmix.norm(dim=1, keepdim=True)
        est = rows @ white
        negentropy = (torch.log(torch.cosh(est)).mean(dim=1) - gauss_ref) ** 2
        loss = -negentropy.mean() + tv_weight * _total_variation_each(est.view(m, *image_hw))
        if m > 1:
            loss = (
                loss
                + independence_weight * torch.exp(5.0 * (rows @ rows.T).abs()[off_diagonal]).mean()
            )
        opt.zero_grad()
        loss.backward()
        opt.step()
    rows64 = (unmix / unmix.norm(dim=1, keepdim=True)).detach().double().numpy()
    # The same unmixing, in unit space, applied to the uncentred update and the bias.
    to_units = rows64 @ (np.diag(np.sqrt(pixels) / np.maximum(sing[:m], 1e-300)) @ u[:, :m].T)
    scale = to_units @ db
    scale = np.where(np.abs(scale) > 1e-300, scale, 1e-300)
    return torch.from_numpy((to_units @ dw) / scale[:, None]).float()


def _total_variation_each(images: torch.Tensor) -> torch.Tensor:
    return (
        (images[:, 1:, :] - images[:, :-1, :]).abs().mean(dim=(1, 2))
        + (images[:, :, 1:] - images[:, :, :-1]).abs().mean(dim=(1, 2))
    ).mean()
