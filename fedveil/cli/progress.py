"""A per-round progress bar with loss and accuracy (stderr, so --json stdout stays clean).

On a terminal it redraws one line; when stderr is not a terminal (a log file, a pipe,
CI) it writes one plain line per round instead, with no carriage returns."""

from __future__ import annotations

import sys
import time
from typing import Any

from tqdm import tqdm


class RoundProgress:
    def __init__(self, rounds: int, *, disable: bool = False) -> None:
        self.rounds = rounds
        self.lines = not disable and not sys.stderr.isatty()  # a log: plain lines
        self.bar = tqdm(
            total=rounds,
            unit="round",
            file=sys.stderr,
            disable=disable or self.lines,
            dynamic_ncols=True,
        )
        self.post: dict[str, str] = {}
        self._shown = 0.0

    def clients(self, done: int, total: int) -> None:
        """Clients finished in the current exchange (redrawn at most 5 times a second)."""
        now = time.monotonic()
        if self.lines or (done < total and now - self._shown < 0.2):
            return
        self._shown = now
        self.post["clients"] = f"{done}/{total}"
        self.bar.set_postfix(self.post, refresh=True)

    def update(self, record: Any) -> None:
        post: dict[str, str] = {}
        dp = "epsilon" in record.extra
        # Under DP, client losses and drop counts are not published: the bar shows the
        # server's own evaluation and the epsilon spent.
        if record.train_loss is not None and not dp:
            post["train_loss"] = f"{record.train_loss:.3f}"
        if record.test_accuracy is not None:
            post["test_acc"] = f"{record.test_accuracy:.4f}"
        if record.dropped and not dp:
            post["dropped"] = str(record.dropped)
        if dp:
            post["epsilon"] = f"{record.extra['epsilon']:.3g}"
        self.post = post
        if self.lines:
            shown = " ".join(f"{k} {v}" for k, v in post.items())
            print(f"round {record.round}/{self.rounds} {shown}".rstrip(), file=sys.stderr)
            return
        self.bar.set_postfix(post, refresh=False)
        self.bar.n = record.round
        self.bar.refresh()

    def close(self) -> None:
        self.bar.close()
