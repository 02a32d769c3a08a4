"""Reader and writer for the IDX format used by (Fashion-)MNIST.

Layout: two zero bytes, a dtype code, the number of dimensions, one big-endian
uint32 per dimension, then the row-major payload (big-endian for multi-byte
types). Files may be gzip-compressed; we detect that from the gzip magic bytes,
not the file name, so a renamed file still loads.
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import numpy as np

__all__ = ["IdxFormatError", "read_idx", "write_idx"]

# IDX type code -> big-endian numpy dtype.
_DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
_CODES: dict[str, int] = {dt.newbyteorder("=").str: code for code, dt in _DTYPES.items()}
_GZIP_MAGIC = b"\x1f\x8b"
_MAX_NDIM = 8  # the format allows 255; anything above a handful means a corrupt header


class IdxFormatError(ValueError):
    """An IDX file is truncated, corrupt, or not IDX at all."""


def _read_bytes(path: Path) -> bytes:
    raw = path.read_bytes()
    if not raw.startswith(_GZIP_MAGIC):
        return raw
    try:
        return gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as exc:
        raise IdxFormatError(f"{path}: corrupt gzip stream ({exc})") from exc


def read_idx(
    path: str | Path,
    *,
    expected_ndim: int | None = None,
    expected_dtype: np.dtype | type | None = None,
) -> np.ndarray:
    """Decode one IDX file (raw or gzip) into a native-endian numpy array.

    Raises IdxFormatError naming the file and the offending field (magic, type
    code, ndim, payload size) so a half-downloaded file is easy to spot.
    """
    path = Path(path)
    data = _read_bytes(path)
    if len(data) < 4:
        raise IdxFormatError(f"{path}: {len(data)} bytes is too short for an IDX header (need 4)")
    if data[0] != 0 or data[1] != 0:
        raise IdxFormatError(
            f"{path}: bad magic number 0x{data[:4].hex()} (IDX files start with two zero bytes)"
        )
    code, ndim = data[2], data[3]
    if code not in _DTYPES:
        valid = ", ".join(f"0x{c:02X}" for c in _DTYPES)
        raise IdxFormatError(f"{path}: unknown IDX type code 0x{code:02X} (valid: {valid})")
    if not 1 <= ndim <= _MAX_NDIM:
        raise IdxFormatError(f"{path}: ndim={ndim} in header, expected 1..{_MAX_NDIM}")
    header_len = 4 + 4 * ndim
    if len(data) < header_len:
        raise IdxFormatError(f"{path}: truncated header ({len(data)} < {header_len} bytes)")
    shape = tuple(int(d) for d in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    dtype = _DTYPES[code]
    expected_bytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    payload = len(data) - header_len
    if payload != expected_bytes:
        raise IdxFormatError(
            f"{path}: payload is {payload} bytes but header shape {shape} of {dtype.name} "
            f"needs {expected_bytes} (truncated or corrupt file)"
        )
    if expected_ndim is not None and ndim != expected_ndim:
        raise IdxFormatError(f"{path}: ndim={ndim}, expected {expected_ndim}")
    array = np.frombuffer(data, dtype=dtype, offset=header_len).reshape(shape)
    array = array.astype(dtype.newbyteorder("="), copy=False)
    if expected_dtype is not None and array.dtype != np.dtype(expected_dtype):
        raise IdxFormatError(f"{path}: dtype {array.dtype}, expected {np.dtype(expected_dtype)}")
    # frombuffer over immutable bytes is read-only; torch.from_numpy wants writable memory.
    return array if array.flags.writeable else array.copy()


def write_idx(path: str | Path, array: np.ndarray, *, compress: bool | None = None) -> Path:
    """Write ``array`` as IDX; gzip when ``compress`` is True or the name ends in ``.gz``."""
    path = Path(path)
    array = np.asarray(array)
    code = _CODES.get(array.dtype.newbyteorder("=").str)
    if code is None:
        valid = ", ".join(dt.name for dt in _DTYPES.values())
        raise ValueError(f"write_idx: dtype {array.dtype} has no IDX type code (valid: {valid})")
    if not 1 <= array.ndim <= _MAX_NDIM:
        raise ValueError(f"write_idx: array.ndim={array.ndim}, expected 1..{_MAX_NDIM}")
    header = bytes([0, 0, code, array.ndim]) + np.asarray(array.shape, dtype=">u4").tobytes()
    blob = header + np.ascontiguousarray(array, dtype=_DTYPES[code]).tobytes()
    if compress is None:
        compress = path.suffix == ".gz"
    path.write_bytes(gzip.compress(blob, mtime=0) if compress else blob)
    return path
