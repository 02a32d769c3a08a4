"""Replies from a Flower Grid as they arrive, for `Transport.exchange(on_reply=...)`.

Flower's `Grid.send_and_receive` pushes the messages and pulls until every reply came
or the deadline passed, then returns them all: a consumer holds the whole exchange's
replies at once. `replies_as_they_arrive` does the same push and pull loop but yields
each pulled reply at once, so a secure-aggregation server can fold a masked input into
its running sum and let it go before the next one arrives.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

from flwr.app import Message
from flwr.server import Grid

# Between pulls while replies are outstanding. After a pull that brought replies, more
# are on their way: the next pull comes after POLL_S x (the share still pending), at
# least MIN_POLL_S, so the exchange's last replies are taken within a few ms of their
# arrival instead of up to POLL_S later (a secure round has one exchange more than a
# plain one), while the message ids asked for per second never exceed what Flower's own
# loop (POLL_S, every id) asks at the start: each pull names every pending id, a remote
# SuperLink's cost. After an empty pull the wait doubles, up to POLL_S.
MIN_POLL_S = 0.005
POLL_S = 0.1  # Flower's in-memory Grid's own interval


def next_poll_s(interval_s: float, brought_replies: bool, pending: int, pushed: int) -> float:
    """The wait before the next pull, after one that did or did not bring replies, with
    `pending` of the `pushed` messages still unanswered."""
    if brought_replies:
        return max(MIN_POLL_S, POLL_S * pending / max(pushed, 1))
    return min(POLL_S, 2 * interval_s)


def replies_as_they_arrive(
    grid: Grid, messages: Sequence[Message], timeout_s: float | None
) -> Iterator[Message]:
    """Push `messages`, then yield each reply as a pull brings it, until every pushed
    message has its reply or `timeout_s` passed (None: no deadline). A message the Grid
    could not push (empty id) gets no reply."""
    pending = {msg_id for msg_id in grid.push_messages(messages) if msg_id}
    pushed = len(pending)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    interval = MIN_POLL_S
    while pending:
        brought = False
        for reply in grid.pull_messages(list(pending)):
            pending.discard(reply.metadata.reply_to_message_id)
            brought = True
            yield reply
        if not pending or (deadline is not None and time.monotonic() >= deadline):
            return
        interval = next_poll_s(interval, brought, len(pending), pushed)
        time.sleep(
            interval if deadline is None else max(0.0, min(interval, deadline - time.monotonic()))
        )
