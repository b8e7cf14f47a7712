"""`samplechain new-plugin NAME`: scaffold a plugin package samplechain-NAME/ (pyproject, module, tests, README)."""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console
from rich.markup import escape

from ..tools import plugin_tools

__all__ = ["add_parser", "cmd_new_plugin"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "new-plugin",
        help="generate a ready plugin package samplechain-NAME/ (pyproject, module, tests, README)",
        description="Generate samplechain-NAME/: pyproject.toml (hatchling, the samplechain entry point), "
        "samplechain_NAME.py with a working example, tests/test_NAME.py (passing) and README.md.",
    )
    p.add_argument("name", metavar="NAME", help="plugin name: lowercase letters, digits, '_' or '-' (my-filter)")
    p.add_argument("--dir", default=".", help="folder to create samplechain-NAME/ in (default: the current one)")
    p.add_argument(
        "--kind",
        choices=plugin_tools.KINDS,
        default="sampler",
        help="sampler: an example filter (default); criterion: an example stopping criterion",
    )
    p.set_defaults(func=cmd_new_plugin)


def cmd_new_plugin(args: argparse.Namespace, console: Console) -> int:
    target = plugin_tools.new_plugin(args.name, args.dir, args.kind)
    names = plugin_tools.plugin_names(args.name)
    console.print(
        f"created [bold]{escape(str(target))}[/bold]: {args.kind} [bold]{names.plugin}[/bold] "
        f"(distribution {names.distribution}, module {names.module})",
        highlight=False,
    )
    for path in sorted(p for p in target.rglob("*") if p.is_file()):
        console.print(f"  {escape(str(path.relative_to(target)))}", highlight=False)
    console.print(
        "next:\n"
        f"  cd {escape(str(target))}\n"
        "  pytest -q                  # the example's tests pass as generated\n"
        "  samplechain install .      # or: pip install -e .\n"
        f"  samplechain plugins        # {names.plugin} is listed as loaded",
        highlight=False,
    )
    return 0
