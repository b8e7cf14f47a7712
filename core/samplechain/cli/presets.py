"""`samplechain presets`: the named preset chains of registry.toml."""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..engine.discovery import get_host

__all__ = ["add_parser", "cmd_presets"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser("presets", help="list the named preset chains of registry.toml")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_presets)


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
