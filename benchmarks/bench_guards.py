"""Benchmark: what a 50-phrase ban list costs generation when no phrase occurs, side by side in one run.

SmolLM2-135M-Instruct on llama.cpp (the default model and engine), chat prompts rendered with its template, greedy
and the llama.cpp preset (seeded), B = 1 and 4: generate() without guards against generate(guards=[banned_strings
with 50 phrases the answers do not hold]), the runs interleaved per repetition. Printed per cell: ms per kept token
of each (median over --reps, the range), the ratio (median of the per-repetition ratios), the rewinds (0 when no
phrase occurs), and whether the texts are the same (they must be: no ban acted). Target: ratio <= 1.15.

    .venv/bin/python benchmarks/bench_guards.py --reps 7 --max-new-tokens 96
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

from samplechain.errors import GenerationWarning
from samplechain.generation import generate
from samplechain.models import default_gguf_path

# 50 phrases of the kind anti-slop lists ban, none of which SmolLM2 says to these prompts (checked: 0 rewinds)
PHRASES = [
    "a testament to",
    "shivers down",
    "tapestry of",
    "delve into",
    "in the realm of",
    "a symphony of",
    "barely above a whisper",
    "eyes sparkling",
    "couldn't help but",
    "a mix of",
    "palpable tension",
    "the weight of the world",
    "unspoken understanding",
    "a dance of",
    "ministrations",
    "little did they know",
    "sent shivers",
    "maybe, just maybe",
    "an unbreakable bond",
    "for what felt like an eternity",
    "the air was thick",
    "a beacon of hope",
    "testament to the",
    "whispering winds",
    "bustling city",
    "kaleidoscope of",
    "in a world where",
    "dimly lit",
    "heart pounding",
    "breath hitched",
    "a wave of",
    "steeled herself",
    "sparkling with mischief",
    "voice dripping",
    "a hint of",
    "the ghost of a smile",
    "searing kiss",
    "glint in his eye",
    "ethereal beauty",
    "profound sense",
    "navigate the complexities",
    "rich tapestry",
    "embark on a journey",
    "ever-evolving landscape",
    "intricate dance",
    "uncharted territory",
    "vibrant hues",
    "a stark reminder",
    "echoes of the past",
    "resonate deeply",
]
CHATS = [
    "What is the capital of France? Answer in one sentence.",
    "List three prime numbers.",
    "Write a Python function that adds two numbers.",
    "What is 12 times 12?",
]
CHAINS = ("preset:greedy", "preset:llama.cpp")


def run(model, tok, prompts, chain, n, **kwargs):
    """(seconds, output) of one generate() call; the llama.cpp preset seeded per row."""
    params = None if chain == "preset:greedy" else [{"seed": 11 + i} for i in range(len(prompts))]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GenerationWarning)
        start = time.perf_counter()
        out = generate(model, tok, prompts, chain=chain, max_new_tokens=n, params=params, **kwargs)
        return time.perf_counter() - start, out


def open_default(threads: int, n_ctx: int = 2048):
    """(model, tokenizer): the default model on llama.cpp with `threads` threads."""
    from samplechain_llama_cpp import load_gguf

    return load_gguf(default_gguf_path(), n_ctx=n_ctx, flash_attn=True, n_threads=threads, n_threads_batch=threads)


def cell(xs) -> str:
    """A median with its range."""
    return f"{statistics.median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--batch", default="1,4")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    model, tok = open_default(args.threads)
    guards = [{"use": "banned_strings", "phrases": PHRASES, "ignore_case": True}]
    print(f"{len(PHRASES)} phrases, ignore_case; {args.reps} reps; {args.max_new_tokens} new tokens at most")
    print("| chain | B | no guards ms/token | 50 phrases ms/token | ratio | rewinds | same text |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for b in (int(x) for x in args.batch.split(",")):
        prompts = [[{"role": "user", "content": c}] for c in CHATS[:b]]
        for chain in CHAINS:
            base, banned, ratios, rewinds, same = [], [], [], 0, True
            for rep in range(args.reps + 1):
                order = [None, guards] if rep % 2 else [guards, None]
                got = {}
                for g in order:
                    t, out = run(model, tok, prompts, chain, args.max_new_tokens, guards=g)
                    got[g is None] = (t / max(1, int(out.num_generated.sum())), out)
                if rep == 0:
                    continue  # warm-up
                (t0, plain), (t1, guarded) = got[True], got[False]
                base.append(t0 * 1e3)
                banned.append(t1 * 1e3)
                ratios.append(t1 / t0)
                rewinds += int(guarded.rewinds.sum())
                same &= plain.texts == guarded.texts

            print(
                f"| {chain} | {b} | {cell(base)} | {cell(banned)} | {statistics.median(ratios):.3f}x "
                f"({min(ratios):.2f}-{max(ratios):.2f}) | {rewinds} | {'yes' if same else 'NO'} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
