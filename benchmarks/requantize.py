"""Write the default model's GGUF in another llama.cpp quantization, for the benchmarks' `--gguf`.

The default model ships as Q4_1, which llama.cpp's CPU backend multiplies one token at a time: a call over k tokens
costs nearly k steps, so checking drafted tokens gains little there. Q8_0, Q4_0 and F16 have many-token kernels;
this rewrites the same weights in one of them (llama.cpp's own `llama_model_quantize`, offline):

    .venv/bin/python benchmarks/requantize.py Q8_0 /tmp/smollm2-q8_0.gguf
    .venv/bin/python benchmarks/bench_verify.py --engine llama.cpp --gguf /tmp/smollm2-q8_0.gguf --sections 1,3

Requantizing from Q4_1 rounds the Q4_1 values once more (F16 keeps them to within float16's rounding): the model
is the same up to that rounding, not bit for bit. `--compare` measures how far: it scores the prompts of
bench_speculative.py's four tasks (eight each, chat-rendered) with the default file and the written one and prints
each file's perplexity on them and, against the default file, the mean KL divergence of the next-token distributions
(KL(default || written), nats) and how often the two files' most likely next tokens agree.
"""

from __future__ import annotations

import argparse
import ctypes
import math
import sys
import warnings
from pathlib import Path
from typing import Any

TYPES = ("Q8_0", "Q4_0", "F16")


def _prompts(tok: Any) -> list[list[int]]:
    here = str(Path(__file__).parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    import bench_speculative as bs

    return [bs._batch(tok, task, [i]).ids[0].tolist() for task in bs.TASKS for i in range(8)]


def _log_probs(path: str, threads: int, count: int | None) -> tuple[list[Any], list[list[int]]]:
    """Each prompt's next-token log-probabilities at every position but its last, float64, under the file at `path`,
    and the prompts' tokens (the first `count` prompts; all where None)."""
    import torch

    from samplechain.errors import GenerationWarning
    from samplechain_llama_cpp import load_gguf
    from samplechain_llama_cpp.runner import LlamaCppRunner

    model, tok = load_gguf(path, n_ctx=2048, n_threads=threads, n_threads_batch=threads)
    prompts = _prompts(tok)[:count]
    out = []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", GenerationWarning)  # a float KV cache past 256 tokens: scoring, no drafts
            for ids in prompts:
                row = torch.tensor([ids])
                runner = LlamaCppRunner(model, row[:, :1], None)
                first = runner.prefill().view(1, -1)
                logits = torch.cat([first, runner.extend(row[:, 1:-1])[0]]).double()
                out.append(torch.log_softmax(logits, -1))
    finally:
        model.close()  # the file's weights and contexts, before the other file loads
    return out, prompts


def compare(source: str, written: str, threads: int = 2, count: int | None = None) -> dict[str, float]:
    """The two files on the benchmark's prompts (the first `count` of them; all where None): each one's perplexity,
    the mean KL(source || written) of the next-token distributions (nats a position) and the share of positions
    whose most likely next tokens agree."""
    import torch

    ref, prompts = _log_probs(source, threads, count)
    new, _ = _log_probs(written, threads, count)
    n = sum(len(p) - 1 for p in prompts)
    nll_source = nll_written = kl = agree = 0.0
    for a, b, ids in zip(ref, new, prompts, strict=True):
        nxt = torch.tensor(ids[1:])
        at = torch.arange(len(nxt))
        nll_source -= a[at, nxt].sum().item()
        nll_written -= b[at, nxt].sum().item()
        kl += (a.exp() * (a - b)).sum().item()
        agree += (a.argmax(-1) == b.argmax(-1)).sum().item()
    return {
        "positions": n,
        "perplexity_source": math.exp(nll_source / n),
        "perplexity_written": math.exp(nll_written / n),
        "kl": kl / n,
        "agree": agree / n,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("type", choices=TYPES)
    ap.add_argument("out", help="the GGUF file to write")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--compare", action="store_true", help="then score the two files on the benchmark's prompts")
    args = ap.parse_args(argv)
    import llama_cpp

    from samplechain.models import default_gguf_path

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{args.type}")
    params.allow_requantize = True
    params.nthread = args.threads
    source = str(default_gguf_path())
    rc = llama_cpp.llama_model_quantize(source.encode(), args.out.encode(), ctypes.byref(params))
    if rc != 0:
        print(f"llama_model_quantize({source!r} -> {args.out!r}, {args.type}) returned {rc}", file=sys.stderr)
        return 1
    print(args.out)
    if args.compare:
        c = compare(source, args.out, args.threads)
        print(f"{c['positions']} positions of the prompts of bench_speculative.py's tasks")
        print(f"perplexity: {Path(source).name} {c['perplexity_source']:.3f}, {args.out} {c['perplexity_written']:.3f}")
        print(f"KL(source || written): {c['kl']:.5f} nats a position; most likely next tokens agree: {c['agree']:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
