"""Logprobs through vLLM serving: a request's `samplechain.logprobs_at` gives the logprobs samplechain's own
generate(logprobs_mode=..., top_logprobs=...) gives for the same prompt, seed and chain (the server runs with vLLM's
default logprobs_mode, raw_logprobs, which a request without logprobs_at keeps)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from test_serve import complete

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

PROMPTS = ["In Python, a list is", "The dictionary", "import os"]
SEEDS = [7, 8, 9]
MAX_TOKENS, TOP = 8, 3
STAGES = ["processed", "temp_ext", "top_k", "raw"]  # entries of the llama.cpp preset, and both ends


def reference(stage: str) -> list[dict[str, Any]]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from samplechain.generation import generate
    from samplechain.models import tiny_model_path

    path = tiny_model_path()
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    out = []
    for prompt, seed in zip(PROMPTS, SEEDS):
        got = generate(
            model,
            tok,
            prompt,
            chain="preset:llama.cpp",
            seed=seed,
            max_new_tokens=MAX_TOKENS,
            ignore_eos=True,
            logprobs_mode=stage,
            top_logprobs=TOP,
        )
        out.append(
            {
                "tokens": got.sequences[0, got.prompt_length :].tolist(),
                "logprobs": got.logprobs[0].tolist(),
                "top": [sorted(v[0].tolist(), reverse=True) for v, _ in got.top_logprobs],
            }
        )
    return out


@pytest.mark.parametrize("stage", STAGES)
def test_served_logprobs_equal_generate_at_every_stage(server: str, stage: str) -> None:
    want = reference(stage)
    for prompt, seed, ref in zip(PROMPTS, SEEDS, want):
        xargs = {"samplechain": "llama.cpp", "samplechain.logprobs_at": stage}
        response = complete(server, prompt, xargs, seed, logprobs=TOP, max_tokens=MAX_TOKENS)
        assert response.status_code == 200, response.text
        choice = response.json()["choices"][0]
        assert choice["token_ids"] == ref["tokens"]
        served = choice["logprobs"]
        torch.testing.assert_close(
            torch.tensor(served["token_logprobs"]), torch.tensor(ref["logprobs"]), atol=2e-3, rtol=1e-3
        )
        for step, top in enumerate(served["top_logprobs"]):
            values = sorted(top.values(), reverse=True)[:TOP]  # the sampled token may be listed besides the top n
            finite = [v for v in ref["top"][step] if v > float("-inf")]
            torch.testing.assert_close(torch.tensor(values[: len(finite)]), torch.tensor(finite), atol=2e-3, rtol=1e-3)
