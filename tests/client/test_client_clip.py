"""One clip for a DP update, applied once: the client runtime clips with privacy.dp.clipping,
and the clipped update's float64 L2 norm never exceeds C, whatever float32 does."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tiny_task
from fedveil.client.runtime import ClientRuntime
from fedveil.client.training import LocalResult
from fedveil.config import RunConfig
from fedveil.privacy.dp.clipping import check_l2_bound, clip_update, l2_norm
from fedveil.protocol.envelope import Envelope

F32 = np.float32


def norm64(vector: np.ndarray | torch.Tensor) -> float:
    if isinstance(vector, torch.Tensor):
        vector = vector.detach().cpu().numpy()
    return float(np.linalg.norm(np.asarray(vector, np.float64)))


def float32_hides_overshoot(dim: int, clip: float, seed: int = 7) -> np.ndarray:
    """A float32 vector whose float32 norm (torch's) is <= clip while its float64 norm is
    above: the case a float32 check lets through."""
    rng = np.random.default_rng(seed)
    for _ in range(100_000):
        x = rng.normal(size=dim)
        x = (x * (clip / np.linalg.norm(x))).astype(F32)
        if norm64(x) > clip and float(torch.linalg.vector_norm(torch.from_numpy(x))) <= clip:
            return x
    raise AssertionError("no such vector found")


def test_norm_exactly_c_is_left_unchanged_bit_for_bit() -> None:
    x = np.array([3.0, 4.0, 0.0], F32)
    result = clip_update(x, 5.0)
    assert not result.changed and result.norm == 5.0
    assert result.vector.tobytes() == x.tobytes()


def test_just_above_c_is_clipped_to_at_most_c() -> None:
    x = np.array([3.0, np.nextafter(F32(4.0), F32(5.0))], F32)
    result = clip_update(x, 5.0)
    assert result.changed and result.norm > 5.0
    assert result.vector.dtype == F32
    assert norm64(result.vector) <= 5.0
    assert norm64(result.vector) > 5.0 * (1 - 1e-5)  # clipped to C, not far below it


def test_float32_norm_under_c_with_float64_norm_above_is_clipped() -> None:
    x = float32_hides_overshoot(195, 1.0)
    result = clip_update(x, 1.0)
    assert result.changed
    assert norm64(result.vector) <= 1.0


@pytest.mark.parametrize("dim", [1, 1000, 100_000])
def test_huge_float32_values(dim: int) -> None:
    x = np.full(dim, np.finfo(F32).max, F32)
    x[::2] *= -1
    clipped = clip_update(x, 1.0).vector
    assert np.all(np.isfinite(clipped))
    assert 1.0 * (1 - 1e-5) < norm64(clipped) <= 1.0


def test_float64_values_whose_squared_norm_overflows() -> None:
    x = np.full(10, 1e300)
    clipped = clip_update(x, 2.0).vector
    assert 2.0 * (1 - 1e-5) < norm64(clipped) <= 2.0
    np.testing.assert_allclose(clipped, np.full(10, 2.0 / np.sqrt(10)), rtol=1e-5)


def test_denormal_values_and_denormal_clip_norms() -> None:
    tiny = np.finfo(F32).smallest_subnormal
    x = np.full(16, tiny, F32)  # norm 4 * tiny
    for clip in [4.0 * float(tiny), 3.5 * float(tiny), 1.5 * float(tiny), 0.5 * float(tiny)]:
        clipped = clip_update(x, clip).vector
        assert norm64(clipped) <= clip, clip
    x = np.full(16, 3e-39, F32)  # subnormal entries, clip in the normal range
    assert norm64(clip_update(x, 1e-39).vector) <= 1e-39


def test_random_vectors_never_exceed_c_in_float64() -> None:
    rng = np.random.default_rng(0)
    for _ in range(300):
        dim = int(rng.integers(1, 3000))
        x = (rng.standard_cauchy(dim) * 10.0 ** rng.uniform(-30, 30)).astype(F32)
        clip = float(10.0 ** rng.uniform(-20, 20))
        if not np.all(np.isfinite(x)):
            continue
        result = clip_update(x, clip)
        assert norm64(result.vector) <= clip
        assert check_l2_bound(result.vector, clip) <= clip  # what an encoder checks


def test_non_finite_updates_and_bad_clip_norms_are_refused() -> None:
    with pytest.raises(ValueError, match="NaN or infinite"):
        clip_update(np.array([1.0, np.nan], F32), 1.0)
    with pytest.raises(ValueError, match="clip_norm"):
        clip_update(np.ones(3, F32), 0.0)
    with pytest.raises(ValueError, match="exceeds clip_norm"):
        check_l2_bound(np.ones(4, F32), 1.0)


# -- through the client runtime, with its trainer injected -------------------------------


def request(**dp: object) -> Envelope:
    config: dict[str, object] = {
        "seed": 1,
        "local_epochs": 1,
        "local_steps": 0,
        "batch_size": 8,
        "lr": 0.1,
        "momentum": 0.0,
        "weight_decay": 0.0,
        "prox_mu": 0.0,
        **dp,
    }
    return Envelope("train", 1, config, {"model": torch.zeros(195)})


def runtime_returning(delta: torch.Tensor) -> ClientRuntime:
    calls: list[int] = []

    def trainer(model, global_vector, x, y, hp, loss_fn, generator) -> LocalResult:
        calls.append(int(x.shape[0]))
        return LocalResult(delta.clone(), int(x.shape[0]), 1, 0.5)

    runtime = ClientRuntime(tiny_task.make(RunConfig()), trainer=trainer)
    assert runtime.model.size == delta.numel() == 195
    runtime.calls = calls  # type: ignore[attr-defined]
    return runtime


def test_runtime_clips_an_update_whose_float32_norm_hides_the_overshoot() -> None:
    # A client that checked its norm in float32 would send this unclipped: above C.
    delta = torch.from_numpy(float32_hides_overshoot(195, 1.0))
    runtime = runtime_returning(delta)
    reply = runtime.handle(0, request(clip_norm=1.0, clip_indicator=True), {})
    assert runtime.calls, "the injected trainer ran"  # type: ignore[attr-defined]
    sent = reply.arrays["delta"]
    assert sent.dtype == torch.float32
    assert norm64(sent) <= 1.0
    assert reply.config["unclipped"] == 0  # its norm was above C


def test_runtime_clips_huge_updates_to_c() -> None:
    delta = torch.full((195,), 1e30)
    reply = ClientRuntime(
        tiny_task.make(RunConfig()),
        trainer=lambda m, g, x, y, hp, lf, gen: LocalResult(delta.clone(), 10, 1, 0.1),
    ).handle(0, request(clip_norm=0.5), {})
    assert 0.5 * (1 - 1e-5) < norm64(reply.arrays["delta"]) <= 0.5


def test_without_dp_the_update_is_sent_as_trained_bit_for_bit() -> None:
    delta = torch.from_numpy(np.random.default_rng(3).normal(size=195).astype(F32) * 100)
    reply = runtime_returning(delta).handle(0, request(), {})
    assert torch.equal(reply.arrays["delta"], delta)
    assert l2_norm(reply.arrays["delta"]) > 100  # nothing clipped it


def test_an_update_within_c_is_sent_unchanged() -> None:
    delta = torch.from_numpy(np.array([0.1] * 195, F32))
    reply = runtime_returning(delta).handle(0, request(clip_norm=10.0, clip_indicator=True), {})
    assert torch.equal(reply.arrays["delta"], delta)
    assert reply.config["unclipped"] == 1


@pytest.mark.parametrize("loss", [float("nan"), float("inf")])
def test_a_finite_update_with_a_non_finite_loss_is_refused_naming_the_loss(loss) -> None:
    # The loss travelled with the update to the coordinator (its own check dropped it).
    from fedveil.client.trained_update import NonFiniteUpdate

    runtime = ClientRuntime(
        tiny_task.make(RunConfig()),
        trainer=lambda m, g, x, y, hp, lf, gen: LocalResult(torch.zeros(195), 10, 1, loss),
    )
    with pytest.raises(NonFiniteUpdate, match=rf"^loss = {loss!r} after local training in round"):
        runtime.handle(0, request(), {})
