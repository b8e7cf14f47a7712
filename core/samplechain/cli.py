"""The `samplechain` command: generate, plugins, validate, presets, demo, bench."""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections.abc import Sequence
from typing import Any

try:
    from importlib import metadata as _md
except ImportError:  # pragma: no cover
    import importlib_metadata as _md  # type: ignore[no-redef]

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .chain import Chain
from .cli_bench import add_bench_parser
from .cli_convert import add_convert_parser
from .cli_generate import add_generate_parser
from .cli_plugin_tools import add_plugin_tools_parser
from .cli_trace import add_trace_parser
from .errors import SamplechainError
from .plugins import PluginWarning, get_host

__all__ = ["main"]


def _installed_version(distribution: str) -> str | None:
    try:
        return _md.version(distribution)
    except _md.PackageNotFoundError:
        return None


def _plugin_rows(available: bool) -> list[dict[str, Any]]:
    host = get_host()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PluginWarning)  # broken plugins are shown as rows, not warnings
        infos = host.load_all()
    registry = host.registry
    samplers = host.registered("sampler")
    rows = []
    for info in infos:
        entry = registry.plugins.get(info.name)
        kind = ",".join(info.kinds) or (entry.kind if entry else "")
        rows.append({
            "name": info.name,
            "kind": kind,
            "version": info.version,
            "distribution": info.distribution,
            "status": info.status,
            "error": info.error,
            "provides": info.provides,
            "step": _step_kind(info.provides, samplers),
        })
    if available:
        seen = {r["name"] for r in rows}
        for entry in registry.plugins.values():
            if entry.name in seen:
                continue
            rows.append({
                "name": entry.name,
                "kind": entry.kind,
                "version": _installed_version(entry.distribution),
                "distribution": entry.distribution,
                "status": "not installed",
                "error": None,
                "provides": list(entry.provides),
                "summary": entry.summary,
                "install": entry.install_hint(registry.root),
            })
    return rows


def _step_kind(provides: list[str], samplers: dict[str, dict[int, type]]) -> str | None:
    """"sync-free" when every sampler a plugin provides declares it reads nothing on the host in a sync-free step
    (`Sampler.sync_free`), "host-bound" when one does not; None for plugins without samplers."""
    classes = []
    for name in provides:
        base, _, version = name.rpartition(".v")
        cls = samplers.get(base, {}).get(int(version)) if version.isdigit() else None
        if cls is not None:
            classes.append(cls)
    if not classes:
        return None
    return "sync-free" if all(c.sync_free for c in classes) else "host-bound"


def cmd_plugins(args: argparse.Namespace, console: Console) -> int:
    from .plugin_tools import installed_index, normalize_distribution

    rows = _plugin_rows(args.available)
    added = installed_index()  # what `samplechain install` put into this environment
    for r in rows:
        r["installed"] = added.get(normalize_distribution(r["distribution"])) if r["distribution"] else None
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    table = Table(title="samplechain plugins" + (" (installed and available)" if args.available else ""))
    for col in ("name", "kind", "version", "distribution", "status", "provides", "step", "added"):
        table.add_column(col)
    if args.available:
        table.add_column("install")
    for r in rows:
        status = {"loaded": "[green]loaded", "broken": "[red]broken"}.get(r["status"], r["status"])
        rec = r["installed"]
        when = f"{rec['installed_at'][:10]} ({rec['source']})" if rec else "-"
        cells = [r["name"], r["kind"], r["version"] or "-", r["distribution"] or "-", status, ", ".join(r["provides"]),
                 r.get("step") or "-", escape(when)]
        if args.available:
            cells.append(r.get("install", ""))
        table.add_row(*cells)
    console.print(table)
    for r in rows:
        if r["status"] == "broken":
            detail = escape(f"{r['name']} ({r['distribution']} {r['version']}): {r['error']}")
            console.print(f"[red]broken[/red] {detail}")
    return 0


def cmd_validate(args: argparse.Namespace, console: Console) -> int:
    chain = Chain.load(args.chain, backend=args.backend)
    table = Table(title=f"{args.chain}: valid")
    for col in ("#", "sampler", "stage", "parameters"):
        table.add_column(col)
    for i, step in enumerate(chain.describe()):
        params = ", ".join(f"{k}={v}" for k, v in step["params"].items())
        table.add_row(str(i), step["name"], step["stage"], escape(params))
    console.print(table)
    return 0


def cmd_presets(args: argparse.Namespace, console: Console) -> int:
    registry = get_host().registry
    if args.json:
        print(json.dumps({k: dict(v) for k, v in registry.presets.items()}, indent=2))
        return 0
    table = Table(title=f"presets ({registry.source})")
    for col in ("name", "chain", "summary"):
        table.add_column(col)
    for name, preset in registry.presets.items():
        steps = " -> ".join(
            s["use"] + "(" + ", ".join(f"{k}={v}" for k, v in s.items() if k not in ("use", "id")) + ")"
            for s in preset.get("samplers", [])
        )
        table.add_row(name, escape(steps), escape(preset.get("summary", "")))
    console.print(table)
    return 0


def cmd_demo(args: argparse.Namespace, console: Console) -> int:
    from .demo import run_demo

    return run_demo(args, console)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="samplechain", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plugins", help="list installed plugins (name, kind, version, distribution, status)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--available", action="store_true", help="also list known plugins that are not installed")
    p.set_defaults(func=cmd_plugins)
    p = sub.add_parser("validate", help="check a chain file (or preset:NAME) and show the resolved chain")
    p.add_argument("chain")
    p.add_argument("--backend", default=None, help="override the chain's backend (e.g. cpu)")
    p.set_defaults(func=cmd_validate)
    p = sub.add_parser("presets", help="list the named preset chains of registry.toml")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_presets)
    p = sub.add_parser("demo", help="sample a chain over the logits of a real transformers model")
    p.add_argument("--chain", default="preset:llama.cpp", help="chain file or preset:NAME")
    p.add_argument("--backend", default=None)
    p.add_argument("--prompt", action="append", help="prompt text (repeatable; default: two prompts)")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--seed", type=int, default=None, help="seed every request (default: fresh seeds)")
    p.set_defaults(func=cmd_demo)
    add_generate_parser(sub)
    add_convert_parser(sub)
    add_trace_parser(sub)
    add_plugin_tools_parser(sub)
    add_bench_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    console = Console()
    err = Console(stderr=True)
    try:
        return int(args.func(args, console) or 0)
    except SamplechainError as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False, soft_wrap=True)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
