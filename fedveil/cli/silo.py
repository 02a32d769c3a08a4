"""`fedveil silo`: one silo of a secure all-reduce run, as its own process.

Each silo trains on its own data and sums masked updates with the other silos over
torch.distributed (gloo on CPU, NCCL on GPU), with no coordinator. Start one per silo
with the same --config: `--rank R --world N --rendezvous tcp://HOST:PORT` (rank 0 hosts
the rendezvous store at HOST:PORT), or under torchrun (MASTER_ADDR, MASTER_PORT, RANK,
WORLD_SIZE). Key adverts are signed with each silo's identity key (`fedveil identity
keygen`) and checked against the roster of silo ranks (`fedveil identity roster`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def add_silo(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "silo",
        help="run one silo of a secure all-reduce (no coordinator)",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
    )
    p.add_argument("--config", help="the run's TOML file (the same at every silo)")
    p.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key"
    )
    p.add_argument("--rank", type=int, help="this silo's rank (its id in the roster)")
    p.add_argument("--world", type=int, help="number of silos (= data.num_clients)")
    p.add_argument(
        "--rendezvous",
        metavar="tcp://HOST:PORT",
        help="the store rank 0 hosts; "
        "without it, torchrun's MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE",
    )
    p.add_argument("--identity-key", required=True, help="this silo's Ed25519 identity key")
    p.add_argument("--roster", required=True, help="silo ranks -> identity public keys")
    p.add_argument("--out", required=True, help="this silo's output directory")
    p.add_argument(
        "--backend",
        choices=("gloo", "nccl"),
        default="gloo",
        help="gloo (CPU), or nccl (a GPU per silo: LOCAL_RANK's, else rank mod the GPUs) [gloo]",
    )
    p.add_argument(
        "--collective",
        choices=("all_reduce", "ring"),
        default="all_reduce",
        help="the backend's all_reduce, or a ring over send/recv [all_reduce]",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        help="seconds a collective or the store may wait for a peer before the attempt "
        "aborts and the survivors rerun the round [60]",
    )
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=cmd_silo)


def cmd_silo(args: argparse.Namespace) -> int:
    from fedveil.client.silo.process import SiloProcess, run_silo
    from fedveil.client.silo.rendezvous import from_environment, parse_address
    from fedveil.config import ConfigError, load_config
    from fedveil.config.run import parse_set
    from fedveil.privacy.secagg.identity_files import load_identity_key, load_roster

    overrides = {"server.aggregation": "allreduce", **parse_set(args.set)}
    cfg = load_config(args.config, overrides)
    if args.rendezvous is not None:
        if args.rank is None or args.world is None:
            raise ConfigError("--rendezvous needs --rank and --world")
        rdv = parse_address(args.rendezvous, args.rank, args.world)
    else:
        rdv = from_environment()
    if not (args.timeout > 0 and args.timeout <= 86_400):
        raise ConfigError(f"--timeout {args.timeout}: must be in (0, 86400]")
    process = SiloProcess(
        cfg=cfg,
        rendezvous=rdv,
        identity=load_identity_key(Path(args.identity_key)),
        roster=load_roster(Path(args.roster)),
        out=Path(args.out),
        backend=args.backend,
        collective=args.collective,
        timeout_s=args.timeout,
    )
    summary = run_silo(process)
    print(f"silo {rdv.rank}: {summary['rounds']} rounds -> {args.out}", file=sys.stderr)
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    return 0
