"""One exchange, two protocol messages: a request with a rider.

Secure aggregation runs the next round's key stages inside this round's
exchanges (fedveil/server/secagg_channel.py), so one Envelope may carry two messages:
the primary, whose kind and round are the Envelope's own (transports, device
policies and the availability model see it as before), and a rider for
another round under RIDER-prefixed fields. The reply carries both answers
the same way. Either half may fail on its own: a client whose training fails
can still take part in the next round's key exchange.
"""

from __future__ import annotations

from collections.abc import Mapping

from fedveil.protocol.envelope import ArrayValue, ConfigValue, Envelope, MessageError

RIDER = "rider."  # prefix of the rider's own fields
RIDER_KIND = "rider:kind"
RIDER_ROUND = "rider:round"
# Reply config keys saying why the primary or the rider failed.
FAILED = "primary:failed"
RIDER_FAILED = "rider:failed"
# Why a rider is missing from a reply that answers its primary: the client does
# not know riders (an older version); the sender should stop using them.
IGNORED = "no answer to the"


def latest_round(round_num: int, config: Mapping[str, object]) -> int:
    """The latest round a message (its primary round and `config`) carries work for."""
    rider = config.get(RIDER_ROUND)
    if isinstance(rider, int) and not isinstance(rider, bool):
        return max(round_num, rider)
    return round_num


def attach(primary: Envelope, rider: Envelope) -> Envelope:
    """`primary` carrying `rider`."""
    config = dict(primary.config)
    arrays = dict(primary.arrays)
    config[RIDER_KIND] = rider.kind
    config[RIDER_ROUND] = rider.round
    config.update({RIDER + k: v for k, v in rider.config.items()})
    arrays.update({RIDER + k: v for k, v in rider.arrays.items()})
    return Envelope(primary.kind, primary.round, config, arrays)


def _split(msg: Envelope) -> tuple[Envelope, Envelope]:
    """Fields of the primary (with the rider's meta keys) and the rider's, unprefixed."""
    own = Envelope(msg.kind, msg.round)
    rest = Envelope("", 0)
    for key, value in msg.config.items():
        if key.startswith(RIDER):
            rest.config[key[len(RIDER) :]] = value
        else:
            own.config[key] = value
    for key, array in msg.arrays.items():
        if key.startswith(RIDER):
            rest.arrays[key[len(RIDER) :]] = array
        else:
            own.arrays[key] = array
    return own, rest


def detach(msg: Envelope) -> tuple[Envelope, Envelope | None]:
    """The primary request and its rider (None when it carries none)."""
    if RIDER_KIND not in msg.config:
        return msg, None
    kind = msg.config[RIDER_KIND]
    round_num = msg.config.get(RIDER_ROUND)
    if not isinstance(kind, str) or not kind:
        raise MessageError(f"{msg.kind} message: field {RIDER_KIND!r} must be a message kind")
    if not isinstance(round_num, int) or isinstance(round_num, bool):
        raise MessageError(f"{msg.kind} message: field {RIDER_ROUND!r} must be an integer")
    primary, rest = _split(msg)
    del primary.config[RIDER_KIND], primary.config[RIDER_ROUND]
    return primary, Envelope(kind, round_num, rest.config, rest.arrays)


def join_replies(primary: Envelope | str, rider: Envelope | str, request: Envelope) -> Envelope:
    """One reply to `request` carrying both answers; a str is why that half failed."""
    config: dict[str, ConfigValue] = {}
    arrays: dict[str, ArrayValue] = {}
    if isinstance(primary, str):
        config[FAILED] = primary
    else:
        config.update(primary.config)
        arrays.update(primary.arrays)
    if isinstance(rider, str):
        config[RIDER_FAILED] = rider
    else:
        config.update({RIDER + k: v for k, v in rider.config.items()})
        arrays.update({RIDER + k: v for k, v in rider.arrays.items()})
    return Envelope(request.kind, request.round, config, arrays)


def split_reply(reply: Envelope, rider: Envelope) -> tuple[Envelope | str, Envelope | str]:
    """Both answers of a reply to a request that carried `rider`; a str says why one is
    missing (a client that does not know riders answers the primary alone)."""
    own, rest = _split(reply)
    primary: Envelope | str = own
    if FAILED in own.config:
        primary = _reason(own.config.pop(FAILED))
    answer: Envelope | str
    if RIDER_FAILED in own.config:
        answer = _reason(own.config.pop(RIDER_FAILED))
    elif not rest.config and not rest.arrays:
        answer = f"{IGNORED} {rider.kind} it carried"
    else:
        answer = Envelope(rider.kind, rider.round, rest.config, rest.arrays)
    return primary, answer


def _reason(value: object) -> str:
    return value if isinstance(value, str) else f"failed (reason of type {type(value).__name__})"
