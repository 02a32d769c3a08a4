"""The model of a chosen round of a run, as safetensors bytes.

A run keeps its final model (model.safetensors, whose metadata names its round) and the
checkpoint of its last completed round (checkpoint/state.pt, operator-only): those are
the rounds whose model can be registered. Nothing else is kept, so any other round is
refused with what the run does hold.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fedveil.server.registry.store import MODEL_FILE, RegistryError

CHECKPOINT = Path("checkpoint") / "state.pt"


def model_metadata(path: Path) -> dict[str, str]:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return dict(f.metadata() or {})


def model_round(meta: dict[str, str], path: Path) -> int:
    try:
        return int(meta["round"])
    except (KeyError, ValueError):
        raise RegistryError(f"{path}: metadata lacks an integer 'round'") from None


def round_model(run_dir: Path, round_num: int | None) -> tuple[bytes, dict[str, str], int]:
    """(safetensors bytes, metadata, round) of the run's model of `round_num` (None: the
    final model)."""
    final = run_dir / MODEL_FILE
    if not final.is_file():
        raise RegistryError(
            f"{run_dir}: no {MODEL_FILE}; a run writes it when it finishes or is stopped"
        )
    meta = model_metadata(final)
    final_round = model_round(meta, final)
    if round_num is None or round_num == final_round:
        return final.read_bytes(), meta, final_round
    if round_num < 1:
        raise RegistryError(f"round {round_num}: rounds count from 1")
    state = _checkpoint(run_dir)
    kept = sorted({final_round, *([int(state["round"])] if state else [])})
    if state is None or int(state["round"]) != round_num:
        raise RegistryError(
            f"{run_dir}: round {round_num}'s model is not kept; this run holds the models of "
            f"round(s) {', '.join(map(str, kept))} ({MODEL_FILE} and {CHECKPOINT}: fedveil "
            "keeps only the last completed round's checkpoint)"
        )
    return (
        _from_checkpoint(run_dir, state, meta, round_num),
        {**meta, "round": str(round_num)},
        round_num,
    )


def _checkpoint(run_dir: Path) -> dict[str, Any] | None:
    path = run_dir / CHECKPOINT
    if not path.is_file():
        return None
    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except PermissionError as error:
        raise RegistryError(
            f"{path}: {error} (the checkpoint is the operator's, mode 600)"
        ) from None
    if not isinstance(state, dict) or "round" not in state or "weights" not in state:
        raise RegistryError(f"{path}: not a fedveil checkpoint (no 'round' and 'weights')")
    return state


def _from_checkpoint(
    run_dir: Path, state: dict[str, Any], meta: dict[str, str], round_num: int
) -> bytes:
    """The checkpoint's flat weights named as the final model's tensors."""
    from safetensors.torch import save

    from fedveil.flat_model import FlatModel

    flat = FlatModel(_module(run_dir, meta))
    weights = state["weights"].detach().cpu().float()
    if weights.numel() != flat.size:
        raise RegistryError(
            f"{run_dir / CHECKPOINT}: {weights.numel()} weights, the model has {flat.size}"
        )
    return save(flat.named_tensors(weights), metadata={**meta, "round": str(round_num)})


def _module(run_dir: Path, meta: dict[str, str]) -> Any:
    """The run's model architecture, rebuilt as model.safetensors' metadata says."""
    shape = tuple(int(v) for v in json.loads(meta["input_shape"]))
    classes = int(meta["num_classes"])
    if "model" in meta:
        from fedveil.builtin_models import build_model

        return build_model(meta["model"], shape, classes)
    from fedveil.config import load_config
    from fedveil.tasks import make_task

    return make_task(load_config(str(run_dir / "config.toml"))).model_fn()
