"""Identity keys and rosters on disk (malicious-server secure aggregation).

NAME.identity.key   the device's Ed25519 private key (PKCS#8 PEM, mode 0600);
                    made on the device and never leaves it
NAME.identity.pub   its public key, one base64 line: what the operator collects
roster.json         client id -> public key (privacy.secagg.identity.Roster),
                    copied by the operator to the coordinator and to every device
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedveil.privacy.secagg.identity import (
    ClientIdentity,
    Roster,
    RosterError,
    decode_public,
    encode_public,
    public_bytes,
)

MAX_ROSTER_BYTES = 128 << 20  # a million clients in base64 JSON is ~60 MB


def write_identity_key(out: Path, name: str, *, force: bool = False) -> tuple[Path, Path]:
    """Make a key pair from the OS CSPRNG; (private key path, public key path)."""
    if not name or "/" in name or name.startswith("."):
        raise RosterError(f"--name {name!r}: must be a plain file name")
    key_path, pub_path = out / f"{name}.identity.key", out / f"{name}.identity.pub"
    for p in (key_path, pub_path):
        if p.exists() and not force:
            raise RosterError(f"{p} exists; pass --force to replace it")
    out.mkdir(parents=True, exist_ok=True)
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    # 0600 from creation: no moment in which the key is readable by others.
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    os.chmod(key_path, 0o600)
    pub_path.write_text(encode_public(public_bytes(key)) + "\n")
    return key_path, pub_path


def load_identity_key(path: Path) -> Ed25519PrivateKey:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise RosterError(f"--identity-key {path}: {exc.strerror or exc}") from None
    mode = os.stat(path).st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise RosterError(
            f"--identity-key {path}: readable by other users (mode {stat.S_IMODE(mode):o}); "
            "chmod 600 it"
        )
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise RosterError(f"--identity-key {path}: not a PEM private key ({exc})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise RosterError(f"--identity-key {path}: not an Ed25519 key")
    return key


def read_public_key(source: str) -> bytes:
    """A public key from a NAME.identity.pub file, or the base64 text itself."""
    p = Path(source)
    text = p.read_text() if p.is_file() else source
    return decode_public(text.strip(), source)


def load_roster(path: Path, flag: str = "--roster") -> Roster:
    try:
        size = Path(path).stat().st_size
        if size > MAX_ROSTER_BYTES:
            raise RosterError(f"{flag} {path}: {size} bytes, at most {MAX_ROSTER_BYTES}")
        text = Path(path).read_bytes()
    except OSError as exc:
        raise RosterError(f"{flag} {path}: {exc.strerror or exc}") from None
    try:
        return Roster.from_json(text)
    except RosterError as exc:
        raise RosterError(f"{flag} {path}: {exc}") from None


@dataclass(frozen=True, repr=False)
class DeviceIdentity(ClientIdentity):
    """A ClientIdentity whose roster came from a file (so it has a fingerprint)."""

    roster: Roster


def load_client_identity(client_id: int, key_path: Path, roster_path: Path) -> DeviceIdentity:
    key, roster = load_identity_key(key_path), load_roster(roster_path)
    try:
        return DeviceIdentity(client_id, key, roster)
    except RosterError as exc:
        raise RosterError(f"--roster {roster_path} and --identity-key {key_path}: {exc}") from None
