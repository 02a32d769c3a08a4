"""Hostile prediction bodies against a real `fedveil serve`: a zip bomb, a declared shape
of 1e11 rows, 100,000-deep JSON. Each is refused with 422 naming the limit, before the
server decompresses or parses it (its peak memory barely moves), and it goes on serving."""

from __future__ import annotations

import io
import json
import secrets
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from serve_harness import metric, predict_json, predict_npz, request, serving

from fedveil.builtin_models import build_model
from fedveil.flat_model import FlatModel
from fedveil.server.serving.inputs import InputError, check, decode

SHAPE = (1, 28, 28)
META = {
    "model": "cnn",
    "task": "fashion-mnist/cnn",
    "dataset": "fashion-mnist",
    "input_shape": json.dumps(list(SHAPE)),
    "num_classes": "10",
}
BOMB_BYTES = 256 << 20  # decompressed; about 256 KiB on the wire


@pytest.fixture(scope="module")
def cnn_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(7)
    flat = FlatModel(build_model("cnn", SHAPE, 10))
    path = tmp_path_factory.mktemp("model") / "cnn.safetensors"
    flat.save(flat.get(), str(path), metadata=META)
    return path


def npz_declaring(shape: tuple[int, ...], data_bytes: int, dtype: str = "<f4") -> bytes:
    """An NPZ whose inputs.npy header declares `shape` and whose data is `data_bytes`
    zero bytes (deflated: a few KiB per MiB), whatever the header says."""
    buf = io.BytesIO()
    with (
        zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z,
        z.open("inputs.npy", "w", force_zip64=True) as member,
    ):
        header = {"descr": dtype, "fortran_order": False, "shape": shape}
        np.lib.format.write_array_header_1_0(member, header)
        zeros = bytes(1 << 20)
        for start in range(0, data_bytes, len(zeros)):
            member.write(zeros[: min(len(zeros), data_bytes - start)])
    return buf.getvalue()


def _peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


@pytest.mark.procs
def test_bomb_huge_shape_and_deep_json_refused_before_the_work(
    cnn_file: Path, tmp_path: Path
) -> None:
    token = secrets.token_urlsafe(24)
    (tmp_path / "token").write_text(token)
    (tmp_path / "token").chmod(0o600)
    args = ["--model", str(cnn_file), "--token-file", str(tmp_path / "token")]
    rows = BOMB_BYTES // (4 * 28 * 28)
    bomb = npz_declaring((rows, *SHAPE), BOMB_BYTES)
    assert len(bomb) < 2 << 20
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/x-npz"}
    url_of = "{}/v1/models/cnn/predict".format
    with serving(args, tmp_path) as served:
        url = url_of(served.url)
        x = np.zeros((2, *SHAPE), np.float32)
        assert predict_npz(served.url, "cnn", x, token)[0] == 200
        before = _peak_rss(served.proc.pid)

        status, _, body = request(url, bomb, headers)
        assert status == 422, body
        assert f"inputs: {rows} examples; a request takes 1 to 512" in json.loads(body)["detail"]
        # Refused on the header: the 256 MiB were never decompressed.
        grown = _peak_rss(served.proc.pid) - before
        assert grown < 48 << 20, f"peak RSS grew {grown >> 20} MiB on a 256 KiB body"

        # A declared 1e11 rows (23 TiB): 422 naming the row limit, not a 500.
        status, _, body = request(url, npz_declaring((10**11, *SHAPE), 0), headers)
        assert status == 422 and "a request takes 1 to 512" in json.loads(body)["detail"]

        # 100,000-deep JSON: 422 naming the depth limit, not a RecursionError (500).
        deep = b'{"inputs": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
        json_headers = {**headers, "Content-Type": "application/json"}
        status, _, body = request(url, deep, json_headers)
        assert status == 422, body
        assert "JSON nested 100001 deep; the limit is 7" in json.loads(body)["detail"]

        assert predict_npz(served.url, "cnn", x, token)[0] == 200  # still serving
        assert request(f"{served.url}/readyz")[0] == 200


def test_npz_data_beyond_its_header_is_refused() -> None:
    """The header declares one example; the member inflates to 64 MiB. Decompression
    stops one byte past the declared size, whatever the zip's size fields say."""
    lying = npz_declaring((1, *SHAPE), 64 << 20)
    with pytest.raises(InputError, match="holds more than the 3136 bytes its header declares"):
        decode(lying, "application/x-npz", SHAPE, 8)
    short = npz_declaring((2, *SHAPE), 100)
    with pytest.raises(InputError, match="holds 100 bytes, its header declares 6272"):
        decode(short, "application/x-npz", SHAPE, 8)
    with pytest.raises(InputError, match="dtype object"):
        decode(npz_declaring((1, *SHAPE), 0, dtype="|O"), "application/x-npz", SHAPE, 8)
    # An honest body, C and Fortran order, decodes to the same values.
    x = np.arange(2 * 784, dtype=np.float32).reshape(2, *SHAPE)
    for arr in (x, np.asfortranarray(x)):
        buf = io.BytesIO()
        np.savez_compressed(buf, inputs=arr)
        got, as_npz = decode(buf.getvalue(), "application/x-npz", SHAPE, 8)
        assert as_npz and np.array_equal(got, x)


def test_json_value_count_checked_before_parsing() -> None:
    many = b'{"inputs": [' + b"0," * 20_000 + b"0]}"
    with pytest.raises(InputError, match="more than 1632 values"):
        decode(many, "application/json", (1, 28, 28), 1)
    # Brackets inside strings are not nesting.
    ok = b'{"note": "[[[[[[[[[[", "inputs": [[1, 2]]}'
    got, _ = decode(ok, "application/json", (2,), 4)
    assert got.tolist() == [[1.0, 2.0]]


def test_a_model_file_never_chooses_code_to_import(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`fedveil serve --model model.safetensors` in a downloaded model's folder ran the
    module its metadata named (task_ref), found in the current directory. Now nothing
    is imported: the user must name the task."""
    from fedveil.cli.main import main

    module = f"fedveil_extra_task_{secrets.token_hex(4)}"
    marker = tmp_path / "ran"
    (tmp_path / f"{module}.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('pwned')\n"
        "def make(cfg):\n    raise SystemExit('never')\n"
    )
    flat = FlatModel(build_model("mlp", (8,), 3))
    meta = {"task_ref": f"{module}:make", "input_shape": "[8]", "num_classes": "3"}
    flat.save(flat.get(), str(tmp_path / "model.safetensors"), metadata=meta)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FEDVEIL_SERVE_TOKEN", "t" * 32)
    path_before = list(sys.path)
    status = main(["serve", "--model", "model.safetensors", "--insecure", "--port", "0"])
    assert status == 2
    assert f"names the custom task '{module}:make'" in capsys.readouterr().err
    assert not marker.exists(), "the model file's module was imported"
    assert module not in sys.modules
    assert sys.path == path_before  # the cwd was not put on sys.path


def test_json_checks_stay_linear_on_escapes() -> None:
    """Escaped quotes with no closing quote made a string pattern backtrack quadratically;
    brackets hidden in escaped strings still end in a 422, never a RecursionError."""
    start = time.process_time()  # CPU time: the backtracking's cost, not the machine's load
    with pytest.raises(InputError):
        decode(b'{"inputs": "' + b'\\"' * 2_000_000, "application/json", (8,), 4)
    assert time.process_time() - start < 5
    hidden = b'{"x": "' + b"]" * 5000 + b'\\n", "inputs": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    with pytest.raises(InputError, match="JSON nested too deep"):
        decode(hidden, "application/json", (8,), 4)


@pytest.mark.procs
def test_finite_inputs_whose_outputs_overflow_are_422_not_500(
    cnn_file: Path, tmp_path: Path
) -> None:
    # Every value is finite (the input check passes), but rows of +-3e38 overflow the
    # first convolution: inf - inf = NaN. JSON cannot carry NaN: it was a 500.
    x = np.full((3, *SHAPE), 3e38, np.float32)
    x[1, :, ::2, :] *= -1
    honest = np.zeros((2, *SHAPE), np.float32)
    with serving(["--model", str(cnn_file), "--public"], tmp_path) as served:
        for status, _, body in (
            predict_json(served.url, "cnn", x.tolist()),
            predict_npz(served.url, "cnn", x),
        ):
            detail = (body if isinstance(body, dict) else json.loads(body))["detail"]
            assert status == 422, detail
            assert "outputs for example 1 are NaN or infinite" in detail
        assert predict_npz(served.url, "cnn", honest)[0] == 200  # still serving
        text = request(f"{served.url}/metrics")[2].decode()
        labels = {"model": "cnn", "version": "cnn"}
        assert metric(text, "fedveil_serve_requests_total", **labels, code="422") == 2


@pytest.mark.parametrize("boolean", [b"true", b"false"])
def test_a_boolean_among_numbers_is_refused_naming_example_and_position(boolean: bytes) -> None:
    # numpy read [[3, true]] as [[3, 1]]: a boolean was served as the number 1 (or 0).
    shape = (1, 2, 2)
    body = b'{"inputs": [[[[1, 2], [3, 4]]], [[[5, 6], [7, ' + boolean + b"]]]]}"
    with pytest.raises(
        InputError,
        match=r"inputs\[1\]\[0\]\[1\]\[1\]: (true|false) is a boolean "
        r"\(example 1, position \[0\]\[1\]\[1\]\)",
    ):
        decode(body, "application/json", shape, 8)
    # The word inside a string elsewhere in the body is no boolean input.
    fine = b'{"inputs": [[[[1, 2], [3, 4]]]], "note": "' + boolean + b'"}'
    assert decode(fine, "application/json", shape, 8)[0].shape == (1, *shape)


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (b"9" * 400, "NaN or infinite"),  # an int past float's range: OverflowError, a 500
        (b"-" + b"9" * 4000, "NaN or infinite"),
        (b'"1"', "strings, booleans or nulls"),  # was parsed as 1.0
        (b"true", "true is a boolean"),
        (b"null", "strings, booleans or nulls"),
    ],
)
def test_json_values_that_are_not_float_numbers_are_refused(value: bytes, says: str) -> None:
    shape = (1, 2, 2)
    row = b"[[[" + value + b", " + value + b"], [" + value + b", " + value + b"]]]"
    with pytest.raises(InputError, match=says):
        check(decode(b'{"inputs": [' + row + b"]}", "application/json", shape, 8)[0], shape, 8)
    # An integer past int64 but within float32's range is the number it says.
    big = decode(
        b'{"inputs": [[[[' + b"1" + b"0" * 30 + b", 2], [3, 4]]]]}", "application/json", shape, 8
    )
    assert check(big[0], shape, 8).ravel().tolist() == np.float32([1e30, 2, 3, 4]).tolist()
