"""Benchmark: where prompt lookup's time goes on the llama.cpp runner, apart from the host's noise.

On a shared CPU the tokens per second of two runs move 5-10% from one run to the next, as much as drafting on free
chat gains or loses. This splits generate() with `draft="prompt_lookup"` and without a drafter, on bench_speculative's
tasks and prompts (B = 1, the first `--prompts` prompts one after another, `--max-new-tokens` each), into:

- model work: every llama.cpp decode's token count F and time; each decode then counts at the median time of all
  the decodes of its F in both runs, so a slow moment of the host weighs as little as the median lets it. The ratio
  is the run without a drafter's work over the drafted run's (above 1: the drafts saved model work);
- decode: the decodes' measured time summed, the same ratio;
- loop: wall time outside llama.cpp's decode, per generated token (the loop, the chain's sampling, the drafter).

    .venv/bin/python benchmarks/bench_draft_work.py --tasks chat,code --settings greedy,sampling --reps 3
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))

import bench_speculative as bs  # noqa: E402 - the tasks, prompts, chains and model loading of that benchmark

from samplechain.generation import generate  # noqa: E402


def _timing_decodes() -> list[tuple[int, float]]:
    """Every llama.cpp decode from here on appends (tokens, seconds) to the returned list."""
    from samplechain_llama_cpp.model import LlamaCppContext

    log: list[tuple[int, float]] = []
    decode = LlamaCppContext.decode

    def timed(self: Any, seq: Any, pos: Any, tokens: Any, logits: Any) -> Any:
        started = time.perf_counter()
        out = decode(self, seq, pos, tokens, logits)
        log.append((len(tokens), time.perf_counter() - started))
        return out

    LlamaCppContext.decode = timed  # type: ignore[method-assign]
    return log


def _run(model: Any, tok: Any, runs: list[Any], setting: str, n: int, draft: str | None, log: list) -> dict[str, Any]:
    """One run over the prompts: its decodes, wall seconds, tokens, drafted and kept."""
    log.clear()
    wall = tokens = drafted = kept = 0
    for batch in runs:
        kw: dict[str, Any] = {"max_new_tokens": n, "chain": bs._chain(setting), "seed": bs.SEED}
        if draft is not None:
            kw["draft"] = draft
        started = time.perf_counter()
        out = generate(model, tok, input_ids=batch.ids, attention_mask=batch.mask, **kw)
        wall += time.perf_counter() - started
        tokens += int(out.num_generated.sum())
        if draft is not None:
            drafted, kept = drafted + int(out.drafted.sum()), kept + int(out.kept.sum())
    return {"decodes": list(log), "wall": wall, "tokens": tokens, "drafted": drafted, "kept": kept}


def _row(task: str, setting: str, pairs: list[tuple[dict[str, Any], dict[str, Any]]]) -> str:
    by_f: dict[int, list[float]] = defaultdict(list)
    for plain, drafted in pairs:
        for f, t in plain["decodes"] + drafted["decodes"]:
            by_f[f].append(t)
    cost = {f: statistics.median(ts) for f, ts in by_f.items()}

    def work(r: dict[str, Any]) -> float:
        return sum(cost[f] for f, _ in r["decodes"])

    def decode(r: dict[str, Any]) -> float:
        return sum(t for _, t in r["decodes"])

    def loop(r: dict[str, Any]) -> float:
        return 1000 * (r["wall"] - decode(r)) / r["tokens"]

    work_ratio = statistics.median(work(p) / work(d) for p, d in pairs)
    decode_ratio = statistics.median(decode(p) / decode(d) for p, d in pairs)
    wall_ratio = statistics.median((d["tokens"] / d["wall"]) / (p["tokens"] / p["wall"]) for p, d in pairs)
    step = 1000 * cost.get(1, float("nan"))
    check = 1000 * cost.get(2, float("nan"))
    kept = sum(d["kept"] for _, d in pairs)
    drafted = sum(d["drafted"] for _, d in pairs)
    return (
        f"| {task} | {setting} | {work_ratio:.3f} | {decode_ratio:.3f} | {wall_ratio:.2f}x | "
        f"{statistics.median(loop(p) for p, _ in pairs):.2f} / {statistics.median(loop(d) for _, d in pairs):.2f} | "
        f"{step:.1f} / {check:.1f} | {kept}/{drafted} |"
    )


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--tasks", default="chat", help=f"of {', '.join(bs.TASKS)}")
    ap.add_argument("--settings", default="greedy,sampling", help="greedy, sampling")
    ap.add_argument("--reps", type=int, default=3, help="pairs of runs (without a drafter, with it) per row")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    torch.set_num_threads(args.threads)
    model, tok = bs._load("llama.cpp", args.threads)
    log = _timing_decodes()
    print(f"machine: {_cpu()}, {args.threads} threads; {' '.join(sys.argv)}")
    print()
    print(
        "| task | setting | model work (none / drafted) | decode time (none / drafted) | tok/s ratio | loop ms/token "
        "(none / drafted) | ms: step / check of 1 token | kept/drafted |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for task in args.tasks.split(","):
        runs = bs._runs(tok, task, 1, args.prompts)
        for setting in args.settings.split(","):
            for draft in (None, "prompt_lookup"):  # warm-up
                _run(model, tok, runs, setting, args.max_new_tokens, draft, log)
            pairs = []
            for _ in range(args.reps):
                plain = _run(model, tok, runs, setting, args.max_new_tokens, None, log)
                drafted = _run(model, tok, runs, setting, args.max_new_tokens, "prompt_lookup", log)
                pairs.append((plain, drafted))
            print(_row(task, setting, pairs), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
