"""`fedveil serve` as a user meets it: a real uvicorn process on loopback, real requests."""

from __future__ import annotations

import io
import json
import secrets
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
from docs_pages import code_blocks, section
from serve_harness import metric, predict_json, predict_npz, request, serving

from fedveil.builtin_models import build_model
from fedveil.cli.main import main
from fedveil.config import load_config
from fedveil.flat_model import FlatModel
from fedveil.server.registry import Registry
from fedveil.server.serving.loading import load_model_file
from fedveil.server.serving.versions import card_guarantee
from fedveil.simulations.simulate_run import simulate

PAGE = "how-to/registry-and-serving.md"
SHAPE = (1, 28, 28)
META = {
    "model": "cnn",
    "task": "fashion-mnist/cnn",
    "dataset": "fashion-mnist",
    "input_shape": json.dumps(list(SHAPE)),
    "num_classes": "10",
}


@pytest.fixture(scope="module")
def cnn_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(7)
    flat = FlatModel(build_model("cnn", SHAPE, 10))
    path = tmp_path_factory.mktemp("model") / "cnn.safetensors"
    flat.save(flat.get(), str(path), metadata=META)
    return path


def readme_snippet() -> str:
    code = code_blocks(section(PAGE, "Serving the model"), "python")
    assert code, f"docs/{PAGE}: 'Serving the model' lost its code block"
    return code[0]


def _expected(path: Path, x: np.ndarray) -> np.ndarray:
    model, _ = load_model_file(path)
    with torch.no_grad():
        return model(torch.from_numpy(x)).numpy()


def _outputs(raw: bytes) -> np.ndarray:
    with np.load(io.BytesIO(raw), allow_pickle=False) as f:
        return f["outputs"]


def test_predictions_token_and_bad_input(cnn_file: Path, tmp_path: Path) -> None:
    token = secrets.token_urlsafe(24)
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    args = ["--model", str(cnn_file), "--token-file", str(token_file)]
    args += ["--max-batch", "64", "--max-wait-ms", "1000", "--max-body-bytes", "400000"]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, *SHAPE)).astype(np.float32)
    want = _expected(cnn_file, x)
    with serving(args, tmp_path) as served:
        url, name = served.url, "cnn"
        # No token, a wrong token: refused, whatever the body.
        assert predict_json(url, name, x.tolist())[0] == 401
        assert predict_json(url, name, x.tolist(), token="x" * 32)[0] == 403

        status, headers, reply = predict_json(url, name, x.tolist(), token)
        assert status == 200 and headers["x-fedveil-model-version"] == "cnn"
        np.testing.assert_allclose(np.asarray(reply["outputs"], np.float32), want, atol=1e-5)
        status, headers, raw = predict_npz(url, name, x, token)
        assert status == 200 and headers["content-type"] == "application/x-npz"
        np.testing.assert_allclose(_outputs(raw), want, atol=1e-5)

        # Concurrent requests merge into one forward pass; each gets its own rows back.
        parts = [rng.standard_normal((16, *SHAPE)).astype(np.float32) for _ in range(4)]
        with ThreadPoolExecutor(4) as pool:
            replies = list(pool.map(lambda p: predict_npz(url, name, p, token), parts))
        for part, (status, _, raw) in zip(parts, replies, strict=True):
            assert status == 200
            np.testing.assert_allclose(_outputs(raw), _expected(cnn_file, part), atol=1e-5)

        bad = {
            "shape [5, 1, 28, 27], expected [N, 1, 28, 28]": predict_npz(
                url, name, x[..., :27], token
            ),
            "1 to 64": predict_npz(url, name, np.zeros((65, *SHAPE), np.float32), token),
            "NaN or infinite (first in example 3)": predict_npz(
                url, name, np.where(np.arange(5)[:, None, None, None] == 3, np.inf, x), token
            ),
            "dtype <U1 is not a real number type": predict_npz(
                url, name, np.full((1, *SHAPE), "a"), token
            ),
            "not a rectangular array of numbers": predict_json(url, name, [[1, 2], [3]], token),
            "784 value(s) are NaN or infinite (first in example 1)": predict_json(
                url,
                name,
                np.where(np.arange(5)[:, None, None, None] == 1, np.nan, x).tolist(),
                token,
            ),
            "the limit is 400000 bytes": predict_npz(
                url, name, np.zeros((200, *SHAPE), np.float32), token
            ),
        }
        for problem, (status, _, body) in bad.items():
            detail = body["detail"] if isinstance(body, dict) else json.loads(body)["detail"]
            assert status == 422 and problem in detail, (problem, detail)

        # Still serving, and everything counted against the version.
        assert predict_npz(url, name, x, token)[0] == 200
        text = request(f"{url}/metrics")[2].decode()
        labels = {"model": "cnn", "version": "cnn"}
        assert metric(text, "fedveil_serve_requests_total", **labels, code="200") == 7
        assert metric(text, "fedveil_serve_requests_total", **labels, code="422") == len(bad)
        assert metric(text, "fedveil_serve_rejected_total", reason="unauthorized") == 1
        assert metric(text, "fedveil_serve_rejected_total", reason="forbidden") == 1
        # 3 single requests, the merged 4 x 16 (64 rows: the batch is full), 1 after
        assert metric(text, "fedveil_serve_batch_rows_count", **labels) == 4
        assert metric(text, "fedveil_serve_batch_rows_bucket", **labels, le="32") == 3
        assert metric(text, "fedveil_serve_request_seconds_count", **labels) == 7 + len(bad)
        # /models needs the token too (it named the model file's absolute path, open).
        assert request(f"{url}/models")[0] == 401
        auth = {"Authorization": f"Bearer {token}"}
        status, _, raw = request(f"{url}/models", headers=auth)
        listed = json.loads(raw)["models"]
        assert [m["name"] for m in listed] == ["cnn"] and listed[0]["public"] is False
        assert str(cnn_file.parent) not in raw.decode()  # no path on the server's disk
        assert listed[0]["versions"][0]["source"] is None
        assert request(f"{url}/v1/models/other/predict", b"{}")[0] in (401, 404)
        assert token not in served.output()  # the secret never reaches the log
        # The page's client snippet, as it stands but for the address and the token.
        code = readme_snippet().replace("http://127.0.0.1:8480", url)
        code = code.replace("/models/fashion/", f"/models/{name}/").replace("TOKEN", token)
        exec(compile(code, f"docs/{PAGE}", "exec"), {})


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two versions of a model without DP in a fresh registry."""
    run = tmp_path_factory.mktemp("run")
    overrides = {
        "data.dataset": "digits",
        "model.name": "mlp",
        "server.rounds": 1,
        "data.num_clients": 4,
        "server.per_round": 4,
        "device": "cpu",
        "out": str(run),
    }
    simulate(load_config(None, overrides))
    root = tmp_path_factory.mktemp("registry")
    reg = Registry(root)
    reg.register(run, name="digits-demo")
    reg.register(run, name="digits-demo")
    return root


def test_public_canary_split_counts_each_version(registry: Path, tmp_path: Path) -> None:
    args = ["--model", "digits-demo@1", "--canary", "digits-demo@2", "--canary-share", "0.5"]
    x = np.zeros((2, 1, 8, 8), np.float32)
    with serving([*args, "--public"], tmp_path, env={"FEDVEIL_REGISTRY": str(registry)}) as s:
        seen = [predict_npz(s.url, "digits-demo", x) for _ in range(30)]
        assert {status for status, _, _ in seen} == {200}  # no token needed
        versions = [h["x-fedveil-model-version"] for _, h, _ in seen]
        assert set(versions) == {"1", "2"}  # P(one version only) = 2^-29
        text = request(f"{s.url}/metrics")[2].decode()
        for v in ("1", "2"):
            labels = {"model": "digits-demo", "version": v}
            count = metric(text, "fedveil_serve_requests_total", **labels, code="200")
            assert count == versions.count(v)
            assert metric(text, "fedveil_serve_rows_total", **labels) == 2 * count
        listed = json.loads(request(f"{s.url}/models")[2])["models"][0]
        assert [(v["version"], v["share"]) for v in listed["versions"]] == [("1", 0.5), ("2", 0.5)]
        assert [v["source"] for v in listed["versions"]] == ["digits-demo@1", "digits-demo@2"]
        assert all(v["dp_guarantee"] is None for v in listed["versions"])
        out = s.output()
    # Public and without DP: warned in the log and on the start-up line.
    assert "digits-demo@1 (digits-demo@1) has NO differential-privacy guarantee" in out
    assert "PUBLIC (no token) WITHOUT a DP guarantee" in out


def _serve_fails(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """`fedveil serve ARGS` refuses to start (exit status 2); its error message."""
    assert main(["serve", *args]) == 2
    return capsys.readouterr().err


def test_refused_configurations(
    cnn_file: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FEDVEIL_SERVE_TOKEN", raising=False)
    model = ["--model", str(cnn_file)]
    err = _serve_fails([*model, "--insecure", "--public", "--host", "0.0.0.0"], capsys)
    assert "--insecure with --host 0.0.0.0: plain HTTP is only served on loopback" in err
    err = _serve_fails([*model, "--insecure", "--host", "127.0.0.1"], capsys)
    assert "prediction needs a token" in err
    err = _serve_fails([*model, "--public"], capsys)
    assert "TLS needs --tls-cert and --tls-key" in err


def test_guarantee_from_card() -> None:
    dp = {"dp": "central", "epsilon": 2.0, "delta": 1e-5, "accountant": "pld"}
    assert card_guarantee({"privacy": dp}) == "(2, 1e-05)-DP (central, pld)"
    assert card_guarantee({"privacy": {"dp": "none", "epsilon": None}}) is None
    # A retrained model whose lineage includes a run without DP has no guarantee.
    assert card_guarantee({"privacy": dp, "lineage": {"composed": {"observers": None}}}) is None
    composed = {"observers": {"epsilon": 3.5, "delta": 2e-5}}
    assert card_guarantee({"privacy": dp, "lineage": {"composed": composed}}).startswith(
        "(3.5, 2e-05)-DP composed over its lineage"
    )
