"""`samplechain demo`: sample a chain over the logits of a real transformers model (the embedded one)."""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console

__all__ = ["add_parser", "cmd_demo"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser("demo", help="sample a chain over the logits of a real transformers model")
    p.add_argument("--chain", default="preset:llama.cpp", help="chain file or preset:NAME")
    p.add_argument("--backend", default=None)
    p.add_argument("--prompt", action="append", help="prompt text (repeatable; default: two prompts)")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--seed", type=int, default=None, help="seed every request (default: fresh seeds)")
    p.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace, console: Console) -> int:
    from ..tools.demo import run_demo
    from .generate import check_run_arguments

    check_run_arguments(args)
    return run_demo(args, console)
