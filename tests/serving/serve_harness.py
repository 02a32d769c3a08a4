"""A real `fedveil serve` process on loopback, and small HTTP helpers for the tests."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedveil.ops.procs import spawn, stop_group

STARTUP = re.compile(r"fedveil serve: .* on (https?://[^/\s]+)/")


@dataclass
class Served:
    url: str
    log: Path
    proc: subprocess.Popen[bytes]

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@contextmanager
def serving(args: list[str], tmp: Path, env: dict[str, str] | None = None) -> Iterator[Served]:
    """`fedveil serve ARGS --insecure --port 0`, until its start-up line; stopped after."""
    log = tmp / f"serve-{time.monotonic_ns()}.log"
    full_env = {**os.environ, **(env or {})}
    with log.open("wb") as out:
        proc = spawn(
            [sys.executable, "-m", "fedveil.cli.main", "serve", *args, "--insecure", "--port", "0"],
            env=full_env,
            log=out,
        )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            found = STARTUP.search(log.read_text(errors="replace"))
            if found:
                break
            if proc.poll() is not None:
                raise AssertionError(f"fedveil serve exited {proc.returncode}:\n{log.read_text()}")
            time.sleep(0.1)
        else:
            raise AssertionError(f"fedveil serve did not start:\n{log.read_text()}")
        served = Served(found.group(1), log, proc)
        _wait_ready(served.url)
        yield served
    finally:
        stop_group(proc)


def _wait_ready(url: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if request(url + "/readyz")[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{url}/readyz never answered 200")


def request(
    url: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], bytes]:
    """(status, headers (lower-case names), body); HTTP errors are returned, not raised."""
    req = urllib.request.Request(url, data=body, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()


def npz(**arrays: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def predict_json(
    url: str, name: str, inputs: object, token: str | None = None
) -> tuple[int, dict[str, str], dict]:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    body = json.dumps({"inputs": inputs}).encode()
    status, h, raw = request(f"{url}/v1/models/{name}/predict", body, headers)
    return status, h, json.loads(raw)


def predict_npz(
    url: str, name: str, x: np.ndarray, token: str | None = None
) -> tuple[int, dict[str, str], bytes]:
    headers = {"Content-Type": "application/x-npz"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return request(f"{url}/v1/models/{name}/predict", npz(inputs=x), headers)


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one Prometheus sample (0 when absent)."""
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}", 1)[0]))
        if all(got.get(k) == v for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0
