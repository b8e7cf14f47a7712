"""The `samplechain` command: one module per verb (generate, chat, plugins, validate, presets, demo, convert,
trace, new-plugin, install, bench), each with `add_parser(subparsers)`; `main` runs one and turns a
SamplechainError into one red line and exit status 1."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from rich.console import Console
from rich.markup import escape

from ..errors import SamplechainError
from . import bench, chat, convert, demo, generate, install, new_plugin, plugins, presets, trace, validate

__all__ = ["main", "build_parser"]

VERBS = (
    plugins,
    validate,
    presets,
    demo,
    generate,
    chat,
    convert,
    trace,
    new_plugin,
    install,
    bench,
)  # in --help's order


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="samplechain", description="samplechain: composable, batched LLM decoding.")
    sub = parser.add_subparsers(dest="command", required=True)
    for verb in VERBS:
        verb.add_parser(sub)
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
    except OSError as exc:
        if exc.filename is None:  # not about a path the command was given
            raise
        err.print(
            f"[red]error:[/red] {escape(str(exc.filename))}: {escape(exc.strerror or str(exc))}",
            highlight=False,
            soft_wrap=True,
        )
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
