"""SessionConfig: everything all parties of one secure-aggregation round must agree on.

The cohort (sorted client ids) is part of the session: together with the graph seed it fixes
the neighbour graph, and share x-coordinates are positions in it. The session digest (SHA-256
of the canonical encoding) salts every derived key and is covered by every signature, so two
parties holding different configs cannot interoperate by accident or by a server's design.

The session also names the run and the round it belongs to (`run_id`, `round`), so both are
inside the digest too. The server picks the random session id, but a client checks the run
id against the run it serves (from its own context, never from a message) and the round
against the round of the envelope carrying the session (`check_binding`): a session replayed
into another round or another run is refused by name.
"""

from __future__ import annotations

import hashlib
import itertools
import operator
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from . import randomness
from .errors import SecAggProtocolError
from .graph import NeighbourGraph
from .params import ThreatMode, ThreatModel, find_parameters, validate_degree
from .wire import Arrays, Bytes, Config, Int, Str, Vector, fail

SESSION_ID_MIN, SESSION_ID_MAX = 8, 64
RUN_ID_MIN, RUN_ID_MAX = 1, 64
MAX_ROUND = 2**63 - 1
GRAPH_SEED_BYTES = 32
MAX_BITS = 62
MAX_DIMENSION = 1 << 31
# The protocol revision: bumped with crypto.DOMAIN whenever masks or messages change, so a
# client and a server of different revisions refuse each other by name at the first message
# instead of producing masks that do not cancel.
PROTOCOL = "fedveil-secagg/3"
_MAGIC = b"fvsa3"
# session-id length, bits, dimension, k, t, n, threat mode, run-id length, round
_HEADER = ">BIIIIIBBQ"
# The run id of an in-process simulation, where server and clients are one operator's
# objects; a deployment binds Flower's run id instead (`flower_run_id`).
SIMULATION_RUN_ID = b"fedveil-simulation"


def flower_run_id(run_id: int) -> bytes:
    """The session run id of a Flower run: both sides read it from their own Flower context."""
    return b"flower-run:%d" % run_id


_FIELDS = {
    "session_id": Bytes(SESSION_ID_MIN, SESSION_ID_MAX),
    "modulus_bits": Int(1, MAX_BITS),
    "dimension": Int(1, MAX_DIMENSION),
    # At most 2^32 - 1: the canonical encoding (and the digest) packs both as uint32.
    "neighbors": Int(2, 2**32 - 1),
    "threshold": Int(2, 2**32 - 1),
    "threat_mode": Str(tuple(m.value for m in ThreatMode)),
    "graph_seed": Bytes(GRAPH_SEED_BYTES, GRAPH_SEED_BYTES),
    "run_id": Bytes(RUN_ID_MIN, RUN_ID_MAX),
    "round": Int(0, MAX_ROUND),
}


def check_binding(
    session_run: bytes, session_round: int, run_id: bytes, round_num: int, path: str
) -> None:
    """Refuse a session naming another run than `run_id` or another round than `round_num`."""
    if session_run != run_id:
        raise SecAggProtocolError(
            f"{path}.run_id: {session_run[:64]!r} is not this client's run {run_id!r} "
            "(replayed from another run?)"
        )
    if session_round != round_num:
        raise SecAggProtocolError(
            f"{path}.round: session of round {session_round} delivered in round "
            f"{round_num} (replayed from another round?)"
        )


def modulus_dtype(bits: int) -> type[np.unsignedinteger]:
    """The smallest unsigned integer type that holds values mod 2**bits."""
    return np.uint32 if bits <= 32 else np.uint64


@dataclass(frozen=True, eq=False)
class SessionConfig:
    """Round parameters. Build with `SessionConfig.create(...)` to get k and t from a threat
    model; the constructor only checks structural validity."""

    session_id: bytes
    client_ids: tuple[int, ...]
    modulus_bits: int
    dimension: int
    neighbors: int
    threshold: int
    threat_mode: ThreatMode
    graph_seed: bytes
    run_id: bytes
    round: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "threat_mode", ThreatMode(self.threat_mode))
        # Built once per message and per client state restore: keep the O(n) checks in C
        # (map/min/max), not Python-level generators, or n=1000 cohorts pay O(n^2) per round.
        object.__setattr__(self, "client_ids", tuple(map(int, self.client_ids)))
        ids = self.client_ids
        if not SESSION_ID_MIN <= len(self.session_id) <= SESSION_ID_MAX:
            raise ValueError(f"session_id must be {SESSION_ID_MIN}..{SESSION_ID_MAX} bytes")
        if ids and not (min(ids) >= 0 and max(ids) < 2**64):
            raise ValueError("client ids must be in [0, 2^64)")
        if not all(map(operator.lt, ids, itertools.islice(ids, 1, None))):
            raise ValueError("client_ids must be sorted and unique")
        if not 1 <= self.modulus_bits <= MAX_BITS:
            raise ValueError(f"modulus_bits must be in [1, {MAX_BITS}], got {self.modulus_bits}")
        if not 1 <= self.dimension <= MAX_DIMENSION:
            raise ValueError(f"dimension must be in [1, {MAX_DIMENSION}], got {self.dimension}")
        validate_degree(len(ids), self.neighbors)
        if not 2 <= self.threshold <= self.neighbors:
            raise ValueError(f"threshold must be in [2, neighbors={self.neighbors}]")
        if self.threat_mode is ThreatMode.MALICIOUS and 2 * self.threshold <= self.neighbors + 1:
            # Below this even an honest-only neighbourhood can be split into both share kinds.
            raise ValueError("malicious mode needs 2 * threshold > neighbors + 1")
        if len(self.graph_seed) != GRAPH_SEED_BYTES:
            raise ValueError(f"graph_seed must be {GRAPH_SEED_BYTES} bytes")
        if type(self.run_id) is not bytes or not RUN_ID_MIN <= len(self.run_id) <= RUN_ID_MAX:
            raise ValueError(f"run_id must be {RUN_ID_MIN}..{RUN_ID_MAX} bytes")
        if type(self.round) is not int or not 0 <= self.round <= MAX_ROUND:
            raise ValueError(f"round must be an int in [0, {MAX_ROUND}], got {self.round!r}")

    @classmethod
    def create(
        cls,
        client_ids: Iterable[int],
        *,
        dimension: int,
        modulus_bits: int,
        run_id: bytes,
        round: int,
        threat: ThreatModel | None = None,
        neighbors: int | None = None,
        threshold: int | None = None,
        session_id: bytes | None = None,
        graph_seed: bytes | None = None,
    ) -> SessionConfig:
        """New session with k, t from the parameter finder and fresh random ids/seeds."""
        threat = threat or ThreatModel()
        ids = tuple(sorted(set(int(c) for c in client_ids)))
        params = find_parameters(len(ids), threat, neighbors=neighbors, threshold=threshold)
        return cls(
            session_id=session_id or randomness.random_bytes(16),
            client_ids=ids,
            modulus_bits=modulus_bits,
            dimension=dimension,
            neighbors=params.neighbors,
            threshold=params.threshold,
            threat_mode=threat.mode,
            graph_seed=graph_seed or randomness.random_bytes(GRAPH_SEED_BYTES),
            run_id=run_id,
            round=round,
        )

    # Derived views, computed once per instance.
    def check_binding(self, run_id: bytes, round_num: int, path: str = "session") -> None:
        """Refuse a session of another run or round. `run_id` is the run the checking party
        serves (from its own context), `round_num` the round of the message carrying it."""
        check_binding(self.run_id, self.round, run_id, round_num, path)

    def neighbours_of(self, client_id: int) -> frozenset[int]:
        return self.graph.neighbours(client_id)

    @property
    def n(self) -> int:
        return len(self.client_ids)

    @property
    def malicious(self) -> bool:
        return self.threat_mode is ThreatMode.MALICIOUS

    @property
    def dtype(self) -> type[np.unsignedinteger]:
        return modulus_dtype(self.modulus_bits)

    @property
    def modulus_mask(self) -> int:
        return (1 << self.modulus_bits) - 1

    @cached_property
    def ids_array(self) -> np.ndarray:
        return np.array(self.client_ids, dtype=np.uint64)

    def _index(self, client_id: int) -> int | None:
        """Position in the sorted cohort by binary search (no per-cohort dict to build)."""
        if not 0 <= client_id < 2**64:
            return None
        ids = self.ids_array
        i = int(np.searchsorted(ids, np.uint64(client_id)))
        return i if i < len(ids) and int(ids[i]) == client_id else None

    def contains(self, client_id: int) -> bool:
        return self._index(client_id) is not None

    def share_x(self, client_id: int) -> int:
        """Public, non-zero Shamir x-coordinate of a holder: 1 + its cohort position."""
        index = self._index(client_id)
        if index is None:
            raise KeyError(f"client {client_id} is not in the cohort")
        return index + 1

    def share_xs(self, client_ids: list[int]) -> list[int]:
        """`share_x` of many holders in one vectorised lookup (a client shares with k + 1)."""
        ids = self.ids_array
        wanted = np.array(client_ids, dtype=np.uint64)
        index = np.searchsorted(ids, wanted)
        found = index < len(ids)
        found[found] = ids[index[found]] == wanted[found]
        if not found.all():
            raise KeyError(f"client {client_ids[int(np.argmin(found))]} is not in the cohort")
        return (index + 1).tolist()

    @cached_property
    def graph(self) -> NeighbourGraph:
        return NeighbourGraph(self.ids_array, self.neighbors, self.graph_seed, self.session_id)

    @cached_property
    def digest(self) -> bytes:
        return hashlib.sha256(self.to_bytes()).digest()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SessionConfig) and other.digest == self.digest

    def __hash__(self) -> int:
        return hash(self.digest)

    # Encodings.
    def to_bytes(self) -> bytes:
        """Canonical encoding (also what the digest covers and the client state stores)."""
        header = struct.pack(
            _HEADER,
            len(self.session_id),
            self.modulus_bits,
            self.dimension,
            self.neighbors,
            self.threshold,
            self.n,
            list(ThreatMode).index(self.threat_mode),
            len(self.run_id),
            self.round,
        )
        ids = self.ids_array.astype(">u8").tobytes()
        return b"".join([_MAGIC, header, self.session_id, self.run_id, self.graph_seed, ids])

    @classmethod
    def from_bytes(cls, raw: bytes) -> SessionConfig:
        try:
            if not raw.startswith(_MAGIC):
                raise ValueError("bad magic")
            offset = len(_MAGIC)
            header = struct.unpack_from(_HEADER, raw, offset)
            sid_len, bits, dim, k, t, n, mode, run_len, round_num = header
            offset += struct.calcsize(_HEADER)
            session_id = raw[offset : offset + sid_len]
            offset += sid_len
            run_id = raw[offset : offset + run_len]
            offset += run_len
            graph_seed = raw[offset : offset + GRAPH_SEED_BYTES]
            offset += GRAPH_SEED_BYTES
            ids = np.frombuffer(raw, dtype=">u8", count=n, offset=offset)
            if offset + 8 * n != len(raw):
                raise ValueError("trailing or missing bytes")
            modes = list(ThreatMode)
            return cls(
                session_id,
                tuple(ids.tolist()),
                bits,
                dim,
                k,
                t,
                modes[mode],
                graph_seed,
                run_id,
                round_num,
            )
        except (ValueError, IndexError, struct.error) as exc:
            raise SecAggProtocolError(f"session: cannot decode ({exc})") from None

    def to_wire(self) -> tuple[Config, Arrays]:
        config: Config = {name: spec.encode(getattr(self, name)) for name, spec in _FIELDS.items()}
        config["protocol"] = PROTOCOL
        return config, {"client_ids": self.ids_array}

    @classmethod
    def from_wire(cls, config: Config, arrays: Arrays, path: str = "session") -> SessionConfig:
        protocol = config.get("protocol")
        if type(protocol) is not str or protocol != PROTOCOL:
            shown = "missing" if protocol is None else repr(str(protocol)[:40])
            raise fail(f"{path}.protocol", f"{shown}; this party speaks {PROTOCOL!r}")
        values = {}
        for name, spec in _FIELDS.items():
            if name not in config:
                raise fail(f"{path}.{name}", "missing")
            values[name] = spec.decode(f"{path}.{name}", config[name])
        if "client_ids" not in arrays:
            raise fail(f"{path}.client_ids", "missing")
        ids = Vector(("uint64",)).decode(f"{path}.client_ids", arrays["client_ids"])
        try:
            return cls(client_ids=tuple(ids.tolist()), **values)
        except ValueError as exc:
            raise fail(path, str(exc)) from None
