"""`samplechain trace`: run one generation with tracing on; write a PNG plot and a self-contained HTML page of what
every sampler of the chain did at every step, and print a compact table."""

from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from ..errors import ConfigError
from ..tools.progress import LONG_RUN_TOKENS, progress_bar
from .generate import add_run_arguments

__all__ = ["add_parser", "cmd_trace"]


def add_parser(sub: Any) -> None:
    """Register the subcommand(s) of this module on the `samplechain` parser."""
    p = sub.add_parser(
        "trace",
        help="trace a generation: candidates, entropy and chosen probability per step and per sampler",
        description="Generate from one prompt with tracing on and write OUT.png (plot) and OUT.html (self-contained "
        "page: text, plot, steps x stages table); print a compact table. Tracing does not change the tokens.",
    )
    p.add_argument("prompt", nargs="*", help="prompt text (words are joined; default: stdin, or 'The')")
    add_run_arguments(p, new_tokens=32)
    p.add_argument("--out", default="trace", help="output path stem: writes OUT.png and OUT.html (default: trace)")
    p.add_argument("--no-table", action="store_true", help="do not print the table")
    p.add_argument("--max-rows", type=int, default=None, help="print at most N steps in the table")
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="a progress bar over the steps on stderr (default: on when stderr is a terminal and more "
        f"than {LONG_RUN_TOKENS} new tokens are asked for)",
    )
    p.set_defaults(func=cmd_trace, prompts=None)


def _stem(out: str) -> Path:
    path = Path(out)
    if path.suffix.lower() in (".png", ".html", ".htm"):
        path = path.with_suffix("")
    return path


def cmd_trace(args: argparse.Namespace, console: Console) -> int:
    from ..generation import GenerationWarning
    from ..tools.trace import trace_generation
    from .generate import _chain, _prompts, check_run_arguments, load_cli_model, parse_sets, unescape

    err = Console(stderr=True)
    chain = _chain(args)
    params = parse_sets(args.sets)
    prompts = _prompts(args)
    if len(prompts) != 1:  # pragma: no cover - the parser takes one prompt
        raise ConfigError("trace follows one prompt: give a single prompt")
    check_run_arguments(args)
    if args.max_rows is not None and args.max_rows < 0:
        raise ConfigError(f"--max-rows {args.max_rows}: must be an integer >= 0 (the most steps the table shows)")
    model, tokenizer, _name = load_cli_model(args.model, args.engine)
    has_limit = any(spec.cls.is_length_limit for spec in chain.config.stop)
    max_new = args.max_new_tokens if args.max_new_tokens is not None else (None if has_limit else 32)
    kwargs: dict[str, Any] = dict(
        chain=chain,
        params=params,
        seed=args.seed,
        max_new_tokens=max_new,
        stop_strings=[unescape(s) for s in args.stop] if args.stop else None,
    )
    stem = _stem(args.out)
    stem.parent.mkdir(parents=True, exist_ok=True)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", GenerationWarning)
        start = time.perf_counter()
        show = args.progress if args.progress is not None else (None if (max_new or 0) > LONG_RUN_TOKENS else False)
        with progress_bar(max_new, "tracing", show, console=err) as bar:
            if bar.enabled:
                kwargs["progress"] = lambda step, total: bar.update(completed=step)
            trace = trace_generation(model, tokenizer, prompts[0], **kwargs)
        elapsed = time.perf_counter() - start
        png = trace.to_png(stem.with_suffix(".png"))
        page = trace.to_html(stem.with_suffix(".html"))
    for w in caught:
        if issubclass(w.category, GenerationWarning):
            err.print(f"[yellow]warning:[/yellow] {escape(str(w.message))}", highlight=False)

    if not args.no_table:
        console.print(trace.rich_table(max_rows=args.max_rows))
    console.print(f"[bold]{escape(prompts[0])}[/bold]{escape(trace.texts[0])}", highlight=False, soft_wrap=True)
    n = trace.num_generated[0]
    reason = trace.output.finish_reasons[0] if trace.output is not None else None
    err.print(
        f"[dim][{n} tokens in {elapsed:.2f} s, finish: {reason}; chain: {escape(trace.chain_repr)}][/dim]",
        highlight=False,
    )
    err.print(f"wrote {escape(str(png))} and {escape(str(page))}", highlight=False)
    return 0
