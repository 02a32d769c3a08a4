"""Identity keys and rosters: strict decoding, one key per client, keys kept private."""

from __future__ import annotations

import json
import logging
import os

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedveil.privacy.secagg.identity_files import (
    load_client_identity,
    load_identity_key,
    load_roster,
    write_identity_key,
)
from fedveil.privacy.secagg.identity_keys import (
    ROSTER_FORMAT,
    ClientIdentity,
    Roster,
    RosterError,
    encode_public,
    public_bytes,
)


def keys(n: int) -> dict[int, bytes]:
    return {cid: public_bytes(Ed25519PrivateKey.generate()) for cid in range(n)}


def roster_json(clients: object, fmt: str = ROSTER_FORMAT) -> str:
    return json.dumps({"format": fmt, "clients": clients})


def test_a_roster_survives_its_json_and_its_fingerprint_ignores_order():
    listed = keys(5)
    roster = Roster(listed)
    again = Roster.from_json(roster.to_json())
    assert dict(again) == listed and again.fingerprint() == roster.fingerprint()
    shuffled = Roster(dict(reversed(list(listed.items()))))
    assert shuffled.fingerprint() == roster.fingerprint()
    other = dict(listed)
    other[2] = public_bytes(Ed25519PrivateKey.generate())
    assert Roster(other).fingerprint() != roster.fingerprint()


good = encode_public(public_bytes(Ed25519PrivateKey.generate()))


BAD_ROSTERS = [
    ("not json", "roster: not JSON"),
    ("[1]", "roster: must be a JSON object"),
    (roster_json({}, fmt="other/1"), "format: 'other/1'"),
    (roster_json([good]), "clients: must be an object"),
    (roster_json({"x1": good}), "clients: key 'x1' is not a client id"),
    (roster_json({"-1": good}), "is not a client id"),
    (roster_json({"99999999": good}), "is not a client id"),
    (roster_json({"3": "!!notbase64"}), "clients.3: not valid base64"),
    (roster_json({"3": "AAAA"}), "clients.3: 3 bytes, an Ed25519 public key has 32"),
    (roster_json({"3": 5}), "clients.3: must be a base64 string"),
    (roster_json({"1": good, "2": good}), "clients.2: the same key as client 1"),
]


# Ids from the expected message: the roster text holds a fresh random key, and ids must be
# the same in every collecting process (pytest-xdist compares them).
@pytest.mark.parametrize(("text", "message"), BAD_ROSTERS, ids=[m for _, m in BAD_ROSTERS])
def test_a_bad_roster_is_refused_naming_the_field(text, message):
    with pytest.raises(RosterError) as err:
        Roster.from_json(text)
    assert message in str(err.value)


def test_an_identity_must_match_its_roster_entry():
    key = Ed25519PrivateKey.generate()
    listed = keys(3)
    with pytest.raises(RosterError, match="not this identity key's public key"):
        ClientIdentity(1, key, Roster(listed))
    with pytest.raises(RosterError, match="has no key for client 7"):
        ClientIdentity(7, key, Roster(listed))
    listed[1] = public_bytes(key)
    identity = ClientIdentity(1, key, Roster(listed))
    assert identity.peer_keys([0, 1, 9]) == {0: listed[0], 1: listed[1]}
    assert "key=" not in repr(identity)


def test_keygen_writes_a_private_key_only_its_owner_can_read(tmp_path):
    key_path, pub_path = write_identity_key(tmp_path, "client-1")
    assert os.stat(key_path).st_mode & 0o777 == 0o600
    key = load_identity_key(key_path)
    assert pub_path.read_text().strip() == encode_public(public_bytes(key))
    with pytest.raises(RosterError, match="exists; pass --force"):
        write_identity_key(tmp_path, "client-1")
    os.chmod(key_path, 0o644)
    with pytest.raises(RosterError, match="readable by other users"):
        load_identity_key(key_path)
    os.chmod(key_path, 0o600)
    (tmp_path / "ec.key").write_bytes(
        b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"
    )
    os.chmod(tmp_path / "ec.key", 0o600)
    with pytest.raises(RosterError, match="not a PEM private key"):
        load_identity_key(tmp_path / "ec.key")


def test_the_cli_makes_keys_and_a_roster_a_device_can_load(tmp_path, monkeypatch, fedveil_cli):
    # In process (main([...])), in the folder the commands write to.
    monkeypatch.chdir(tmp_path)
    fedveil = fedveil_cli

    for cid in (0, 1):
        assert fedveil("identity", "keygen", "--name", f"c{cid}").returncode == 0
    made = fedveil(
        "identity", "roster", "0=c0.identity.pub", "1=c1.identity.pub", "--out", "r.json"
    )
    assert made.returncode == 0, made.stderr
    shown = fedveil("identity", "show", "r.json")
    fingerprint = load_roster(tmp_path / "r.json").fingerprint()
    assert fingerprint in made.stdout and fingerprint in shown.stdout
    identity = load_client_identity(1, tmp_path / "c1.identity.key", tmp_path / "r.json")
    assert identity.client_id == 1
    with pytest.raises(RosterError, match="client 0 is not this device's identity key"):
        load_client_identity(0, tmp_path / "c1.identity.key", tmp_path / "r.json")
    twice = fedveil("identity", "roster", "0=c0.identity.pub", "1=c0.identity.pub", "--out", "x")
    assert twice.returncode == 2 and "the same key as client 0" in twice.stderr
    # `show` of a public key said "roster c0.identity.pub: roster: not JSON (...)".
    key = fedveil("identity", "show", "c0.identity.pub")
    assert key.returncode == 2 and "c0.identity.pub is a device's public key, not a roster" in (
        key.stderr
    ), key.stderr
    # A mistyped file name read as base64 text: "c9.identity.pub: not valid base64".
    typo = fedveil("identity", "roster", "0=c0.identity.pub", "9=c9.identity.pub", "--out", "y")
    assert typo.returncode == 2 and "'9=c9.identity.pub': no such file c9.identity.pub" in (
        typo.stderr
    ), typo.stderr
    lonely = fedveil(
        "client",
        "--server",
        "127.0.0.1:1",
        "--client-id",
        "1",
        "--task",
        "a:b",
        "--identity-key",
        "c1.identity.key",
    )
    assert lonely.returncode == 2 and "--identity-key and --roster go together" in lonely.stderr


def publish(path, listed: dict[int, bytes]) -> None:
    """What an operator does: write the new roster beside the old one, rename it over."""
    fresh = path.with_name(path.name + ".new")
    fresh.write_text(Roster(listed).to_json())
    os.replace(fresh, path)


def test_a_device_takes_a_changed_roster_file_at_its_next_request(tmp_path, caplog):
    key_path, _ = write_identity_key(tmp_path, "c1")
    listed = {**keys(1), 1: public_bytes(load_identity_key(key_path))}
    path = tmp_path / "roster.json"
    publish(path, listed)
    identity = load_client_identity(1, key_path, path)
    assert identity.peer_keys([0, 1, 2]) == listed
    assert identity.roster.refresh() is False  # unchanged: not read again
    listed[2] = public_bytes(Ed25519PrivateKey.generate())
    publish(path, listed)
    with caplog.at_level(logging.INFO, logger="fedveil.privacy.secagg.identity_files"):
        assert identity.peer_keys([0, 1, 2]) == listed
    assert f"re-read: 3 clients, fingerprint {Roster(listed).fingerprint()}" in caplog.text
    # Rewritten in place (same file, no rename) is noticed too.
    listed[3] = public_bytes(Ed25519PrivateKey.generate())
    path.write_text(Roster(listed).to_json())
    assert identity.peer_keys([3]) == {3: listed[3]}


@pytest.mark.parametrize(
    ("version", "reason"),
    [
        (lambda listed: "{not json", "roster: not JSON"),
        (lambda listed: Roster({0: listed[0]}).to_json(), "has no key for client 1"),
        (
            lambda listed: Roster(
                {**listed, 1: public_bytes(Ed25519PrivateKey.generate())}
            ).to_json(),
            "the key listed for client 1 is not this device's identity key",
        ),
        (None, "No such file"),
    ],
)
def test_a_bad_new_roster_file_is_refused_and_the_last_good_one_stays(
    tmp_path, caplog, version, reason
):
    key_path, _ = write_identity_key(tmp_path, "c1")
    listed = {**keys(1), 1: public_bytes(load_identity_key(key_path))}
    path = tmp_path / "roster.json"
    publish(path, listed)
    identity = load_client_identity(1, key_path, path)
    if version is None:
        path.unlink()
    else:
        path.write_text(version(listed))
    with caplog.at_level(logging.INFO, logger="fedveil.privacy.secagg.identity_files"):
        assert identity.peer_keys([0, 1]) == listed
        assert identity.roster.refresh() is False
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings  # each version of the file is judged once
    assert reason in warnings[0] and "keeping the one in force (2 clients" in warnings[0]
    listed[5] = public_bytes(Ed25519PrivateKey.generate())
    publish(path, listed)  # the operator fixes it
    assert identity.peer_keys([0, 1, 5]) == listed
