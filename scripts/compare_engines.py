"""How far llama.cpp's logits are from transformers' for the same GGUF model on the same tokens (a report).

The default model (SmolLM2-135M-Instruct, Q4_1 GGUF) runs in llama.cpp as it is (its quantized kernels) and in
transformers as `samplechain.models.load_model()` converts it (the same weights, dequantized to float32). A few
prompts are continued greedily by llama.cpp; then both engines score every position of each whole sequence in one
forward pass, and this prints per position: the largest and the mean absolute logit difference, whether the argmax
agrees, and KL(llama.cpp || transformers) of the softmaxes.

    .venv/bin/python scripts/compare_engines.py [--steps 48] [--threads 1]
"""

from __future__ import annotations

import argparse
import platform
import sys
from collections.abc import Sequence

import numpy as np
import torch

PROMPTS = (
    "The history of the Roman Empire",
    "def fibonacci(n):",
    "<|im_start|>user\nList five fruits.<|im_end|>\n<|im_start|>assistant\n",
)


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def sequences(llm: object, steps: int) -> list[list[int]]:
    """Each prompt and llama.cpp's greedy continuation of it."""
    out = []
    for text in PROMPTS:
        prompt = llm.tokenize(text.encode(), add_bos=False, special=True)  # type: ignore[attr-defined]
        llm.reset()  # type: ignore[attr-defined]
        tokens = list(prompt)
        for token in llm.generate(prompt, temp=0.0, repeat_penalty=1.0):  # type: ignore[attr-defined]
            tokens.append(int(token))
            if len(tokens) - len(prompt) >= steps:
                break
        out.append(tokens)
    return out


def compare(steps: int, threads: int) -> list[dict[str, float]]:
    from samplechain.models import default_gguf_path, load_model
    from samplechain_llama_cpp.reference import open_llama

    torch.set_num_threads(threads)
    model, _ = load_model(engine="transformers")
    model.eval()
    llm = open_llama(default_gguf_path(), n_ctx=512, logits_all=True, n_threads=threads)
    rows = []
    for tokens in sequences(llm, steps):
        llm.reset()
        llm.eval(tokens)
        ours = np.array(llm.scores[: len(tokens)], dtype=np.float32)
        with torch.no_grad():
            theirs = model(torch.tensor([tokens])).logits[0].float().numpy()
        diff = np.abs(ours - theirs)
        lp, lq = _log_softmax(ours), _log_softmax(theirs)
        kl = (np.exp(lp) * (lp - lq)).sum(-1)
        rows.append(
            {
                "positions": float(len(tokens)),
                "max_abs": float(diff.max()),
                "mean_abs": float(diff.mean()),
                "top1": float((ours.argmax(-1) == theirs.argmax(-1)).mean()),
                "kl_mean": float(kl.mean()),
                "kl_max": float(kl.max()),
                "logit_range": float((theirs.max(-1) - theirs.min(-1)).mean()),
            }
        )
    llm.close()
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=48, help="greedy tokens after each prompt (default 48)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    rows = compare(args.steps, args.threads)
    head = [
        "prompt",
        "positions",
        "max abs Δlogit",
        "mean abs Δlogit",
        "top-1 agree",
        "KL mean",
        "KL max",
        "logit range",
    ]
    print("| " + " | ".join(head) + " |")
    print("|" + " --- |" * len(head))
    for text, r in zip(PROMPTS, rows, strict=True):
        print(
            f"| {text[:24]!r} | {int(r['positions'])} | {r['max_abs']:.3f} | {r['mean_abs']:.4f} | {r['top1']:.3f} | "
            f"{r['kl_mean']:.2e} | {r['kl_max']:.2e} | {r['logit_range']:.1f} |"
        )
    total = sum(r["positions"] for r in rows)
    top1 = sum(r["top1"] * r["positions"] for r in rows) / total
    worst = max(r["max_abs"] for r in rows)
    print(f"\nall {int(total)} positions: top-1 agreement {top1:.3f}, max abs Δlogit {worst:.3f}")
    import llama_cpp
    import transformers

    print(
        f"llama-cpp-python {llama_cpp.__version__}, transformers {transformers.__version__}, torch {torch.__version__}, "
        f"Python {sys.version.split()[0]}, {platform.machine()}, {args.threads} thread(s)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
