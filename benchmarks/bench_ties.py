"""bf16-rounded logits against float32 ones (ties settled without Python loops).

Logits of a bf16 model tie at the k-th place in most rows; a step on them should cost what it costs on float32
logits. Median ms per step of several chains on `torch.randn(B, V) * 3` and on the same logits rounded to bf16
(then float32), one seeded request per row, and the ratio.

    python benchmarks/bench_ties.py                 # B = 8 and 64, V = 128256
    python benchmarks/bench_ties.py --batch 1 8 --vocab 50257 --steps 20
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch

from samplechain import Chain

CHAINS = {
    "top_k 50 + top_p 0.9 + dist": {
        "samplers": [{"use": "top_k", "k": 50}, {"use": "top_p", "p": 0.9}, {"use": "dist", "seed": 1}]
    },
    "top_k 50 + dist": {"samplers": [{"use": "top_k", "k": 50}, {"use": "dist", "seed": 1}]},
    "llama.cpp preset": "preset:llama.cpp",
    "top_p 0.9 + dist": {"samplers": [{"use": "top_p", "p": 0.9}, {"use": "dist", "seed": 1}]},
    "min_p 0.05 + dist": {"samplers": [{"use": "min_p", "p": 0.05}, {"use": "dist", "seed": 1}]},
}


def median_ms(chain: Chain, logits: torch.Tensor, steps: int) -> float:
    history = torch.zeros(logits.shape[0], 1, dtype=torch.int64)
    extra = {"history": history} if chain.needs_history else {}
    for _ in range(3):
        chain.sample(logits, **extra)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        chain.sample(logits, **extra)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    torch.set_num_threads(args.threads)
    print("| chain | B | float32 ms | bf16-rounded ms | bf16 / float32 |\n|---|---:|---:|---:|---:|")
    for batch in args.batch:
        logits = torch.randn(batch, args.vocab, generator=torch.Generator().manual_seed(0)) * 3
        rounded = logits.bfloat16().float()
        for name, config in CHAINS.items():
            chain = Chain.load(config)
            a, b = median_ms(chain, logits, args.steps), median_ms(chain, rounded, args.steps)
            print(f"| {name} | {batch} | {a:.2f} | {b:.2f} | {b / a:.2f} |")


if __name__ == "__main__":
    main()
