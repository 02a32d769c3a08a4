"""Names on the wire, each defined once: message kinds, secure-aggregation stages,
error codes.

The members are `str` (or `int`) Enums whose values are the wire values, so they
compare, hash and serialise as their values; `str()` and f-strings give the value
too (a plain `(str, Enum)` would print `Kind.TRAIN` on Python 3.11+). Python 3.10
is supported, hence no `enum.StrEnum`.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum, IntEnum

from fedveil.protocol.fields import is_evaluation_input


class WireName(str, Enum):
    """A str Enum that prints as its value."""

    def __str__(self) -> str:
        return str.__str__(self)

    def __format__(self, spec: str) -> str:
        return str.__format__(str.__str__(self), spec)


class Stage(WireName):
    """The stages of one secure-aggregation session, in protocol order."""

    ADVERTISE = "advertise"
    SHARE_KEYS = "share_keys"
    MASKED_INPUT = "masked_input"
    CONSISTENCY = "consistency"
    UNMASK = "unmask"


SECAGG = "secagg."  # prefix of the secure-aggregation kinds: "secagg.<stage>"


class Kind(WireName):
    """Every message kind a client answers (the Envelope's `kind`)."""

    HELLO = "hello"
    TRAIN = "train"
    EVALUATE = "evaluate"
    SECAGG_ADVERTISE = SECAGG + Stage.ADVERTISE.value
    SECAGG_SHARE_KEYS = SECAGG + Stage.SHARE_KEYS.value
    SECAGG_MASKED_INPUT = SECAGG + Stage.MASKED_INPUT.value
    SECAGG_CONSISTENCY = SECAGG + Stage.CONSISTENCY.value
    SECAGG_UNMASK = SECAGG + Stage.UNMASK.value

    @classmethod
    def secagg(cls, stage: Stage | str) -> Kind:
        """The kind of a secure-aggregation stage's messages."""
        return cls(SECAGG + Stage(stage).value)


def stage_of(kind: str) -> Stage | None:
    """The secure-aggregation stage a kind names, or None for other kinds (a
    "secagg." kind naming no stage is None too: the caller refuses it)."""
    if not kind.startswith(SECAGG):
        return None
    try:
        return Stage(kind[len(SECAGG) :])
    except ValueError:
        return None


# The stage whose request is also a training request (the update rides masked on it).
TRAINING_STAGE = Stage.MASKED_INPUT
# The kinds whose request makes a client train (a masked input may be an evaluation: `trains`).
TRAINING_KINDS = (Kind.TRAIN, Kind.SECAGG_MASKED_INPUT)


def trains(kind: str, config: Mapping[str, object]) -> bool:
    """Whether a request of `kind` with `config` makes the client train: a train request, or
    a masked-input stage whose input is an update, not an evaluation (fields.INPUT)."""
    return kind in TRAINING_KINDS and not is_evaluation_input(config)


SECAGG_KINDS = tuple(Kind.secagg(stage) for stage in Stage)
# The kinds whose answer computes nothing on the client's data (keys, shares, signatures):
# a message's round trip, not a training's (the availability model's message latency).
MESSAGE_KINDS = tuple(k for k in SECAGG_KINDS if k not in TRAINING_KINDS)


class ErrorCode(IntEnum):
    """Codes of a client's error replies (Flower `Error.code`)."""

    BAD_MESSAGE = 4001  # the request was malformed or against local policy
    CLIENT_FAILURE = 4002  # the client failed while answering a valid request
