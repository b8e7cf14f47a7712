"""Benchmark: one sampling step of samplechain against transformers' logits processors, side by side.

The chain   temperature 0.8 -> top_k 40 -> top_p 0.95 -> min_p 0.05 -> dist
against     LogitsProcessorList([TemperatureLogitsWarper(0.8), TopKLogitsWarper(40), TopPLogitsWarper(0.95),
            MinPLogitsWarper(0.05)]) -> softmax -> torch.multinomial
on the same float32 logits (B, V), in the same process, with the same torch thread count. The "read floor" column
times one `logits.max(dim=-1)`: a single pass over the logits that also finds an index, which is what any top-k or
argmax pays; the amax column times `logits.amax(dim=-1)`, a vectorised pass without indices (the memory floor).

samplechain is timed on its steady-state serving path: a chain from `Chain.load({...})`, a request store from
`chain.new_store()` holding one request per row, and `chain.sample(logits, store, ids)` with accept=True (so the
per-request RNG positions advance every step, as in a generation loop).

Before timing, an untimed check compares the candidate sets: the finite entries of transformers' processed
scores against the finite entries of samplechain's `return_scores=True` scores, row by row.

    python benchmarks/bench_chain.py                      # B in {1, 32}, V in {50257, 128256}, both logit kinds
    python benchmarks/bench_chain.py --markdown --json out.json --reps 50 --rounds 4
    python benchmarks/bench_chain.py --breakdown          # also the time of each stage of both pipelines

A progress bar over rounds x cells is drawn on stderr when it is a terminal (--no-progress: never, --progress:
always), only between timed blocks: stdout (--markdown) and the timings are the same with or without it.

Importable: `run(batches, vocabs, reps)` returns one dict per (logits kind, B, V).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

import torch

import samplechain
from samplechain.tools.bench import (
    LOGIT_KINDS,
    environment,
    make_logits,
    print_breakdown,
    print_rows,
    stage_medians,
    timing_arguments,
    transformers_step,
)
from samplechain.tools.bench import summary as _summary
from samplechain.tools.bench import time_blocks as _time
from samplechain.tools.bench import warmup_for as _warmup_for
from samplechain.tools.progress import progress_bar

__all__ = ["CHAIN", "LOGIT_KINDS", "make_logits", "build_chain", "build_transformers", "run", "breakdown", "main"]

TEMPERATURE, TOP_K, TOP_P, MIN_P, SEED = 0.8, 40, 0.95, 0.05, 1234

CHAIN: dict[str, Any] = {
    "chain": {
        "name": "bench",
        "samplers": [
            {"use": "temperature", "t": TEMPERATURE},
            {"use": "top_k", "k": TOP_K},
            {"use": "top_p", "p": TOP_P},
            {"use": "min_p", "p": MIN_P},
            {"use": "dist", "seed": SEED},
        ],
    }
}


# --------------------------------------------------------------------------- inputs and pipelines
def build_chain() -> samplechain.Chain:
    return samplechain.Chain.load(CHAIN)


def build_transformers() -> Any:
    from transformers import (
        LogitsProcessorList,
        MinPLogitsWarper,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    return LogitsProcessorList(
        [
            TemperatureLogitsWarper(TEMPERATURE),
            TopKLogitsWarper(TOP_K),
            TopPLogitsWarper(TOP_P),
            MinPLogitsWarper(MIN_P),
        ]
    )


# --------------------------------------------------------------------------- candidate-set check
def compare_candidates(chain: samplechain.Chain, processors: Any, logits: torch.Tensor, rows: int = 4) -> dict:
    """Untimed: do both pipelines keep the same tokens? Compares the finite sets of the processed scores."""
    rows = min(rows, logits.shape[0])
    x = logits[:rows].contiguous()
    store = chain.new_store(capacity=rows)
    ids = [f"check{i}" for i in range(rows)]
    store.add_many(ids)
    ours = chain.sample(x, store, ids, accept=False, return_scores=True).scores
    theirs = processors(torch.zeros(rows, 1, dtype=torch.long), x)
    ours_keep, theirs_keep = torch.isfinite(ours), torch.isfinite(theirs)
    differ = (ours_keep != theirs_keep).sum(dim=-1)  # (rows,) tokens kept by exactly one pipeline
    return {
        "rows": rows,
        "agree": bool((differ == 0).all()),
        "kept_ours": ours_keep.sum(dim=-1).tolist(),
        "kept_transformers": theirs_keep.sum(dim=-1).tolist(),
        "tokens_differing": differ.tolist(),
    }


# --------------------------------------------------------------------------- the benchmark
def run(
    batches: Sequence[int] = (1, 32),
    vocabs: Sequence[int] = (50257, 128256),
    reps: int = 30,
    *,
    kinds: Sequence[str] = tuple(LOGIT_KINDS),
    rounds: int = 3,
    threads: int = 2,
    warmup: int | None = None,
    check: bool = True,
    progress: bool | None = None,
) -> list[dict[str, Any]]:
    """Time samplechain, transformers and the read floor for every (kind, B, V). One dict per combination.

    Each combination is measured `rounds` times (reps calls per pipeline each time), the rounds spread over the
    whole run, and the samples pooled: a slow spell of a shared machine then spoils a part of every cell's samples
    rather than all of one cell's. Times are milliseconds per step: {"median", "p10", "p90"}; the ratios are
    ratios of medians. torch's thread count is set to `threads` for the run and restored afterwards.

    progress: a bar over rounds x cells on stderr (None: when stderr is a terminal); it is drawn after a cell's
    timing ends, by this thread, never during a timed call.
    """
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    warmup = _warmup_for(reps) if warmup is None else warmup
    chain, processors = build_chain(), build_transformers()
    cells = [(kind, batch, vocab) for kind in kinds for vocab in vocabs for batch in batches]
    samples: dict[tuple[str, int, int], dict[str, list[float]]] = {cell: {} for cell in cells}
    checks: dict[tuple[str, int, int], dict[str, Any]] = {}
    try:
        with progress_bar(rounds * len(cells), "bench_chain", progress, auto_refresh=False) as bar:
            for r in range(rounds):
                for kind, batch, vocab in cells:
                    bar.update(status=f"round {r + 1}/{rounds}: {kind} B={batch} V={vocab}")  # drawn before timing
                    logits = make_logits(kind, batch, vocab)
                    before = logits.clone()
                    input_ids = torch.zeros(batch, 1, dtype=torch.long)  # the processors here ignore it
                    store = chain.new_store(capacity=batch)
                    ids = [f"req{i}" for i in range(batch)]
                    store.add_many(ids)
                    if check and (kind, batch, vocab) not in checks:
                        checks[(kind, batch, vocab)] = compare_candidates(chain, processors, logits)
                    times = _time(
                        {
                            "ours": lambda x=logits, s=store, r=ids: chain.sample(x, s, r),
                            "transformers": lambda i=input_ids, x=logits: transformers_step(processors, i, x),
                            "read": lambda x=logits: x.max(dim=-1),  # one pass with indices: what any top-k/argmax pays
                            "read_amax": lambda x=logits: x.amax(dim=-1),  # one vectorised pass, no indices
                        },
                        reps,
                        warmup,
                    )
                    if not torch.equal(logits, before):
                        raise AssertionError("a pipeline modified the caller's logits in place")
                    for name, t in times.items():
                        samples[(kind, batch, vocab)].setdefault(name, []).extend(t)
                    bar.advance()  # drawn after timing
    finally:
        torch.set_num_threads(previous_threads)
    results = []
    for cell in cells:
        kind, batch, vocab = cell
        row: dict[str, Any] = {"kind": kind, "batch": batch, "vocab": vocab, "reps": reps * rounds}
        if cell in checks:
            row["candidates"] = checks[cell]
        row.update({name: _summary(t) for name, t in samples[cell].items()})
        row["ratio_transformers_over_ours"] = row["transformers"]["median"] / row["ours"]["median"]
        row["ours_over_read"] = row["ours"]["median"] / row["read"]["median"]
        row["ours_over_amax"] = row["ours"]["median"] / row["read_amax"]["median"]
        results.append(row)
    return results


def breakdown(batch: int, vocab: int, reps: int = 50, *, kind: str = "randn", threads: int = 2) -> dict[str, Any]:
    """Median ms of each stage of both pipelines at one (B, V), by wrapping each stage with a timer.

    samplechain: each sampler's apply()/select(), and "executor", the rest of chain.sample() (batch view,
    logprob, accept). transformers: each processor, softmax, multinomial, and "LogitsProcessorList", the rest
    (its per-step inspect.signature of every processor). Steps of the two pipelines alternate.
    """
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        logits = make_logits(kind, batch, vocab)
        chain, processors = build_chain(), build_transformers()
        store = chain.new_store(capacity=batch)
        ids = [f"req{i}" for i in range(batch)]
        store.add_many(ids)
        input_ids = torch.zeros(batch, 1, dtype=torch.long)
        out: dict[str, Any] = {"kind": kind, "batch": batch, "vocab": vocab, "reps": reps}
        out.update(stage_medians(chain, processors, lambda: chain.sample(logits, store, ids), input_ids, logits, reps))
        return out
    finally:
        torch.set_num_threads(previous_threads)


# --------------------------------------------------------------------------- output
HEADERS = [
    "logits",
    "B",
    "V",
    "samplechain ms",
    "transformers ms",
    "read ms (max(dim=-1))",
    "amax ms",
    "transformers / samplechain",
    "samplechain / read",
    "same candidates",
]


def _cells(r: dict[str, Any]) -> list[str]:
    def ms(t: dict[str, float]) -> str:
        return f"{t['median']:.3f} ({t['p10']:.3f}–{t['p90']:.3f})"

    cand = r.get("candidates")
    same = "—" if cand is None else ("yes" if cand["agree"] else f"no (Δ {cand['tokens_differing']})")
    return [
        r["kind"],
        str(r["batch"]),
        str(r["vocab"]),
        ms(r["ours"]),
        ms(r["transformers"]),
        ms(r["read"]),
        f"{r['read_amax']['median']:.3f}",
        f"{r['ratio_transformers_over_ours']:.1f}x",
        f"{r['ours_over_read']:.2f}x",
        same,
    ]


def _int_list(text: str) -> list[int]:
    return [int(x) for x in text.replace(",", " ").split()]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch", type=_int_list, default=[1, 32], help="batch sizes, e.g. '1,32' (default)")
    parser.add_argument(
        "--vocab", type=_int_list, default=[50257, 128256], help="vocabulary sizes (default 50257,128256)"
    )
    parser.add_argument("--kinds", default=",".join(LOGIT_KINDS), help=f"logits kinds: {', '.join(LOGIT_KINDS)}")
    timing_arguments(parser, reps=30, rounds=3)
    parser.add_argument("--warmup", type=int, default=None, help="untimed warm-up calls (default reps // 5, >= 3)")
    parser.add_argument("--json", metavar="PATH", help="also write the results and the environment as JSON")
    parser.add_argument("--no-check", action="store_true", help="skip the candidate-set comparison")
    parser.add_argument("--breakdown", action="store_true", help="also time each stage, at every B and the largest V")
    args = parser.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]

    env = environment(args.threads)
    print(
        f"samplechain {env['samplechain']}, torch {env['torch']}, transformers {env['transformers']}, "
        f"{env['cpu']} ({env['cpu_count']} cores), torch threads {args.threads}, {env['date']}"
    )
    for k in kinds:
        print(f"  {k}: {LOGIT_KINDS.get(k, '?')}")
    results = run(
        args.batch,
        args.vocab,
        args.reps,
        kinds=kinds,
        rounds=args.rounds,
        threads=args.threads,
        warmup=args.warmup,
        check=not args.no_check,
        progress=args.progress,
    )
    print_rows(HEADERS, [_cells(r) for r in results], range(1, len(HEADERS)), markdown=args.markdown)
    if not args.no_check:
        bad = [r for r in results if not r["candidates"]["agree"]]
        print(
            "candidate sets: "
            + (
                "identical in every checked row"
                if not bad
                else "DIFFER in "
                + "; ".join(f"{r['kind']} B={r['batch']} V={r['vocab']}: {r['candidates']}" for r in bad)
            )
        )
    extra = []
    if args.breakdown:
        for k in kinds:
            for batch in args.batch:
                b = breakdown(batch, max(args.vocab), args.reps * args.rounds, kind=k, threads=args.threads)
                print_breakdown(b, f"{b['kind']} logits, B={b['batch']} V={b['vocab']}")
                extra.append(b)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "environment": env,
                    "chain": CHAIN,
                    "logit_kinds": LOGIT_KINDS,
                    "results": results,
                    "breakdown": extra,
                    "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
                },
                f,
                indent=2,
            )
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
