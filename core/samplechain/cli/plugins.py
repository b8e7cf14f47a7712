"""`samplechain plugins`: the installed plugins (name, kind, version, distribution, status, whether their
samplers' step is sync-free), whether the cpu backend's compiled path is on (and why not), and with --available the
registry's plugins that are not installed."""

from __future__ import annotations

import argparse
import json
import warnings
from typing import Any

try:
    from importlib import metadata as _md
except ImportError:  # pragma: no cover
    import importlib_metadata as _md  # type: ignore[no-redef]

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..engine.discovery import PluginWarning, get_host

__all__ = ["add_parser", "cmd_plugins"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser("plugins", help="list installed plugins (name, kind, version, distribution, status)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--available", action="store_true", help="also list known plugins that are not installed")
    p.set_defaults(func=cmd_plugins)


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
        rows.append(
            {
                "name": info.name,
                "kind": kind,
                "version": info.version,
                "distribution": info.distribution,
                "status": info.status,
                "error": info.error,
                "provides": info.provides,
                "step": _step_kind(info.provides, samplers),
                "compiled": _compiled_path(info),
            }
        )
    if available:
        seen = {r["name"] for r in rows}
        for entry in registry.plugins.values():
            if entry.name in seen:
                continue
            rows.append(
                {
                    "name": entry.name,
                    "kind": entry.kind,
                    "version": _installed_version(entry.distribution),
                    "distribution": entry.distribution,
                    "status": "not installed",
                    "error": None,
                    "provides": list(entry.provides),
                    "summary": entry.summary,
                    "install": entry.install_hint(registry.root),
                }
            )
    return rows


def _compiled_path(info: Any) -> dict[str, Any] | None:
    """{"on", "reason"} from a loaded backend plugin's compiled_path() (the cpu backend's: numba's kernels or the
    torch paths, several times slower, and why), None for a plugin without one."""
    if info.status != "loaded" or info.entry_point is None:
        return None
    report = getattr(info.entry_point.load(), "compiled_path", None)
    if not callable(report):
        return None
    on, reason = report()
    return {"on": bool(on), "reason": str(reason)}


def _step_kind(provides: list[str], samplers: dict[str, dict[int, type[Any]]]) -> str | None:
    """ "sync-free" when every sampler a plugin provides declares it reads nothing on the host in a sync-free step
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
    from ..tools.plugin_tools import installed_index, normalize_distribution

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
        cells = [
            r["name"],
            r["kind"],
            r["version"] or "-",
            r["distribution"] or "-",
            status,
            ", ".join(r["provides"]),
            r.get("step") or "-",
            escape(when),
        ]
        if args.available:
            cells.append(r.get("install", ""))
        table.add_row(*cells)
    console.print(table)
    for r in rows:
        compiled = r.get("compiled")
        if compiled and compiled["on"]:
            console.print(f"{escape(r['name'])} backend: compiled path on ({escape(compiled['reason'])})")
        elif compiled:
            console.print(
                f"{escape(r['name'])} backend: [yellow]compiled path OFF[/yellow]: {escape(compiled['reason'])}"
            )
    for r in rows:
        if r["status"] == "broken":
            detail = escape(f"{r['name']} ({r['distribution']} {r['version']}): {r['error']}")
            console.print(f"[red]broken[/red] {detail}")
    return 0
