"""SessionView: what one client learns of a semi-honest session, and nothing more.

A semi-honest client needs only its own neighbourhood: its neighbours' ids, their Shamir
x-coordinates (and its own), the session parameters and the session digest, which salts
every derived key, so pairwise keys still bind the one full session. It never receives the
cohort list, so a cohort member (or a client that holds the next round's view early, under
pipelining) learns no client id outside its neighbourhood. Survivor information reaches it
as the survivor count plus one bit per neighbourhood member (UnmaskRequest).

In malicious mode clients keep the full `SessionConfig`: they check the neighbour graph
and co-sign the survivor set, which the consistency round shows them.
"""

from __future__ import annotations

import itertools
import operator
import struct
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from .errors import SecAggProtocolError
from .params import ThreatMode
from .session import (
    _FIELDS,
    MAX_BITS,
    MAX_DIMENSION,
    MAX_ROUND,
    PROTOCOL,
    RUN_ID_MAX,
    RUN_ID_MIN,
    SESSION_ID_MAX,
    SESSION_ID_MIN,
    SessionConfig,
    check_binding,
    modulus_dtype,
)
from .wire import Arrays, Bytes, Config, Int, Vector, fail

DIGEST_BYTES = 32
_MAGIC = b"fvsv3"
# session-id length, run-id length, bits, dimension, k, t, threat mode, round, holder, members
_HEADER = ">BBIIIIBQQI"
_VIEW_FIELDS = {
    **{name: spec for name, spec in _FIELDS.items() if name != "graph_seed"},
    "digest": Bytes(DIGEST_BYTES, DIGEST_BYTES),
    "holder": Int(),
}
VIEW_ARRAYS = frozenset({"neighbourhood_ids", "neighbourhood_xs"})


@dataclass(frozen=True, eq=False)
class SessionView:
    """One client's (`holder`'s) view of a session: the parameters, the full session's
    digest, and its neighbourhood (itself and its neighbours, sorted) with their x."""

    session_id: bytes
    run_id: bytes
    round: int
    modulus_bits: int
    dimension: int
    neighbors: int
    threshold: int
    threat_mode: ThreatMode
    digest: bytes
    holder: int
    neighbourhood_ids: tuple[int, ...]
    neighbourhood_xs: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "threat_mode", ThreatMode(self.threat_mode))
        object.__setattr__(self, "neighbourhood_ids", tuple(map(int, self.neighbourhood_ids)))
        object.__setattr__(self, "neighbourhood_xs", tuple(map(int, self.neighbourhood_xs)))
        ids, xs = self.neighbourhood_ids, self.neighbourhood_xs
        if not SESSION_ID_MIN <= len(self.session_id) <= SESSION_ID_MAX:
            raise ValueError(f"session_id must be {SESSION_ID_MIN}..{SESSION_ID_MAX} bytes")
        if not RUN_ID_MIN <= len(self.run_id) <= RUN_ID_MAX:
            raise ValueError(f"run_id must be {RUN_ID_MIN}..{RUN_ID_MAX} bytes")
        if not 0 <= self.round <= MAX_ROUND:
            raise ValueError(f"round must be in [0, {MAX_ROUND}], got {self.round}")
        if not 1 <= self.modulus_bits <= MAX_BITS:
            raise ValueError(f"modulus_bits must be in [1, {MAX_BITS}], got {self.modulus_bits}")
        if not 1 <= self.dimension <= MAX_DIMENSION:
            raise ValueError(f"dimension must be in [1, {MAX_DIMENSION}], got {self.dimension}")
        if not 2 <= self.threshold <= self.neighbors:
            raise ValueError(f"threshold must be in [2, neighbors={self.neighbors}]")
        if self.threat_mode is not ThreatMode.SEMI_HONEST:
            raise ValueError("a per-client view is for semi-honest sessions only")
        if len(self.digest) != DIGEST_BYTES:
            raise ValueError(f"digest must be {DIGEST_BYTES} bytes")
        if len(ids) != len(xs):
            raise ValueError(f"{len(ids)} neighbourhood ids but {len(xs)} x-coordinates")
        if not 2 <= len(ids) <= self.neighbors + 1:
            raise ValueError(f"neighbourhood of {len(ids)}: must be 2..neighbors + 1")
        # map/all in C: a view is built for every request and every restore of a session
        if not all(map(operator.lt, ids, itertools.islice(ids, 1, None))) or ids[0] < 0:
            raise ValueError("neighbourhood ids must be sorted, unique and >= 0")
        if ids[-1] >= 2**64 or self.holder not in ids:
            raise ValueError("the holder must be in its neighbourhood, ids < 2^64")
        if len(set(xs)) != len(xs) or min(xs) < 1 or max(xs) > 2**32:
            raise ValueError("x-coordinates must be unique and in [1, 2^32]")

    @classmethod
    def of(cls, session: SessionConfig, holder: int, neighbours: frozenset[int]) -> SessionView:
        """`holder`'s view of `session`, given its neighbours in the session's graph."""
        ids = sorted({holder, *neighbours})
        return cls(
            session_id=session.session_id,
            run_id=session.run_id,
            round=session.round,
            modulus_bits=session.modulus_bits,
            dimension=session.dimension,
            neighbors=session.neighbors,
            threshold=session.threshold,
            threat_mode=session.threat_mode,
            digest=session.digest,
            holder=holder,
            neighbourhood_ids=tuple(ids),
            neighbourhood_xs=tuple(session.share_xs(ids)),
        )

    # The parts of SessionConfig's interface a client uses.
    malicious = False

    @property
    def dtype(self) -> type[np.unsignedinteger]:
        return modulus_dtype(self.modulus_bits)

    @property
    def modulus_mask(self) -> int:
        return (1 << self.modulus_bits) - 1

    @cached_property
    def ids_array(self) -> np.ndarray:
        """The neighbourhood, sorted: the order of the survivor bits a client receives."""
        return np.array(self.neighbourhood_ids, dtype=np.uint64)

    @cached_property
    def _x_of(self) -> dict[int, int]:
        return dict(zip(self.neighbourhood_ids, self.neighbourhood_xs, strict=True))

    def contains(self, client_id: int) -> bool:
        return client_id in self._x_of

    def share_xs(self, client_ids: list[int]) -> list[int]:
        try:
            return [self._x_of[c] for c in client_ids]
        except KeyError as exc:
            raise KeyError(f"client {exc.args[0]} is not in this neighbourhood") from None

    def neighbours_of(self, client_id: int) -> frozenset[int]:
        if client_id != self.holder:
            raise KeyError(f"this view is client {self.holder}'s, not client {client_id}'s")
        return frozenset(self.neighbourhood_ids) - {self.holder}

    def check_binding(self, run_id: bytes, round_num: int, path: str = "session") -> None:
        check_binding(self.run_id, self.round, run_id, round_num, path)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SessionView) and other.to_bytes() == self.to_bytes()

    def __hash__(self) -> int:
        return hash(self.to_bytes())

    # Encodings.
    def to_bytes(self) -> bytes:
        header = struct.pack(
            _HEADER,
            len(self.session_id),
            len(self.run_id),
            self.modulus_bits,
            self.dimension,
            self.neighbors,
            self.threshold,
            list(ThreatMode).index(self.threat_mode),
            self.round,
            self.holder,
            len(self.neighbourhood_ids),
        )
        ids = np.array(self.neighbourhood_ids, dtype=">u8").tobytes()
        xs = np.array(self.neighbourhood_xs, dtype=">u8").tobytes()
        return b"".join([_MAGIC, header, self.session_id, self.run_id, self.digest, ids, xs])

    @classmethod
    def from_bytes(cls, raw: bytes) -> SessionView:
        try:
            if not raw.startswith(_MAGIC):
                raise ValueError("bad magic")
            offset = len(_MAGIC)
            sid_len, run_len, bits, dim, k, t, mode, round_num, holder, m = struct.unpack_from(
                _HEADER, raw, offset
            )
            offset += struct.calcsize(_HEADER)
            parts = []
            for size in (sid_len, run_len, DIGEST_BYTES):
                parts.append(raw[offset : offset + size])
                offset += size
            ids = np.frombuffer(raw, dtype=">u8", count=m, offset=offset)
            xs = np.frombuffer(raw, dtype=">u8", count=m, offset=offset + 8 * m)
            if offset + 16 * m != len(raw):
                raise ValueError("trailing or missing bytes")
            return cls(
                parts[0],
                parts[1],
                round_num,
                bits,
                dim,
                k,
                t,
                list(ThreatMode)[mode],
                parts[2],
                holder,
                tuple(ids.tolist()),
                tuple(xs.tolist()),
            )
        except (ValueError, IndexError, struct.error) as exc:
            raise SecAggProtocolError(f"session view: cannot decode ({exc})") from None

    def to_wire(self) -> tuple[Config, Arrays]:
        config: Config = {n: spec.encode(getattr(self, n)) for n, spec in _VIEW_FIELDS.items()}
        config["protocol"] = PROTOCOL
        arrays = {
            "neighbourhood_ids": np.array(self.neighbourhood_ids, dtype=np.uint64),
            "neighbourhood_xs": np.array(self.neighbourhood_xs, dtype=np.uint64),
        }
        return config, arrays

    @classmethod
    def from_wire(cls, config: Config, arrays: Arrays, path: str = "session") -> SessionView:
        protocol = config.get("protocol")
        if type(protocol) is not str or protocol != PROTOCOL:
            shown = "missing" if protocol is None else repr(str(protocol)[:40])
            raise fail(f"{path}.protocol", f"{shown}; this party speaks {PROTOCOL!r}")
        values = {}
        for name, spec in _VIEW_FIELDS.items():
            if name not in config:
                raise fail(f"{path}.{name}", "missing")
            values[name] = spec.decode(f"{path}.{name}", config[name])
        for name in sorted(VIEW_ARRAYS):
            if name not in arrays:
                raise fail(f"{path}.{name}", "missing")
            values[name] = tuple(
                Vector(("uint64",)).decode(f"{path}.{name}", arrays[name]).tolist()
            )
        try:
            return cls(**values)
        except ValueError as exc:
            raise fail(path, str(exc)) from None


def session_from_bytes(raw: bytes) -> SessionConfig | SessionView:
    """A stored session: the full config or a client's view (by its magic)."""
    if isinstance(raw, bytes) and raw.startswith(_MAGIC):
        return SessionView.from_bytes(raw)
    return SessionConfig.from_bytes(raw)
