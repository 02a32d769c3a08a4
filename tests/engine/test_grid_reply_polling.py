"""How often the server pulls a Flower Grid for replies (server/engine/grid_replies.py).

Soon after a pull that brought a reply (more are on the way: the exchange's last reply
is taken within MIN_POLL_S instead of up to POLL_S later), backing off to Flower's own
interval when pulls bring nothing. The Grid here is a scripted stand-in for Flower's
(push returns ids, each pull hands over what the script says has arrived); the real
Grid's exchanges are covered by the Flower tests and benchmarked by `fedveil bench secagg`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from types import SimpleNamespace
from typing import Any

from fedveil.server.engine.grid_replies import (
    MIN_POLL_S,
    POLL_S,
    next_poll_s,
    replies_as_they_arrive,
)


def test_the_wait_is_short_after_a_reply_and_backs_off_to_flowers_interval() -> None:
    assert MIN_POLL_S <= POLL_S / 10
    assert next_poll_s(POLL_S, brought_replies=True) == MIN_POLL_S
    waits, interval = [], MIN_POLL_S
    for _ in range(8):
        interval = next_poll_s(interval, brought_replies=False)
        waits.append(interval)
    assert waits == sorted(waits) and waits[0] == 2 * MIN_POLL_S and waits[-1] == POLL_S


class ScriptedGrid:
    """Each pull hands over the next batch of replies of the script (one per pull)."""

    def __init__(self, batches: list[int]) -> None:
        self.batches, self.pulls = batches, []

    def push_messages(self, messages: Iterable[Any]) -> list[str]:
        return [str(i) for i, _ in enumerate(messages)]

    def pull_messages(self, message_ids: Iterable[str]) -> list[Any]:
        self.pulls.append(time.monotonic())
        count = self.batches.pop(0) if self.batches else 0
        ids = sorted(message_ids, key=int)[:count]
        return [SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=i)) for i in ids]


def test_replies_arriving_pull_after_pull_are_taken_without_flowers_interval() -> None:
    grid = ScriptedGrid([1] * 6)
    messages = [object()] * 6
    started = time.monotonic()
    replies = list(replies_as_they_arrive(grid, messages, timeout_s=30))  # type: ignore[arg-type]
    assert len(replies) == 6 and len(grid.pulls) == 6
    # Five waits between six pulls that each brought a reply: the old fixed interval
    # slept POLL_S each (0.5 s in all).
    assert time.monotonic() - started < 5 * POLL_S / 2
