"""Benchmark: drafting from earlier answers (Suffix Decoding, contrib/samplechain-example-suffix) against prompt lookup
and no drafter, on requests asked again, side by side in one run.

SmolLM2-135M-Instruct (the default model; --engine transformers or llama.cpp), chat prompts rendered with its
template, the llama.cpp preset. Two workloads:

- `asked again`: each prompt asked --asks times one after another at B = 1, with seeds 0, 1, ... (an agent loop,
  several samples drawn one by one); the first ask and the later ones are reported apart, since only a later ask has
  earlier answers to draft from;
- `samples`: each prompt with num_return_sequences = --samples in one batch (seed 0), whose rows draft from each
  other's answers as they are written.

Per round, the drafters take turns (their order rotating from round to round); the earlier answers are forgotten
before each drafter's asks and before each batch of samples, so every round starts alike and a batch drafts from its
own rows only. Printed per workload and drafter: tokens per second of each generate() call (generated tokens over
wall time, prefill included; the median over prompts and rounds, the range), the ratio to the same call without a
drafter in the same round (the median), kept/drafted, tokens per model call per row, and whether every text is the
one generated without a drafter.

    .venv/bin/python benchmarks/bench_suffix.py --rounds 3 --asks 3 --max-new-tokens 96
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "contrib" / "samplechain-example-suffix"))

from samplechain.errors import GenerationWarning  # noqa: E402
from samplechain.generation import generate  # noqa: E402
from samplechain.models import default_gguf_path, load_model  # noqa: E402
from samplechain_example_suffix import SuffixDecoding, clear_answers  # noqa: E402

CHATS = [
    "Write a Python function that reverses a string, with a docstring and an example.",
    "Explain what a hash table is in three sentences.",
    "Give me a short packing list for a weekend hiking trip.",
]
DRAFTERS = ("none", "prompt_lookup", "suffix")


def timed(model, tok, prompt, drafter: str, **kwargs):
    """(seconds, output) of one generate() call with `drafter`."""
    draft = {"none": None, "prompt_lookup": "prompt_lookup", "suffix": SuffixDecoding()}[drafter]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GenerationWarning)
        start = time.perf_counter()
        out = generate(model, tok, [prompt], chain="preset:llama.cpp", draft=draft, **kwargs)
        return time.perf_counter() - start, out


def cell(xs: list[float], digits: int = 1) -> str:
    return f"{statistics.median(xs):.{digits}f} ({min(xs):.{digits}f}-{max(xs):.{digits}f})"


class Tally:
    """One (workload, drafter)'s rounds: tokens per second, counts, and whether the texts were the plain ones."""

    def __init__(self) -> None:
        self.rates: list[float] = []
        self.ratios: list[float] = []
        self.kept = self.drafted = self.tokens = self.calls = 0
        self.same = True

    def add(self, seconds: float, out, plain_texts, base_rate: float | None) -> float:
        tokens = int(out.num_generated.sum())
        rate = tokens / seconds
        self.rates.append(rate)
        if base_rate is not None:
            self.ratios.append(rate / base_rate)
        if out.kept is not None:
            self.kept += int(out.kept.sum())
            self.drafted += int(out.drafted.sum())
            self.calls += int(out.model_calls.sum())
        self.tokens += tokens
        self.same &= out.texts == plain_texts
        return rate

    def row(self, workload: str, drafter: str) -> str:
        ratio = (
            "1"
            if not self.ratios
            else f"{statistics.median(self.ratios):.2f}x ({min(self.ratios):.2f}-{max(self.ratios):.2f})"
        )
        kept = "-" if not self.drafted else f"{self.kept / self.drafted:.2f} ({self.kept}/{self.drafted})"
        per_call = "1.00" if not self.calls else f"{self.tokens / self.calls:.2f}"
        same = "yes" if self.same else "NO"
        return f"| {workload} | {drafter} | {cell(self.rates)} | {ratio} | {kept} | {per_call} | {same} |"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", default="transformers", choices=["transformers", "llama.cpp"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--asks", type=int, default=3)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.engine == "llama.cpp":
        threads = {"n_threads": args.threads, "n_threads_batch": args.threads}
        model, tok = load_model(default_gguf_path(), n_ctx=2048, flash_attn=True, **threads)
    else:
        model, tok = load_model()
    prompts = [[{"role": "user", "content": c}] for c in CHATS]
    n = args.max_new_tokens
    timed(model, tok, prompts[0], "none", seed=0, max_new_tokens=8)  # warm-up
    workloads = ("asked again: first ask", "asked again: later asks", f"{args.samples} samples in a batch")
    tallies = {(w, d): Tally() for w in workloads for d in DRAFTERS}
    plain: dict[tuple, list[str]] = {}
    for r in range(args.rounds):
        order = DRAFTERS[r % len(DRAFTERS) :] + DRAFTERS[: r % len(DRAFTERS)]
        base: dict[tuple, float] = {}
        runs: dict[str, list[tuple]] = {d: [] for d in DRAFTERS}
        for drafter in order:
            clear_answers()
            for p, prompt in enumerate(prompts):
                for ask in range(args.asks):
                    runs[drafter].append(((p, ask), timed(model, tok, prompt, drafter, seed=ask, max_new_tokens=n)))
            settings = {"seed": 0, "max_new_tokens": n, "num_return_sequences": args.samples}
            for p, prompt in enumerate(prompts):
                clear_answers()  # the batch's rows draft from each other only
                runs[drafter].append(((p, "samples"), timed(model, tok, prompt, drafter, **settings)))
        for drafter in ("none",) + tuple(d for d in DRAFTERS if d != "none"):
            for key, (seconds, out) in runs[drafter]:
                if drafter == "none":
                    plain.setdefault(key, out.texts)
                workload = workloads[2] if key[1] == "samples" else workloads[0 if key[1] == 0 else 1]
                rate = tallies[(workload, drafter)].add(seconds, out, plain[key], base.get(key))
                if drafter == "none":
                    base[key] = rate
        print(f"round {r + 1} of {args.rounds} done", file=sys.stderr, flush=True)
    print(
        f"{args.engine}, {len(prompts)} prompts, {args.asks} asks each, {args.samples} samples, {n} new tokens at "
        f"most, {args.rounds} rounds"
    )
    print("| workload | drafter | tok/s | vs no drafter | kept/drafted | tok/call | same text |")
    print("|---|---|---:|---:|---:|---:|---|")
    for w in workloads:
        for d in DRAFTERS:
            print(tallies[(w, d)].row(w, d))


if __name__ == "__main__":
    main()
