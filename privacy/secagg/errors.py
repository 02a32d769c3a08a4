"""Exception types of the secure-aggregation protocol.

Every failure a peer can provoke is a `SecAggError`; transports can catch that one type.
"""

from __future__ import annotations


class SecAggError(Exception):
    """Base class of every secure-aggregation error."""


class SecAggProtocolError(SecAggError, ValueError):
    """A message or call violates the protocol: bad field, wrong stage, failed check.

    The text names the offending field (or client) and the check that failed.
    """


class SecAggStateError(SecAggProtocolError):
    """A party method was called out of order (wrong stage, already finished, aborted)."""


class SecAggAborted(SecAggError):
    """The round cannot complete safely; nothing about any input has been released."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
