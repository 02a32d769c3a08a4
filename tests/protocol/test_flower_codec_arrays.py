"""The Flower codec builds a message's arrays without `np.save`, byte for byte as before.

`flower_codec.npy_array` writes numpy's own .npy header (cached per dtype and shape) and
the array's bytes; a peer reads them with `Array.numpy()` (np.load) exactly as it read
what `np.save` wrote. Every dtype and shape an Envelope can carry gives the same Array.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import Array

from fedveil.protocol.envelope import Envelope, MessageError
from fedveil.protocol.flower_codec import from_content, npy_array, to_content

CASES = {
    "model float32": np.random.default_rng(0).random(100_000).astype(np.float32),
    "ids uint64": np.arange(17, dtype=np.uint64),
    "masked uint32": np.random.default_rng(1).integers(0, 2**29, 1000, dtype=np.uint32),
    "empty": np.zeros(0, np.uint32),
    "2-d": np.arange(12, dtype=np.int64).reshape(3, 4),
    "fortran-ordered": np.arange(12.0).reshape(3, 4).T,
    "bool": np.array([True, False, True]),
    "0-d": np.array(3.5),
    "zero-size 3-d": np.zeros((2, 0, 3), np.float16),
    "big-endian": np.arange(5, dtype=">i4"),
    "bytes": np.array([b"ab", b"c"]),
    "unicode": np.array(["x", "yz"]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_npy_array_is_byte_for_byte_what_np_save_gives(name: str) -> None:
    value = CASES[name]
    expected, got = Array(np.ascontiguousarray(value)), npy_array(value)
    assert (got.dtype, got.shape, got.stype) == (expected.dtype, expected.shape, expected.stype)
    assert got.data == expected.data
    np.testing.assert_array_equal(got.numpy(), np.ascontiguousarray(value))


def test_object_arrays_are_still_refused() -> None:
    with pytest.raises(ValueError):  # np.save without pickles refuses them
        npy_array(np.array([object()], dtype=object))


def test_an_envelope_round_trips_through_the_codec() -> None:
    model = torch.arange(10, dtype=torch.float32)
    env = Envelope("train", 3, {"lr": 0.1}, {"model": model, "ids": np.arange(4, dtype=np.uint64)})
    back = from_content(to_content(env))
    assert (back.kind, back.round, back.config) == ("train", 3, {"lr": 0.1})
    np.testing.assert_array_equal(back.arrays["model"], model.numpy())
    np.testing.assert_array_equal(back.arrays["ids"], np.arange(4, dtype=np.uint64))


def _content_with(array: Array) -> object:
    content = to_content(Envelope("train", 1, {}, {}))
    content["arrays"]["x"] = array
    return content


@pytest.mark.parametrize("name", sorted(CASES))
def test_from_content_reads_every_array_as_np_load_does(name: str) -> None:
    """The decoder parses each distinct .npy header once (cached) and copies the data once;
    what it returns is what `np.load` returned: values, dtype, shape, order, writability."""
    array = Array(np.ascontiguousarray(CASES[name]))
    for _ in range(2):  # the second read hits the header cache
        got = from_content(_content_with(array)).arrays["x"]
        expected = array.numpy()
        np.testing.assert_array_equal(got, expected)
        assert (got.dtype, got.shape) == (expected.dtype, expected.shape)
        assert got.flags.writeable and got.flags.c_contiguous == expected.flags.c_contiguous


def test_a_fortran_header_is_read_in_fortran_order() -> None:
    value = np.asfortranarray(np.arange(12.0).reshape(3, 4))
    array = Array(value)  # np.save keeps the Fortran order and says so in the header
    assert b"'fortran_order': True" in array.data[:128]
    got = from_content(_content_with(array)).arrays["x"]
    np.testing.assert_array_equal(got, value)
    assert got.flags.f_contiguous


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda d: d[:-1], "carries fewer"),
        (lambda d: b"\x93NUMPX" + d[6:], "magic"),
        (lambda d: d[:6] + b"\x03\x00" + d[8:], "version"),
        (lambda d: d[:8] + (60_000).to_bytes(2, "little") + d[10:], "exceeds the limit"),
        (lambda d: d[:40], "cannot be decoded"),
        (lambda d: d.replace(b"<u4", b"|O8"), "cannot be decoded"),
    ],
)
def test_malformed_arrays_are_refused_naming_the_array(mutate: object, reason: str) -> None:
    data = Array(np.arange(100, dtype=np.uint32)).data
    bad = Array(dtype="uint32", shape=(100,), stype="numpy.ndarray", data=mutate(data))  # type: ignore[operator]
    with pytest.raises(MessageError, match=reason) as err:
        from_content(_content_with(bad))
    assert "'x'" in str(err.value)
