"""The one check of a number a client or a device reads from a request.

A request comes from the coordinator, and a guarantee against the coordinator cannot
trust its numbers: a NaN fails every comparison, so a check written `x < floor`
lets it through. `request_number` and `request_int` read one field of a request's
config and return it only if it is a real number (not a bool, not a string), finite,
and within the stated limits; anything else (missing without a default, NaN,
infinity, the wrong type, out of range) raises a MessageError naming the field, the
value and the limit. Every limit is tested as `not (value >= limit)`, so a value that
is not a number fails it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from .envelope import MessageError

_REQUIRED = object()


def _limits(
    at_least: float | None, above: float | None, at_most: float | None, integer: bool
) -> str:
    """The limits in words, as the refusal states them."""
    kind = "an integer" if integer else "a finite number"
    parts = []
    if above is not None:
        parts.append(f"> {above:g}")
    if at_least is not None:
        parts.append(f">= {at_least:g}")
    if at_most is not None:
        parts.append(f"<= {at_most:g}")
    return " ".join([kind, " and ".join(parts)]) if parts else kind


def request_number(
    config: Mapping[str, object],
    field: str,
    *,
    at_least: float | None = None,
    above: float | None = None,
    at_most: float | None = None,
    default: float | object = _REQUIRED,
    where: str = "request",
) -> float:
    """`config[field]` as a float: a finite int or float within the limits.

    `default`: the value when the field is absent (absent and no default: refused). A
    present field is always checked, whatever the default."""
    if field not in config:
        if default is _REQUIRED:
            limits = _limits(at_least, above, at_most, False)
            raise MessageError(f"{where}: field {field!r} is missing; it must be {limits}")
        return float(default)  # type: ignore[arg-type]
    return _checked(config[field], field, at_least, above, at_most, False, where)


def request_int(
    config: Mapping[str, object],
    field: str,
    *,
    at_least: int | None = None,
    at_most: int | None = None,
    default: int | object = _REQUIRED,
    where: str = "request",
) -> int:
    """`config[field]` as an int within the limits (a float, even 3.0, is refused)."""
    if field not in config:
        if default is _REQUIRED:
            limits = _limits(at_least, None, at_most, True)
            raise MessageError(f"{where}: field {field!r} is missing; it must be {limits}")
        return int(default)  # type: ignore[call-overload]
    return int(_checked(config[field], field, at_least, None, at_most, True, where))


def _checked(
    value: object,
    field: str,
    at_least: float | None,
    above: float | None,
    at_most: float | None,
    integer: bool,
    where: str,
) -> float | int:
    limits = _limits(at_least, above, at_most, integer)
    kinds: tuple[type, ...] = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise MessageError(
            f"{where}: field {field!r} = {value!r} ({type(value).__name__}); it must be {limits}"
        )
    number = value if integer else float(value)  # type: ignore[arg-type]
    # Each test is written so that NaN fails it: NaN >= x, NaN > x and NaN <= x are False.
    ok = (
        (integer or math.isfinite(number))
        and (at_least is None or number >= at_least)
        and (above is None or number > above)
        and (at_most is None or number <= at_most)
    )
    if not ok:
        raise MessageError(f"{where}: field {field!r} = {value!r}; it must be {limits}")
    return number
