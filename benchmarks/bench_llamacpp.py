"""Benchmark: the llama.cpp sampler chain, samplechain against llama.cpp's own samplers, on the same logits.

The chain  penalties (last 64, repeat 1.1) -> top_k 40 -> top_p 0.95 -> min_p 0.05 -> temperature 0.8 -> dist
runs in samplechain on the whole batch (`chain.sample(logits, store, ids, history=...)`, one request per row) and
in llama.cpp (llama-cpp-python's bindings to `llama_sampler_chain_*`) row by row, as llama.cpp's server does:
one sampler chain per request, the last 64 history tokens accepted into its penalty window before timing, and per
step the row's logits copied into a `llama_token_data_array` (what `llama_sampler_sample` does) and
`llama_sampler_apply` called. Neither side accepts tokens while timed, so every step does the same work.

llama-cpp-python is not part of the set-up (it compiles llama.cpp, ~10 minutes on 2 cores):

    CMAKE_ARGS="-DGGML_NATIVE=ON" .venv/bin/python -m pip install llama-cpp-python   # from its sdist
    .venv/bin/python benchmarks/bench_llamacpp.py --markdown

Before timing, an untimed check runs both filter chains (without dist) on 4 rows and compares the kept token
sets.
"""

from __future__ import annotations

import argparse
import ctypes
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

import samplechain
from samplechain.tools.bench import (
    environment,
    make_history,
    make_logits,
    markdown_rows,
    summary,
    time_blocks,
    timing_arguments,
    warmup_for,
)
from samplechain.tools.progress import progress_bar

LAST_N, REPEAT, TOP_K, TOP_P, MIN_P, TEMP, SEED = 64, 1.1, 40, 0.95, 0.05, 0.8, 1234
FILTERS = [
    {"use": "penalties", "repeat": REPEAT, "last_n": LAST_N},
    {"use": "top_k", "k": TOP_K},
    {"use": "top_p", "p": TOP_P},
    {"use": "min_p", "p": MIN_P},
    {"use": "temperature", "t": TEMP},
]


def _llama() -> Any:
    try:
        import llama_cpp
    except ImportError:
        sys.exit(
            'llama-cpp-python is not installed: CMAKE_ARGS="-DGGML_NATIVE=ON" .venv/bin/python -m pip install '
            "llama-cpp-python (it builds llama.cpp from source)"
        )
    return llama_cpp


class LlamaRows:
    """One llama.cpp sampler chain per row, and a reusable token-data array per row."""

    def __init__(self, vocab: int, history: torch.Tensor, *, with_dist: bool = True) -> None:
        self.L = _llama()
        L = self.L
        self.vocab = vocab
        self.chains = []
        for row in range(history.shape[0]):
            chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
            L.llama_sampler_chain_add(chain, L.llama_sampler_init_penalties(vocab, LAST_N, REPEAT, 0.0, 0.0))
            L.llama_sampler_chain_add(chain, L.llama_sampler_init_top_k(TOP_K))
            L.llama_sampler_chain_add(chain, L.llama_sampler_init_top_p(TOP_P, 1))
            L.llama_sampler_chain_add(chain, L.llama_sampler_init_min_p(MIN_P, 1))
            L.llama_sampler_chain_add(chain, L.llama_sampler_init_temp(TEMP))
            if with_dist:
                L.llama_sampler_chain_add(chain, L.llama_sampler_init_dist(SEED + row))
            for token in history[row, -LAST_N:].tolist():  # the penalty window: the last 64 tokens
                L.llama_sampler_accept(chain, int(token))
            self.chains.append(chain)
        self.data = (L.llama_token_data * vocab)()
        self.view = np.frombuffer(self.data, dtype=np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")]))
        self.ids = np.arange(vocab, dtype=np.int32)
        self.array = L.llama_token_data_array(self.data, vocab, -1, False)

    def apply(self, row: int, logits: np.ndarray) -> Any:
        """llama_sampler_sample's work for one row: fill the candidates from the logits, apply the chain."""
        self.view["id"] = self.ids
        self.view["logit"] = logits
        self.array.size, self.array.selected, self.array.sorted = self.vocab, -1, False
        self.L.llama_sampler_apply(self.chains[row], ctypes.byref(self.array))
        return self.array

    def step(self, logits: np.ndarray) -> list[int]:
        out = []
        for row in range(logits.shape[0]):
            arr = self.apply(row, logits[row])
            out.append(int(self.view["id"][arr.selected]))
        return out

    def kept(self, row: int, logits: np.ndarray) -> set[int]:
        arr = self.apply(row, logits)
        return set(self.view["id"][: arr.size].tolist())

    def close(self) -> None:
        for chain in self.chains:
            self.L.llama_sampler_free(chain)


def _ours(batch: int) -> tuple[samplechain.Chain, Any, list[str]]:
    chain = samplechain.Chain.load({"chain": {"samplers": [*FILTERS, {"use": "dist", "seed": SEED}]}})
    store = chain.new_store()
    ids = [f"r{i}" for i in range(batch)]
    for rid in ids:
        store.add(rid, {})
    return chain, store, ids


def check(kind: str, vocab: int, rows: int = 4) -> str:
    """Untimed: the kept sets of both filter chains (no dist) on the same rows."""
    logits = make_logits(kind, rows, vocab, seed=1)
    history = make_history(rows, vocab)
    ours = samplechain.Chain.load({"chain": {"samplers": [*FILTERS, {"use": "greedy"}]}})
    scores = ours.process(logits, history=history, prompt_lengths=torch.full((rows,), history.shape[1] - LAST_N))
    theirs = LlamaRows(vocab, history, with_dist=False)
    try:
        same = sum(
            theirs.kept(r, logits[r].numpy()) == set(torch.isfinite(scores[r]).nonzero().flatten().tolist())
            for r in range(rows)
        )
    finally:
        theirs.close()
    return f"same sets, {same}/{rows} rows" if same == rows else f"DIFFERENT sets in {rows - same}/{rows} rows"


def run(
    batches: Sequence[int], vocab: int, kinds: Sequence[str], reps: int, rounds: int, progress: bool | None = None
) -> list[dict[str, Any]]:
    results = []
    cells = [(kind, b) for kind in kinds for b in batches]
    with progress_bar(len(cells) * rounds, "bench_llamacpp", progress, auto_refresh=False) as bar:
        times: dict[tuple[str, int], dict[str, list[float]]] = {cell: {} for cell in cells}
        for _ in range(rounds):
            for kind, batch in cells:
                logits = make_logits(kind, batch, vocab)
                history = make_history(batch, vocab)
                lengths = torch.full((batch,), history.shape[1] - LAST_N)
                chain, store, ids = _ours(batch)
                theirs = LlamaRows(vocab, history)
                as_numpy = logits.numpy()
                fns = {
                    "samplechain": lambda c=chain, x=logits, s=store, r=ids, h=history, n=lengths: c.sample(
                        x, s, r, history=h, prompt_lengths=n
                    ),
                    "llama.cpp": lambda t=theirs, a=as_numpy: t.step(a),
                    "read": lambda x=logits: x.max(dim=-1),
                }
                try:
                    for name, ts in time_blocks(fns, reps, warmup_for(reps)).items():
                        times[(kind, batch)].setdefault(name, []).extend(ts)
                finally:
                    theirs.close()
                bar.advance()
    for kind, batch in cells:
        t = {name: summary(ts) for name, ts in times[(kind, batch)].items()}
        results.append(
            {
                "kind": kind,
                "batch": batch,
                "vocab": vocab,
                **t,
                "llama_over_ours": t["llama.cpp"]["median"] / t["samplechain"]["median"],
                "check": check(kind, vocab),
            }
        )
    return results


def markdown(results: Sequence[dict[str, Any]]) -> str:
    def ms(t: dict[str, float]) -> str:
        return f"{t['median']:.3f} ({t['p10']:.3f}–{t['p90']:.3f})"

    headers = ["logits", "B", "samplechain ms", "llama.cpp ms", "llama.cpp / samplechain", "read ms", "check"]
    rows = [
        [
            r["kind"],
            str(r["batch"]),
            ms(r["samplechain"]),
            ms(r["llama.cpp"]),
            f"{r['llama_over_ours']:.2f}x",
            f"{r['read']['median']:.3f}",
            r["check"],
        ]
        for r in results
    ]
    return markdown_rows(headers, rows, range(1, 6))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", default="1,8,32", help="batch sizes (default 1,8,32)")
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--kinds", default="peaked,randn")
    timing_arguments(parser, reps=20, rounds=3)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    results = run(
        [int(b) for b in args.batch.split(",")],
        args.vocab,
        args.kinds.split(","),
        args.reps,
        args.rounds,
        args.progress,
    )
    print(markdown(results))
    env = environment(args.threads)
    print(f"\nllama-cpp-python {_llama().__version__}; " + ", ".join(f"{k} {v}" for k, v in env.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
