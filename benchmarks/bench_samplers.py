"""Benchmark: every filter, shaper and selector of the catalogue alone on the full vocabulary, B = 32, V = 128256.

Each sampler runs as the only stage before `dist` (selectors alone), so it sees every token, and is timed against
one `logits.max(dim=-1)` (the read floor) and, where transformers has the same processor, against that processor
followed by softmax + multinomial. The table shows which samplers have a fast path for wide rows and which still
cost tens of milliseconds (float64 passes over the vocabulary, full sorts).

    python benchmarks/bench_samplers.py --markdown
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch

import samplechain
from samplechain.tools.bench import (
    environment,
    make_logits,
    markdown_rows,
    summary,
    time_blocks,
    timing_arguments,
    transformers_step,
    warmup_for,
)
from samplechain.tools.progress import progress_bar

# sampler entry (before dist), transformers processor factory or None
CASES: dict[str, tuple[dict[str, Any], Callable[[], Any] | None]] = {}


def _hf(name: str, *args: Any, **kwargs: Any) -> Callable[[], Any]:
    def build() -> Any:
        import transformers.generation.logits_process as lp

        return lp.LogitsProcessorList([getattr(lp, name)(*args, **kwargs)])

    return build


for _name, _entry, _hf_factory in [
    ("top_k", {"k": 40}, _hf("TopKLogitsWarper", 40)),
    ("top_p", {"p": 0.9}, _hf("TopPLogitsWarper", 0.9)),
    ("min_p", {"p": 0.05}, _hf("MinPLogitsWarper", 0.05)),
    ("typical", {"p": 0.9}, _hf("TypicalLogitsWarper", 0.9)),
    ("epsilon", {"epsilon": 3e-4}, _hf("EpsilonLogitsWarper", 3e-4)),
    ("eta", {"epsilon": 3e-4}, _hf("EtaLogitsWarper", 3e-4)),
    ("top_h", {"top_h": 0.5}, _hf("TopHLogitsWarper", 0.5)),
    ("temperature", {"t": 0.8}, _hf("TemperatureLogitsWarper", 0.8)),
    ("top_n_sigma", {"n": 1.0}, None),
    ("xtc", {"probability": 0.5, "threshold": 0.1, "seed": 1}, None),
    ("top_a", {"a": 0.2}, None),
    ("tfs", {"z": 0.95}, None),
    ("p_less", {}, None),
    ("quadratic", {"factor": 0.3}, None),
    ("temp_ext", {"t": 0.8, "delta": 0.5}, None),
]:
    CASES[_name] = ({"use": _name, **_entry}, _hf_factory)
SELECTORS = {
    "dist": {"use": "dist", "seed": 1},
    "greedy": {"use": "greedy"},
    "mirostat": {"use": "mirostat"},
    "mirostat_v2": {"use": "mirostat_v2"},
    "adaptive_p": {"use": "adaptive_p", "target": 0.5},
}


def run(batch: int, vocab: int, kind: str, reps: int, progress: bool | None) -> list[dict[str, Any]]:
    logits = make_logits(kind, batch, vocab)
    input_ids = torch.zeros(batch, 1, dtype=torch.int64)
    rows = []
    names = [*CASES, *SELECTORS]
    with progress_bar(len(names), "bench_samplers", progress, auto_refresh=False) as bar:
        for name in names:
            entry, hf = CASES[name] if name in CASES else (SELECTORS[name], None)
            samplers = [entry] if name in SELECTORS else [entry, {"use": "dist", "seed": 1}]
            chain = samplechain.Chain.load({"chain": {"samplers": samplers}})
            store = chain.new_store()
            ids = [f"r{i}" for i in range(batch)]
            for rid in ids:
                store.add(rid, {})
            fns = {"ours": lambda c=chain, s=store, r=ids: c.sample(logits, s, r), "read": lambda: logits.max(dim=-1)}
            if hf is not None:
                procs = hf()
                fns["transformers"] = lambda p=procs: transformers_step(p, input_ids, logits)
            times = {k: summary(v) for k, v in time_blocks(fns, reps, warmup_for(reps)).items()}
            rows.append({"sampler": name, **times})
            bar.advance()
    return rows


def markdown(rows: Sequence[dict[str, Any]]) -> str:
    headers = ["sampler (then dist)", "ours ms", "transformers ms", "transformers / ours", "ours / read"]
    cells = []
    for r in rows:
        ours, theirs = r["ours"]["median"], r.get("transformers")
        cells.append(
            [
                r["sampler"],
                f"{ours:.2f}",
                f"{theirs['median']:.2f}" if theirs else "—",
                f"{theirs['median'] / ours:.1f}x" if theirs else "—",
                f"{ours / r['read']['median']:.1f}x",
            ]
        )
    return markdown_rows(headers, cells, range(1, 5))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--kind", default="peaked")
    timing_arguments(parser, reps=10)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = run(args.batch, args.vocab, args.kind, args.reps, args.progress)
    print(markdown(rows))
    print(
        f"\nB = {args.batch}, V = {args.vocab}, {args.kind} logits, median of {args.reps}; "
        + ", ".join(f"{k} {v}" for k, v in environment(args.threads).items()),
        file=sys.stdout,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
