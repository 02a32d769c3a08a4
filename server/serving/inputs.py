"""Prediction request and reply bodies: JSON or NPZ, checked before the model sees them.

    JSON  {"inputs": [[...], ...]}          -> {"outputs": [[...], ...], ...}
    NPZ   array "inputs" (application/x-npz) -> array "outputs"

Every check names the problem and the limit, so a client can fix its request: the body's
size, its format, the dtype, the shape (one example is the model's input shape), the
number of rows, and non-finite values (NaN, Inf).

The work a request can cause is bounded before the expensive step (docs/how-to/
hostile-inputs.md): an NPZ member's `.npy` header (dtype, shape, rows) is checked
before anything is decompressed, and decompression stops at the byte count that
header implies (counted as read: the zip's declared sizes can lie); a JSON body's
nesting depth and number of values are counted on the raw bytes before it is parsed.
`decode` is CPU work: the service runs it off the event loop.
"""

from __future__ import annotations

import io
import json
import math
import re
import zipfile
from typing import Any

import numpy as np

NPZ_TYPE = "application/x-npz"
JSON_TYPE = "application/json"
NPZ_MEMBER = "inputs.npy"
MAX_NPY_HEADER = 10_000  # bytes; numpy's own default for untrusted headers
READ_CHUNK = 1 << 20
# A JSON body is {"inputs": [example, ...]}: the object, the list of examples, then one
# level per input dimension; this many more levels are allowed for other keys' values.
JSON_SPARE_DEPTH = 2
# A string without escapes: linear to strip (a pattern with escapes backtracks
# quadratically on '"\\"\\"...' with no closing quote).
_PLAIN_STRING = re.compile(rb'"[^"]*"')
_BOOLEAN = re.compile(rb"true|false")


class InputError(ValueError):
    """A request the model cannot take; answered with 422 and this message."""


def decode(
    body: bytes, content_type: str, input_shape: tuple[int, ...], max_rows: int
) -> tuple[np.ndarray, bool]:
    """The request's inputs as an array, and whether the reply should be NPZ. Refused
    (InputError) before decompressing or parsing when the body declares more than
    `max_rows` examples of `input_shape`, or nests deeper than such examples can."""
    kind = content_type.split(";", 1)[0].strip().lower()
    if kind == NPZ_TYPE:
        return _decode_npz(body, input_shape, max_rows), True
    if kind in (JSON_TYPE, ""):
        return _decode_json(body, input_shape, max_rows), False
    raise InputError(f"Content-Type {kind!r}: send {JSON_TYPE} or {NPZ_TYPE}")


def json_limits(body: bytes, max_depth: int, max_values: int) -> None:
    """InputError unless `body`, outside its strings, nests at most `max_depth` deep
    and has at most `max_values` commas (one fewer than its values): counted on the
    bytes, so a deep or huge body costs one linear pass, never a parse."""
    # Brackets and commas inside strings are not counted. A body with escapes (no
    # prediction body needs one) is counted as it is: conservative for commas, and a
    # depth it hides behind ']' in strings is still refused by the parser's own
    # recursion limit (RecursionError -> InputError), never a crash.
    stripped = body if b"\\" in body else _PLAIN_STRING.sub(b'""', body)
    raw = np.frombuffer(stripped, dtype=np.uint8)
    commas = int(np.count_nonzero(raw == ord(",")))
    if commas > max_values:
        raise InputError(
            f"body: more than {max_values} values; a request takes at most that many "
            "(rows x values per example, --max-batch)"
        )
    depth, deepest = 0, 0
    for start in range(0, raw.size, READ_CHUNK):
        part = raw[start : start + READ_CHUNK]
        step = (part == ord("[")).astype(np.int32) + (part == ord("{"))
        step -= (part == ord("]")).astype(np.int32) + (part == ord("}"))
        if step.size:
            running = np.cumsum(step) + depth
            deepest = max(deepest, int(running.max()))
            depth = int(running[-1])
    if deepest > max_depth:
        raise InputError(
            f"body: JSON nested {deepest} deep; the limit is {max_depth} (an object, the "
            "list of examples, one level per input dimension, and "
            f"{JSON_SPARE_DEPTH} more)"
        )


def _decode_json(body: bytes, input_shape: tuple[int, ...], max_rows: int) -> np.ndarray:
    per_example = math.prod(input_shape)
    json_limits(
        body,
        max_depth=2 + len(input_shape) + JSON_SPARE_DEPTH,
        max_values=2 * max_rows * max(per_example, 1) + 64,
    )
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputError(f"body: not valid JSON ({exc})") from None
    except RecursionError:  # depth hidden behind escaped strings: still never a 500
        raise InputError("body: JSON nested too deep") from None
    if not isinstance(payload, dict) or "inputs" not in payload:
        raise InputError('body: expected a JSON object {"inputs": [[...], ...]}')
    inputs = payload["inputs"]
    if not isinstance(inputs, list):
        raise InputError(f"inputs: expected a list of examples, got {type(inputs).__name__}")
    if _BOOLEAN.search(body):
        # numpy reads [1, true] as [1, 1]: a boolean is refused wherever it is. Walked
        # only when the bytes name one (a string's content can too: the walk decides).
        _refuse_booleans(inputs)
    try:
        try:
            array = np.asarray(inputs)
        except OverflowError:  # an integer past float's range beside floats
            array = np.asarray(inputs, dtype=object)
        if array.dtype.kind == "O" and all(
            type(v) in (int, float) for v in array.reshape(-1).tolist()
        ):
            # Integers past int64 (JSON has no limit): their float value, or infinity.
            array = np.array([_as_float(v) for v in array.reshape(-1).tolist()]).reshape(
                array.shape
            )
    except (ValueError, TypeError) as exc:
        # Ragged lists: numpy names where.
        raise InputError(
            f"inputs: not a rectangular array of numbers ({exc}); every example must "
            "have the model's input shape"
        ) from None
    if array.dtype.kind not in "fiu":
        # Strings ("1" would parse), booleans, nulls: not numbers, whatever numpy makes of
        # them (check() refuses NPZ inputs of these dtypes the same way).
        raise InputError(
            "inputs: not a rectangular array of numbers (strings, booleans or nulls among "
            "the values); every value must be a JSON number"
        )
    return array.astype(np.float32)


def _refuse_booleans(inputs: list[Any]) -> None:
    """InputError naming the first boolean among the inputs: its example and its
    position within the example (`inputs[3][0][1]`)."""
    stack: list[tuple[Any, tuple[int, ...]]] = [(inputs, ())]
    while stack:
        value, where = stack.pop()
        if isinstance(value, bool):
            example, inner = where[0], "".join(f"[{i}]" for i in where[1:])
            raise InputError(
                f"inputs{''.join(f'[{i}]' for i in where)}: {str(value).lower()} is a "
                f"boolean (example {example}, position {inner or 'the example itself'}); "
                "every value must be a JSON number"
            )
        if isinstance(value, list):
            # reversed, so the first boolean in reading order is the one named
            stack.extend((v, (*where, i)) for i, v in reversed(list(enumerate(value))))


def _as_float(value: int | float) -> float:
    """`value` as a float; an integer past float's range as infinity of its sign (then
    refused by check() as not finite)."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def _decode_npz(body: bytes, input_shape: tuple[int, ...], max_rows: int) -> np.ndarray:
    try:
        with zipfile.ZipFile(io.BytesIO(body)) as archive:
            names = archive.namelist()
            if NPZ_MEMBER not in names:
                shown = sorted(n.removesuffix(".npy") for n in names)[:20]
                raise InputError(f"NPZ body: no array 'inputs' (has {shown})")
            with archive.open(NPZ_MEMBER) as member:
                dtype, shape, fortran = _npy_header(member)
                _check_declared(dtype, shape, input_shape, max_rows)
                size = math.prod(shape) * dtype.itemsize
                data = _read_exactly(member, size)
    except InputError:
        raise
    except (ValueError, OSError, zipfile.BadZipFile, EOFError, NotImplementedError) as exc:
        raise InputError(f"NPZ body: not a readable .npz file ({exc})") from None
    array = np.frombuffer(data, dtype=dtype)
    return array.reshape(shape[::-1]).T if fortran else array.reshape(shape)


def _npy_header(member: Any) -> tuple[np.dtype, tuple[int, ...], bool]:
    """The member's declared dtype, shape and order, from its `.npy` header alone."""
    version = np.lib.format.read_magic(member)
    if version == (1, 0):
        read = np.lib.format.read_array_header_1_0
    elif version in ((2, 0), (3, 0)):
        read = np.lib.format.read_array_header_2_0
    else:
        raise InputError(f"NPZ body: .npy format version {version} is not supported")
    shape, fortran, dtype = read(member, max_header_size=MAX_NPY_HEADER)
    return np.dtype(dtype), tuple(int(d) for d in shape), bool(fortran)


def _check_declared(
    dtype: np.dtype, shape: tuple[int, ...], input_shape: tuple[int, ...], max_rows: int
) -> None:
    """The `check` rules, on what the header declares, before a byte is decompressed."""
    if dtype.kind not in "fiu" or dtype.hasobject:
        raise InputError(
            f"inputs: dtype {dtype} is not a real number type; send float32 "
            "(float16/64 and integers are converted)"
        )
    _check_shape(shape, input_shape, max_rows)


def _read_exactly(member: Any, size: int) -> bytes:
    """`size` bytes of the member, counted as they are decompressed; anything short
    or beyond is refused, so the zip's own size fields are never trusted."""
    chunks, got = [], 0
    while got < size:
        chunk = member.read(min(READ_CHUNK, size - got))
        if not chunk:
            raise InputError(f"NPZ body: 'inputs' holds {got} bytes, its header declares {size}")
        chunks.append(chunk)
        got += len(chunk)
    if member.read(1):
        raise InputError(f"NPZ body: 'inputs' holds more than the {size} bytes its header declares")
    return b"".join(chunks)


def _check_shape(shape: tuple[int, ...], input_shape: tuple[int, ...], max_rows: int) -> None:
    if tuple(shape[1:]) != tuple(input_shape) or len(shape) != len(input_shape) + 1:
        raise InputError(
            f"inputs: shape {list(shape)}, expected [N, "
            f"{', '.join(str(d) for d in input_shape)}] (N examples of the model's input "
            f"shape {list(input_shape)}, 1 <= N <= {max_rows})"
        )
    rows = int(shape[0])
    if not 1 <= rows <= max_rows:
        raise InputError(f"inputs: {rows} examples; a request takes 1 to {max_rows}")


def check(array: np.ndarray, input_shape: tuple[int, ...], max_rows: int) -> np.ndarray:
    """The inputs as a contiguous float32 (N, *input_shape) array, 1 <= N <= max_rows,
    all finite; else InputError naming what is wrong."""
    _check_shape(tuple(array.shape), input_shape, max_rows)
    if array.dtype.kind not in "fiu":
        raise InputError(
            f"inputs: dtype {array.dtype} is not a real number type; send float32 "
            "(float16/64 and integers are converted)"
        )
    rows = int(array.shape[0])
    out = np.ascontiguousarray(array, dtype=np.float32)
    finite = np.isfinite(out)
    if not finite.all():
        bad = int(out.size - np.count_nonzero(finite))
        first = int(np.flatnonzero(~finite.reshape(rows, -1).all(axis=1))[0])
        raise InputError(
            f"inputs: {bad} value(s) are NaN or infinite (first in example {first}); "
            "every value must be finite"
        )
    return out


def check_outputs(outputs: np.ndarray) -> np.ndarray:
    """The model's outputs if all are finite; else InputError naming the first example.

    Finite inputs can still overflow float32 inside the model (values near 3.4e38 with
    alternating signs give inf - inf = NaN): such an answer is not a prediction, and
    JSON cannot carry it (it was a 500)."""
    finite = np.isfinite(outputs)
    if finite.all():
        return outputs
    rows = int(outputs.shape[0])
    first = int(np.flatnonzero(~finite.reshape(rows, -1).all(axis=1))[0])
    raise InputError(
        f"outputs: the model's outputs for example {first} are NaN or infinite (its inputs "
        "overflow float32 inside the model); every output must be finite"
    )


def encode(outputs: np.ndarray, npz: bool, extra: dict[str, Any]) -> tuple[bytes, str]:
    """The reply body and its Content-Type."""
    if npz:
        buf = io.BytesIO()
        np.savez(buf, outputs=outputs)
        return buf.getvalue(), NPZ_TYPE
    # float32 -> Python float (double) -> JSON repr: reading it back as float32 is exact.
    body = json.dumps({"outputs": outputs.tolist(), **extra}, allow_nan=False)
    return body.encode(), JSON_TYPE


def human_bytes(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    exp = min(int(math.log(n, 1024)), 3)
    return f"{n / 1024**exp:.1f} {['B', 'KiB', 'MiB', 'GiB'][exp]}"
