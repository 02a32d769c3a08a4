"""Why clients dropped out of a round: each reason named by the check that failed.

A drop reason is free text from wherever the client was lost: the client's own
exception ("RuntimeError: expected target dtype Long ..."), a wrapper around it
from the transport ("client error: ...", "error reply: ..."), a check on the reply
("train message: array 'delta' has 3 values, expected 10"), a deadline, a
simulated dropout. `drop_check` maps each to a short, stable name (no client ids,
no values) so a round's drops can be counted per reason: `drops_by_reason`, the
round's one failure line in the log, and the run summary's `client_errors`.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping

# Wrappers a transport puts around the client's own reason; the check is inside.
_WRAPPERS = (
    "gone since an earlier stage: ",
    "client error: ",
    "error reply: ",
    "bad reply: ",
)

# Checks whose wording is known, by the stable name they are counted under.
_KNOWN: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (name, re.compile(pattern))
    for name, pattern in (
        ("NaN among coordinates", r"NaN among coordinates"),
        ("NaN or Inf in the update", r"contains NaN or Inf"),
        ("wrong shape", r"has \d+ values, expected \d+"),
        ("wrong dtype", r"has dtype \S+, not float32"),
        ("update overflows the sum", r"updates summed\): the sum would overflow$"),
        ("timeout", r"^no reply before the deadline|^simulated straggler"),
        ("no reply", r"^no reply$"),
        ("simulated dropout", r"^simulated dropout"),
        ("not connected", r"^not connected$|^went offline"),
        ("worker process died", r"^worker process \d+ died"),
        ("wrong round", r"^reply is for round \d+"),
        ("dropped during secure aggregation", r"^dropped during secure aggregation$"),
    )
)

# "ValueError: ..." or "torch.OutOfMemoryError: ...": a client-side exception's type.
_EXCEPTION = re.compile(r"^((?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Exit|Interrupt)):")
# "client 7 rejected at masked_input: ..." (secure aggregation) names the client.
_CLIENT_ID = re.compile(r"\bclient \d+")
_CLIENT_PREFIX = re.compile(r"^client \d+: ")
# "<kind> message: <check>" (fedveil.protocol.envelope): the check follows the kind.
_MESSAGE_PREFIX = re.compile(r"^[\w.]+ message: ")
_NUMBER = re.compile(r"\d+(?:\.\d+)?(?:e[+-]?\d+)?")

MAX_CHECK = 80


def drop_check(reason: str) -> str:
    """The short, stable name of the check a drop reason reports.

    Known checks by name ("timeout", "wrong shape", "NaN among coordinates", ...);
    a client's exception as "client error: <ExceptionType>"; otherwise the reason's
    text before its first ':', without client ids, and with numbers as "N"."""
    text = reason.strip()
    stripped = True
    while stripped:
        stripped = False
        for prefix in _WRAPPERS:
            if text.startswith(prefix):
                text, stripped = text[len(prefix) :], True
        if _CLIENT_PREFIX.match(text):
            text, stripped = _CLIENT_PREFIX.sub("", text), True
    for name, pattern in _KNOWN:
        if pattern.search(text):
            return name
    exc = _EXCEPTION.match(text)
    if exc:
        return f"client error: {exc.group(1).rsplit('.', 1)[-1]}"
    text = _MESSAGE_PREFIX.sub("", text)
    head = _CLIENT_ID.sub("client", text).split(":", 1)[0].strip()
    head = _NUMBER.sub("N", head.split(" = ", 1)[0])
    return head[:MAX_CHECK] or "unknown"


def drops_by_reason(dropped: Mapping[int, str]) -> dict[str, int]:
    """{check: how many clients dropped for it}, most frequent first (ties by name)."""
    counts = Counter(drop_check(reason) for reason in dropped.values())
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


MAX_REASON = 160


def _sample(text: str) -> str:
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 3] + "..."


def failure_summary(dropped: Mapping[int, str], *, counts: bool) -> str:
    """The distinct reasons of a round's drops, one example text per check, in client-id
    order of first appearance: "20 x RuntimeError: expected ..." with `counts`; without
    (a DP run's log: counts reveal participation) the texts alone, client ids removed."""
    first: dict[str, str] = {}
    for cid in sorted(dropped):
        first.setdefault(drop_check(dropped[cid]), dropped[cid])
    tally = drops_by_reason(dropped)
    parts = []
    for check in sorted(first, key=lambda c: (-tally[c], c)):
        if counts:
            parts.append(f"{tally[check]} x {_sample(first[check])}")
        else:
            parts.append(_sample(_CLIENT_ID.sub("client", first[check])))
    return "; ".join(parts)
