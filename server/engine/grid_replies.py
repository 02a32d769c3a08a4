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

# Between pulls while replies are outstanding: MIN_POLL_S after a pull that brought a
# reply (more are on their way, and the exchange's last one is taken within MIN_POLL_S
# of its arrival instead of up to POLL_S later), doubling after each empty pull up to
# POLL_S (Flower's in-memory Grid's own interval), so a long wait pulls no more often
# than Flower's own loop. Each exchange saves about half of POLL_S at its end: a secure
# round has one exchange more than a plain one.
MIN_POLL_S = 0.005
POLL_S = 0.1


def next_poll_s(interval_s: float, brought_replies: bool) -> float:
    """The wait before the next pull, after one that did or did not bring a reply."""
    return MIN_POLL_S if brought_replies else min(POLL_S, 2 * interval_s)


def replies_as_they_arrive(
    grid: Grid, messages: Sequence[Message], timeout_s: float | None
) -> Iterator[Message]:
    """Push `messages`, then yield each reply as a pull brings it, until every pushed
    message has its reply or `timeout_s` passed (None: no deadline). A message the Grid
    could not push (empty id) gets no reply."""
    pending = {msg_id for msg_id in grid.push_messages(messages) if msg_id}
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
        interval = next_poll_s(interval, brought)
        time.sleep(
            interval if deadline is None else max(0.0, min(interval, deadline - time.monotonic()))
        )
