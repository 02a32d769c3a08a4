"""`fedveil identity keygen|roster|show`: identity keys for malicious-server secure aggregation.

Against a coordinator that may lie, clients check each other's signed key
advertisements with keys the coordinator cannot swap. Each device makes its
own Ed25519 key (`keygen`, on the device); the operator lists the public keys
by client id in a roster (`roster`) and copies that file to the coordinator
(server.toml: [secagg] roster) and to every device (fedveil client --roster),
by a channel the coordinator does not control. `show` prints a roster's
fingerprint, to compare copies.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_identity(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "identity",
        help="identity keys and rosters for malicious-server secure aggregation",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
    )
    isub = p.add_subparsers(dest="identity_command", required=True, metavar="ACTION")
    kg = isub.add_parser(
        "keygen", help="make this device's Ed25519 identity key (run it on the device)"
    )
    kg.add_argument("--name", required=True, help="file name stem, e.g. client-3")
    kg.add_argument("--out", default=".", help="directory [.]")
    kg.add_argument("--force", action="store_true", help="replace existing files")
    kg.set_defaults(func=cmd_keygen)
    ro = isub.add_parser(
        "roster",
        help="list client ids and their identity public keys in a roster file",
        description="Write a roster: each ID=KEY names a client id and its public key "
        "(a NAME.identity.pub file or the base64 text). Prints the roster's fingerprint.",
    )
    ro.add_argument("entries", nargs="+", metavar="ID=KEY")
    ro.add_argument("--out", required=True, help="roster file to write (JSON)")
    ro.add_argument("--force", action="store_true", help="replace an existing file")
    ro.set_defaults(func=cmd_roster)
    sh = isub.add_parser("show", help="a roster's client count and fingerprint")
    sh.add_argument("roster")
    sh.set_defaults(func=cmd_show)


def cmd_keygen(args: argparse.Namespace) -> int:
    from fedveil.privacy.secagg.identity_files import write_identity_key

    key, pub = write_identity_key(Path(args.out), args.name, force=args.force)
    print(f"wrote {key} (private, mode 0600: keep it on this device)")
    print(f"wrote {pub} (public: give it to the operator for the roster)")
    return 0


def cmd_roster(args: argparse.Namespace) -> int:
    from fedveil.privacy.secagg.identity_files import read_public_key
    from fedveil.privacy.secagg.identity_keys import Roster, RosterError

    keys: dict[int, bytes] = {}
    for entry in args.entries:
        cid, sep, source = entry.partition("=")
        if not sep or not cid.isdigit():
            raise RosterError(f"{entry!r}: expected ID=KEY, e.g. 3=client-3.identity.pub")
        if int(cid) in keys:
            raise RosterError(f"{entry!r}: client {int(cid)} is listed twice")
        if source.endswith(".pub") and not Path(source).is_file():  # not base64 text either
            raise RosterError(
                f"{entry!r}: no such file {source}; give the NAME.identity.pub that "
                "`fedveil identity keygen` wrote on the device, or the key's base64 text"
            )
        keys[int(cid)] = read_public_key(source)
    roster = Roster(keys)
    out = Path(args.out)
    if out.exists() and not args.force:
        raise RosterError(f"{out} exists; pass --force to replace it")
    out.write_text(roster.to_json())
    print(f"wrote {out}: {len(roster)} clients, fingerprint {roster.fingerprint()}")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from fedveil.privacy.secagg.identity_files import load_roster, read_public_key
    from fedveil.privacy.secagg.identity_keys import RosterError

    try:
        roster = load_roster(Path(args.roster), "roster")
    except RosterError:
        try:  # a device's public key given for the roster: say so, not "not JSON"
            is_key = Path(args.roster).is_file() and bool(read_public_key(args.roster))
        except (RosterError, ValueError, OSError):
            is_key = False
        if not is_key:
            raise
        raise RosterError(
            f"{args.roster} is a device's public key, not a roster: list it in one with "
            f"`fedveil identity roster ID={args.roster} ... --out roster.json`, then show that"
        ) from None
    ids = list(roster)
    span = f"ids {ids[0]}..{ids[-1]}" if ids else "empty"
    print(f"{args.roster}: {len(roster)} clients ({span}), fingerprint {roster.fingerprint()}")
    return 0
