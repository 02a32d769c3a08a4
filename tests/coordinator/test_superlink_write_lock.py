"""Issue 33: a Fleet request waits for SQLite's write lock instead of failing with a 500
(server/coordinator/sqlite_busy.py).

A real `fedveil server` (TLS, SuperNode authentication, its SuperLink child serving the
Fleet port) and one enrolled device whose ActivateNode is built and signed by Flower's
own client code. While another connection holds the SuperLink database's write lock
for longer than Flower's 5 s busy_timeout, as a fleet's queued writers do during a
secure round on a loaded machine, the device's request must wait and succeed. With
Flower's 5 s it was answered 500 ("database is locked"), which a SuperNode does not
retry.
"""

from __future__ import annotations

import sqlite3
import tempfile
import threading
import time
from pathlib import Path

import httpx
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from flwr.proto.fleet_pb2 import ActivateNodeRequest

from fedveil.benchmarks.fleet_coordinator import Coordinator
from fedveil.benchmarks.fleet_wire import build, capturing_client
from fedveil.ops.certs import CLIENT_CURVE

pytestmark = pytest.mark.procs  # starts `fedveil server` and its SuperLink

HOLD_S = 8.0  # longer than Flower's busy_timeout (5 s), far below the coordinator's


def test_a_fleet_request_waits_for_the_write_lock_instead_of_a_500() -> None:
    # Its own short temporary directory: a pytest path is too long for the SuperLink's socket.
    with tempfile.TemporaryDirectory(prefix="fv-lock-") as tmp:
        coord = Coordinator(Path(tmp))
        try:
            coord.start()
            key = ec.generate_private_key(CLIENT_CURVE)
            public = key.public_key()
            coord.enroll(
                1,
                public.public_bytes(
                    serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
                ).decode(),
            )
            pem = public.public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
            request = build(
                capturing_client(coord.fleet_address, key),
                "ActivateNode",
                ActivateNodeRequest(public_key=pem, heartbeat_interval=30.0),
            )
            db = sqlite3.connect(
                Path(tmp) / "state" / "superlink.db", isolation_level=None, check_same_thread=False
            )
            db.execute("BEGIN IMMEDIATE")  # the write lock, as a queued writer holds it
            held = threading.Event()
            releaser = threading.Timer(HOLD_S, lambda: (db.execute("COMMIT"), held.set()))
            started = time.monotonic()
            releaser.start()
            with httpx.Client(verify=str(coord.ca), timeout=60) as http:
                r = http.send(request)
            waited = time.monotonic() - started
            releaser.join()
            db.close()
        finally:
            coord.stop()
    assert held.is_set()
    assert r.status_code == 200, f"{r.status_code} after {waited:.1f} s: {r.text[:300]}"
    assert waited >= HOLD_S - 1.0  # it did wait for the lock, and got it
