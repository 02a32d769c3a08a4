"""The privacy report renders in a real browser (headless Chromium)."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

from fedveil.config import load_config
from fedveil.simulations.simulate_run import simulate

pytestmark = pytest.mark.procs  # starts processes: not in make test-fast

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def png_pixels(data: bytes) -> tuple[int, int, bytes]:
    """Width, height and raw scanlines of an 8-bit RGB(A) PNG (enough to check it is not blank)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width, height = 8, b"", 0, 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            width, height = struct.unpack(">II", body[:8])
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    return width, height, zlib.decompress(idat)


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (make test installs it)")
def test_privacy_report_renders_with_charts(tmp_path):
    cfg = load_config(
        None,
        {
            "model.task": "tiny_task:make",
            "data.num_clients": 12,
            "server.per_round": 6,
            "server.rounds": 4,
            "server.sampling": "poisson",
            "dp.mechanism": "central",
            "dp.epsilon": 8.0,
            "out": str(tmp_path / "run"),
        },
    )
    simulate(cfg)
    page = tmp_path / "run" / "privacy" / "report.html"
    html = page.read_text()
    assert "http://" not in html and "https://" not in html  # self-contained
    profile = tmp_path / "profile"
    dom = subprocess.run(
        [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "--dump-dom", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    assert "<svg" in dom and ("<polyline" in dom or "<path" in dom)
    assert "epsilon" in dom.lower()
    shot = tmp_path / "report.png"
    subprocess.run(
        [
            CHROMIUM,
            *FLAGS,
            f"--user-data-dir={profile}",
            f"--screenshot={shot}",
            "--window-size=1200,1600",
            page.as_uri(),
        ],
        capture_output=True,
        timeout=120,
        check=True,
    )
    width, height, raw = png_pixels(shot.read_bytes())
    assert (width, height) == (1200, 1600)
    assert len(set(raw[:: max(1, len(raw) // 50_000)])) > 20  # not a blank page


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (make test installs it)")
def test_operator_report_marks_noise_only_rounds_and_the_public_one_does_not(tmp_path):
    # Seeded cohorts and simulated dropout: rounds 2 and 3 of this seed release noise alone.
    cfg = load_config(
        None,
        {
            "model.task": "tiny_task:make",
            "data.num_clients": 4,
            "server.per_round": 2,
            "server.rounds": 4,
            "dp.mechanism": "central",
            "dp.epsilon": 8.0,
            "dp.seeded_cohorts": True,
            "simulation.dropout": 0.85,
            "simulation.workers": 1,
            "out": str(tmp_path / "run"),
        },
    )
    simulate(cfg)
    run = tmp_path / "run"
    annex = [
        json.loads(line) for line in (run / "private" / "rounds.jsonl").read_text().splitlines()
    ]
    empty = [r["round"] for r in annex if r.get("applied") and r.get("cohort_aggregated") == 0]
    assert empty, "this seed should give noise-only rounds"
    operator = json.loads((run / "private" / "report.json").read_text())
    assert operator["noise_only_rounds"] == empty
    assert (run / "private" / "report.html").stat().st_mode & 0o077 == 0
    public = (run / "privacy" / "report.json").read_text()
    assert 'noise_only_rounds"' not in public and "neither those rounds nor their number" in public
    profile = tmp_path / "profile"
    dom = subprocess.run(
        [
            CHROMIUM,
            *FLAGS,
            f"--user-data-dir={profile}",
            "--dump-dom",
            (run / "private" / "report.html").as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    listed = ", ".join(str(r) for r in empty)
    assert f"{len(empty)} of 4 released rounds were noise only" in dom and listed in dom
    assert "noise-only round</text>" in dom
    shot = tmp_path / "operator.png"
    subprocess.run(
        [
            CHROMIUM,
            *FLAGS,
            f"--user-data-dir={profile}",
            f"--screenshot={shot}",
            "--window-size=1200,1600",
            (run / "private" / "report.html").as_uri(),
        ],
        capture_output=True,
        timeout=120,
        check=True,
    )
    width, height, raw = png_pixels(shot.read_bytes())
    assert (width, height) == (1200, 1600) and len(set(raw[:: max(1, len(raw) // 50_000)])) > 20
    keep = os.environ.get("FEDVEIL_REPORT_SHOTS")  # a folder to look at them in
    if keep:
        shutil.copy(shot, Path(keep) / "privacy-report-operator.png")
