"""Envelope <-> Flower Message content (RecordDict).

Only this module and the two Flower adapters know Flower's record types.
"""

from __future__ import annotations

import functools
from io import BytesIO
from typing import TypeVar

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict
from flwr.common.constant import SType

from fedveil.protocol.envelope import Envelope, MessageError
from fedveil.protocol.kinds import Kind

R = TypeVar("R", ConfigRecord, ArrayRecord)

# Flower message types are "<category>.<action>"; every fedveil kind rides on
# one of Flower's categories with the kind as the action.
CATEGORY = {Kind.HELLO: "query", Kind.EVALUATE: "evaluate"}
# Every kind a ClientApp answers; protocols that add kinds extend Kind.
KINDS = [kind.value for kind in Kind]

# Flower's own Message-API conventions (flwr.serverapp.strategy.FedAvg and the quickstart
# ClientApps): what a stock client reads and answers, without fedveil's envelope.
STOCK_TRAIN = "train"  # message types of a stock app's @app.train() / @app.evaluate()
STOCK_EVALUATE = "evaluate"
STOCK_ARRAYS = "arrays"  # ArrayRecord: the model's state_dict, in its order
STOCK_CONFIG = "config"  # ConfigRecord: "server-round" plus the training settings
STOCK_METRICS = "metrics"  # MetricRecord of a reply
STOCK_SERVER_ROUND = "server-round"
STOCK_NUM_EXAMPLES = "num-examples"  # FedAvg's weighting key


def message_type(kind: str) -> str:
    category = CATEGORY.get(kind, Kind.TRAIN.value)
    return f"{category}.{kind.replace('.', '_')}"


def npy_array(value: np.ndarray) -> Array:
    """`Array(value)`, byte for byte, without `np.save`: numpy's own .npy header for the
    array's dtype and shape (cached), then its raw bytes. `np.save` into a BytesIO costs
    several times a copy of the data (a 400 KB model or masked vector, on every message
    both ways), and its header formatting dominates for the small arrays of
    secure-aggregation requests."""
    value = np.ascontiguousarray(value)
    if value.dtype.hasobject:
        return Array(value)  # refused there, as before (never pickled)
    header = _npy_header(value.dtype.str, value.shape)
    if header is None:
        return Array(value)
    return Array(
        dtype=str(value.dtype),
        shape=tuple(int(n) for n in value.shape),
        stype=SType.NUMPY,
        data=b"".join((header, value.data)),  # one allocation, one copy
    )


@functools.lru_cache(maxsize=256)
def _npy_header(descr: str, shape: tuple[int, ...]) -> bytes | None:
    """The .npy 1.0 header `np.save` writes for a C-ordered array of `descr` and `shape`;
    None where it needs format 2.0 (then `np.save` itself runs)."""
    buffer = BytesIO()
    header = {"descr": np.lib.format.dtype_to_descr(np.dtype(descr)), "fortran_order": False}
    header["shape"] = shape
    try:
        np.lib.format.write_array_header_1_0(buffer, header)
    except ValueError:
        return None
    return buffer.getvalue()


def to_content(env: Envelope) -> RecordDict:
    arrays = {}
    for key, value in env.arrays.items():
        if isinstance(value, torch.Tensor):
            value = value.detach().cpu().numpy()
        arrays[key] = npy_array(value)
    meta = {"kind": env.kind, "round": env.round}
    return RecordDict(
        {
            "meta": ConfigRecord(meta),
            "config": ConfigRecord(dict(env.config)),
            "arrays": ArrayRecord(arrays),
        }
    )


def from_content(content: RecordDict) -> Envelope:
    # Records are read by key: RecordDict's typed views (`config_records`, ...) rebuild a
    # dict of every record on each access, a cost paid per message.
    meta = _record(content, "meta", ConfigRecord)
    config = _record(content, "config", ConfigRecord)
    arrays = _record(content, "arrays", ArrayRecord)
    kind, rnd = meta.get("kind"), meta.get("round")
    if not isinstance(kind, str) or not isinstance(rnd, int) or isinstance(rnd, bool):
        raise MessageError("message meta record needs a string 'kind' and an integer 'round'")
    return Envelope(kind, rnd, dict(config), {k: _numpy(k, a) for k, a in arrays.items()})


def numpy_of(key: str, array: Array) -> np.ndarray:
    """A peer's array as numpy, checked as `from_content` checks it (MessageError)."""
    return _numpy(key, array)


def _numpy(key: str, array: Array) -> np.ndarray:
    """An array of a peer's message; a malformed one is a MessageError naming it.

    What `array.numpy()` (`np.load`, no pickles) returns, a writable C-ordered (or, as the
    header says, Fortran-ordered) array, in one copy of the data: the .npy header is parsed
    by numpy's own reader once per distinct header (`_npy_layout`, cached), not twice per
    array as `np.load` after our check did (its `ast.literal_eval` was most of the cost of
    a secure-aggregation request's small arrays). A header announcing more data than the
    message carries is refused before anything is allocated for it.
    """
    try:
        if array.stype != SType.NUMPY:
            raise TypeError(f"unsupported serialization type {array.stype!r}")
        data = array.data
        shape, fortran_order, dtype, offset = _npy_layout(data)
        count = int(np.prod(shape, dtype=object))
        if count * dtype.itemsize > len(data) - offset:
            raise ValueError(
                f"header announces {count * dtype.itemsize} bytes, the message carries fewer"
            )
        if dtype.itemsize == 0:  # nothing to read (np.load makes these the same way)
            flat = np.ndarray(count, dtype=dtype)
        else:
            flat = np.frombuffer(data, dtype=dtype, count=count, offset=offset).copy()
        return flat.reshape(shape[::-1]).transpose() if fortran_order else flat.reshape(shape)
    except Exception as exc:  # numpy's and Flower's many failure types, all the peer's fault
        raise MessageError(
            f"message array {key[:60]!r} cannot be decoded ({type(exc).__name__}: {exc})"[:300]
        ) from None


NPY_MAGIC = b"\x93NUMPY"
# numpy's own limit on a header it parses without allow_pickle (np.lib.format).
NPY_MAX_HEADER = 10_000


def _npy_layout(data: bytes) -> tuple[tuple[int, ...], bool, np.dtype, int]:
    """(shape, fortran_order, dtype, offset of the data) of an .npy buffer; ValueError for
    anything numpy's reader refuses, an object dtype (never unpickled) and a header over
    numpy's size limit (refused before it is copied)."""
    if data[: len(NPY_MAGIC)] != NPY_MAGIC or len(data) < 12:
        raise ValueError("not an .npy array (magic string missing)")
    version = (data[6], data[7])
    if version == (1, 0):
        start, length = 10, int.from_bytes(data[8:10], "little")
    elif version == (2, 0):
        start, length = 12, int.from_bytes(data[8:12], "little")
    else:
        raise ValueError(f"npy format version {version} is not 1.0 or 2.0")
    if length > NPY_MAX_HEADER:
        raise ValueError(f"npy header of {length} bytes exceeds the limit {NPY_MAX_HEADER}")
    shape, fortran_order, dtype = _parse_npy_header(bytes(data[: start + length]))
    return shape, fortran_order, dtype, start + length


@functools.lru_cache(maxsize=256)
def _parse_npy_header(header: bytes) -> tuple[tuple[int, ...], bool, np.dtype]:
    """numpy's reading of one complete .npy header (magic, version, length, dict), cached:
    a run's messages carry a handful of distinct headers. Keyed by the exact bytes, so a
    cache hit is what numpy said of those bytes."""
    stream = BytesIO(header)
    version = np.lib.format.read_magic(stream)
    read_header = (
        np.lib.format.read_array_header_1_0
        if version == (1, 0)
        else np.lib.format.read_array_header_2_0
    )
    shape, fortran_order, dtype = read_header(stream, max_header_size=NPY_MAX_HEADER)
    if stream.tell() != len(header):
        raise ValueError("npy header shorter than its announced length")
    if dtype.hasobject:
        raise ValueError("Object arrays cannot be loaded when allow_pickle=False")
    return tuple(int(n) for n in shape), bool(fortran_order), dtype


def _record(content: RecordDict, name: str, kind: type[R]) -> R:
    record = content.get(name)
    if not isinstance(record, kind):
        raise MessageError(f"message lacks the {kind.__name__} {name!r}")
    return record
