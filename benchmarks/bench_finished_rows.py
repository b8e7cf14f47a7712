"""Benchmark: what decoding finished rows costs a batch on llama.cpp, side by side in one run.

SmolLM2-135M-Instruct on llama.cpp, chat prompts whose answers end at different lengths, greedy and the llama.cpp
preset (seeded), B = 4 and 8: generate() as it runs (the llama.cpp runner decodes only the rows still generating,
`skips_inactive`) against the same runner made to decode every row until the last one ends (what a runner that
runs the padded batch as a whole does), the runs interleaved per repetition. Printed per cell: the time per
generated token of each (median over --reps, the range), the ratio (median of the per-repetition ratios), and
whether the tokens are the same (they must be: a row's sequence does not depend on the others).

    .venv/bin/python benchmarks/bench_finished_rows.py --reps 5 --max-new-tokens 128
"""

from __future__ import annotations

import argparse
import statistics

from bench_guards import cell, open_default, run  # the same model, timing and cells as the guards' benchmark

CHATS = [
    "What is 12 times 12?",
    "Write a short story about a cat.",
    "List three prime numbers.",
    "Describe the sea in five sentences.",
    "What is the capital of France? Answer in one word.",
    "Explain how a rainbow forms.",
    "Say hello.",
    "Give me three tips for sleeping well.",
]
CHAINS = ("preset:greedy", "preset:llama.cpp")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--batch", default="4,8")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    from samplechain_llama_cpp.runner import LlamaCppRunner

    model, tok = open_default(args.threads, n_ctx=4096)
    print(f"{args.reps} reps; {args.max_new_tokens} new tokens at most")
    print("| chain | B | generated (min-max a row) | every row ms/token | active rows ms/token | ratio | same tokens |")
    print("|---|---:|---|---:|---:|---:|---|")
    for b in (int(x) for x in args.batch.split(",")):
        prompts = [[{"role": "user", "content": c}] for c in CHATS[:b]]
        for chain in CHAINS:
            every, active, ratios, same, lengths = [], [], [], True, ""
            for rep in range(args.reps + 1):
                got = {}
                for skips in [True, False] if rep % 2 else [False, True]:
                    LlamaCppRunner.skips_inactive = skips
                    t, out = run(model, tok, prompts, chain, args.max_new_tokens)
                    got[skips] = (t / max(1, int(out.num_generated.sum())), out)
                LlamaCppRunner.skips_inactive = True
                if rep == 0:
                    continue  # warm-up
                (t0, full), (t1, skipping) = got[False], got[True]
                every.append(t0 * 1e3)
                active.append(t1 * 1e3)
                ratios.append(t1 / t0)
                same &= full.sequences.tolist() == skipping.sequences.tolist()
                n = full.num_generated.tolist()
                lengths = f"{sum(n)} ({min(n)}-{max(n)})"

            print(
                f"| {chain} | {b} | {lengths} | {cell(every)} | {cell(active)} | {statistics.median(ratios):.3f}x "
                f"({min(ratios):.2f}-{max(ratios):.2f}) | {'yes' if same else 'NO'} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
