"""The thinking budget (plugins/reasoning_budget) in vLLM: per-request budgets through vllm_xargs, a prompt that
opens the block, a request resumed after preemption mid-thought; and in serving, the tokens of samplechain's own
generate() with the reasoning-think preset."""

from __future__ import annotations

import types

import pytest
import torch

pytest.importorskip("vllm", reason="needs vLLM: run `make test-vllm`")

from transformers import AutoConfig, AutoTokenizer  # noqa: E402
from vllm import SamplingParams  # noqa: E402
from vllm.v1.sample.logits_processor import BatchUpdate  # noqa: E402

from samplechain.models import default_model_path  # noqa: E402
from samplechain_vllm import SamplechainLogitsProcessor  # noqa: E402

pytestmark = pytest.mark.vllm
V = 4096
PROMPTS = ["Question: what is a list?\n<think>", "Question: what is a dict?\n<think>", "Question: why?\n"]


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(default_model_path())


def make_processor() -> SamplechainLogitsProcessor:
    path = str(default_model_path())
    config = types.SimpleNamespace(model_config=types.SimpleNamespace(
        tokenizer=path, tokenizer_revision=None, trust_remote_code=False, hf_config=AutoConfig.from_pretrained(path)))
    return SamplechainLogitsProcessor(config, torch.device("cpu"), False)


def request(budget: int | None, seed: int) -> SamplingParams:
    xargs = {"samplechain": "reasoning-think"}
    if budget is not None:
        xargs["samplechain.thinking_token_budget"] = budget
    return SamplingParams(seed=seed, extra_args=xargs, max_tokens=16)


def run(proc, prompts, outputs, steps, seed=0):
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        out = proc.apply(torch.randn(len(prompts), V, generator=gen) * 3)
        for b in range(len(prompts)):
            finite = torch.isfinite(out[b]).nonzero().flatten().tolist()
            assert len(finite) == 1
            outputs[b].append(finite[0])  # vLLM appends the sampled token to the live output list


def test_per_request_budgets_close_the_block_in_one_batch(tok) -> None:
    end = tok.encode("</think>")
    prompts = [tok.encode(p) for p in PROMPTS]
    budgets = [2, 5, 3]  # the third prompt opens no block: its budget never applies
    outputs: list[list[int]] = [[], [], []]
    proc = make_processor()
    proc.update_state(BatchUpdate(batch_size=3, removed=[], moved=[],
                                  added=[(b, request(budgets[b], 10 + b), prompts[b], outputs[b]) for b in range(3)]))
    run(proc, prompts, outputs, 12)
    assert outputs[0][2:2 + len(end)] == end
    assert outputs[1][5:5 + len(end)] == end
    assert outputs[2][:len(end)] != end  # no block open: nothing forced


def test_a_request_resumed_mid_thought_keeps_its_budget(tok) -> None:
    """Preempted after 2 thinking tokens and re-added with its output so far: 2 of its 4 tokens are spent."""
    end = tok.encode("</think>")
    prompt = tok.encode(PROMPTS[0])
    output = tok.encode(" A list")[:2]
    assert len(output) == 2
    proc = make_processor()
    proc.update_state(BatchUpdate(batch_size=1, removed=[], moved=[], added=[(0, request(4, 1), prompt, output)]))
    run(proc, [prompt], [output], 8)
    assert output[4:4 + len(end)] == end


@pytest.mark.slow
def test_serving_with_a_thinking_budget_equals_generate(server: str) -> None:
    from reference import reference_tokens
    from test_serve import run_all

    budgets = [1, 4]
    seeds = [21, 22]
    jobs = [(PROMPTS[b], {"samplechain": "reasoning-think", "samplechain.thinking_token_budget": budgets[b]},
             seeds[b]) for b in range(2)]
    responses = run_all(server, jobs)
    for b, r in enumerate(responses):
        assert r.status_code == 200, r.text
        want = reference_tokens("preset:reasoning-think", [PROMPTS[b]], [seeds[b]], 16,
                                {"reasoning_budget": budgets[b]})["tokens"][0]
        assert r.json()["choices"][0]["token_ids"] == want
        end = AutoTokenizer.from_pretrained(default_model_path()).encode("</think>")
        assert want[budgets[b]:budgets[b] + len(end)] == end
