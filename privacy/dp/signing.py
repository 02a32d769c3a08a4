"""Ed25519 signing keys for the privacy ledger, and the per-user key store.

The coordinator signs every ledger entry's hash, so a verifier holding the public
key rejects a chain that was edited and re-hashed. The key lives in a per-user
store (`$FEDVEIL_KEY_DIR`, else `~/.local/share/fedveil/keys/`, mode 700): on the
machine that produced a run, `fedveil privacy verify` finds the public key there by
its key id; elsewhere the auditor passes it with `--public-key`.

A key on the operator's own machine cannot stop the operator from re-signing a
rewritten chain; devices' witnessed heads (client/witness.py) catch that.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

KEY_DIR_ENV = "FEDVEIL_KEY_DIR"
SIGNING_KEY_NAME = "ledger-signing.key"
PUBLIC_KEY_SUFFIX = ".pub"
PUBLIC_KEY_BYTES = 32
SIGNATURE_BYTES = 64


class KeyStoreError(RuntimeError):
    """A key file is unreadable, malformed or readable by other users."""


def key_id_for(public_key_bytes: bytes) -> str:
    """Hex of the first 16 bytes of SHA-256 over the raw 32-byte public key."""
    if len(public_key_bytes) != PUBLIC_KEY_BYTES:
        raise ValueError(
            f"public key has {len(public_key_bytes)} bytes; an Ed25519 key has {PUBLIC_KEY_BYTES}"
        )
    return hashlib.sha256(public_key_bytes).digest()[:16].hex()


def verify_signature(public_key_bytes: bytes, signature: bytes, data: bytes) -> bool:
    """True iff `signature` is a valid Ed25519 signature of `data` under the key."""
    try:
        Ed25519PublicKey.from_public_bytes(public_key_bytes).verify(signature, data)
    except (InvalidSignature, ValueError):
        return False
    return True


class LedgerSigner:
    """An Ed25519 private key; `LedgerSigner.generate()` draws one from the OS CSPRNG."""

    def __init__(self, private_key: Ed25519PrivateKey) -> None:
        self._key = private_key
        self.public_key_bytes: bytes = private_key.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        self.key_id: str = key_id_for(self.public_key_bytes)

    @classmethod
    def generate(cls) -> LedgerSigner:
        # cryptography draws Ed25519 keys from the OS CSPRNG (OpenSSL's RAND_bytes).
        return cls(Ed25519PrivateKey.generate())

    def sign(self, data: bytes) -> bytes:
        return self._key.sign(data)

    def private_pem(self) -> bytes:
        return self._key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    def public_pem(self) -> bytes:
        return self._key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )


def key_dir() -> Path:
    """The per-user key store: $FEDVEIL_KEY_DIR, else ~/.local/share/fedveil/keys."""
    configured = os.environ.get(KEY_DIR_ENV)
    if configured:
        return Path(configured)
    return Path.home() / ".local" / "share" / "fedveil" / "keys"


def public_key_path(private_key_path: Path) -> Path:
    """Where the public key of a private key file is written (beside it)."""
    return private_key_path.with_suffix(PUBLIC_KEY_SUFFIX)


def load_or_create_signer(path: Path | None = None) -> LedgerSigner:
    """The signing key at `path` (None: the key store's), created on first use.

    The directory is made mode 700, the private key file 600 (written atomically,
    so two processes starting at once end up with the same key), and the public
    key is written beside it so the store can find it by key id.
    """
    if path is None:
        directory = key_dir()
        path = directory / SIGNING_KEY_NAME
    else:
        path = Path(path)
        directory = path.parent
    _make_private_directory(directory)
    if not path.exists():
        _create_key_file(path)
    signer = _read_private_key(path)
    public = public_key_path(path)
    if not public.exists() or load_public_key(public) != signer.public_key_bytes:
        _write_atomically(public, signer.public_pem(), 0o644, exclusive=False)
    return signer


def find_public_key(key_id: str) -> bytes | None:
    """The raw public key with this key id among the key store's *.pub files, or None."""
    directory = key_dir()
    if not directory.is_dir():
        return None
    for candidate in sorted(directory.glob("*" + PUBLIC_KEY_SUFFIX)):
        try:
            raw = load_public_key(candidate)
        except (KeyStoreError, OSError):
            continue
        if key_id_for(raw) == key_id:
            return raw
    return None


def load_public_key(path: str | os.PathLike[str]) -> bytes:
    """Raw 32-byte Ed25519 public key from a PEM file (as written here) or raw bytes."""
    data = Path(path).read_bytes()
    if len(data) == PUBLIC_KEY_BYTES:
        return data
    try:
        key = serialization.load_pem_public_key(data)
    except ValueError as error:
        raise KeyStoreError(f"{path}: not a PEM public key ({error})") from None
    if not isinstance(key, Ed25519PublicKey):
        raise KeyStoreError(f"{path}: a {type(key).__name__}, expected an Ed25519 public key")
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def _make_private_directory(directory: Path) -> None:
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(directory, 0o700)  # mkdir's mode is masked by the umask, and skipped if it existed


def _create_key_file(path: Path) -> None:
    signer = LedgerSigner.generate()
    # FileExistsError: another process created it first; use that one.
    with contextlib.suppress(FileExistsError):
        _write_atomically(path, signer.private_pem(), 0o600, exclusive=True)


def _read_private_key(path: Path) -> LedgerSigner:
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        raise KeyStoreError(
            f"{path}: private key has mode {mode:o}; allowed: 600 (readable by its owner only)"
        )
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except ValueError as error:
        raise KeyStoreError(f"{path}: not a PEM private key ({error})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyStoreError(f"{path}: a {type(key).__name__}, expected an Ed25519 private key")
    return LedgerSigner(key)


def _write_atomically(path: Path, data: bytes, mode: int, *, exclusive: bool) -> None:
    # Write a private temp file, fsync, then link (exclusive) or rename into place:
    # a reader never sees a half-written key.
    temp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        os.fchmod(fd, mode)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        if exclusive:
            os.link(temp, path)
        else:
            os.replace(temp, path)
    finally:
        if temp.exists():
            temp.unlink()
