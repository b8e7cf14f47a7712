"""samplechain's own generate() for the prompts of the vLLM tests: the tokens vLLM serving must reproduce.

    python reference.py '{"chain": "preset:llama.cpp", "prompts": ["..."], "seeds": [1, 2], "max_new_tokens": 16}'

prints {"tokens": [[...], ...], "prompt_tokens": [[...], ...]}. Each prompt runs alone (no padding), with its own
seed, eos ignored (vLLM runs with ignore_eos too), on the embedded model. Runs in any environment with samplechain
and the presets' plugins (the vllm tests call it in-process; the main .venv can run it as a script)."""

from __future__ import annotations

import json
import sys
from typing import Any

import torch


def reference_tokens(
    chain: Any, prompts: list[str], seeds: list[int | None], max_new_tokens: int, params: dict[str, Any] | None = None
) -> dict[str, list[list[int]]]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from samplechain.generation import generate
    from samplechain.models import tiny_model_path

    path = tiny_model_path()
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tokens, prompt_tokens = [], []
    for prompt, seed in zip(prompts, seeds):
        out = generate(
            model, tok, prompt, chain=chain, seed=seed, max_new_tokens=max_new_tokens, ignore_eos=True, params=params
        )
        tokens.append(out.sequences[0, out.prompt_length :].tolist())
        prompt_tokens.append(out.sequences[0, : out.prompt_length].tolist())
    return {"tokens": tokens, "prompt_tokens": prompt_tokens}


if __name__ == "__main__":
    args = json.loads(sys.argv[1])
    print(
        json.dumps(
            reference_tokens(args["chain"], args["prompts"], args["seeds"], args["max_new_tokens"], args.get("params"))
        )
    )
