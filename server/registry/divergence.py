"""Whether a run's model learned anything. A model whose central evaluation is at chance
level or not finite (a diverged or DP-swamped run) is registered with a warning: the
coordinator keeps it in the run's record (the dashboard marks the run diverged), and
`fedveil models register` prints it."""

from __future__ import annotations

import math
from typing import Any

# Within this factor of 1 / num_classes counts as chance: a model that learned a little
# is above it on every built-in task after a round (fashion-mnist 0.1 -> ~0.6).
CHANCE_MARGIN = 1.2


def divergence(card: dict[str, Any]) -> str | None:
    """Why the card's model is diverged, or None when it is not (or nothing says)."""
    evaluation = card.get("central_evaluation") or {}
    accuracy, loss = evaluation.get("test_accuracy"), evaluation.get("test_loss")
    if loss is not None and not math.isfinite(float(loss)):
        return f"its test loss is {loss}"
    classes = card.get("num_classes")
    if accuracy is None or not classes or int(classes) < 2:
        return None
    chance = 1.0 / int(classes)
    if not (float(accuracy) > CHANCE_MARGIN * chance):  # NaN counts as diverged
        return (
            f"its test accuracy {float(accuracy):.4f} is at chance level (1/{int(classes)} = "
            f"{chance:.4f}; at most {CHANCE_MARGIN:g}x that counts as chance)"
        )
    return None
