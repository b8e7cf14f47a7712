"""`samplechain bench`: time the target matrix of samplechain.tools.bench (ours, transformers, the read floor) and print
every cell, the ratios and whether each target is met; optionally write JSON and a PNG plot."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..errors import ConfigError

__all__ = ["add_parser", "cmd_bench", "markdown_table", "write_plot"]

HEADERS = [
    "config",
    "logits",
    "dtype",
    "B",
    "ours ms",
    "transformers ms",
    "read ms",
    "baseline ms",
    "transformers / ours",
    "ours / read",
    "ours / baseline",
    "target",
    "met?",
]


def _names(text: str) -> list[str]:
    return [x for x in text.replace(" ", ",").split(",") if x]


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in _names(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected integers separated by commas, e.g. 1,8,32") from None


def add_parser(sub: Any) -> None:
    """Register the subcommand(s) of this module on the `samplechain` parser."""
    from ..tools.bench import CONFIGS, DTYPES, LOGIT_KINDS

    p = sub.add_parser(
        "bench",
        help="time the speed-target matrix: ours vs transformers vs one read of the logits, per batch size",
        description="Time one sampling step of each configuration of the target matrix against transformers' "
        "equivalent processors (+ softmax + multinomial) and one logits.max(dim=-1) (the read floor), alternating "
        "in blocks, and print median (p10-p90) ms, the ratios and whether each target is met. Configurations: "
        + "; ".join(f"{c.name}: {c.target_text}" for c in CONFIGS.values())
        + ".",
    )
    p.add_argument("--batch", type=_ints, default=[1, 8, 32], help="batch sizes (default 1,8,32)")
    p.add_argument("--vocab", type=int, default=128256, help="vocabulary size V (default 128256)")
    p.add_argument(
        "--kinds", type=_names, default=["peaked"], help=f"logits kinds: {', '.join(LOGIT_KINDS)} (default peaked)"
    )
    p.add_argument(
        "--configs", type=_names, default=list(CONFIGS), help=f"configurations (default all: {','.join(CONFIGS)})"
    )
    p.add_argument(
        "--dtypes",
        type=_names,
        default=list(DTYPES),
        help=f"logits dtypes (default {','.join(DTYPES)}); non-float32 rows are compared with our float32 "
        "time, transformers is timed at float32 only",
    )
    p.add_argument("--reps", type=int, default=20, help="timed calls per pipeline per round (default 20)")
    p.add_argument("--rounds", type=int, default=3, help="rounds, spread over the run, samples pooled (default 3)")
    p.add_argument("--warmup", type=int, default=None, help="untimed warm-up calls (default reps // 5, >= 3)")
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads for the run (default 2)")
    p.add_argument("--markdown", action="store_true", help="print a markdown table instead of a rich one")
    p.add_argument("--json", metavar="PATH", help="also write the rows and the environment as JSON")
    p.add_argument(
        "--plot",
        metavar="PATH",
        help="also write a PNG: ms/step against batch size, one panel per configuration (and logits kind / dtype)",
    )
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="a bar over rounds x cells on stderr, drawn between timed blocks (default: when stderr is a terminal)",
    )
    p.set_defaults(func=cmd_bench)


# --------------------------------------------------------------------------- cells
def _ms(t: dict[str, float] | None) -> str:
    return "n/a" if t is None else f"{t['median']:.3f} ({t['p10']:.3f}–{t['p90']:.3f})"


def _x(v: float | None, digits: int = 2) -> str:
    return "n/a" if v is None else f"{v:.{digits}f}x"


def _cells(r: dict[str, Any]) -> list[str]:
    base = "—" if r["baseline"] is None else f"{r['baseline_label']}: {_ms(r['baseline'])}"
    met = {True: "yes", False: "NO", None: "n/a"}[r["met"]]
    return [
        r["config"],
        r["kind"],
        r["dtype"],
        str(r["batch"]),
        _ms(r["ours"]),
        _ms(r["transformers"]),
        _ms(r["read"]),
        base,
        _x(r["transformers_over_ours"], 1),
        _x(r["ours_over_read"]),
        _x(r["ours_over_baseline"], 3) if r["baseline"] is not None else "—",
        r["target"],
        met,
    ]


_RIGHT = range(4, 11)  # the numeric columns


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    from ..tools.bench import markdown_rows

    return markdown_rows(HEADERS, [_cells(r) for r in rows], _RIGHT)


def _rich_table(rows: Sequence[dict[str, Any]], vocab: int) -> Table:
    from ..tools.bench import rich_rows

    cells = []
    for r in rows:
        row = [escape(c) for c in _cells(r)]
        row[-1] = {"yes": "[green]yes", "NO": "[red]NO"}.get(row[-1], row[-1])
        cells.append(row)
    return rich_rows(HEADERS, cells, range(3, 11), f"ms per step at V={vocab}: median (p10–p90)")


# --------------------------------------------------------------------------- plot
def write_plot(rows: Sequence[dict[str, Any]], path: str | Path, *, dpi: int = 100) -> Path:
    """A PNG (matplotlib, Agg canvas): one panel per configuration (columns) and logits kind / dtype (rows),
    median ms/step against batch size, log y; lines for ours, transformers and the read floor (and our
    baseline, dashed, where the target has one)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    configs = list(dict.fromkeys(r["config"] for r in rows))
    groups = list(dict.fromkeys((r["kind"], r["dtype"]) for r in rows))
    fig = Figure(figsize=(4.2 * len(configs), 3.4 * len(groups)), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(groups), len(configs), squeeze=False)
    lines: list[tuple[str, str | None, dict[str, Any]]] = [
        ("ours", "samplechain", dict(color="tab:blue", marker="o")),
        ("transformers", "transformers", dict(color="tab:orange", marker="s")),
        ("read", "read floor (max(dim=-1))", dict(color="tab:gray", marker="^")),
        ("baseline", None, dict(color="tab:blue", marker=".", linestyle="--", alpha=0.6)),
    ]
    for gi, (kind, dtype) in enumerate(groups):
        for ci, config in enumerate(configs):
            ax = axes[gi][ci]
            cell = sorted(
                (r for r in rows if r["config"] == config and (r["kind"], r["dtype"]) == (kind, dtype)),
                key=lambda r: r["batch"],
            )
            for key, label, style in lines:
                points = [(r["batch"], r[key]["median"]) for r in cell if r[key] is not None]
                if points:
                    name = label or f"samplechain, {cell[0]['baseline_label']}"
                    ax.plot([b for b, _ in points], [m for _, m in points], label=name, **style)
            ax.set_yscale("log")
            ax.set_xscale("log", base=2)
            batches = [r["batch"] for r in cell]
            ax.set_xticks(batches, [str(b) for b in batches])
            ax.set_xlabel("batch size")
            ax.set_ylabel("ms / step")
            vocab = cell[0]["vocab"] if cell else "?"
            ax.set_title(f"{config}\nV={vocab}, {dtype}, {kind} logits", fontsize=10)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    return path


# --------------------------------------------------------------------------- the command
def cmd_bench(args: argparse.Namespace, console: Console) -> int:
    from ..tools.bench import CONFIGS, LOGIT_KINDS, environment, run_matrix, transformers_available

    err = Console(stderr=True)
    if args.threads < 1:
        raise ConfigError(f"--threads {args.threads}: must be >= 1")
    env = environment(args.threads)
    header = (
        f"samplechain {env['samplechain']}, torch {env['torch']}, transformers {env['transformers'] or 'n/a'}, "
        f"{env['cpu']} ({env['cpu_count']} cores), torch threads {args.threads}, {env['date']}"
    )
    notes = [f"  {k}: {LOGIT_KINDS[k]}" for k in args.kinds if k in LOGIT_KINDS]
    if not transformers_available():
        notes.append("  transformers is not installed: its columns are n/a (pip install transformers)")
    start = time.perf_counter()
    rows = run_matrix(
        args.batch,
        args.vocab,
        args.kinds,
        args.dtypes,
        args.reps,
        args.rounds,
        args.progress,
        configs=args.configs,
        threads=args.threads,
        warmup=args.warmup,
    )
    elapsed = time.perf_counter() - start
    counts = {v: sum(r["met"] is v for r in rows) for v in (True, False, None)}
    tally = f"targets: {counts[True]} met, {counts[False]} missed, {counts[None]} n/a; {elapsed:.0f} s"
    if args.markdown:
        print(header)
        print("\n".join(notes))
        print(markdown_table(rows))
        print(tally)
    else:
        if not console.is_terminal:  # piped: rich would wrap at 80 columns
            console = Console(width=260)
        console.print(escape(header), highlight=False)
        console.print(escape("\n".join(notes)), highlight=False)
        console.print(_rich_table(rows, args.vocab))
        console.print(tally, highlight=False)
    if args.json:
        payload = {
            "environment": env,
            "settings": {
                k: getattr(args, k)
                for k in ("batch", "vocab", "kinds", "configs", "dtypes", "reps", "rounds", "warmup", "threads")
            },
            "configs": {
                n: {"chain": c.chain, "transformers": c.transformers_text, "targets": c.target_text}
                for n, c in CONFIGS.items()
                if n in args.configs
            },
            "logit_kinds": LOGIT_KINDS,
            "rows": rows,
            "command": " ".join([os.path.basename(sys.argv[0]), *sys.argv[1:]]),
        }
        Path(args.json).write_text(json.dumps(payload, indent=2))
        err.print(f"wrote {escape(args.json)}", highlight=False)
    if args.plot:
        err.print(f"wrote {escape(str(write_plot(rows, args.plot)))}", highlight=False)
    return 0
