"""`samplechain validate CHAIN`: load a chain file (or preset:NAME), check it and show the resolved chain."""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..engine.chain import Chain

__all__ = ["add_parser", "cmd_validate"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser("validate", help="check a chain file (or preset:NAME) and show the resolved chain")
    p.add_argument("chain")
    p.add_argument("--backend", default=None, help="override the chain's backend (e.g. cpu)")
    p.set_defaults(func=cmd_validate)


def cmd_validate(args: argparse.Namespace, console: Console) -> int:
    chain = Chain.load(args.chain, backend=args.backend)
    table = Table(title=f"{args.chain}: valid")
    for col in ("#", "sampler", "stage", "parameters"):
        table.add_column(col)
    for i, step in enumerate(chain.describe()):
        params = ", ".join(f"{k}={v}" for k, v in step["params"].items())
        table.add_row(str(i), step["name"], step["stage"], escape(params))
    console.print(table)
    if chain.config.draft is not None:  # the [draft] table: the drafter its generations speculate with
        console.print(f"draft: {_spec(chain.config.draft)}")
    for guard in chain.config.guards:  # the guards its generations run
        console.print(f"guard: {_spec(guard)}")
    return 0


def _spec(table: Any) -> str:
    """A drafter's or guard's table as `name (key=value, ...)`."""
    rest = ", ".join(f"{k}={v!r}" for k, v in table.items() if k != "use")
    return escape(str(table["use"])) + (f" ({escape(rest)})" if rest else "")
