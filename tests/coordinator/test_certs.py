"""`fedveil certs`: a CA, a server certificate that TLS accepts, SuperNode keys Flower accepts."""

from __future__ import annotations

import ipaddress
import socket
import ssl
import stat
import threading

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_ssh_private_key

from fedveil.ops.certs import (
    CertError,
    create_client_key,
    create_test_deployment,
    fingerprint,
    load_client_public_key,
)


def handshake(files, cafile, server_name="localhost") -> str:
    """A real TLS handshake on loopback; returns what the client saw or raises."""
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(files["cert"], files["key"])
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]

    def serve() -> None:
        conn, _ = listener.accept()
        try:
            with server_ctx.wrap_socket(conn, server_side=True) as tls:
                tls.sendall(b"hello over tls")
        except (ssl.SSLError, OSError):
            pass

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    client_ctx = ssl.create_default_context(cafile=str(cafile))
    try:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
            client_ctx.wrap_socket(raw, server_hostname=server_name) as tls,
        ):
            return tls.recv(100).decode()
    finally:
        t.join(10)
        listener.close()


def test_test_deployment_files_and_a_verified_tls_handshake(tmp_path):
    files = create_test_deployment(tmp_path, ["localhost", "127.0.0.1"], clients=2)
    for name in ("ca_key", "key", "client-0.key", "client-1.key"):
        assert stat.S_IMODE(files[name].stat().st_mode) == 0o600, name
    ca = x509.load_pem_x509_certificate(files["ca"].read_bytes())
    cert = x509.load_pem_x509_certificate(files["cert"].read_bytes())
    cert.verify_directly_issued_by(ca)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "localhost" in san.get_values_for_type(x509.DNSName)
    assert ipaddress.ip_address("127.0.0.1") in san.get_values_for_type(x509.IPAddress)
    assert handshake(files, files["ca"]) == "hello over tls"
    assert handshake(files, files["ca"], server_name="127.0.0.1") == "hello over tls"
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(files, files["ca"], server_name="elsewhere.example")
    other = create_test_deployment(tmp_path / "other", ["localhost"])
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(files, other["ca"])


def test_client_keys_are_what_flower_supernode_auth_loads(tmp_path):
    key_path, pub_path = create_client_key(tmp_path, "dev-1")
    private = load_ssh_private_key(key_path.read_bytes(), None)  # as flower-supernode does
    # P-256: the cheapest NIST curve to verify, at TLS's 128-bit level (issue 33).
    assert isinstance(private, ec.EllipticCurvePrivateKey) and private.curve.name == "secp256r1"
    public = load_client_public_key(pub_path.read_text())
    assert public.public_numbers() == private.public_key().public_numbers()
    assert (
        fingerprint(public) == fingerprint(private.public_key()) and len(fingerprint(public)) == 16
    )


ED25519 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl x"


def test_nothing_is_overwritten_and_bad_keys_are_named(tmp_path):
    create_test_deployment(tmp_path, ["localhost"])
    with pytest.raises(CertError, match="exists"):
        create_test_deployment(tmp_path, ["localhost"])
    create_test_deployment(tmp_path, ["localhost"], force=True)
    with pytest.raises(CertError, match="public_key"):
        load_client_public_key(
            "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl x"
        )
    with pytest.raises(CertError, match="public_key"):
        load_client_public_key("not a key")
    with pytest.raises(CertError, match="name"):
        create_client_key(tmp_path, "../escape")


def test_certs_command(tmp_path, fedveil_cli):
    out = tmp_path / "certs"
    proc = fedveil_cli("certs", "--out", str(out), "--clients", "1", "--host", "127.0.0.1")
    assert proc.returncode == 0, proc.stderr
    assert (out / "server.pem").exists() and (out / "clients" / "client-0.pub").exists()
    assert "(0o600)" in proc.stdout
    again = fedveil_cli("certs", "--out", str(out))
    assert again.returncode == 2 and "exists" in again.stderr


@pytest.mark.parametrize("curve", [ec.SECP256R1(), ec.SECP384R1(), ec.SECP521R1()])
def test_keys_on_every_nist_curve_stay_enrollable(curve):
    """P-256 is what `fedveil clients keygen` makes now; devices enrolled with P-384 before
    (or bringing P-521) are still accepted, as Flower's SuperLink accepts them."""
    key = ec.generate_private_key(curve).public_key()
    text = key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    assert load_client_public_key(text.decode()).public_numbers() == key.public_numbers()
