"""`fedveil models list|show|promote|register`: the model registry from the command line."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

REGISTRY_HELP = (
    "the registry directory (default: $FEDVEIL_REGISTRY, else ~/.local/share/fedveil/registry)"
)


def add_models(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "models",
        help="the model registry: versions, model cards, the promoted version",
        description="Each registered model version keeps a copy of the run's model and a "
        "model card: task and model, rounds, central test accuracy, secure aggregation, "
        "each adversary's epsilon/delta/accountant and the signed ledger head (DP runs), "
        "and clients' statistics only for runs without DP.",
    )
    msub = p.add_subparsers(dest="models_command", required=True, metavar="ACTION")
    lst = msub.add_parser("list", help="the registered names, or one name's versions")
    lst.add_argument("name", nargs="?", help="list this model's versions")
    show = msub.add_parser("show", help="a version's model card")
    show.add_argument("ref", help="name@version, name@production, name@latest or name")
    promote = msub.add_parser("promote", help="make a version the one 'name' resolves to")
    promote.add_argument("name")
    promote.add_argument("version", type=int)
    reg = msub.add_parser(
        "register",
        help="register a run's model as the next version",
        description="Register RUN_DIR's final model (or --round N's, if the run still holds "
        "it) as the next version of --name. A DP run's ledger must verify.",
    )
    reg.add_argument("run_dir")
    reg.add_argument("--name", help="model name (default: from the task's name)")
    reg.add_argument("--round", type=int, dest="round_num", metavar="N", help="round N's model")
    reg.add_argument(
        "--parent",
        metavar="REF",
        help="the version this run started from (name@version): the card composes epsilon "
        "over the lineage (summed, unless --disjoint-users)",
    )
    reg.add_argument(
        "--disjoint-users",
        action="store_true",
        help="no user of the parent's runs took part in this one: the composed figure is "
        "the largest, not the sum",
    )
    for parser in (lst, show, promote, reg):
        parser.add_argument("--registry", metavar="DIR", help=REGISTRY_HELP)
        parser.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_models)


def cmd_models(args: argparse.Namespace) -> int:
    registry = open_registry(args.registry)
    action = args.models_command
    if action == "register":
        from fedveil.server.registry.divergence import divergence

        version = registry.register(
            Path(args.run_dir),
            name=args.name,
            round_num=args.round_num,
            parent=args.parent,
            same_users=not args.disjoint_users,
        )
        diverged = divergence(version.card)
        if diverged is not None:
            print(
                f"fedveil: warning: {version.ref}: the model diverged or learned nothing: "
                f"{diverged}",
                file=sys.stderr,
            )
        _out(args, version.card, f"registered {version.ref}")
    elif action == "promote":
        registry.promote(args.name, args.version)
        _out(
            args,
            {"name": args.name, "promoted": args.version},
            f"{args.name}@{args.version}: production",
        )
    elif action == "show":
        version = registry.resolve(args.ref)
        _out(args, {**version.card, "stage": version.stage}, "\n".join(card_lines(version)))
    elif args.name:
        rows = [_row(v) for v in registry.versions(args.name)]
        _out(args, rows, "\n".join(_table(rows)) if rows else f"{args.name}: no versions")
    else:
        names = [
            {"name": n, "versions": len(registry.versions(n)), "promoted": _promoted(registry, n)}
            for n in registry.names()
        ]
        text = "\n".join(
            f"{n['name']}  {n['versions']} version(s)  production: {n['promoted'] or '-'}"
            for n in names
        )
        _out(args, names, text or f"no models in {registry.root}")
    return 0


def open_registry(directory: str | None) -> Any:
    from fedveil.server.registry import Registry, default_registry_root

    return Registry(Path(directory) if directory else default_registry_root())


def card_lines(version: Any) -> list[str]:
    """A version's card in a few lines; `--json` prints it whole."""
    card = version.card
    privacy = card.get("privacy") or {}
    central = card.get("central_evaluation") or {}
    lines = [
        f"{version.ref} ({version.stage})  task {card.get('task')}  model {card.get('model')}",
        f"  rounds {card.get('rounds')}  central test accuracy "
        f"{_fmt(central.get('test_accuracy'))}  secure aggregation "
        f"{card.get('secure_aggregation')}",
        f"  run {card.get('source', {}).get('run_dir')}",
    ]
    if privacy.get("dp", "none") == "none":
        lines.append(f"  privacy: {privacy.get('statement')}")
        data = card.get("client_data") or {}
        lines.append(
            f"  clients {data.get('clients')}  partition {data.get('partition')}  federated "
            f"accuracy {_fmt(data.get('federated_accuracy'))}  examples {data.get('examples')}"
        )
    else:
        lines.append(f"  privacy: {privacy['dp']}, delta {privacy['delta']:g}")
        for adversary, figure in (privacy.get("adversaries") or {}).items():
            lines.append(f"    {adversary}: {_figure(figure)}")
        ledger = privacy.get("ledger") or {}
        lines.append(f"  ledger {ledger.get('state')}, head {ledger.get('head_hash')}")
    lineage = card.get("lineage")
    if lineage:
        composed = lineage.get("composed") or {}
        users = "same" if lineage.get("same_users") else "disjoint"
        lines.append(f"  parent {lineage.get('parent')}; composed ({users} users):")
        for adversary, figure in composed.items():
            lines.append(f"    {adversary}: {_figure(figure)}")
    return lines


def verify_card_option(card_arg: str, registry_dir: str | None, run_dir: Path, result: Any) -> bool:
    """`fedveil privacy verify RUN_DIR --card CARD`: whether the card agrees with the
    run's verified ledger; prints each field that differs."""
    from fedveil.server.registry import RegistryError
    from fedveil.server.registry.card_check import check_card

    registry = open_registry(registry_dir)
    model_path = None
    if Path(card_arg).is_file():
        try:
            card = json.loads(Path(card_arg).read_text())
        except ValueError as error:
            print(f"FAIL: card {card_arg}: not valid JSON ({error})", file=sys.stderr)
            return False
        if not isinstance(card, dict):
            print(f"FAIL: card {card_arg}: not a JSON object", file=sys.stderr)
            return False
        if (Path(card_arg).parent / "model.safetensors").is_file():
            model_path = Path(card_arg).parent / "model.safetensors"
    else:
        try:
            version = registry.resolve(card_arg)
        except RegistryError as error:
            print(f"FAIL: --card {card_arg}: {error}", file=sys.stderr)
            return False
        card, model_path = version.card, version.model_path
    check = check_card(
        card,
        run_dir,
        result=result,
        parent_card=registry.parent_card(card),
        model_path=model_path,
    )
    for problem in check.problems:
        print(f"FAIL: {problem}", file=sys.stderr)
    if check.ok:
        print(f"OK: card {card.get('name')}@{card.get('version')} agrees with the ledger")
    return check.ok


def _row(version: Any) -> dict[str, Any]:
    card = version.card
    privacy = card.get("privacy") or {}
    return {
        "ref": version.ref,
        "stage": version.stage,
        "rounds": card.get("rounds"),
        "test_accuracy": (card.get("central_evaluation") or {}).get("test_accuracy"),
        "dp": privacy.get("dp"),
        "epsilon": privacy.get("epsilon"),
        "registered_at": card.get("registered_at"),
    }


def _table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [f"{'version':<24} {'stage':<11} {'rounds':>6} {'test acc':>8}  {'dp':<18} epsilon"]
    for r in rows:
        lines.append(
            f"{r['ref']:<24} {r['stage']:<11} {r['rounds'] or '-':>6} "
            f"{_fmt(r['test_accuracy']):>8}  {r['dp'] or '-':<18} {_fmt(r['epsilon'])}"
        )
    return lines


def _promoted(registry: Any, name: str) -> str | None:
    version = registry.promoted(name)
    return None if version is None else version.ref


def _figure(figure: Any) -> str:
    if not isinstance(figure, dict):
        return "no guarantee" if figure is None else str(figure)
    epsilon = figure.get("epsilon", figure.get("epsilon_bound"))
    if epsilon is None:
        return str(figure.get("statement") or figure.get("bound") or "no figure")
    delta = figure.get("delta")
    accountant = figure.get("accountant")
    return (
        f"epsilon {epsilon:.4g}"
        + (f", delta {delta:g}" if delta is not None else "")
        + (f" ({accountant})" if accountant else "")
    )


def _fmt(value: Any) -> str:
    return "-" if value is None else f"{value:.4f}" if isinstance(value, float) else str(value)


def _out(args: argparse.Namespace, data: Any, text: str) -> None:
    print(json.dumps(data, indent=2, sort_keys=True) if args.json else text)
