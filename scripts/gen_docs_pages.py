"""Pages of the documentation site generated at build time (mkdocs-gen-files runs this
from mkdocs.yml), so that they cannot drift from the code they describe:

- reference/config-schema.md: every field of a run config, `server.toml` and `[deploy]`,
  from the dataclasses of fedveil/config (type, default, limits, help);
- reference/cli.md: every `fedveil` command's --help, from the argparse parser;
- reference/openapi.md and openapi.json: the coordinator's HTTP API, from its FastAPI app;
- reference/dp-rules.md: the DP rule table (fedveil/protocol/dp_rules.py) and the
  accountant registry's declarations (privacy/dp/accounting.py);
- explanation/round-architecture.md, dp-design.md, secagg-design.md, simulation-engine.md:
  ARCHITECTURE.md and the design notes kept beside the code (privacy/dp, privacy/secagg,
  simulations), copied as they stand.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import os
from pathlib import Path
from typing import Any

import mkdocs_gen_files

ROOT = Path(__file__).resolve().parents[1]

COPIED = {
    "explanation/round-architecture.md": "ARCHITECTURE.md",
    "explanation/dp-design.md": "privacy/dp/README.md",
    "explanation/secagg-design.md": "privacy/secagg/README.md",
    "explanation/simulation-engine.md": "simulations/README.md",
}


def main() -> None:
    for page, source in COPIED.items():
        with mkdocs_gen_files.open(page, "w") as f:
            f.write((ROOT / source).read_text())
        mkdocs_gen_files.set_edit_path(page, Path("..") / source)
    with mkdocs_gen_files.open("reference/config-schema.md", "w") as f:
        f.write(config_schema())
    with mkdocs_gen_files.open("reference/cli.md", "w") as f:
        f.write(cli_reference())
    with mkdocs_gen_files.open("reference/dp-rules.md", "w") as f:
        f.write(dp_rules_page())
    spec = openapi_spec()
    with mkdocs_gen_files.open("reference/openapi.json", "w") as f:
        json.dump(spec, f, indent=1)
    with mkdocs_gen_files.open("reference/openapi.md", "w") as f:
        f.write(openapi_page(spec))


# -- the DP rule table ---------------------------------------------------------------


def dp_rules_page() -> str:
    from fedveil.privacy.dp.accounting import create_accountant, registered_accountants
    from fedveil.protocol.dp_rules import CONFIG_KEYS, CONFIG_OF_MECHANISM, REFUSALS, SOUND

    def names(values: tuple[str, ...] | None) -> str:
        return "any" if values is None else ", ".join(f"`{v}`" for v in values)

    out = [
        "# DP rule table\n",
        "Generated from `fedveil/protocol/dp_rules.py` and the accountant registry",
        "(`privacy/dp/accounting.py`) when the site is built. Why the table is what it is, and",
        "how to extend it: [The DP rules](../explanation/dp-rules.md). Mechanisms by their",
        "ledger names; a run config's `dp.mechanism` maps "
        + ", ".join(f"`{k}` to `{v}`" for v, k in CONFIG_OF_MECHANISM.items())
        + ".\n",
        "## Sound combinations\n",
        "Accountants tightest first: `auto` resolves to the first.\n",
        "| mechanism | sampling | neighbouring | accountants | why |",
        "|---|---|---|---|---|",
    ]
    for row in SOUND:
        out.append(
            f"| {names(row.mechanisms)} | `{row.sampling}` | `{row.neighbouring}` | "
            f"{names(row.accountants)} | {row.why} |"
        )
    out += [
        "\n## Refusals\n",
        "Every combination no row above lists is refused by the first of these that matches",
        "(a test checks that each is matched), with an error naming the run config's key.\n",
        "| refuses | mechanism | sampling | neighbouring | accountant | secure aggregation "
        "| why | fix |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in REFUSALS:
        secagg = "any" if r.secure_aggregation is None else str(r.secure_aggregation).lower()
        out.append(
            f"| `{CONFIG_KEYS[r.field]}` | {names(r.mechanisms)} | {names(r.samplings)} | "
            f"{names(r.neighbourings)} | {names(r.accountants)} | {secagg} | {r.why} | {r.fix} |"
        )
    out += [
        "\n## Accountant registry\n",
        "What each registered accountant declares sound for (mechanism, sampling, neighbouring).\n",
        "| accountant | class | sound for |",
        "|---|---|---|",
    ]
    for name in registered_accountants():
        acc = create_accountant(name)
        combos = ", ".join(f"{m} / {s} / {n}" for m, s, n in sorted(acc.sound_for))
        if acc.successor:
            combos = f"none (legacy: old ledgers verify as {acc.successor}'s)"
        out.append(f"| `{name}` | `{type(acc).__name__}` | {combos} |")
    return "\n".join(out) + "\n"


# -- configuration -------------------------------------------------------------------


def config_schema() -> str:
    from fedveil.config.deploy_settings import DeploySettings
    from fedveil.config.run_schema import SECTIONS, RunConfig
    from fedveil.config.service_settings import SERVICE_SECTIONS, ServiceConfig

    out = [
        "# Configuration fields\n",
        "Generated from the config schema (`fedveil/config/`) when the site is built. Every",
        "value is checked before any data is loaded; an error names the field, the value and",
        "the limit. Limits in brackets: `[lo, hi]` inclusive, `(lo, hi]` with lo excluded.",
        "How the files are used: [Configuration](configuration.md).\n",
        "## Run config\n",
        "A run's TOML file (`fedveil simulate --config`, `fedveil run submit`, `POST /runs`);",
        "any field is also `--set section.key=value`.\n",
    ]
    out += tables(RunConfig, SECTIONS, "")
    out += [
        "## server.toml\n",
        "The coordinator's own file (`fedveil server --config server.toml`). Relative paths",
        "are taken from the file's directory.\n",
    ]
    out += tables(ServiceConfig, SERVICE_SECTIONS, "")
    out += [
        "## [deploy]\n",
        "The `[deploy]` table of a run submitted to the coordinator: settings of the",
        "deployment, kept apart from the training and never sent to devices.\n",
    ]
    out += tables(DeploySettings, {}, "deploy.")
    return "\n".join(out) + "\n"


def tables(cls: type, sections: dict[str, type], prefix: str) -> list[str]:
    top = [f for f in dataclasses.fields(cls) if f.name not in sections]
    out = [table(top, prefix)] if top else []
    for f in dataclasses.fields(cls):
        if f.name in sections:
            out.append(f"### [{f.name}]\n")
            doc = (sections[f.name].__doc__ or "").strip()
            if doc and not doc.startswith(sections[f.name].__name__ + "("):
                out.append(doc + "\n")
            out.append(table(list(dataclasses.fields(sections[f.name])), f"{f.name}."))
    return out


def table(fields: list[dataclasses.Field], prefix: str) -> str:
    rows = ["| field | type | default | limits | what |", "| --- | --- | --- | --- | --- |"]
    for f in fields:
        m = f.metadata
        kind = m.get("kind") or type(default_of(f))
        rows.append(
            f"| `{prefix}{f.name}` | {kind.__name__}{' or none' if m.get('optional') else ''} "
            f"| {cell(default_of(f))} | {limits(m)} | {escape(m.get('help', ''))} |"
        )
    return "\n".join(rows) + "\n"


def default_of(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def limits(m: dict[str, Any]) -> str:
    if m.get("choices"):
        return "one of " + ", ".join(f"`{c}`" for c in m["choices"])
    lo, hi = m.get("lo"), m.get("hi")
    if lo is None and hi is None:
        return ""
    left = "(" if m.get("lo_open") else "["
    return f"{left}{fmt(lo) if lo is not None else '-inf'}, {fmt(hi) if hi is not None else 'inf'}]"


def fmt(x: float) -> str:
    return f"{x:g}" if isinstance(x, float) else f"{x:,}".replace(",", "_")


def cell(value: Any) -> str:
    if value is None:
        return "none"
    return "`" + escape(json.dumps(value) if not isinstance(value, str) else f'"{value}"') + "`"


def escape(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


# -- command line --------------------------------------------------------------------


def cli_reference() -> str:
    from fedveil.cli.main import build_parser

    os.environ["COLUMNS"] = "100"  # argparse wraps to the terminal: one width for the site
    parser = build_parser()
    out = [
        "# Command line\n",
        "Generated from the `fedveil` argparse parser when the site is built: each command's",
        "`--help`, as the command prints it.\n",
    ]
    for path, p in walk(parser, ["fedveil"]):
        out.append(f"{'#' * min(len(path) + 1, 4)} {' '.join(path)}\n")
        out.append("```text\n" + p.format_help().rstrip() + "\n```\n")
        if path == ["fedveil", "bench"]:
            out += benchmark_helps()
    return "\n".join(out)


def benchmark_helps() -> list[str]:
    """`fedveil bench X --help` of every benchmark: each benchmark module owns its flags
    (fedveil/cli/bench.py only lists them), so each prints its own help."""
    from fedveil.cli.bench import BENCHMARKS

    out = []
    for name, bench in BENCHMARKS.items():
        text = io.StringIO()
        with contextlib.redirect_stdout(text), contextlib.suppress(SystemExit):
            bench.main(["--help"], f"fedveil bench {name}")
        out.append(f"#### fedveil bench {name}\n")
        out.append("```text\n" + text.getvalue().rstrip() + "\n```\n")
    return out


def walk(parser: argparse.ArgumentParser, path: list[str]) -> list[tuple[list[str], Any]]:
    found = [(path, parser)]
    for action in parser._actions:  # argparse keeps subcommands only here
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += walk(sub, [*path, name])
    return found


# -- HTTP API ------------------------------------------------------------------------


def openapi_spec() -> dict[str, Any]:
    from fedveil.server.coordinator.api import create_api

    # The routes read the service per request (routes.deps.get_service); the schema needs
    # none, so the app is built without one.
    return create_api(None).openapi()  # type: ignore[arg-type]


def openapi_page(spec: dict[str, Any]) -> str:
    info = spec["info"]
    out = [
        "# HTTP API (OpenAPI)\n",
        f"Generated from the coordinator's FastAPI app ({info['title']} {info['version']})",
        "when the site is built. The machine-readable spec is [openapi.json](openapi.json);",
        "a running coordinator serves it at `GET /openapi.json` and an explorer at `GET /docs`.",
        "Which endpoints need the admin token: [Commands and endpoints](http-api.md).\n",
        escape(info.get("description", "")) + "\n",
    ]
    for path, methods in spec["paths"].items():
        for method, op in methods.items():
            out.append(f"## `{method.upper()} {path}`\n")
            if op.get("summary"):
                out.append(f"**{op['summary']}**\n")
            if op.get("description"):
                out.append(op["description"].strip() + "\n")
            params = op.get("parameters", [])
            if params:
                out.append("| parameter | in | required | type |\n| --- | --- | --- | --- |")
                for prm in params:
                    kind = prm.get("schema", {}).get("type", "")
                    req = "yes" if prm.get("required") else ""
                    out.append(f"| `{prm['name']}` | {prm['in']} | {req} | {kind} |")
                out.append("")
            responses = ", ".join(
                f"{code} {r.get('description', '')}" for code, r in op.get("responses", {}).items()
            )
            if responses:
                out.append(f"Responses: {escape(responses)}.\n")
    return "\n".join(out) + "\n"


main()
