"""`samplechain install NAME_OR_PATH`: pip-install a plugin into this environment and record it for
`samplechain plugins`."""

from __future__ import annotations

import argparse
import shlex
from typing import Any

from rich.console import Console
from rich.markup import escape

from ..tools import plugin_tools

__all__ = ["add_parser", "cmd_install"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "install",
        help="pip-install a plugin (registry name, folder or wheel) into this environment and record it",
        description="pip-install into this interpreter's environment (python -m pip install). A bare NAME is a "
        "plugin of registry.toml: installed from its folder when the checkout has it, else by distribution name. "
        "The install is recorded (name, distribution, version, source, time) in $SAMPLECHAIN_HOME/installed.json "
        "(default ~/.local/share/samplechain).",
    )
    p.add_argument("target", metavar="NAME_OR_PATH", help="a registry plugin name (min_p), a folder or a wheel")
    p.add_argument(
        "--pip-args",
        action="append",
        metavar="ARGS",
        help="extra pip arguments, one shell-quoted string (repeatable): --pip-args='--no-deps --no-index'",
    )
    p.add_argument("-e", "--editable", action="store_true", help="install a folder in editable mode (pip install -e)")
    p.set_defaults(func=cmd_install)


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
