"""Benchmark: one sampling step of the engine presets (llama.cpp, transformers) against transformers' processors.

At B = 32, V = 128256 (float32 logits, two kinds as in bench_chain.py) with a token history of a 256-token prompt
plus 64 generated tokens per row, the configurations are:

  llama.cpp: pen+DRY   `preset:llama.cpp` with repeat_penalty 1.1, presence_penalty 0.1, penalty_last_n 64,
                       dry_multiplier 0.8, dry_base 1.75, dry_allowed_length 2, dry_penalty_last_n -1
  llama.cpp: pen       the same, dry_multiplier 0 (DRY off)
  llama.cpp: off       penalties and DRY both off (the preset's defaults: top_k 40, top_p 0.95, min_p 0.05,
                       temperature 0.8, dist)
  transformers         `preset:transformers` with repetition_penalty 1.1, temperature 0.8, top_k 50, top_p 0.95

against transformers' LogitsProcessorList + softmax + torch.multinomial (what GenerationMixin._sample does):

  for llama.cpp pen+DRY and pen:  [RepetitionPenalty(1.1), TopK(40), TopP(0.95), MinP(0.05), Temperature(0.8)]
  for llama.cpp off:              [TopK(40), TopP(0.95), MinP(0.05), Temperature(0.8)]
  for transformers:               [RepetitionPenalty(1.1), Temperature(0.8), TopK(50), TopP(0.95)]

transformers has no penalty window (its repetition penalty counts the whole history), no presence penalty and no
DRY: the llama.cpp rows do more work than their transformers counterpart, and the tables say so.

DRY's default sequence breakers ("\\n", ":", "\\"", "*") are strings that need a tokenizer; the shipped tokenizer
has 4096 tokens, not 128256. So the preset's samplers are copied from the registry and DRY's entry gets
`breakers = []` and `breaker_ids = [[10], [25], [1], [9]]` (four single-token breakers; the history never
contains them). Everything else is the preset verbatim.

samplechain runs its serving path: a request store with one request per row (`store.add(rid, {...})`) and
`chain.sample(logits, store, ids, history=hist, prompt_lengths=lengths)` with accept=True. The history is fixed
(the same 320 tokens every step) so every timed step does the same work; the transformers pipelines get the same
ids as `input_ids`.

Before timing (untimed), the transformers preset's `return_scores=True` scores are compared with transformers'
processed scores on all 32 rows: the same finite set per row, and the largest difference of the finite values.
The same is done for "llama.cpp: off" against its transformers list.

    python benchmarks/bench_presets.py --reps 20 --rounds 3 --markdown --breakdown --json out.json

A progress bar over rounds x kinds is drawn on stderr when it is a terminal (--no-progress: never, --progress:
always), only between timed blocks: stdout and the timings are the same with or without it.

Importable: `run(reps, rounds, ...)` returns one dict per (logits kind, configuration).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

import samplechain
from samplechain.tools.bench import (
    LOGIT_KINDS,
    environment,
    make_history,
    make_logits,
    print_breakdown,
    print_rows,
    stage_medians,
    transformers_step,
)
from samplechain.tools.bench import summary as _summary
from samplechain.tools.bench import time_blocks as _time
from samplechain.tools.bench import warmup_for as _warmup_for
from samplechain.tools.progress import progress_bar

__all__ = [
    "CONFIGS",
    "BREAKER_IDS",
    "make_history",
    "build_llama_cpp",
    "build_transformers_preset",
    "build_hf",
    "run",
    "breakdown",
    "main",
]

BATCH, VOCAB, PROMPT, GENERATED, SEED = 32, 128256, 256, 64, 1234
BREAKER_IDS = [[10], [25], [1], [9]]

LLAMA_ON = {
    "repeat_penalty": 1.1,
    "presence_penalty": 0.1,
    "penalty_last_n": 64,
    "dry_multiplier": 0.8,
    "dry_base": 1.75,
    "dry_allowed_length": 2,
    "dry_penalty_last_n": -1,
}
# name -> (samplechain preset, per-request settings, transformers pipeline, note)
CONFIGS: dict[str, tuple[str, dict[str, Any], str, str]] = {
    "llama.cpp: pen+DRY": (
        "llama.cpp",
        dict(LLAMA_ON),
        "hf_llama_rep",
        "transformers: repetition 1.1 over the whole history; no window, no presence, no DRY",
    ),
    "llama.cpp: pen": (
        "llama.cpp",
        {**LLAMA_ON, "dry_multiplier": 0.0},
        "hf_llama_rep",
        "transformers: repetition 1.1 over the whole history; no window, no presence",
    ),
    "llama.cpp: off": ("llama.cpp", {}, "hf_llama", "same samplers on both sides"),
    "transformers": (
        "transformers",
        {"repetition_penalty": 1.1, "temperature": 0.8, "top_k": 50, "top_p": 0.95},
        "hf_transformers",
        "same samplers on both sides",
    ),
}


# --------------------------------------------------------------------------- pipelines
def build_llama_cpp() -> samplechain.Chain:
    """`preset:llama.cpp` with DRY's string breakers replaced by token-id breakers (no 128256-token tokenizer)."""
    preset = samplechain.get_host().registry.presets["llama.cpp"]
    samplers = copy.deepcopy(preset["samplers"])
    for entry in samplers:
        if entry["use"] == "dry":
            entry["breakers"] = []
            entry["breaker_ids"] = [list(b) for b in BREAKER_IDS]
    return samplechain.Chain.load({"chain": {"name": "llama.cpp (breaker_ids)", "samplers": samplers}})


def build_transformers_preset() -> samplechain.Chain:
    return samplechain.Chain.load("preset:transformers")


def build_hf(name: str) -> Any:
    from transformers import (
        LogitsProcessorList,
        MinPLogitsWarper,
        RepetitionPenaltyLogitsProcessor,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    llama = [TopKLogitsWarper(40), TopPLogitsWarper(0.95), MinPLogitsWarper(0.05), TemperatureLogitsWarper(0.8)]
    if name == "hf_llama":
        return LogitsProcessorList(llama)
    if name == "hf_llama_rep":
        return LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.1), *llama])
    if name == "hf_transformers":
        return LogitsProcessorList(
            [
                RepetitionPenaltyLogitsProcessor(1.1),
                TemperatureLogitsWarper(0.8),
                TopKLogitsWarper(50),
                TopPLogitsWarper(0.95),
            ]
        )
    raise ValueError(name)


class Setup:
    """The chains (one per preset), a store per configuration, the transformers pipelines."""

    def __init__(self, batch: int = BATCH) -> None:
        self.chains = {"llama.cpp": build_llama_cpp(), "transformers": build_transformers_preset()}
        self.ids = [f"req{i}" for i in range(batch)]
        self.stores = {}
        for name, (preset, params, _hf, _note) in CONFIGS.items():
            store = self.chains[preset].new_store(capacity=batch)
            for rid in self.ids:
                store.add(rid, params)
            self.stores[name] = store
        self.hf = {name: build_hf(name) for name in {c[2] for c in CONFIGS.values()}}


# --------------------------------------------------------------------------- check
def compare_scores(
    chain: samplechain.Chain,
    params: dict[str, Any],
    processors: Any,
    logits: torch.Tensor,
    history: torch.Tensor,
    lengths: torch.Tensor,
) -> dict[str, Any]:
    """Untimed: same finite set per row, and the largest |difference| of the finite values."""
    store = chain.new_store(capacity=logits.shape[0])
    ids = [f"check{i}" for i in range(logits.shape[0])]
    for rid in ids:
        store.add(rid, params)
    ours = chain.sample(
        logits, store, ids, accept=False, return_scores=True, history=history, prompt_lengths=lengths
    ).scores
    theirs = processors(history, logits.clone())
    ok, tk = torch.isfinite(ours), torch.isfinite(theirs)
    differ = (ok != tk).sum(dim=-1)
    both = ok & tk
    diff = float((ours[both] - theirs[both]).abs().max()) if bool(both.any()) else 0.0
    bad = differ.nonzero().flatten().tolist()
    return {
        "rows": logits.shape[0],
        "agree": not bad,
        "mismatching_rows": {r: int(differ[r]) for r in bad},
        "kept_ours_median": statistics.median(ok.sum(-1).tolist()),
        "max_abs_diff": diff,
    }


CHECKS = {"transformers": "hf_transformers", "llama.cpp: off": "hf_llama"}


# --------------------------------------------------------------------------- the benchmark
def run(
    reps: int = 20,
    rounds: int = 3,
    *,
    kinds: Sequence[str] = tuple(LOGIT_KINDS),
    batch: int = BATCH,
    vocab: int = VOCAB,
    threads: int | None = None,
    warmup: int | None = None,
    check: bool = True,
    progress: bool | None = None,
) -> list[dict[str, Any]]:
    """Time every configuration and transformers pipeline for each logits kind; one dict per (kind, config).

    progress: a bar over rounds x kinds on stderr (None: when stderr is a terminal), drawn by this thread between
    timed blocks only (no refresh thread)."""
    previous = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    warmup = _warmup_for(reps) if warmup is None else warmup
    s = Setup(batch)
    history = make_history(batch, vocab)
    lengths = torch.full((batch,), PROMPT, dtype=torch.int64)
    samples: dict[str, dict[str, list[float]]] = {k: {} for k in kinds}
    checks: dict[tuple[str, str], dict[str, Any]] = {}
    try:
        with progress_bar(rounds * len(kinds), "bench_presets", progress, auto_refresh=False) as bar:
            for r in range(rounds):
                for kind in kinds:
                    bar.update(status=f"round {r + 1}/{rounds}: {kind}")  # drawn before timing
                    logits = make_logits(kind, batch, vocab)
                    before = logits.clone()
                    if check and not any(k == kind for k, _ in checks):
                        for cfg, hf in CHECKS.items():
                            preset, params = CONFIGS[cfg][0], CONFIGS[cfg][1]
                            checks[(kind, cfg)] = compare_scores(
                                s.chains[preset], params, s.hf[hf], logits, history, lengths
                            )
                    fns: dict[str, Callable[[], Any]] = {}
                    for name, (preset, _p, _hf, _n) in CONFIGS.items():
                        chain, store = s.chains[preset], s.stores[name]
                        fns[name] = lambda c=chain, st=store, x=logits: c.sample(
                            x, st, s.ids, history=history, prompt_lengths=lengths
                        )
                    for hf, procs in s.hf.items():
                        fns[hf] = lambda p=procs, x=logits: transformers_step(p, history, x)
                    times = _time(fns, reps, warmup)
                    if not torch.equal(logits, before):
                        raise AssertionError("a pipeline modified the caller's logits in place")
                    for name, t in times.items():
                        samples[kind].setdefault(name, []).extend(t)
                    bar.advance()  # drawn after timing
    finally:
        torch.set_num_threads(previous)
    results = []
    for kind in kinds:
        for name, (preset, params, hf, note) in CONFIGS.items():
            ours, theirs = _summary(samples[kind][name]), _summary(samples[kind][hf])
            row = {
                "kind": kind,
                "config": name,
                "preset": preset,
                "params": params,
                "transformers_pipeline": hf,
                "note": note,
                "batch": batch,
                "vocab": vocab,
                "reps": reps * rounds,
                "ours": ours,
                "transformers": theirs,
                "ratio_transformers_over_ours": theirs["median"] / ours["median"],
            }
            if (kind, name) in checks:
                row["check"] = checks[(kind, name)]
            results.append(row)
    return results


def breakdown(
    config: str,
    reps: int = 40,
    *,
    kind: str = "randn",
    batch: int = BATCH,
    vocab: int = VOCAB,
    threads: int | None = None,
) -> dict[str, Any]:
    """Median ms of each sampler of one configuration (apply/select wrapped with a timer; "executor" is the rest
    of chain.sample) and of each stage of its transformers pipeline. Steps of the two alternate."""
    previous = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        preset, params, hf, _note = CONFIGS[config]
        chain = build_llama_cpp() if preset == "llama.cpp" else build_transformers_preset()
        store = chain.new_store(capacity=batch)
        ids = [f"req{i}" for i in range(batch)]
        for rid in ids:
            store.add(rid, params)
        processors = build_hf(hf)
        logits = make_logits(kind, batch, vocab)
        history = make_history(batch, vocab)
        lengths = torch.full((batch,), PROMPT, dtype=torch.int64)
        out: dict[str, Any] = {"config": config, "kind": kind, "batch": batch, "vocab": vocab, "reps": reps}
        out.update(
            stage_medians(
                chain,
                processors,
                lambda: chain.sample(logits, store, ids, history=history, prompt_lengths=lengths),
                history,
                logits,
                reps,
            )
        )
        return out
    finally:
        torch.set_num_threads(previous)


# --------------------------------------------------------------------------- output
HEADERS = [
    "logits",
    "configuration",
    "samplechain ms",
    "transformers ms",
    "transformers / samplechain",
    "transformers pipeline",
    "check",
]
HF_NAMES = {
    "hf_llama_rep": "RepetitionPenalty 1.1 → TopK 40 → TopP .95 → MinP .05 → Temp .8",
    "hf_llama": "TopK 40 → TopP .95 → MinP .05 → Temp .8",
    "hf_transformers": "RepetitionPenalty 1.1 → Temp .8 → TopK 50 → TopP .95",
}


def _cells(r: dict[str, Any]) -> list[str]:
    def ms(t: dict[str, float]) -> str:
        return f"{t['median']:.2f} ({t['p10']:.2f}–{t['p90']:.2f})"

    c = r.get("check")
    if c is None:
        check = "—"
    elif c["agree"]:
        check = f"same sets, {c['rows']} rows; max Δ {c['max_abs_diff']:.1e}"
    else:
        check = f"sets differ in rows {c['mismatching_rows']}; max Δ {c['max_abs_diff']:.1e}"
    pipeline = HF_NAMES[r["transformers_pipeline"]]
    if r["note"] != "same samplers on both sides":
        pipeline += f" ({r['note'].removeprefix('transformers: ')})"
    return [
        r["kind"],
        r["config"],
        ms(r["ours"]),
        ms(r["transformers"]),
        f"{r['ratio_transformers_over_ours']:.1f}x",
        pipeline,
        check,
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--kinds", default=",".join(LOGIT_KINDS), help=f"logits kinds: {', '.join(LOGIT_KINDS)}")
    parser.add_argument("--reps", type=int, default=20, help="timed calls per pipeline per round (default 20)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, spread over the run, samples pooled (3)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed warm-up calls (default reps // 5, >= 3)")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's default)")
    parser.add_argument("--markdown", action="store_true", help="print a markdown table instead of a rich one")
    parser.add_argument("--json", metavar="PATH", help="also write the results and the environment as JSON")
    parser.add_argument("--no-check", action="store_true", help="skip the untimed score comparison")
    parser.add_argument(
        "--breakdown",
        action="store_true",
        help="also time each sampler of 'llama.cpp: pen+DRY' and 'transformers' (first logits kind, --reps steps)",
    )
    parser.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="a bar over rounds x kinds on stderr, drawn between timed blocks (default: when stderr is a terminal)",
    )
    args = parser.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    threads = args.threads or torch.get_num_threads()

    env = environment(threads)
    print(
        f"samplechain {env['samplechain']}, torch {env['torch']}, transformers {env['transformers']}, "
        f"{env['cpu']} ({env['cpu_count']} cores), torch threads {threads}, {env['date']}"
    )
    print(
        f"B={BATCH} V={VOCAB}, history {PROMPT} prompt + {GENERATED} generated tokens per row (fixed), "
        f"DRY breaker_ids {BREAKER_IDS} instead of the preset's strings"
    )
    for k in kinds:
        print(f"  {k}: {LOGIT_KINDS.get(k, '?')}")
    t0 = time.perf_counter()
    results = run(
        args.reps,
        args.rounds,
        kinds=kinds,
        threads=threads,
        warmup=args.warmup,
        check=not args.no_check,
        progress=args.progress,
    )
    print_rows(HEADERS, [_cells(r) for r in results], {2, 3, 4}, markdown=args.markdown)
    for r in results:
        if "check" in r and not r["check"]["agree"]:
            print(f"check: {r['kind']} {r['config']}: finite sets differ: {r['check']}")
    extra = []
    if args.breakdown:
        for cfg in ("llama.cpp: pen+DRY", "transformers"):
            b = breakdown(cfg, args.reps, kind=kinds[0], threads=threads)
            print_breakdown(b, f"{b['config']}, {b['kind']} logits, B={b['batch']} V={b['vocab']}")
            extra.append(b)
    print(f"total {time.perf_counter() - t0:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "environment": env,
                    "configs": {k: list(v) for k, v in CONFIGS.items()},
                    "breaker_ids": BREAKER_IDS,
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
