"""Benchmark: what checking drafted tokens costs on a device, and what speculation can gain there whatever the drafter.

Speculative decoding pays where one model call over k tokens costs little more than a call over one: the model's
weights are read once for all k, so a call that is bound by reading weights (a GPU at small batch) checks a draft
almost for free, while a call bound by arithmetic (a CPU with few cores) costs nearly k steps. The sections run on
the transformers runner (SmolLM2-135M-Instruct where it is installed, else `--random`: a random-weight model of its
shape, for machines without the model) or with `--engine llama.cpp` on the llama.cpp runner (the default model's
GGUF, or `--gguf` another file: how fast a quantization checks drafts depends on whether llama.cpp has a
many-token kernel for it):

1. cost: one `runner.extend` of k tokens per row against one token (k = 1 ... 16, B = 1 and 8), ms per call
   (median), and the ratio to k = 1; at B > 1 also a call where only the first row takes k tokens and the others
   one (`runner.extend_rows`: one row's draft in a batch; llama.cpp runs it as two passes, the rows' first tokens
   and then that row's others); on a CPU also the same calls in each of the two W x^T / own layouts the runner
   times per row count and picks from (`TransformersRunner.few_row_products`): its few-row products (a check's
   linear layers of 1-5 rows, and its vocabulary head, as W x^T) and the model's own (the runner itself may also
   run the head and the layers on oneDNN's packed copies of their weights); and with the key/value heads copied per
   query head as transformers' attention does (`TransformersRunner.grouped_attention`), and in the runner's
   batch-invariant passes (`TransformersRunner.batch_invariant`);
2. numerics: the largest difference between the logits of one k-token call and k one-token steps, k = 4 and 8
   (what `match`'s promise of the same tokens rests on), and in batch-invariant passes (0: the same bit for bit);
3. bounds: generate() tokens per second with an oracle drafter (it proposes the run without a drafter's next
   tokens, so every draft is kept) and with a drafter that always misses (its drafts are never kept; the adaptive
   length backs off), against no drafter, greedy and seeded sampling; "same tokens" compares with the run without a
   drafter. Any real drafter lands between the two.
4. layouts (transformers): ms of each of the model's linear-layer shapes over n rows, `x @ W.T` (torch's linear)
   against `W @ x.T` (the few-row layout of a check's products of 1-5 rows and its vocabulary head; one row
   as two columns, `W @ [x 0].T`, as its fast steps do) and, where torch has oneDNN, oneDNN's product on a packed
   copy of the weight (the runner's third layout), on weights read from memory, interleaved, median of 7 times
   --reps.
5. released rows (transformers): ms of a one-token step of the largest --batch after all but n of its rows left
   the batch (`runner.release`, as the speculative loop releases rows that have drawn all their tokens), n = B ... 1,
   against the same steps in each layout: once rows left, the runner's steps run the faster of its few-row products
   and the model's own.

6. appending (transformers): ms of a one-token step with the cache's layers appending in place, into room kept
   past their tokens (the runner's, `TransformersRunner.room`), against transformers' own layers, which copy the
   whole cache into a new tensor every pass: --max-new-tokens steps after a prompt of each --contexts length, at
   each --batch, the two runners taking turns step by step.
7. prefill (transformers): ms of a prompt's pass of each --contexts length at each --batch in the runner's default
   passes and in its batch-invariant passes (`TransformersRunner.batch_invariant`: attention in float64, in blocks
   of queries), taking turns, median of --reps.

    .venv/bin/python benchmarks/bench_verify.py                       # the default model, on the CPU
    .venv/bin/python benchmarks/bench_verify.py --engine llama.cpp --sections 1,3
    python3 benchmarks/bench_verify.py --random --device cuda --dtype bfloat16
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

from samplechain.drafters import Drafter
from samplechain.generation import generate, products
from samplechain.generation.model import TransformersRunner, runner_for
from samplechain.runners import ModelRunner

# SmolLM2-135M-Instruct's shape (its GGUF's metadata)
SMOLLM2 = dict(
    hidden_size=576,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    intermediate_size=1536,
    vocab_size=49152,
    head_dim=64,
    max_position_embeddings=8192,
    rope_theta=100000.0,
    tie_word_embeddings=True,
    rms_norm_eps=1e-5,
)
CHAINS = {
    "greedy": [{"use": "greedy"}],
    "sampling": [
        {"use": "temperature", "t": 0.8},
        {"use": "top_k", "k": 40},
        {"use": "top_p", "p": 0.95},
        {"use": "dist"},
    ],
}


def build(args: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> Any:
    if args.engine == "llama.cpp":
        from samplechain.models import load_model

        # flash attention: a many-token pass gives the logits of one-token steps (docs/speculative.md, "Numerics")
        model, _ = load_model(args.gguf, engine="llama.cpp", flash_attn=True, n_threads=args.threads)
        return model
    if not args.random:
        from samplechain.models import load_model

        model, _ = load_model(engine="transformers")
        return model.to(device, dtype).eval()
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**SMOLLM2, bos_token_id=1, eos_token_id=None, pad_token_id=0)
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = None
    return model.to(dtype).eval()


def timed(device: torch.device, fn: Callable[..., Any], *args: Any) -> tuple[float, Any]:
    """(seconds, fn(*args)), the device's queue drained before and after."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    out = fn(*args)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start, out


def runner(model: Any, ids: torch.Tensor, batch_invariant: bool = False) -> ModelRunner:
    """The model's runner on `ids`; `batch_invariant`: a transformers runner's batch-invariant passes."""
    if not batch_invariant:
        return runner_for(model)(model, ids, torch.ones_like(ids))
    TransformersRunner.batch_invariant = True
    try:
        return TransformersRunner(model, ids, torch.ones_like(ids))
    finally:
        TransformersRunner.batch_invariant = False


def invariant_runs(model: Any, device: torch.device) -> bool:
    """Whether batch-invariant passes can run here (transformers, float32, on a CPU with oneDNN)."""
    return (
        runner_for(model) is TransformersRunner
        and device.type == "cpu"
        and getattr(model, "dtype", None) == torch.float32
        and products._PACKED
    )


def prompts(model: Any, batch: int, length: int, device: torch.device) -> torch.Tensor:
    g = torch.Generator().manual_seed(batch * 1000 + length)
    return torch.randint(10, model.config.vocab_size, (batch, length), generator=g).to(device)


@torch.inference_mode()
def cost(
    model: Any, device: torch.device, batches: Sequence[int], ks: Sequence[int], reps: int, context: int
) -> list[dict]:
    """ms per runner.extend of k tokens per row after a `context`-token prompt, the cache cut back after each call
    (its length stays put). Where the runner picks a check's layout by timing both (`few_row_products`), the same
    calls in each layout too; where it attends to shared key/value heads (`grouped_attention`), the same calls
    without; interleaved."""
    rows = []
    for b in batches:
        ids = prompts(model, b, context, device)
        runs = {"ms": runner(model, ids)}
        if getattr(runs["ms"], "few_row_products", False) is None:  # timed per shape: each layout on its own too
            runs["few-row products ms"] = runner(model, ids)
            runs["few-row products ms"].few_row_products = True
        for switch, name in (("few_row_products", "model's products ms"), ("grouped_attention", "copied heads ms")):
            if getattr(runs["ms"], switch, False) is not False:
                runs[name] = runner(model, ids)
                setattr(runs[name], switch, False)
        if invariant_runs(model, device):
            runs["batch-invariant ms"] = runner(model, ids, batch_invariant=True)
        for run in runs.values():
            run.prefill()
        width = ids.shape[1]
        checks = {name: (run, _check) for name, run in runs.items()}
        if b > 1:  # row 0 drafts k - 1 tokens, the others none
            checks["one row ms"] = (runs["ms"], _check_one_row)
        times: dict[tuple[str, int], list[float]] = {(name, k): [] for name in checks for k in ks}
        for rep in range(reps + 2):
            for k in ks:
                block = prompts(model, b, k, device)
                for name, (run, check) in checks.items():
                    t, _ = timed(device, check, run, block, width)
                    if rep >= 2:  # the first two rounds warm the kernels up
                        times[name, k].append(t)
        base = statistics.median(times["ms", ks[0]])
        for k in ks:
            ms = {name: statistics.median(times[name, k]) for name in checks}
            row = {"B": b, "k": k, "ms": round(ms["ms"] * 1e3, 3), "ratio": round(ms["ms"] / base, 2)}
            rows.append(row | {name: round(t * 1e3, 3) for name, t in ms.items() if name != "ms"})
    return rows


def _check(run: ModelRunner, block: torch.Tensor, width: int) -> None:
    run.extend(block)
    run.truncate(width)


def _check_one_row(run: ModelRunner, block: torch.Tensor, width: int) -> None:
    """Row 0 takes its k tokens, every other row its first: a batch where one row drafts."""
    run.extend_rows(range(block.shape[0]), [block[0], *block[1:, :1]])
    run.truncate(width)


@torch.inference_mode()
def numerics(model: Any, device: torch.device, k: int, batch_invariant: bool = False) -> dict[str, Any]:
    """The largest |difference| of the logits of one k-token call and k one-token steps, B = 1 and 4 (with
    `batch_invariant`, both in the runner's batch-invariant passes)."""
    out = {}
    for b in (1, 4):
        ids = prompts(model, b, 48, device)
        block = prompts(model, b, k, device)
        one = runner(model, ids, batch_invariant)
        one.prefill()
        together = one.extend(block)
        steps = runner(model, ids, batch_invariant)
        steps.prefill()
        seq, each = ids, []
        for j in range(k):
            seq = torch.cat([seq, block[:, j : j + 1]], dim=1)
            each.append(steps.step(seq))
        diff = (together - torch.stack(each, dim=1)).abs()
        same = (together.argmax(-1) == torch.stack(each, dim=1).argmax(-1)).float().mean()
        out[f"B={b}"] = {"max": float(diff.max()), "median": float(diff.median()), "same argmax": float(same)}
    return out


class Oracle(Drafter):
    """Proposes each row's reference continuation (every draft kept) or, with miss=True, tokens that differ from
    it (no draft kept)."""

    name = "oracle"

    def __init__(self, reference: torch.Tensor, vocab: int, length: int, miss: bool = False) -> None:
        super().__init__()
        self.reference, self.vocab, self.miss = reference.cpu(), vocab, miss
        self.params = argparse.Namespace(num_tokens=length)

    def propose(self, row: int, tokens: torch.Tensor, limit: int) -> torch.Tensor:
        ahead = self.reference[row, len(tokens) : len(tokens) + limit]
        return (ahead + 1) % self.vocab if self.miss else ahead


def _run(model: Any, ids: torch.Tensor, chain: str, n: int, draft: Any = False) -> Any:
    from samplechain import Chain

    params = [{"seed": 7 + i} for i in range(ids.shape[0])] if chain == "sampling" else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return generate(
            model,
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            chain=Chain.load({"chain": {"name": chain, "samplers": CHAINS[chain]}}),
            max_new_tokens=n,
            ignore_eos=True,
            pad_token_id=0,
            params=params,
            draft=draft,
        )


def bounds(
    model: Any, device: torch.device, batches: Sequence[int], n: int, length: int, reps: int, context: int
) -> list[dict]:
    rows, vocab = [], model.config.vocab_size
    for b in batches:
        ids = prompts(model, b, context, device)
        for chain in CHAINS:
            ref = _run(model, ids, chain, n).sequences
            runs = {"none": None, "oracle": False, "always misses": True}  # the oracle's `miss`
            times: dict[str, list[float]] = {k: [] for k in runs}
            last: dict[str, Any] = {}
            for rep in range(reps + 1):
                for name, miss in runs.items():
                    draft = False if miss is None else Oracle(ref, vocab, length, miss=miss)
                    t, last[name] = timed(device, _run, model, ids, chain, n, draft)
                    if rep:  # the first round warms up
                        times[name].append(t)
            base = statistics.median(times["none"])
            for name in runs:
                out = last[name]
                t = statistics.median(times[name])
                drafted = int(out.drafted.sum()) if out.drafted is not None else 0
                kept = int(out.kept.sum()) if out.kept is not None else 0
                calls = int(out.model_calls.max()) if out.model_calls is not None else n
                rows.append(
                    {
                        "B": b,
                        "chain": chain,
                        "drafter": name,
                        "tok/s": round(b * n / t, 1),
                        "ratio": round(base / t, 2),
                        "kept/drafted": f"{kept}/{drafted}",
                        "calls": calls,
                        "same tokens": bool(torch.equal(out.sequences, ref)),
                    }
                )
    return rows


_STREAMED = 64 << 20  # bytes of weight copies a layout's product cycles through: more than a CPU's caches hold


def _own(x: torch.Tensor, weights: Sequence[torch.Tensor]) -> None:
    for weight in weights:
        torch.nn.functional.linear(x, weight)


def _transposed(x: torch.Tensor, weights: Sequence[torch.Tensor]) -> None:
    columns = torch.cat([x, torch.zeros_like(x)]) if x.shape[0] == 1 else x  # one row: as two columns
    for weight in weights:
        weight @ columns.T


def _packed(x: torch.Tensor, weights: Sequence[torch.Tensor]) -> None:
    for weight in weights:  # each weight packed for oneDNN at its first product (a warm-up round)
        products.product(weight, x, products.PACKED)


@torch.inference_mode()
def layouts(model: Any, device: torch.device, counts: Sequence[int], reps: int) -> list[dict]:
    """ms of each distinct linear-layer weight shape of `model` over n rows in the layouts, interleaved. Each
    product runs on copies of the weight that together outgrow the caches, as a model's pass reads its weights
    from memory (a product repeated on one weight would read it from a cache); one row runs as two columns in the
    runner's layout, as its steps do."""
    shapes = dict.fromkeys(
        tuple(m.weight.shape) for m in model.modules() if type(m) is torch.nn.Linear and m.weight.dim() == 2
    )
    rows = []
    for out_features, in_features in shapes:
        size = out_features * in_features * torch.finfo(model.dtype).bits // 8
        weights = [
            torch.randn(out_features, in_features, device=device, dtype=model.dtype)
            for _ in range(max(1, -(-_STREAMED // size)))
        ]
        for n in counts:
            x = torch.randn(n, in_features, device=device, dtype=model.dtype)
            runs = {"x @ W.T ms": _own, "W @ x.T ms": _transposed}
            if products._PACKED and device.type == "cpu" and model.dtype == torch.float32:
                runs["packed ms"] = _packed
            times: dict[str, list[float]] = {name: [] for name in runs}
            for rep in range(7 * reps + 2):
                for name, fn in runs.items():
                    seconds, _ = timed(device, fn, x, weights)
                    if rep >= 2:
                        times[name].append(seconds * 1e3 / len(weights))
            ms = {name: statistics.median(t) for name, t in times.items()}
            ratio = ms["W @ x.T ms"] / ms["x @ W.T ms"]
            rows.append(
                {
                    "weight": f"{out_features} x {in_features}",
                    "rows": n,
                    **{k: round(v, 3) for k, v in ms.items()},
                    "ratio": round(ratio, 2),
                }
            )
    return rows


@torch.inference_mode()
def released(model: Any, device: torch.device, batch: int, reps: int, context: int) -> list[dict]:
    """ms per `runner.step` of a `batch`-row batch after `batch - n` of its rows were released (finished rows leave
    the batch), n = batch ... 1, against the same steps in the few-row products and in the model's own
    (`few_row_products` True and False), interleaved; each step grows the rows' cache by one token."""
    ids = prompts(model, batch, context, device)
    out = []
    for n in range(batch, 0, -1):
        names = ("ms", "few-row products ms", "model's products ms")
        runs = {name: runner(model, ids) for name in names}
        if getattr(runs["ms"], "few_row_products", False) is False:
            return out
        runs["few-row products ms"].few_row_products = True
        runs["model's products ms"].few_row_products = False
        so_far = {}
        for name, run in runs.items():
            run.prefill()
            run.release(range(n, batch))
            so_far[name] = ids
        times: dict[str, list[float]] = {name: [] for name in runs}
        for rep in range(reps + 2):
            token = prompts(model, batch, 1, device)
            for name, run in runs.items():
                so_far[name] = torch.cat([so_far[name], token], dim=-1)
                t, _ = timed(device, run.step, so_far[name])
                if rep >= 2:
                    times[name].append(t)
        out.append({"B": batch, "rows left": n} | {k: round(statistics.median(v) * 1e3, 3) for k, v in times.items()})
    return out


@torch.inference_mode()
def appending(model: Any, device: torch.device, batches: Sequence[int], contexts: Sequence[int], steps: int) -> list:
    """ms per `runner.step` with the cache's layers appending in place (`TransformersRunner.room`) against the same
    steps on transformers' own layers, which copy the cache into a new tensor every pass: two runners on one prompt
    taking turns step by step (who goes first alternates), `steps` steps after a prompt of each context length;
    medians, and the median of the step-by-step ratios."""
    out = []
    for batch in batches:
        for context in contexts:
            ids = prompts(model, batch, context, device)
            runs = {True: runner(model, ids), False: runner(model, ids)}
            if not hasattr(runs[True], "room"):
                return out
            runs[False].room = False
            so_far = ids
            for run in runs.values():
                run.prefill()
            times: dict[bool, list[float]] = {True: [], False: []}
            for i in range(steps):
                so_far = torch.cat([so_far, prompts(model, batch, 1, device)], dim=-1)
                for room in (True, False) if i % 2 else (False, True):
                    times[room].append(timed(device, runs[room].step, so_far)[0])
            ratios = [b / a for a, b in zip(times[True], times[False])]
            out.append(
                {"B": batch, "context": f"{context}-{context + steps}"}
                | {"in place ms": round(statistics.median(times[True]) * 1e3, 2)}
                | {"concatenating ms": round(statistics.median(times[False]) * 1e3, 2)}
                | {"concatenating / in place": round(statistics.median(ratios), 3)}
            )
    return out


@torch.inference_mode()
def prefills(model: Any, device: torch.device, batches: Sequence[int], contexts: Sequence[int], reps: int) -> list:
    """ms per `runner.prefill` of a prompt in the default passes and in batch-invariant passes, taking turns (who
    goes first alternates) after a warm-up round; medians, and the median of the per-round ratios."""
    out = []
    for batch in batches:
        for context in contexts:
            ids = prompts(model, batch, context, device)
            times: dict[bool, list[float]] = {False: [], True: []}
            for rep in range(reps + 1):
                for invariant in (False, True) if rep % 2 else (True, False):
                    t = timed(device, runner(model, ids, invariant).prefill)[0]
                    if rep:
                        times[invariant].append(t)
            ratios = [b / a for a, b in zip(times[False], times[True])]
            out.append(
                {"B": batch, "prompt": context}
                | {"default ms": round(statistics.median(times[False]) * 1e3, 1)}
                | {"batch-invariant ms": round(statistics.median(times[True]) * 1e3, 1)}
                | {"batch-invariant / default": round(statistics.median(ratios), 3)}
            )
    return out


def table(rows: Sequence[dict]) -> str:
    head = list(dict.fromkeys(h for r in rows for h in r))  # every row's columns (B = 1 has no "one row")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join([*lines, *("| " + " | ".join(str(r.get(h, "")) for h in head) + " |" for r in rows)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--engine", default="transformers", choices=["transformers", "llama.cpp"])
    ap.add_argument("--gguf", default=None, help="llama.cpp: a GGUF file (default: the default model's)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="llama.cpp's threads")
    ap.add_argument("--random", action="store_true", help="a random-weight model of SmolLM2-135M's shape")
    ap.add_argument("--sections", default="1,2,3")
    ap.add_argument("--batch", default="1,8")
    ap.add_argument("--ks", default="1,2,4,8,12,16")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument(
        "--draft-length", type=int, default=8, help="the first draft length (adaptive: it grows while drafts are kept)"
    )
    ap.add_argument("--context", type=int, default=64, help="the prompt's tokens (sections 1 and 3)")
    ap.add_argument("--rows", default="1,2,3,4,5,6,8,12,16,24,48,96", help="section 4's row counts")
    ap.add_argument("--contexts", default="300,1000", help="the prompt lengths of sections 6 and 7")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    model = build(args, device, dtype)
    batches = [int(b) for b in args.batch.split(",")]
    sections = set(args.sections.split(","))
    name = "random weights" if args.random else "SmolLM2-135M-Instruct"
    if args.engine == "llama.cpp":
        name = os.path.basename(str(model.path))
    env = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else platform.processor() or "cpu",
        "engine": args.engine,
        "dtype": args.dtype if args.engine == "transformers" else "the GGUF's",
        "model": name,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }
    print(json.dumps(env))
    report: dict[str, Any] = {"environment": env}
    if "1" in sections:
        ks = [int(k) for k in args.ks.split(",")]
        report["cost"] = cost(model, device, batches, ks, args.reps, args.context)
        print("\n### 1. ms per call of k tokens per row\n\n" + table(report["cost"]), flush=True)
    if "2" in sections:
        # 4 tokens at B = 1: a check of few rows, which the transformers runner computes in its own layout on a CPU
        report["numerics"] = {f"k={k}": numerics(model, device, k) for k in (4, 8)}
        if invariant_runs(model, device):
            report["numerics"] |= {f"k={k}, batch-invariant": numerics(model, device, k, True) for k in (4, 8)}
        print("\n### 2. one k-token call against k one-token steps\n\n" + json.dumps(report["numerics"]), flush=True)
    if "3" in sections:
        n, length = args.max_new_tokens, args.draft_length
        report["bounds"] = bounds(model, device, batches, n, length, args.reps, args.context)
        print("\n### 3. generate() between a drafter that is always right and one always wrong\n", flush=True)
        print(table(report["bounds"]), flush=True)
    if "4" in sections and args.engine == "transformers":
        counts = [int(n) for n in args.rows.split(",")]
        report["layouts"] = layouts(model, device, counts, args.reps)
        print("\n### 4. a linear layer's product over n rows in the two layouts\n\n" + table(report["layouts"]))
    if "5" in sections and args.engine == "transformers":
        report["released"] = released(model, device, max(batches), args.reps, args.context)
        print("\n### 5. a step after rows left the batch\n\n" + table(report["released"]))
    if "6" in sections and args.engine == "transformers":
        contexts = [int(n) for n in args.contexts.split(",")]
        report["appending"] = appending(model, device, batches, contexts, args.max_new_tokens)
        print("\n### 6. a step with the cache appending in place\n\n" + table(report["appending"]))
    if "7" in sections and invariant_runs(model, device):
        contexts = [int(n) for n in args.contexts.split(",")]
        report["prefill"] = prefills(model, device, batches, contexts, args.reps)
        print("\n### 7. a prompt's pass, default and batch-invariant\n\n" + table(report["prefill"]))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=1)


if __name__ == "__main__":
    main()
