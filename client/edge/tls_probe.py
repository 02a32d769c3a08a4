"""Does the coordinator's Fleet port speak TLS? Asked before a device started with
`--insecure` starts its SuperNode: against a TLS server, Flower's plaintext gRPC channel
only logs "Connection attempt failed" and retries forever, which names no cause.

The probe opens one TCP connection and attempts a TLS handshake without verifying the
certificate (it learns only whether TLS is spoken, and sends nothing else). A plaintext
gRPC server answers a ClientHello with an HTTP/2 error or closes, so the handshake fails.
"""

from __future__ import annotations

import socket
import ssl


def server_speaks_tls(host: str, port: int, timeout: float = 3.0) -> bool:
    """True when `host:port` completes a TLS handshake; False if it does not, or cannot be
    reached (then nothing is known, and the SuperNode's own retries take over)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # a probe: whether TLS is spoken, not whom to trust
    ctx.set_alpn_protocols(["h2"])  # gRPC's; some servers refuse a hello without it
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
        with ctx.wrap_socket(sock, server_hostname=host.strip("[]")):
            return True
    except (OSError, ssl.SSLError):
        return False


def insecure_against_tls_error(server: str) -> str:
    """The error a device started with --insecure reports against a TLS server."""
    return (
        f"--server {server}: the server requires TLS: drop --insecure and pass --ca "
        "(the coordinator's CA certificate, e.g. certs/ca.pem)"
    )
