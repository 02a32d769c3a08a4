"""The one field validator: every setting is a dataclass field declared with `spec(...)`.

Run configs, the service's `server.toml` and a run's `[deploy]` table are all
tables of such fields, read by `build`. An error names the field, the value
and the limit: `server.rounds = 0: must be >= 1`.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Mapping
from dataclasses import field
from typing import Any, TypeVar

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration value is missing, of the wrong type or out of range."""


def spec(
    default: Any,
    *,
    lo: float | None = None,
    hi: float | None = None,
    lo_open: bool = False,
    choices: tuple[Any, ...] | None = None,
    optional: bool = False,
    help: str = "",
) -> Any:
    """A dataclass field with its limits attached as metadata.

    The field's kind (bool, int, float, str or list of str) is the default's type;
    a None default means an optional string.
    """
    meta = {
        "kind": str if default is None else type(default),
        "lo": lo,
        "hi": hi,
        "lo_open": lo_open,
        "choices": choices,
        "optional": optional or default is None,
        "help": help,
    }
    if isinstance(default, list):
        items = list(default)
        return field(default_factory=lambda: list(items), metadata=meta)
    return field(default=default, metadata=meta)


def _kind(f: dataclasses.Field) -> type:
    kind = f.metadata.get("kind")
    if kind is not None:
        return kind
    return type(f.default) if f.default not in (None, dataclasses.MISSING) else str


def coerce(name: str, f: dataclasses.Field, value: Any, *, strict: bool = False) -> Any:
    """Convert a TOML/JSON/CLI value to the field's type, or say why it cannot be.

    `strict`: the value comes from a file and is taken as typed (no "80" for 80);
    otherwise strings are parsed, as command-line overrides arrive as strings.
    """
    if value is None:
        if f.metadata.get("optional"):
            return None
        raise ConfigError(f"{name}: a value is required")
    kind = _kind(f)
    if kind is bool:
        if not strict and isinstance(value, str) and value.lower() in ("true", "false", "1", "0"):
            return value.lower() in ("true", "1")
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{name} = {value!r}: must be true or false")
    if kind is int:
        return _integer(name, value, strict)
    if kind is float:
        if isinstance(value, bool) or (strict and not isinstance(value, (int, float))):
            raise ConfigError(f"{name} = {value!r}: must be a number")
        try:
            value = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{name} = {value!r}: must be a number") from None
        if not math.isfinite(value):
            raise ConfigError(f"{name} = {value!r}: must be a finite number")
        return value
    if kind is list:
        if not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            raise ConfigError(f"{name} = {value!r}: must be a list of strings")
        return list(value)
    if not isinstance(value, str):
        raise ConfigError(f"{name} = {value!r}: must be a string")
    return value


def _integer(name: str, value: Any, strict: bool) -> int:
    if isinstance(value, bool):
        raise ConfigError(f"{name} = {value!r}: must be an integer")
    if strict and not isinstance(value, int):
        raise ConfigError(f"{name} = {value!r}: must be an integer")
    if isinstance(value, str):
        try:
            value = int(value, 0)
        except ValueError:
            raise ConfigError(f"{name} = {value!r}: must be an integer") from None
    if isinstance(value, float):
        if not value.is_integer():
            raise ConfigError(f"{name} = {value!r}: must be an integer")
        value = int(value)
    if not isinstance(value, int):
        raise ConfigError(f"{name} = {value!r}: must be an integer")
    return value


def check_range(name: str, f: dataclasses.Field, value: Any) -> None:
    """The field's choices and limits (`lo`, `hi`, `lo_open`)."""
    meta = f.metadata
    if value is None:
        return
    choices = meta.get("choices")
    if choices is not None and value not in choices:
        raise ConfigError(f"{name} = {value!r}: must be one of {', '.join(map(str, choices))}")
    lo, hi = meta.get("lo"), meta.get("hi")
    if lo is not None:
        if meta.get("lo_open") and not value > lo:
            raise ConfigError(f"{name} = {value!r}: must be > {lo}")
        if not meta.get("lo_open") and not value >= lo:
            raise ConfigError(f"{name} = {value!r}: must be >= {lo}")
    if hi is not None and not value <= hi:
        raise ConfigError(f"{name} = {value!r}: must be <= {hi}")


def build(
    cls: type[T],
    values: Mapping[str, Any],
    *,
    prefix: str = "",
    sections: Mapping[str, type] | None = None,
    top: str = "the top level",
    strict: bool = False,
) -> T:
    """`cls` from a table of values: unknown keys refused, each value typed and checked.

    `sections`: the fields of `cls` that are tables ([name] in TOML), built the same way.
    `prefix`: how this table's keys are named in errors ('deploy.' for [deploy]).
    `top`: what the table is called in errors when it has no prefix.
    """
    known = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(values) - set(known))
    if unknown:
        where = f"[{prefix.rstrip('.')}]" if prefix else top
        # A typo is the usual cause: name the nearest key before the whole list.
        near = difflib.get_close_matches(unknown[0], known, n=1)
        hint = f"did you mean {prefix}{near[0]}? " if near else ""
        raise ConfigError(
            f"unknown key {prefix}{unknown[0]} in {where}; {hint}known keys: "
            + ", ".join(sorted(known))
        )
    kwargs: dict[str, Any] = {}
    for name, f in known.items():
        if sections is not None and name in sections:
            section = values.get(name, {})
            if not isinstance(section, dict):
                raise ConfigError(f"[{prefix}{name}] must be a table, got {section!r}")
            kwargs[name] = build(sections[name], section, prefix=f"{prefix}{name}.", strict=strict)
        elif name in values:
            value = coerce(prefix + name, f, values[name], strict=strict)
            check_range(prefix + name, f, value)
            kwargs[name] = value
    return cls(**kwargs)


def help_of(cls: type, sections: Mapping[str, type] | None = None) -> dict[str, str]:
    """'section.key' -> help text of every field of `cls`."""
    out: dict[str, str] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if sections is not None and f.name in sections:
            for g in dataclasses.fields(sections[f.name]):
                out[f"{f.name}.{g.name}"] = g.metadata.get("help", "")
        else:
            out[f.name] = f.metadata.get("help", "")
    return out
