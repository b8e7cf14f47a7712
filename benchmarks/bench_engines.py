"""Benchmark: samplechain's generation loop on both engines against each engine's own generation, side by side.

The default model (SmolLM2-135M-Instruct) on the two engines samplechain runs it on:

    llama.cpp     ours: generate() on the GGUF file through the llama.cpp runner, chain preset:llama.cpp
                  theirs: llama-cpp-python's Llama.create_completion with the same settings (top_k 40, typical 1,
                  top_p 0.95, min_p 0.05, temperature 0.8, repeat penalty 1) and the same prompt tokens
                  and greedy: [greedy] against temperature 0
    transformers  ours: generate() on the dequantized model, chain temperature 0.8 -> top_k 40 -> top_p 0.95 ->
                  min_p 0.05 -> dist; theirs: model.generate(do_sample=True) with the same values
                  and greedy: [greedy] against do_sample=False

Both sides evaluate the prompt in every run (llama-cpp-python's cache of the previous run's prompt is reset first)
and generate exactly N tokens per row: the end-of-text token gets a logit bias of -inf on both (llama.cpp's
logit_bias, a logit_bias stage first in our chain; transformers' suppress_tokens against ours). Reported: tokens
per second (median over interleaved repetitions, who goes first alternating), the ratio ours / theirs (> 1: ours
is faster), the milliseconds per token our chain.sample takes, and its share of a token's time.

    python benchmarks/bench_engines.py --markdown
    python benchmarks/bench_engines.py --engines llama.cpp --new-tokens 64 --reps 5 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

from samplechain.generation import Generation
from samplechain.generation.model import TransformersRunner
from samplechain.tools.bench import write_json

PROMPT = "Write a short story about a robot who learns to paint."
VALUES = {"top_k": 40, "top_p": 0.95, "min_p": 0.05, "temperature": 0.8}


def _eos_bias(eos: int) -> dict[str, Any]:
    return {"use": "logit_bias", "bias": {str(eos): float("-inf")}}


def _llama_chain(eos: int, greedy: bool) -> dict[str, Any]:
    import tomllib

    from samplechain.engine.registry import registry_path

    if greedy:
        return {"samplers": [_eos_bias(eos), {"use": "greedy"}]}
    entries = tomllib.loads(registry_path().read_text())["presets"]["llama.cpp"]["samplers"]
    for e in entries:
        if e["use"] == "dist":
            e["seed"] = 1234
    return {"samplers": [_eos_bias(eos), *entries]}


def _hf_chain(eos: int, greedy: bool) -> dict[str, Any]:
    if greedy:
        return {"samplers": [_eos_bias(eos), {"use": "greedy"}]}
    return {
        "samplers": [
            _eos_bias(eos),
            {"use": "temperature", "t": VALUES["temperature"]},
            {"use": "top_k", "k": VALUES["top_k"]},
            {"use": "top_p", "p": VALUES["top_p"]},
            {"use": "min_p", "p": VALUES["min_p"]},
            {"use": "dist", "seed": 1234},
        ]
    }


def _ours(model: Any, ids: torch.Tensor, chain: dict[str, Any], n: int) -> tuple[float, float]:
    """(wall seconds, seconds inside chain.sample) of one generation of exactly n tokens per row."""
    gen = Generation(model, input_ids=ids, chain=chain, max_new_tokens=n, ignore_eos=True)
    spent = [0.0]
    sample = gen.chain.sample

    def timed(*a: Any, **k: Any) -> Any:
        t = time.perf_counter()
        try:
            return sample(*a, **k)
        finally:
            spent[0] += time.perf_counter() - t

    gen.chain.sample = timed  # type: ignore[method-assign]  # an instance attribute: only this run is timed
    start = time.perf_counter()
    for _ in gen.steps():
        pass
    wall = time.perf_counter() - start
    del gen.chain.sample
    assert gen.input_ids.shape[1] == ids.shape[1] + n
    return wall, spent[0]


def _llama_theirs(llama: Any, tokens: list[int], n: int, eos: int, greedy: bool) -> Callable[[], float]:
    settings: dict[str, Any] = {"temperature": 0.0} if greedy else dict(VALUES, typical_p=1.0, seed=1234)

    def run() -> float:
        # each run evaluates the prompt, as ours does: without the reset, create_completion would reuse the previous
        # run's cache for the prompt (its prefix match) and skip the prefill ours pays for
        llama.reset()
        start = time.perf_counter()
        out = llama.create_completion(
            tokens, max_tokens=n, repeat_penalty=1.0, logit_bias={eos: float("-inf")}, **settings
        )
        wall = time.perf_counter() - start
        assert out["usage"]["completion_tokens"] == n, out["usage"]
        return wall

    return run


def _hf_theirs(model: Any, ids: torch.Tensor, n: int, eos: int, greedy: bool) -> Callable[[], float]:
    kw: dict[str, Any] = {"max_new_tokens": n, "min_new_tokens": n, "suppress_tokens": [eos], "pad_token_id": eos}
    if greedy:
        kw.update(do_sample=False, temperature=None, top_k=None, top_p=None)
    else:
        kw.update(do_sample=True, **VALUES)

    def run() -> float:
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **kw)
        return time.perf_counter() - start

    return run


def _measure(
    name: str, setting: str, b: int, n: int, reps: int, ours: Callable[[], tuple[float, float]], theirs: Any
) -> dict[str, Any]:
    ours()
    theirs()  # warm-up both
    ours_t, theirs_t, chain_t = [], [], []
    for rep in range(reps):  # interleaved, alternating who goes first: slow spells hit both alike
        if rep % 2:
            theirs_t.append(theirs())
        wall, spent = ours()
        ours_t.append(wall)
        chain_t.append(spent)
        if not rep % 2:
            theirs_t.append(theirs())
    mo, mt, mc = statistics.median(ours_t), statistics.median(theirs_t), statistics.median(chain_t)
    row = {
        "engine": name,
        "setting": setting,
        "batch": b,
        "new_tokens": n,
        "ours_tok_s": b * n / mo,
        "theirs_tok_s": b * n / mt,
        "ratio": mt / mo,
        "chain_ms_per_token": 1e3 * mc / n,
        "chain_share": mc / mo,
    }
    print(
        f"{name:12s} {setting:8s} B={b:<2d} ours {row['ours_tok_s']:7.1f} tok/s  theirs {row['theirs_tok_s']:7.1f} "
        f"tok/s  ratio {row['ratio']:.2f}x  chain {row['chain_ms_per_token']:.3f} ms/token "
        f"({100 * row['chain_share']:.1f}%)",
        file=sys.stderr,
        flush=True,
    )
    return row


def bench_llama(n: int, reps: int, threads: int) -> list[dict[str, Any]]:
    from samplechain.models import default_gguf_path, load_model

    model, tok = load_model(default_gguf_path(), engine="llama.cpp", n_threads=threads)
    tokens = tok(PROMPT)["input_ids"]
    ids = torch.tensor([tokens])
    eos = int(model.llama.token_eos())
    rows = []
    for setting in ("sampling", "greedy"):
        greedy = setting == "greedy"
        chain = _llama_chain(eos, greedy)
        rows.append(
            _measure(
                "llama.cpp",
                setting,
                1,
                n,
                reps,
                lambda chain=chain: _ours(model, ids, chain, n),
                _llama_theirs(model.llama, tokens, n, eos, greedy),
            )
        )
    return rows


def bench_transformers(n: int, reps: int, batches: list[int]) -> list[dict[str, Any]]:
    from samplechain.models import load_model

    model, tok = load_model()
    eos = int(tok.eos_token_id)
    base = tok(PROMPT, return_tensors="pt")["input_ids"]
    rows = []
    for b in batches:
        ids = base.repeat(b, 1)
        for setting in ("sampling", "greedy"):
            greedy = setting == "greedy"
            chain = _hf_chain(eos, greedy)
            rows.append(
                _measure(
                    "transformers",
                    setting,
                    b,
                    n,
                    reps,
                    lambda chain=chain, ids=ids: _ours(model, ids, chain, n),
                    _hf_theirs(model, ids, n, eos, greedy),
                )
            )
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    out = [
        "| engine | setting | B | samplechain tok/s | engine's own tok/s | samplechain / own | chain ms/token | "
        "chain share of a token |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        out.append(
            f"| {r['engine']} | {r['setting']} | {r['batch']} | {r['ours_tok_s']:.1f} | {r['theirs_tok_s']:.1f} | "
            f"{r['ratio']:.2f}x | {r['chain_ms_per_token']:.3f} | {100 * r['chain_share']:.1f}% |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--engines", default="llama.cpp,transformers")
    ap.add_argument("--batch", default="1,8", help="transformers batch sizes (llama.cpp's create_completion is B=1)")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument(
        "--fast-steps",
        action="store_true",
        help="the transformers runner's steps in its own products (TransformersRunner.fast_steps; model.generate's "
        "logits up to summation order)",
    )
    ap.add_argument(
        "--batch-invariant",
        action="store_true",
        help="the transformers runner's batch-invariant passes (TransformersRunner.batch_invariant; model.generate's "
        "logits up to summation order)",
    )
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    TransformersRunner.fast_steps = args.fast_steps
    TransformersRunner.batch_invariant = args.batch_invariant
    engines = args.engines.split(",")
    rows: list[dict[str, Any]] = []
    if "llama.cpp" in engines:
        rows += bench_llama(args.new_tokens, args.reps, args.threads)
    if "transformers" in engines:
        rows += bench_transformers(args.new_tokens, args.reps, [int(b) for b in args.batch.split(",")])
    print(markdown(rows) if args.markdown else json.dumps(rows, indent=2))
    if args.json:
        write_json(args.json, args.threads, rows=rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
