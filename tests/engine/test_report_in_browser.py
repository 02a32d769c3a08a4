"""The privacy report renders in a real browser (headless Chromium)."""

from __future__ import annotations

import shutil
import struct
import subprocess
import zlib

import pytest

from fedveil.config import load_config
from fedveil.simulations.run import simulate

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
