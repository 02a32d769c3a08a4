"""Flower's SuperNode, with its replies sent when they are ready instead of one pull late.

flwr 1.41's SuperNode loop pulls one message from the coordinator, then blocks
until *some* reply is in its state and sends the replies there at that moment.
A reply the loop did not wait for takes the place of the next message's reply.
That happens when the coordinator dies while a device downloads a message: the
SuperNode gives the message up (the run is no longer running on the restarted
SuperLink) after the worker already has it and answers it. From then on every
reply of that device leaves one pull late, so the coordinator waits for a reply
that only its own next message would release, and a round without a deadline
waits forever (seen in CI: a run resumed after a coordinator crash never finished).

`main` runs Flower's SuperNode with two changes to that loop:
- after pulling a message it waits for the reply to *that* message (still one
  message at a time), and sends it with any other reply that is waiting;
- when nothing was pulled but a reply is waiting, it sends the reply at once;
- a message whose run stopped while it was being pulled is removed from its
  state, so the worker offered it gives it up at once (forget_given_up).
Everything else (connection, authentication, retries, the Runtime API) is Flower's,
except that the Runtime API's port is reported to the worker (runtime_port.py).
"""

from __future__ import annotations

import importlib
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

POLL_S = 0.05  # how often the loop looks for the reply it waits for (Flower: 0.5 s)
NOTHING_PULLED_BUT_REPLIES = 0  # the loop only asks whether the pull returned None


class Outbox:
    """Replies taken out of the SuperNode's state and not yet sent.

    Taking replies from the state marks them retrieved, so a reply looked at
    while waiting is kept here until the push step sends it.
    """

    def __init__(self) -> None:
        self.replies: list[Any] = []
        self.awaited: str | None = None  # the message the next push step waits for

    def collect(self, state: Any) -> None:
        self.replies.extend(state.get_messages_legacy(is_reply=True))

    def answers(self, message_id: str) -> bool:
        return any(r.metadata.reply_to_message_id == message_id for r in self.replies)

    def take(self) -> list[Any]:
        replies, self.replies = self.replies, []
        return replies


class StateWithOutbox:
    """The SuperNode state as Flower's push step sees it: its replies come from the outbox."""

    def __init__(self, state: Any, outbox: Outbox) -> None:
        self._state, self._outbox = state, outbox

    def __getattr__(self, name: str) -> Any:
        return getattr(self._state, name)

    def get_messages_legacy(self, **filters: Any) -> Sequence[Any]:
        if filters != {"is_reply": True}:
            return self._state.get_messages_legacy(**filters)
        self._outbox.collect(self._state)
        return self._outbox.take()


def reply_driven(
    flower_pull: Callable[..., int | None],
    flower_push: Callable[..., None],
    outbox: Outbox,
    poll_s: float = POLL_S,
) -> tuple[Callable[..., int | None], Callable[..., None]]:
    """The loop's pull and push steps, changed as the module doc says."""

    def pull(*, receive: Callable[[], Any], state: Any, **kwargs: Any) -> int | None:
        received: list[str] = []

        def recording_receive() -> Any:
            got = receive()
            if got is not None:
                received.append(got[0].metadata.message_id)
            return got

        run_id = flower_pull(receive=recording_receive, state=state, **kwargs)
        # A message the pull gave up on is not waited for; if the worker answers it
        # anyway, the reply leaves with the next push step (the SuperLink drops it).
        outbox.awaited = received[0] if run_id is not None and received else None
        if run_id is None and received:
            forget_given_up(state, kwargs["object_store"], received[0])
        if run_id is None:
            outbox.collect(state)
            if outbox.replies:
                return NOTHING_PULLED_BUT_REPLIES
        return run_id

    def push(*, state: Any, **kwargs: Any) -> None:
        awaited, outbox.awaited = outbox.awaited, None
        outbox.collect(state)
        while not (outbox.answers(awaited) if awaited is not None else outbox.replies):
            time.sleep(poll_s)
            outbox.collect(state)
        flower_push(state=StateWithOutbox(state, outbox), **kwargs)

    return pull, push


def forget_given_up(state: Any, object_store: Any, message_id: str) -> None:
    """Remove a message the pull gave up on, with its objects, as Flower's own failed
    pull does.

    When the SuperLink answers mid-download that the message's run is no longer
    running (the coordinator was restarted), Flower's loop logs "not in RUNNING status"
    and leaves the message in the state with its objects registered but never filled.
    The worker, offered that message, would wait for them until its stall limit
    (EdgeOptions.task_pull_stall_s); with the message gone, its next object pull is answered
    "not found" and it gives the task up at once. (Idempotent: a pull that failed
    otherwise has already removed both.)
    """
    state.delete_messages(message_ids=[message_id])
    object_store.delete(message_id)


def install() -> bool:
    """Put the reply-driven steps into Flower's SuperNode loop; False if this flwr differs."""
    from flwr.supernode import start_client_internal as loop

    flower_pull = getattr(loop, "_pull_and_store_message", None)
    flower_push = getattr(loop, "_push_messages", None)
    if not callable(flower_pull) or not callable(flower_push):
        return False
    loop._pull_and_store_message, loop._push_messages = reply_driven(  # type: ignore[attr-defined]
        flower_pull, flower_push, Outbox()
    )
    return True


def main() -> int:
    """`flower-supernode` (same arguments), with the reply-driven push step; with
    `--runtime-port-file PATH`, the Runtime API's bound port reported there
    (runtime_port.py)."""
    from fedveil.client.edge import runtime_port

    port_file = runtime_port.take_flag(sys.argv)
    if port_file is not None:
        # The module (the package exports a function of the same name).
        cli = importlib.import_module("flwr.supernode.cli.flower_supernode")
        cli._start_supernode_http_api = runtime_port.reporting(  # type: ignore[attr-defined]
            cli._start_supernode_http_api, port_file
        )
    if not install():
        import flwr

        print(
            f"fedveil: flwr {flwr.__version__} has no SuperNode loop steps to adjust; "
            "running it unchanged (a reply may be sent one pull late after a coordinator "
            "crash)",
            file=sys.stderr,
        )
    from flwr.supernode.cli import flower_supernode

    result = flower_supernode()
    return int(result or 0)
