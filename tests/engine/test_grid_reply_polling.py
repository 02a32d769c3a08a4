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


def test_the_wait_shrinks_with_the_replies_pending_and_backs_off_when_none_come() -> None:
    assert MIN_POLL_S <= POLL_S / 10
    # After replies: Flower's interval scaled by the share still pending (ids asked for
    # per second stay at most Flower's own), never below MIN_POLL_S.
    assert next_poll_s(POLL_S, True, pending=100, pushed=100) == POLL_S
    assert next_poll_s(POLL_S, True, pending=50, pushed=100) == POLL_S / 2
    assert next_poll_s(POLL_S, True, pending=1, pushed=100) == MIN_POLL_S
    waits, interval = [], MIN_POLL_S
    for _ in range(8):
        interval = next_poll_s(interval, False, pending=1, pushed=100)
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


def test_the_last_replies_of_an_exchange_are_taken_without_flowers_interval() -> None:
    grid = ScriptedGrid([90] + [1] * 10)
    messages = [object()] * 100
    started = time.monotonic()
    replies = list(replies_as_they_arrive(grid, messages, timeout_s=30))  # type: ignore[arg-type]
    assert len(replies) == 100 and len(grid.pulls) == 11
    # 90 replies at the first pull, then the last 10 one pull at a time: ten waits of
    # 5-10 ms (POLL_S x the share pending), about 0.1 s. The old fixed interval slept
    # POLL_S ten times: never under 1.0 s, since a sleep never ends early. The bound sits
    # just below that, so that a loaded machine's late wake-ups do not fail the test.
    assert 10 * POLL_S >= 1.0
    assert time.monotonic() - started < 0.9
