"""Issue 18: a device started with --insecure against a TLS coordinator says that the
server requires TLS, instead of retrying "Connection attempt failed" forever."""

from __future__ import annotations

import contextlib
import socket
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from loopback_ports import free_port

from fedveil.client.edge.tls_probe import server_speaks_tls
from fedveil.ops.certs import create_ca, create_server_cert


@contextlib.contextmanager
def listener(tmp_path: Path, tls: bool) -> Iterator[int]:
    """A loopback server that completes TLS handshakes (tls) or speaks plain HTTP/2 bytes."""
    ctx = None
    if tls:
        ca, ca_key = create_ca(tmp_path)
        cert, key = create_server_cert(tmp_path, ca, ca_key, ["127.0.0.1"])
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        ctx.set_alpn_protocols(["h2"])
    srv = socket.create_server(("127.0.0.1", 0))
    srv.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            with contextlib.suppress(OSError, ssl.SSLError):
                conn.settimeout(2)
                if ctx is not None:
                    conn = ctx.wrap_socket(conn, server_side=True)
                else:  # a plaintext gRPC server: an HTTP/2 SETTINGS frame, then it reads
                    conn.sendall(b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
                    conn.recv(1024)
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield srv.getsockname()[1]
    finally:
        stop.set()
        thread.join(5)
        srv.close()


def test_the_probe_tells_tls_from_plaintext_and_from_nothing(tmp_path):
    with listener(tmp_path, tls=True) as port:
        # A generous timeout: the handshake with this process's own listener thread may
        # wait seconds for a core on a loaded machine (the claim is TLS, not speed).
        assert server_speaks_tls("127.0.0.1", port, timeout=30)
    with listener(tmp_path, tls=False) as port:
        assert not server_speaks_tls("127.0.0.1", port)
    port = free_port()  # nothing listens there, and no other test's server will
    assert not server_speaks_tls("127.0.0.1", port, timeout=1)


@pytest.mark.procs
def test_an_insecure_client_against_tls_names_the_cause_and_exits(tmp_path):
    data = tmp_path / "device.npz"
    rng = np.random.default_rng(0)
    np.savez(data, x=rng.random((20, 4), dtype=np.float32), y=rng.integers(0, 2, 20))
    with listener(tmp_path, tls=True) as port:
        proc = subprocess.run(
            [
                *(sys.executable, "-m", "fedveil.cli.main", "client", "--insecure"),
                *("--server", f"127.0.0.1:{port}", "--client-id", "0", "--data", str(data)),
                *("--state-dir", str(tmp_path / "state")),
            ],
            capture_output=True,
            text=True,
            timeout=120,  # the old client retried forever
        )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "the server requires TLS: drop --insecure and pass --ca" in proc.stderr
    assert not (tmp_path / "state" / "supernode.log").exists()  # no SuperNode was started
