"""`samplechain convert`: a chain from / to transformers, llama.cpp and vLLM settings (see docs/convert.md)."""

from __future__ import annotations

import argparse
import json
import shlex
import warnings
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from ..errors import ConfigError

EXAMPLES = """examples:
  samplechain convert --from transformers --to toml path/to/generation_config.json
  samplechain convert --from vllm --to toml params.json
  samplechain convert --from llama.cpp --to toml -- --top-k 20 --temp 0.5 --samplers "top_k;temperature"
  samplechain convert --from toml --to llama.cpp preset:llama.cpp
"""


def cmd_convert(args: argparse.Namespace, console: Console) -> int:
    from ..integrations.convert import SOURCES, ConvertWarning, export_chain, import_chain

    if args.source not in SOURCES:  # pragma: no cover - argparse's choices
        raise ConfigError(f"--from {args.source!r}: expected one of {', '.join(SOURCES)}")
    inputs = list(args.input)
    if inputs and inputs[0] == "--":
        inputs = inputs[1:]
    if args.source == "llama.cpp":
        source: Any = inputs
    else:
        if len(inputs) != 1:
            what = {
                "transformers": "a generation_config.json (or its folder)",
                "vllm": "a JSON file of vLLM sampling parameters",
                "toml": "a chain TOML file or preset:NAME",
            }[args.source]
            raise ConfigError(
                f"convert --from {args.source}: expected one INPUT, {what}; got {len(inputs)}"
                + (f" ({' '.join(map(shlex.quote, inputs))})" if inputs else "")
            )
        source = inputs[0]
    err = Console(stderr=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        chain = import_chain(args.source, source)
        result = export_chain(args.target, chain)
    for w in caught:
        if issubclass(w.category, (ConvertWarning, UserWarning)):
            err.print(f"[yellow]warning:[/yellow] {escape(str(w.message))}", highlight=False, soft_wrap=True)
    if args.target == "toml":
        text = result
    elif args.target == "llama.cpp":
        text = shlex.join(result) + "\n"
    else:
        text = json.dumps(result, indent=2) + "\n"
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
    else:
        print(text, end="")
    return 0


def add_parser(sub: Any) -> None:
    """Register the subcommand(s) of this module on the `samplechain` parser."""
    p = sub.add_parser(
        "convert",
        help="convert sampling settings between transformers, llama.cpp, vLLM and chain TOML",
        description="Import a chain from transformers' generation_config.json, llama.cpp's sampling flags or vLLM "
        "sampling parameters, and write it as chain TOML or as another engine's settings. A target that cannot "
        "express the chain (a sampler, a parameter or the order) is an error saying which.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--from",
        dest="source",
        required=True,
        choices=["transformers", "llama.cpp", "vllm", "toml"],
        help="what INPUT is",
    )
    p.add_argument(
        "--to",
        dest="target",
        default="toml",
        choices=["toml", "transformers", "llama.cpp", "vllm"],
        help="what to write (default: toml)",
    )
    p.add_argument("-o", "--output", default=None, help="write to this file instead of stdout")
    p.add_argument(
        "input",
        nargs="*",
        help="a file (generation_config.json, a JSON object of vLLM params, a chain TOML / preset:NAME); "
        "for llama.cpp the flags after --",
    )
    p.set_defaults(func=cmd_convert)
