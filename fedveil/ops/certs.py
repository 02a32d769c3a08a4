"""Keys and certificates for a test deployment, made with `cryptography`.

`fedveil certs` writes a private CA, a server certificate signed by it (for
the Fleet API and the HTTP API) and, optionally, SuperNode key pairs for
client authentication:

  ca.pem / ca.key            the CA (keep ca.key offline in a real deployment)
  server.pem / server.key    TLS certificate for the given host names and IPs
  clients/<name>.key|.pub    SuperNode auth keys (OpenSSH format, NIST P-256)

Production deployments bring certificates from their own PKI; this is for
trying the secure path end to end without one. Private keys are written 0600
and never overwritten unless asked.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from fedveil.ops.private_file import write_private_file

DEFAULT_HOSTS = ("localhost", "127.0.0.1", "::1")
# SuperNode authentication keys: P-256 (ECDSA with SHA-256). Every Fleet request is
# signed with it and verified by the SuperLink, so its cost is paid ~380 times a second
# by a 1,000-device fleet: a P-256 verification costs 0.47 ms here against 1.58 ms for
# P-384. P-256 gives a 128-bit security level, the level of the TLS connection the
# request rides on (AES-128/256 with a P-256 or X25519 key exchange), and NIST SP 800-57
# accepts it beyond 2030; it is a NIST curve, as Flower's SuperLink requires (it accepts
# P-256, P-384 and P-521: keys enrolled before, on P-384, keep working). The signature
# only authenticates a device's requests to the coordinator (an attacker who forged
# one could act as that device, never read another's update: secure aggregation's keys
# are separate).
CLIENT_CURVE = ec.SECP256R1()


class CertError(ValueError):
    """A key or certificate cannot be written or read."""


@dataclass(frozen=True)
class TlsFiles:
    ca: Path
    cert: Path
    key: Path


def _write_private(path: Path, data: bytes, force: bool) -> None:
    if path.exists() and not force:
        raise CertError(f"{path} exists; pass --force to replace it")
    path.parent.mkdir(parents=True, exist_ok=True)
    # A new 0600 file (never an old one's mode, never through a link): no window in which
    # the key is readable by others.
    try:
        write_private_file(path, data)
    except OSError as exc:
        raise CertError(str(exc)) from None


def _write_public(path: Path, data: bytes, force: bool) -> None:
    if path.exists() and not force:
        raise CertError(f"{path} exists; pass --force to replace it")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "fedveil test deployment"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _san(hosts: list[str]) -> x509.SubjectAlternativeName:
    entries: list[x509.GeneralName] = []
    for host in hosts:
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            entries.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(entries)


def create_ca(out: Path, *, days: int = 365, force: bool = False) -> tuple[Path, Path]:
    """A self-signed CA (ca.pem, ca.key) in `out`."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.timezone.utc)
    name = _name("fedveil test CA")
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .sign(key, hashes.SHA256())
    )
    ca_pem, ca_key = out / "ca.pem", out / "ca.key"
    _write_private(ca_key, _pem_key(key), force)
    _write_public(ca_pem, cert.public_bytes(serialization.Encoding.PEM), force)
    return ca_pem, ca_key


def create_server_cert(
    out: Path,
    ca_pem: Path,
    ca_key: Path,
    hosts: list[str],
    *,
    days: int = 365,
    force: bool = False,
) -> tuple[Path, Path]:
    """server.pem / server.key for `hosts` (DNS names or IPs), signed by the CA."""
    if not hosts:
        raise CertError("at least one --host is needed for the server certificate")
    ca_cert = x509.load_pem_x509_certificate(ca_pem.read_bytes())
    ca_private = serialization.load_pem_private_key(ca_key.read_bytes(), password=None)
    if not isinstance(ca_private, ec.EllipticCurvePrivateKey):
        raise CertError(f"{ca_key}: not an EC private key")
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(hosts[0]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_san(hosts), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_private.public_key()), False
        )
        .sign(ca_private, hashes.SHA256())
    )
    pem, key_path = out / "server.pem", out / "server.key"
    _write_private(key_path, _pem_key(key), force)
    _write_public(pem, cert.public_bytes(serialization.Encoding.PEM), force)
    return pem, key_path


def create_client_key(out: Path, name: str, *, force: bool = False) -> tuple[Path, Path]:
    """A SuperNode authentication key pair: <name>.key (private) and <name>.pub (OpenSSH)."""
    if not name or "/" in name or name.startswith("."):
        raise CertError(f"client key name {name!r}: use letters, digits, '-' or '_'")
    key = ec.generate_private_key(CLIENT_CURVE)
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    key_path, pub_path = out / f"{name}.key", out / f"{name}.pub"
    _write_private(key_path, private, force)
    _write_public(pub_path, public + f" fedveil-{name}\n".encode(), force)
    return key_path, pub_path


def load_client_public_key(text: str) -> ec.EllipticCurvePublicKey:
    """Parse an OpenSSH EC public key as `fedveil clients enroll` accepts it."""
    try:
        key = serialization.load_ssh_public_key(text.strip().encode())
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        raise CertError(f"public_key: not an OpenSSH public key ({exc})") from None
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name not in (
        "secp256r1",
        "secp384r1",
        "secp521r1",
    ):
        raise CertError("public_key: must be an ECDSA key on a NIST curve (P-256/384/521)")
    return key


def public_key_pem(key: ec.EllipticCurvePublicKey) -> bytes:
    """The key in the form Flower's SuperLink registers (PEM SubjectPublicKeyInfo)."""
    return key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def fingerprint(key: ec.EllipticCurvePublicKey) -> str:
    """SHA-256 of the DER public key, hex: a short stable name for logs and listings."""
    digest = hashes.Hash(hashes.SHA256())
    digest.update(
        key.public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return digest.finalize().hex()[:16]


def create_test_deployment(
    out: Path, hosts: list[str], clients: int = 0, *, days: int = 365, force: bool = False
) -> dict[str, Path]:
    """CA + server certificate (+ `clients` SuperNode keys client-0..N-1) in `out`."""
    ca_pem, ca_key = create_ca(out, days=days, force=force)
    pem, key = create_server_cert(out, ca_pem, ca_key, hosts, days=days, force=force)
    files = {"ca": ca_pem, "ca_key": ca_key, "cert": pem, "key": key}
    for i in range(clients):
        k, p = create_client_key(out / "clients", f"client-{i}", force=force)
        files[f"client-{i}.key"], files[f"client-{i}.pub"] = k, p
    return files
