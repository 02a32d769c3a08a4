"""`fedveil data`: fetch datasets on explicit request, and show how a config splits them."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from fedveil.config import load_config


def add_data(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("data", help="datasets: download, partition report")
    dsub = p.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    dl = dsub.add_parser(
        "download",
        help="download a dataset (the only command that uses the network)",
        description="Download Fashion-MNIST from its official source into the user cache "
        "(or --dest), verifying checksums. Offline alternative on Debian/Ubuntu: "
        "apt-get install dataset-fashion-mnist.",
    )
    dl.add_argument("name", choices=["fashion-mnist"])
    dl.add_argument("--dest", help="target directory (default: the user cache)")
    dl.set_defaults(func=cmd_download)
    rep = dsub.add_parser(
        "report",
        help="per-client sizes and label histograms for a config's partition",
    )
    rep.add_argument("--config", help="TOML file")
    rep.add_argument("--clients", dest="data.num_clients", type=int)
    rep.add_argument("--partition", dest="data.partition")
    rep.add_argument("--alpha", dest="data.alpha", type=float)
    rep.add_argument("--dataset", dest="data.dataset")
    rep.add_argument("--seed", dest="seed", type=int)
    rep.add_argument("--json", action="store_true", help="print the whole report as JSON")
    rep.set_defaults(func=cmd_report)


def cmd_download(args: argparse.Namespace) -> int:
    from fedveil.data.fashion_mnist import download_fashion_mnist

    dest = download_fashion_mnist(Path(args.dest) if args.dest else None)
    print(f"Fashion-MNIST saved in {dest}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    overrides = {k: v for k, v in vars(args).items() if "." in k or k == "seed"}
    overrides = {k: v for k, v in overrides.items() if v is not None}
    cfg = load_config(args.config, overrides)
    from fedveil.data.partition import format_partition_report, partition_report
    from fedveil.tasks import make_task

    task = make_task(cfg)
    report = partition_report(task.info["parts"], task.info["labels"], task.num_classes)
    if args.json:
        print(json.dumps(report, default=lambda v: v.tolist()))
    else:
        print(format_partition_report(report))
    return 0
