"""`fedveil privacy report|verify RUN_DIR`: audit what a run spent."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_privacy(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("privacy", help="privacy reports and independent verification")
    psub = p.add_subparsers(dest="privacy_command", required=True, metavar="ACTION")
    _add_report(psub)
    _add_verify(psub)
    _add_audit_cohorts(psub)
    _add_audit(psub)
    _add_attack_membership_and_model_inversion(attack_subparsers(psub))
    _add_attack_update_inversion(attack_subparsers(psub))


def _add_report(psub: argparse._SubParsersAction) -> None:
    rep = psub.add_parser(
        "report",
        help="write privacy/report.json and a self-contained privacy/report.html",
        description="Verify the run's privacy ledger, then write privacy/report.json and "
        "privacy/report.html (epsilon against the budget, clip norm, participation, "
        "and the trust assumptions in plain words).",
    )
    rep.add_argument("run_dir", help="a run directory made with --dp")
    rep.set_defaults(func=cmd_report)


def _add_verify(psub: argparse._SubParsersAction) -> None:
    ver = psub.add_parser(
        "verify",
        help="check the signed ledger and recompute epsilon; exit 0 final, 3 interrupted, "
        "1 at the first discrepancy",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Check the ledger's signatures, hash chain, run id, round order and\n"
        "budget; recompute epsilon from its events independently of the stored numbers;\n"
        "re-check Skellam releases' z from their recorded parameters; check that the\n"
        "opening record (ledger schema 3) carries the signing key and that every entry\n"
        "names it; and check that report.json's head and every witnessed head are in the\n"
        "chain. Then hold what the run directory shows beside the ledger to it:\n"
        "metrics.jsonl may hold no round past the closing record and no epsilon below\n"
        "the releases' so far; summary.json's epsilon and delta must be the closing\n"
        "record's; report.json must be the report of the ledger up to its head (rebuilt\n"
        "and compared field by field), report.html the page report.json renders to, and\n"
        "model.safetensors must hash to the closing record's model_sha256 where it names\n"
        "one (a record without it: verify says the model is not bound).\n"
        "A secure all-reduce run (RUN_DIR/silos/): check every silo's ledger so, against\n"
        "that silo's key only (--silo-keys, else RUN_DIR/silos/roster.json), and that the\n"
        "silos agree round by round (members, sum commitment, noise, epsilon).",
        epilog="exit codes:\n"
        "  0  final: the run finished; every entry is signed and consistent\n"
        "  3  interrupted at training round N: signed and consistent, resumable, not "
        "finished\n"
        "  1  failed (first discrepancy): unsigned or badly signed entries, a key that "
        "cannot\n"
        "     be found, a ledger without a final or interruption record at its end "
        "(truncated),\n"
        "     a witnessed head the chain lacks (rewritten, re-signed or rolled back), a\n"
        "     witness file with no head, metrics.jsonl, summary.json or report.json/html\n"
        "     stating what the ledger does not prove (each named with the ledger's value),\n"
        "     or any other discrepancy\n"
        "\n"
        "The public key is found by key id in the local key store ($FEDVEIL_KEY_DIR, else\n"
        "~/.local/share/fedveil/keys) on the machine that made the run; elsewhere pass it\n"
        "with --public-key. --second-accountant passes iff the recorded epsilon is at least\n"
        "99.9% of the smallest epsilon the named sound accountants give ('all': every\n"
        "accountant sound for the run's mechanism, sampling and neighbouring relation).",
    )
    ver.add_argument("run_dir")
    ver.add_argument(
        "--public-key",
        metavar="FILE",
        help="the run's Ed25519 public key (PEM or 32 raw bytes); only this key is accepted",
    )
    ver.add_argument(
        "--silo-keys",
        metavar="ROSTER",
        help="secure all-reduce runs: the silos' identity roster (fedveil identity roster; "
        "the one the silos were started with); only these keys are accepted [the keys "
        "pinned in RUN_DIR/silos/roster.json]",
    )
    ver.add_argument(
        "--witness",
        metavar="FILE",
        action="append",
        default=[],
        help="a device's witness file (<state-dir>/witness/<run_id>.jsonl); repeatable; "
        "one with no head fails",
    )
    ver.add_argument(
        "--second-accountant",
        metavar="NAME",
        action="append",
        default=[],
        help="also bound epsilon with NAME (pld, prv, rdp, dpa_rdp, ... or 'all'); repeatable",
    )
    ver.add_argument(
        "--card",
        metavar="CARD",
        help="also check a model card against this run's ledger: a card.json file or a "
        "registry reference (name@version); exit 1 naming each field that differs",
    )
    ver.add_argument(
        "--registry", metavar="DIR", help="the model registry --card refers to (see models)"
    )
    ver.set_defaults(func=cmd_verify)


def _add_audit_cohorts(psub: argparse._SubParsersAction) -> None:
    aud = psub.add_parser(
        "audit-cohorts",
        help="check that a DP run's cohorts and graphs followed its committed key (operator files)",
        description="Check the secret cohort key (the run's private/run.json, or --key) "
        "against the ledger's signed cohort_commitment, then recompute every round's "
        "cohort and secure-aggregation graph seed from it and compare them with the "
        "operator's private round records. Exit 0 when all followed the key, 1 otherwise.",
    )
    aud.add_argument("run_dir")
    aud.add_argument("--key", metavar="HEX", help="the cohort key, when auditing elsewhere")
    aud.set_defaults(func=cmd_audit_cohorts)


def cmd_audit_cohorts(args: argparse.Namespace) -> int:
    from fedveil.server.engine.cohort_key_check import audit_cohorts

    audit = audit_cohorts(Path(args.run_dir), args.key)
    for problem in audit.problems:
        print(f"FAIL: {problem}", file=sys.stderr)
    if audit.ok:
        print(f"cohorts and graphs of {audit.rounds_checked} rounds followed the committed key")
    return 0 if audit.ok else 1


def cmd_report(args: argparse.Namespace) -> int:
    from fedveil.privacy.dp.report import headline_lines
    from fedveil.server.engine.privacy_report import write_privacy_report

    report = write_privacy_report(Path(args.run_dir))
    verdict = report.get("verification", {})
    # One figure per adversary: no single epsilon is true for everyone.
    for line in headline_lines(report):
        print(line)
    print(f"wrote {Path(args.run_dir) / 'privacy' / 'report.html'}")
    if "verification" not in report:
        return 0  # no ledger to verify: a run without DP, reported for its attacks alone
    if verdict.get("ok", False):
        return 0
    # The same codes as `verify`: 3 for an intact ledger of an interrupted run.
    return 3 if verdict.get("status") == "interrupted" else 1


def cmd_verify(args: argparse.Namespace) -> int:
    from fedveil.privacy.dp.signing import KeyStoreError, load_public_key
    from fedveil.server.engine.privacy_report import verify_run

    public_key = None
    if args.public_key:
        try:
            public_key = load_public_key(args.public_key)
        except (OSError, KeyStoreError) as error:
            print(f"FAIL: --public-key {args.public_key}: {error}", file=sys.stderr)
            return 1
    result = verify_run(
        Path(args.run_dir),
        public_key=public_key,
        witnesses=args.witness,
        second_accountants=args.second_accountant,
        silo_keys=args.silo_keys,
    )
    label = {"final": "OK", "interrupted": "INTERRUPTED"}.get(result.status, "FAIL")
    print(f"{label}: {result.message}", file=sys.stdout if result.ok else sys.stderr)
    if args.card and result.status != "failed":
        from fedveil.cli.models import verify_card_option

        if not verify_card_option(args.card, args.registry, Path(args.run_dir), result):
            return 1
    return result.exit_code


def attack_subparsers(psub: argparse._SubParsersAction) -> argparse._SubParsersAction:
    """`fedveil privacy attack ACTION`: one parser shared by every attack (created once;
    each attack adds its own subcommand to what this returns)."""
    existing = psub.choices.get("attack")
    if existing is not None:
        return existing._fedveil_attacks  # type: ignore[attr-defined]
    att = psub.add_parser(
        "attack",
        help="attacks as tests of the privacy a run delivers (in simulation)",
        description="Run an attack against what an observer of a run sees, and report "
        "how well it did next to what the run's DP guarantee allows.",
    )
    asub = att.add_subparsers(dest="attack_command", required=True, metavar="ATTACK")
    att._fedveil_attacks = asub  # type: ignore[attr-defined]
    return asub


def _add_attack_membership_and_model_inversion(asub: argparse._SubParsersAction) -> None:
    mem = asub.add_parser(
        "membership",
        help="membership inference on the final model: loss and offline-LiRA attacks, ROC "
        "against the DP bound",
        description="Train the config's model in simulation on half of a population of "
        "candidate clients (the other half held out), plus shadow models on disjoint "
        "clients; attack the final model at the level its DP covers (clients; examples "
        "under DP-SGD). A DP config is also run without DP, as the baseline. Writes "
        "membership.json (ROC AUC, TPR at 1% FPR, ROC points above TPR <= e^eps * FPR + "
        "delta) and membership_roc.png into --out. Exit 1 when an ROC point lies above the "
        "bound at 95% confidence (Clopper-Pearson): the DP claim is refuted.",
    )
    mem.add_argument("--config", required=True, metavar="FILE", help="the run config (TOML)")
    mem.add_argument(
        "--shadows",
        type=int,
        default=4,
        metavar="N",
        help="shadow models for offline LiRA: 0 (loss attack only) or at least 2 (default 4)",
    )
    mem.add_argument(
        "--no-baseline", action="store_true", help="do not also run a DP config without DP"
    )
    mem.add_argument("--out", required=True, metavar="DIR", help="where the results go")
    mem.set_defaults(func=cmd_attack_membership)
    inv = asub.add_parser(
        "model-inversion",
        help="recover one representative input per class from a run's final model",
        description="Gradient ascent on each class's confidence under a total-variation and "
        "L2 prior, projected into the data's range; writes model_inversion.png (one image "
        "per class) and model_inversion.json into --out.",
    )
    inv.add_argument("run_dir", help="a finished run directory (its model.safetensors)")
    inv.add_argument("--out", required=True, metavar="DIR", help="where the results go")
    inv.add_argument("--steps", type=int, default=400, help="ascent steps per class")
    inv.add_argument(
        "--range",
        metavar="LO,HI",
        help="the inputs' value range (default: from the run's dataset)",
    )
    inv.set_defaults(func=cmd_attack_model_inversion)


def cmd_attack_membership(args: argparse.Namespace) -> int:
    from fedveil.config import load_config
    from fedveil.simulations.attacks.membership import attack_membership

    cfg = load_config(args.config)
    result = attack_membership(
        cfg,
        Path(args.out),
        shadows=args.shadows,
        baseline=not args.no_baseline,
        on_step=lambda msg: print(msg, file=sys.stderr),
    )
    refuted = False
    for name, run in result["runs"].items():
        eps = run["epsilon"]
        claim = "no DP" if eps is None else f"epsilon {eps:.3g}, delta {run['delta']:g}"
        print(f"{name} ({claim}, {run['level']} level, {run['members']} members):")
        for attack, got in run["attacks"].items():
            line = f"  {attack}: AUC {got['auc']:.3f}, TPR at 1% FPR {got['tpr_at_1pct_fpr']:.3f}"
            bound = got.get("bound")
            if bound is not None:
                line += (
                    f"; ROC points above the DP bound: {bound['violations']} "
                    f"({bound['significant_violations']} at 95% confidence)"
                )
                refuted = refuted or bound["significant_violations"] > 0
            print(line)
    print(f"wrote {Path(args.out) / 'membership.json'} and {Path(args.out) / result['roc_image']}")
    return 1 if refuted else 0


def cmd_attack_model_inversion(args: argparse.Namespace) -> int:
    from fedveil.simulations.attacks.model_inversion import InversionSettings, invert_run

    value_range = None
    if args.range:
        try:
            lo, hi = (float(v) for v in args.range.split(","))
        except ValueError:
            raise ValueError(f"--range {args.range!r}: must be LO,HI (two numbers)") from None
        value_range = (lo, hi)
    if args.steps < 1:
        raise ValueError(f"--steps {args.steps}: must be at least 1")
    report = invert_run(
        Path(args.run_dir),
        Path(args.out),
        value_range=value_range,
        settings=InversionSettings(steps=args.steps),
    )
    for row in report["classes"]:
        print(
            f"class {row['class']}: confidence {row['start_confidence']:.3f} -> "
            f"{row['final_confidence']:.3f}"
        )
    print(f"wrote {Path(args.out) / report['image']}")
    return 0


def _add_audit(psub: argparse._SubParsersAction) -> None:
    aud = psub.add_parser(
        "audit",
        help="canary audit: test the accounted epsilon's trade-off curve (f-DP, 99%%), "
        "with the ceiling the canary count reaches; exit 1 when the claim is refuted",
        description="Run the config's training again in simulation with canary clients "
        "(Dirac canaries: the clip norm on one coordinate each, each inserted with "
        "probability 1/2), into the audit's own run directory, and write "
        "privacy/audit.json there. The statistic, fixed in advance, is each canary's "
        "projection summed over rounds; the auditor guesses 'inserted' for the quarter "
        "of canaries with the highest and 'held out' for the quarter with the lowest. "
        "Verdict: the one-run f-DP test (Mahloujifar, Melis and Chaudhuri 2025) of the "
        "trade-off curve of the accountant's own privacy profile at the ledger's noise "
        "and sampling, at 99%, with the lower bound it gives and the ceiling: no epsilon "
        "above it can be refuted with this many canaries. Beside it: the Steinke, Nasr "
        "and Jagielski 2023 bound with its delta term (conservative) and the one-shot "
        "estimate (Andrew et al. 2024; not a bound). A model of d parameters supports at "
        "most d canaries; more are refused. Exit 0 when consistent (or no DP), 1 when "
        "refuted.",
    )
    aud.add_argument("--config", required=True, metavar="FILE", help="the run config (TOML)")
    aud.add_argument(
        "--canaries",
        type=int,
        metavar="N",
        help="canaries (default: [audit] canaries, 1000); at most the model's parameter count",
    )
    aud.add_argument(
        "--out",
        metavar="DIR",
        help="the audit run's directory (default: [audit] out, else <out>-audit)",
    )
    aud.set_defaults(func=cmd_audit)


def cmd_audit(args: argparse.Namespace, *, mechanism: object | None = None) -> int:
    """`mechanism`: the harness's test seam (AuditMechanism); the command line never sets it."""
    from fedveil.config import load_config
    from fedveil.privacy.dp.report import audit_lines
    from fedveil.simulations.audit import run_audit

    cfg = load_config(args.config)
    canaries = cfg.audit.canaries if args.canaries is None else args.canaries
    out = args.out or cfg.audit.out or f"{cfg.out.rstrip('/')}-audit"
    result = run_audit(cfg, canaries=canaries, out=out, mechanism=mechanism)  # type: ignore[arg-type]
    for line in audit_lines(result):
        print(line)
    print(f"wrote {Path(out) / 'privacy' / 'audit.json'}")
    if result["refuted"]:
        print(f"FAIL: {result['verdict']}", file=sys.stderr)
        return 1
    return 0


def _add_attack_update_inversion(asub: argparse._SubParsersAction) -> None:
    upd = asub.add_parser(
        "inversion",
        help="reconstruct training images from updates: one client's, a secure sum, a DP sum",
        description="Compute Fashion-MNIST updates of the built-in MLP through fedveil's "
        "local training (nothing is read from a run: fedveil never stores plain client "
        "updates), then attack what three observers see: one client's update, the sum of "
        "K clients' updates (exactly what secure aggregation reveals) and its central-DP "
        "release. Attacks: analytic first-layer inversion, gradient matching (Geiping et "
        "al. 2020) and the Cocktail Party Attack (Kariyappa et al. 2023). Writes "
        "attack.json (PSNR and SSIM against the best-matching true image, and a random "
        "training image's baseline) and grid_<observer>.png into --out.",
    )
    upd.add_argument("--out", required=True, metavar="DIR", help="where the results go")
    upd.add_argument("--k", type=int, default=20, help="clients in the secure sum (default 20)")
    upd.add_argument("--batch", type=int, default=1, help="images per client (default 1)")
    upd.add_argument(
        "--local-steps", type=int, default=1, help="full-batch local steps (1: FedSGD)"
    )
    upd.add_argument(
        "--dp-noise", type=float, default=0.5, help="central DP noise multiplier z (>= 0.5)"
    )
    upd.add_argument("--seed", type=int, default=0, help="which images and initial model")
    upd.add_argument(
        "--iterations", type=int, default=300, help="gradient-matching Adam steps (default 300)"
    )
    upd.add_argument(
        "--unmix-steps", type=int, default=500, help="Cocktail Party unmixing steps (default 500)"
    )
    upd.set_defaults(func=cmd_attack_update_inversion)


def cmd_attack_update_inversion(args: argparse.Namespace) -> int:
    from fedveil.simulations.attacks.inversion_run import run_inversion

    for name in ("k", "batch", "local_steps", "iterations", "unmix_steps"):
        if getattr(args, name) < 1:
            print(
                f"--{name.replace('_', '-')}={getattr(args, name)} is invalid; allowed: >= 1",
                file=sys.stderr,
            )
            return 2
    if not args.dp_noise >= 0.5:
        print(f"--dp-noise={args.dp_noise} is invalid; allowed: >= 0.5", file=sys.stderr)
        return 2
    out = Path(args.out)
    report = run_inversion(
        out,
        clients=args.k,
        batch=args.batch,
        local_steps=args.local_steps,
        dp_noise=args.dp_noise,
        seed=args.seed,
        opt_iterations=args.iterations,
        cpa_steps=args.unmix_steps,
    )
    print(report["statement"])
    print(f"wrote {out / 'attack.json'} and the PNG grids")
    return 0
