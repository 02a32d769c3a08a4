"""Identity keys and rosters on disk (malicious-server secure aggregation).

NAME.identity.key   the device's Ed25519 private key (PKCS#8 PEM, mode 0600);
                    made on the device and never leaves it
NAME.identity.pub   its public key, one base64 line: what the operator collects
roster.json         client id -> public key (privacy.secagg.identity_keys.Roster),
                    copied by the operator to the coordinator and to every device
"""

from __future__ import annotations

import logging
import os
import stat
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedveil.ops.private_file import write_private_file
from fedveil.privacy.secagg.identity_keys import (
    ClientIdentity,
    Roster,
    RosterError,
    decode_public,
    encode_public,
    public_bytes,
)

MAX_ROSTER_BYTES = 128 << 20  # a million clients in base64 JSON is ~60 MB

log = logging.getLogger(__name__)


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
    # A new 0600 file (never an old one's mode, never through a link): no moment in which
    # the key is readable by others.
    try:
        write_private_file(key_path, pem)
    except OSError as exc:
        raise RosterError(str(exc)) from None
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


class RosterFile(Mapping[int, bytes]):
    """The roster in a file, re-read by `refresh` when the file has changed.

    The operator adds devices by replacing the file on every device (write the new roster
    next to it, then rename it over the old one): running devices take it at their next
    secure-aggregation request, without a restart. A version of the file that cannot be
    read, is not a valid roster, or no longer lists `owner` (this device's id and public
    key) is refused once with a warning, and the last good roster stays in force.
    """

    def __init__(
        self, path: Path, owner: tuple[int, bytes] | None = None, flag: str = "--roster"
    ) -> None:
        self.path, self._owner, self._flag = Path(path), owner, flag
        self._lock = threading.Lock()
        # Stamp before reading: a change made during the read is seen by the next refresh.
        self._stamp = self._file_stamp()
        self._roster = self._read()

    def _file_stamp(self) -> tuple[int, ...] | None:
        """What changes when the file is rewritten or replaced; None if it is gone."""
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    def _read(self) -> Roster:
        roster = load_roster(self.path, self._flag)
        if self._owner is not None:
            cid, key = self._owner
            listed = roster.get(cid)
            if listed is None:
                raise RosterError(f"{self._flag} {self.path}: has no key for client {cid}")
            if listed != key:
                raise RosterError(
                    f"{self._flag} {self.path}: the key listed for client {cid} is not this "
                    "device's identity key"
                )
        return roster

    def refresh(self) -> bool:
        """Take the file's roster if the file changed since it was last judged; True if a
        new roster was taken. Never raises: a bad version is logged and kept out."""
        with self._lock:
            stamp = self._file_stamp()
            if stamp == self._stamp:
                return False
            self._stamp = stamp  # each version of the file is judged once, good or bad
            kept = f"{len(self._roster)} clients, fingerprint {self._roster.fingerprint()}"
            try:
                roster = self._read()
            except RosterError as exc:
                log.warning("roster not taken: %s; keeping the one in force (%s)", exc, kept)
                return False
            self._roster = roster
        log.info(
            "roster %s re-read: %d clients, fingerprint %s (was %s)",
            self.path,
            len(roster),
            roster.fingerprint(),
            kept,
        )
        return True

    @property
    def current(self) -> Roster:
        """The roster in force (immutable: a later re-read replaces it, never changes it)."""
        return self._roster

    def fingerprint(self) -> str:
        return self._roster.fingerprint()

    def __getitem__(self, cid: int) -> bytes:
        return self._roster[cid]

    def __iter__(self) -> Iterator[int]:
        return iter(self._roster)

    def __len__(self) -> int:
        return len(self._roster)


@dataclass(frozen=True, repr=False)
class DeviceIdentity(ClientIdentity):
    """A ClientIdentity whose roster is a file, re-read when it changes (see RosterFile)."""

    roster: RosterFile

    def current_roster(self) -> Roster:
        self.roster.refresh()  # one stat per request; a re-read only when the file changed
        # One immutable roster per lookup, even if another request re-reads the file meanwhile.
        return self.roster.current


def load_client_identity(client_id: int, key_path: Path, roster_path: Path) -> DeviceIdentity:
    key = load_identity_key(key_path)
    roster = RosterFile(roster_path, owner=(client_id, public_bytes(key)))
    return DeviceIdentity(client_id, key, roster)
