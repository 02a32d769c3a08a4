"""IDX reader/writer on small generated files."""

import gzip

import numpy as np
import pytest

from fedveil.data.idx import IdxFormatError, read_idx, write_idx


@pytest.mark.parametrize("compress", [True, False])
@pytest.mark.parametrize(
    "array",
    [
        np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4),
        np.array([7, 0, 9], dtype=np.uint8),
        np.array([[-1, 2], [3, -4]], dtype=np.int8),
        np.array([1, -30000, 30000], dtype=np.int16),
        np.array([[1, -(2**31)], [2**31 - 1, 0]], dtype=np.int32),
        np.linspace(-1, 1, 6, dtype=np.float32).reshape(3, 2),
        np.linspace(-1, 1, 4, dtype=np.float64),
    ],
    ids=["u8-3d", "u8-1d", "i8", "i16", "i32", "f32", "f64"],
)
def test_roundtrip(tmp_path, array, compress):
    path = write_idx(tmp_path / "a.idx", array, compress=compress)
    assert path.read_bytes().startswith(b"\x1f\x8b") == compress
    out = read_idx(path)
    assert out.dtype == array.dtype and out.dtype.isnative
    np.testing.assert_array_equal(out, array)
    assert out.flags.writeable  # torch.from_numpy needs writable memory


def test_known_header_bytes(tmp_path):
    # MNIST label file header: 0x00000801, then the count, big-endian.
    path = write_idx(tmp_path / "labels", np.array([1, 2, 3], dtype=np.uint8))
    assert path.read_bytes() == bytes.fromhex("00000801 00000003 010203")


def test_gzip_is_detected_by_content_not_name(tmp_path):
    src = tmp_path / "raw"
    write_idx(src, np.arange(5, dtype=np.uint8))
    renamed = tmp_path / "looks-raw-but-is-gzip"
    renamed.write_bytes(gzip.compress(src.read_bytes()))
    np.testing.assert_array_equal(read_idx(renamed), np.arange(5))
    misnamed = tmp_path / "raw-but-named.gz"
    misnamed.write_bytes(src.read_bytes())
    np.testing.assert_array_equal(read_idx(misnamed), np.arange(5))


def _raw(tmp_path, blob: bytes, gz: bool = False):
    path = tmp_path / ("f.gz" if gz else "f")
    path.write_bytes(gzip.compress(blob) if gz else blob)
    return path


@pytest.mark.parametrize("gz", [False, True])
def test_bad_magic(tmp_path, gz):
    path = _raw(tmp_path, bytes.fromhex("12340801 00000001 05"), gz)
    with pytest.raises(IdxFormatError, match="bad magic"):
        read_idx(path)


def test_unknown_type_code(tmp_path):
    with pytest.raises(IdxFormatError, match="type code 0x07"):
        read_idx(_raw(tmp_path, bytes.fromhex("00000701 00000001 05")))


def test_zero_ndim(tmp_path):
    with pytest.raises(IdxFormatError, match="ndim=0"):
        read_idx(_raw(tmp_path, bytes.fromhex("00000800")))


@pytest.mark.parametrize("blob", ["00000801 00000003 0102", "00000801 00000003 01020304"])
def test_payload_size_mismatch(tmp_path, blob):
    with pytest.raises(IdxFormatError, match=r"payload is .* needs 3"):
        read_idx(_raw(tmp_path, bytes.fromhex(blob)))


def test_truncated_header(tmp_path):
    with pytest.raises(IdxFormatError, match="truncated header"):
        read_idx(_raw(tmp_path, bytes.fromhex("00000803 00000001")))
    with pytest.raises(IdxFormatError, match="too short"):
        read_idx(_raw(tmp_path, b"\x00\x00"))


def test_corrupt_gzip(tmp_path):
    blob = gzip.compress(bytes.fromhex("00000801 00000003 010203"))
    path = tmp_path / "broken.gz"
    path.write_bytes(blob[:-6])  # cut off the CRC/length trailer
    with pytest.raises(IdxFormatError, match="corrupt gzip"):
        read_idx(path)


def test_expected_ndim_and_dtype(tmp_path):
    path = write_idx(tmp_path / "a", np.zeros((2, 2), dtype=np.uint8))
    with pytest.raises(IdxFormatError, match="ndim=2, expected 3"):
        read_idx(path, expected_ndim=3)
    with pytest.raises(IdxFormatError, match="expected int32"):
        read_idx(path, expected_dtype=np.int32)


def test_write_rejects_unsupported_dtype(tmp_path):
    with pytest.raises(ValueError, match="no IDX type code"):
        write_idx(tmp_path / "a", np.zeros(3, dtype=np.int64))
