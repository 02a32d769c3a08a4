"""One client's evaluation answer, checked: (examples, accuracy, loss) in range, or a
ValueError naming the field. Torch-free (no Envelope), so the coordinator checks its
drift evaluations' answers without importing torch at start-up; the round engine turns
the ValueError into its MessageError (aggregation.check_evaluate_reply)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from fedveil.protocol.fields import ACCURACY, LOSS, NUM_EXAMPLES

# A client may not claim more examples than this: its weight in the average.
MAX_EXAMPLES = 10_000_000


def check_evaluation_answer(config: Mapping[str, Any]) -> tuple[int, float, float]:
    """(count, accuracy, loss) of one client's evaluation reply; ValueError naming the
    field, its value and the range, for anything out of range, NaN or missing. Federated
    evaluation (rounds.py) and drift evaluation (server/coordinator/drift_run.py) check
    replies with it."""
    n = config.get(NUM_EXAMPLES)
    if not (isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= MAX_EXAMPLES):
        raise ValueError(f"{NUM_EXAMPLES} = {n!r}: must be an integer in [1, {MAX_EXAMPLES}]")
    try:
        accuracy, loss = float(config[ACCURACY]), float(config[LOSS])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"accuracy/loss missing or not numbers ({exc!r})") from None
    if not 0.0 <= accuracy <= 1.0:  # NaN fails too
        raise ValueError(f"{ACCURACY} = {accuracy!r}: must be in [0, 1]")
    if not 0.0 <= loss < math.inf:
        raise ValueError(f"{LOSS} = {loss!r}: must be finite and >= 0")
    return n, accuracy, loss
