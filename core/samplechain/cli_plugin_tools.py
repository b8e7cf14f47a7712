"""`samplechain new-plugin` (scaffold a plugin package) and `samplechain install` (pip-install a plugin into this
environment and record it for `samplechain plugins`)."""

from __future__ import annotations

import argparse
import shlex
from typing import Any

from rich.console import Console
from rich.markup import escape

from . import plugin_tools


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


def cmd_install(args: argparse.Namespace, console: Console) -> int:
    pip_args = [a for chunk in args.pip_args or [] for a in shlex.split(chunk)]
    record = plugin_tools.install(args.target, pip_args, editable=args.editable)
    plugins = ", ".join(record["plugins"]) or "no samplechain entry point"
    console.print(
        f"installed [bold]{escape(str(record['distribution']))} {escape(str(record['version']))}[/bold] "
        f"({escape(plugins)}) from {escape(record['source'])}",
        highlight=False,
    )
    console.print(f"recorded in {escape(str(plugin_tools.records_path()))}", highlight=False)
    return 0


def add_plugin_tools_parser(sub: Any) -> None:
    """Register `new-plugin` and `install` on the `samplechain` subparsers."""
    p = sub.add_parser(
        "new-plugin",
        help="generate a ready plugin package samplechain-NAME/ (pyproject, module, tests, README)",
        description="Generate samplechain-NAME/: pyproject.toml (hatchling, the samplechain entry point), "
        "samplechain_NAME.py with a working example, tests/test_NAME.py (passing) and README.md.",
    )
    p.add_argument("name", metavar="NAME", help="plugin name: lowercase letters, digits, '_' or '-' (my-filter)")
    p.add_argument("--dir", default=".", help="folder to create samplechain-NAME/ in (default: the current one)")
    p.add_argument("--kind", choices=plugin_tools.KINDS, default="sampler",
                   help="sampler: an example filter (default); criterion: an example stopping criterion")
    p.set_defaults(func=cmd_new_plugin)

    p = sub.add_parser(
        "install",
        help="pip-install a plugin (registry name, folder or wheel) into this environment and record it",
        description="pip-install into this interpreter's environment (python -m pip install). A bare NAME is a "
        "plugin of registry.toml: installed from its folder when the checkout has it, else by distribution name. "
        "The install is recorded (name, distribution, version, source, time) in $SAMPLECHAIN_HOME/installed.json "
        "(default ~/.local/share/samplechain).",
    )
    p.add_argument("target", metavar="NAME_OR_PATH", help="a registry plugin name (min_p), a folder or a wheel")
    p.add_argument("--pip-args", action="append", metavar="ARGS",
                   help="extra pip arguments, one shell-quoted string (repeatable): --pip-args='--no-deps --no-index'")
    p.add_argument("-e", "--editable", action="store_true", help="install a folder in editable mode (pip install -e)")
    p.set_defaults(func=cmd_install)
