"""Prediction request and reply bodies: JSON or NPZ, checked before the model sees them.

    JSON  {"inputs": [[...], ...]}          -> {"outputs": [[...], ...], ...}
    NPZ   array "inputs" (application/x-npz) -> array "outputs"

Every check names the problem and the limit, so a client can fix its request: the body's
size, its format, the dtype, the shape (one example is the model's input shape), the
number of rows, and non-finite values (NaN, Inf).
"""

from __future__ import annotations

import io
import json
import math
import zipfile
from typing import Any

import numpy as np

NPZ_TYPE = "application/x-npz"
JSON_TYPE = "application/json"


class InputError(ValueError):
    """A request the model cannot take; answered with 422 and this message."""


def decode(body: bytes, content_type: str) -> tuple[np.ndarray, bool]:
    """The request's inputs as an array, and whether the reply should be NPZ."""
    kind = content_type.split(";", 1)[0].strip().lower()
    if kind == NPZ_TYPE:
        return _decode_npz(body), True
    if kind in (JSON_TYPE, ""):
        return _decode_json(body), False
    raise InputError(f"Content-Type {kind!r}: send {JSON_TYPE} or {NPZ_TYPE}")


def _decode_json(body: bytes) -> np.ndarray:
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputError(f"body: not valid JSON ({exc})") from None
    if not isinstance(payload, dict) or "inputs" not in payload:
        raise InputError('body: expected a JSON object {"inputs": [[...], ...]}')
    inputs = payload["inputs"]
    if not isinstance(inputs, list):
        raise InputError(f"inputs: expected a list of examples, got {type(inputs).__name__}")
    try:
        return np.asarray(inputs, dtype=np.float32)
    except (ValueError, TypeError) as exc:
        # Ragged lists, strings, nulls: numpy names which.
        raise InputError(
            f"inputs: not a rectangular array of numbers ({exc}); every example must "
            "have the model's input shape"
        ) from None


def _decode_npz(body: bytes) -> np.ndarray:
    try:
        with np.load(io.BytesIO(body), allow_pickle=False) as npz:
            if "inputs" not in npz.files:
                raise InputError(f"NPZ body: no array 'inputs' (has {sorted(npz.files)})")
            array = npz["inputs"]
    except InputError:
        raise
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as exc:
        raise InputError(f"NPZ body: not a readable .npz file ({exc})") from None
    if array.dtype.kind not in "fiu":
        raise InputError(
            f"inputs: dtype {array.dtype} is not a real number type; send float32 "
            "(float16/64 and integers are converted)"
        )
    return array


def check(array: np.ndarray, input_shape: tuple[int, ...], max_rows: int) -> np.ndarray:
    """The inputs as a contiguous float32 (N, *input_shape) array, 1 <= N <= max_rows,
    all finite; else InputError naming what is wrong."""
    if tuple(array.shape[1:]) != tuple(input_shape) or array.ndim != len(input_shape) + 1:
        raise InputError(
            f"inputs: shape {list(array.shape)}, expected [N, "
            f"{', '.join(str(d) for d in input_shape)}] (N examples of the model's input "
            f"shape {list(input_shape)}, 1 <= N <= {max_rows})"
        )
    rows = int(array.shape[0])
    if not 1 <= rows <= max_rows:
        raise InputError(f"inputs: {rows} examples; a request takes 1 to {max_rows}")
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
