"""The thinking budget (plugins/reasoning_budget) in vLLM: per-request budgets through vllm_xargs, a prompt that
opens the block, a request resumed after preemption mid-thought; vLLM's own SamplingParams.thinking_token_budget
handed over to the chain (so vLLM's ThinkingBudgetStateHolder, which runs after the logits processors, does not force
a second time), and left to vLLM for chains without the sampler; and in serving, the tokens of samplechain's own
generate() with the reasoning-think preset, the budget given either way."""

from __future__ import annotations

import types

import pytest
import torch

pytest.importorskip("vllm", reason="needs vLLM: run `make test-vllm`")

from transformers import AutoTokenizer  # noqa: E402
from vllm import SamplingParams  # noqa: E402
from vllm.v1.sample.logits_processor import BatchUpdate  # noqa: E402
from vllm.v1.sample.thinking_budget_state import ThinkingBudgetStateHolder  # noqa: E402

from samplechain.models import tiny_model_path  # noqa: E402
from samplechain_vllm import RequestSpecError, SamplechainLogitsProcessor  # noqa: E402

from processors import make_processor, tokenizer  # noqa: E402

pytestmark = pytest.mark.vllm
V = 4096
PROMPTS = ["Question: what is a list?\n<think>", "Question: what is a dict?\n<think>", "Question: why?\n"]


@pytest.fixture(scope="module")
def tok():
    return tokenizer()


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
    proc.update_state(
        BatchUpdate(
            batch_size=3,
            removed=[],
            moved=[],
            added=[(b, request(budgets[b], 10 + b), prompts[b], outputs[b]) for b in range(3)],
        )
    )
    run(proc, prompts, outputs, 12)
    assert outputs[0][2 : 2 + len(end)] == end
    assert outputs[1][5 : 5 + len(end)] == end
    assert outputs[2][: len(end)] != end  # no block open: nothing forced


def test_a_request_resumed_mid_thought_keeps_its_budget(tok) -> None:
    """Preempted after 2 thinking tokens and re-added with its output so far: 2 of its 4 tokens are spent."""
    end = tok.encode("</think>")
    prompt = tok.encode(PROMPTS[0])
    output = tok.encode(" A list")[:2]
    assert len(output) == 2
    proc = make_processor()
    proc.update_state(BatchUpdate(batch_size=1, removed=[], moved=[], added=[(0, request(4, 1), prompt, output)]))
    run(proc, [prompt], [output], 8)
    assert output[4 : 4 + len(end)] == end


MESSAGE = " Time to answer."
WITH_MESSAGE = {
    "chain": {"samplers": [{"use": "reasoning_budget", "message": MESSAGE}, {"use": "top_k", "k": 20}, {"use": "dist"}]}
}


def vllm_step(proc, holder, outputs, gen):
    """One step as vLLM's Sampler runs it: the logits processors, then (after the penalties) the thinking budget
    holder of a server with a reasoning config, which sets the forced end-marker token to 1e9."""
    logits = proc.apply(torch.randn(1, V, generator=gen).repeat(len(outputs), 1) * 3)  # every row the same logits
    if holder.has_tracked_requests():
        holder.update_state(outputs, None)
        logits = holder.apply_to_logits(logits, False, None)
    for b, out in enumerate(outputs):
        out.append(int(logits[b].argmax()))  # the processor left one finite token (1e9 where vLLM forces)


def serve(tok, params_list, steps, validate=True):
    """The requests through validate_params (vLLM's frontend), then a processor beside vLLM's holder built from a
    reasoning config with the chain's markers (--reasoning-config); returns (outputs, whether vLLM tracks any)."""
    if validate:
        for params in params_list:
            SamplechainLogitsProcessor.validate_params(params)
    config = types.SimpleNamespace(
        reasoning_start_token_ids=tok.encode("<think>"), reasoning_end_token_ids=tok.encode("</think>")
    )
    holder = ThinkingBudgetStateHolder(config, 8, 0, torch.device("cpu"), False)
    proc = make_processor()
    outputs: list[list[int]] = [[] for _ in params_list]
    added = [(b, p, tok.encode(PROMPTS[0]), outputs[b]) for b, p in enumerate(params_list)]
    batch = BatchUpdate(batch_size=len(added), removed=[], moved=[], added=added)
    holder.sync_batch(batch)  # vLLM syncs its holder, then the logits processors
    proc.update_state(batch)
    tracked = holder.has_tracked_requests()
    gen = torch.Generator().manual_seed(3)
    for _ in range(steps):
        vllm_step(proc, holder, outputs, gen)
    return outputs, tracked


def test_vllms_thinking_token_budget_is_the_chains_budget_and_is_forced_once(tok) -> None:
    """thinking_token_budget on a request whose chain has reasoning_budget: the frontend hands it to the chain (the
    field is cleared, so vLLM's holder does not track the request), and the chain forces its message + end marker
    exactly as with samplechain.thinking_token_budget."""
    xargs = {"samplechain": WITH_MESSAGE}
    by_field = SamplingParams(seed=5, thinking_token_budget=3, extra_args=xargs, max_tokens=16)
    by_xarg = SamplingParams(seed=5, extra_args={**xargs, "samplechain.thinking_token_budget": 3}, max_tokens=16)
    outputs, tracked = serve(tok, [by_field, by_xarg], 16)
    assert by_field.thinking_token_budget is None and not tracked
    handed = {**xargs, "samplechain.thinking_token_budget": 3, "samplechain.vllm_seed": 5}  # the seed: n = 1
    assert by_field.extra_args == handed and by_field.seed is None
    assert xargs == {"samplechain": WITH_MESSAGE}  # the caller's dict is not changed, the params get a new one
    forced = tok.encode(MESSAGE) + tok.encode("</think>")
    assert outputs[0][3 : 3 + len(forced)] == forced
    assert outputs[0] == outputs[1]  # same prompt, seed and budget: the same tokens either way
    SamplechainLogitsProcessor.validate_params(by_field)  # validated again (LLM.generate reuses params): unchanged
    assert by_field.extra_args == handed


def test_without_the_hand_over_vllm_would_force_over_the_chains_message(tok) -> None:
    """Why the field is handed over: left set, vLLM's holder forces its end marker (1e9, after the processor) where
    the chain forces its message, and the chain then goes on forcing the rest of message + end marker."""
    params = SamplingParams(seed=5, thinking_token_budget=3, extra_args={"samplechain": WITH_MESSAGE}, max_tokens=16)
    (out,), tracked = serve(tok, [params], 16, validate=False)
    assert tracked
    forced = tok.encode(MESSAGE) + tok.encode("</think>")
    assert out[3 : 3 + len(forced)] != forced


def test_a_chain_without_the_sampler_leaves_the_budget_to_vllm(tok) -> None:
    """greedy has no reasoning_budget: the field stays, vLLM's holder tracks the request and its forced end marker
    replaces the chain's token (vLLM's forcing runs after every logits processor)."""
    end = tok.encode("</think>")
    params = SamplingParams(thinking_token_budget=3, extra_args={"samplechain": "greedy"}, max_tokens=16)
    (out,), tracked = serve(tok, [params], 12)
    assert params.thinking_token_budget == 3 and tracked
    (free,), _ = serve(tok, [SamplingParams(extra_args={"samplechain": "greedy"}, max_tokens=16)], 12)
    at = next(i for i in range(len(out)) if out[i : i + len(end)] == end)
    assert out[:at] == free[:at] and free[at : at + len(end)] != end  # the chain's own tokens until vLLM forces
    # vLLM 0.32 counts a prompt's open block as if its start marker were one token: <think> is 4 tokens here, so
    # the block runs 3 tokens past the budget (docs/reasoning.md, the differences table)
    assert at == 3 + len(tok.encode("<think>")) - 1


@pytest.mark.parametrize(
    "given",
    [
        {"samplechain.thinking_token_budget": 3},
        {"samplechain.reasoning_budget": 3},
        {"samplechain.reasoning_budget.budget": 3},
    ],
)
def test_the_same_budget_both_ways_is_fine_two_budgets_are_an_error(given) -> None:
    params = SamplingParams(thinking_token_budget=3, extra_args={"samplechain": "reasoning-think", **given})
    SamplechainLogitsProcessor.validate_params(params)
    assert params.thinking_token_budget is None and params.extra_args == {"samplechain": "reasoning-think", **given}
    key = next(iter(given))
    params = SamplingParams(thinking_token_budget=4, extra_args={"samplechain": "reasoning-think", **given})
    with pytest.raises(RequestSpecError, match=f"thinking_token_budget = 4 .*'{key[len('samplechain.') :]}' = 3"):
        SamplechainLogitsProcessor.validate_params(params)


@pytest.mark.slow
def test_serving_with_a_thinking_budget_equals_generate(server: str) -> None:
    from test_serve import run_all

    from reference import reference_tokens

    budgets = [1, 4]
    seeds = [21, 22]
    jobs = [
        (PROMPTS[b], {"samplechain": "reasoning-think", "samplechain.thinking_token_budget": budgets[b]}, seeds[b])
        for b in range(2)
    ]
    responses = run_all(server, jobs)
    for b, r in enumerate(responses):
        assert r.status_code == 200, r.text
        want = reference_tokens(
            "preset:reasoning-think", [PROMPTS[b]], [seeds[b]], 16, {"reasoning_budget": budgets[b]}
        )["tokens"][0]
        assert r.json()["choices"][0]["token_ids"] == want
        end = AutoTokenizer.from_pretrained(tiny_model_path()).encode("</think>")
        assert want[budgets[b] : budgets[b] + len(end)] == end


@pytest.mark.slow
def test_serving_takes_vllms_thinking_token_budget_field(server: str) -> None:
    """The request's own thinking_token_budget on a server without --reasoning-parser: vLLM alone would refuse it
    (HTTP 400); with the reasoning-think chain it is the chain's budget, and the tokens are generate()'s."""
    from test_serve import complete

    from reference import reference_tokens

    r = complete(server, PROMPTS[0], {"samplechain": "reasoning-think"}, 23, thinking_token_budget=2)
    assert r.status_code == 200, r.text
    want = reference_tokens("preset:reasoning-think", [PROMPTS[0]], [23], 16, {"reasoning_budget": 2})["tokens"][0]
    assert r.json()["choices"][0]["token_ids"] == want
    refused = complete(server, PROMPTS[0], {"samplechain": "greedy"}, thinking_token_budget=2)
    assert refused.status_code == 400 and "reasoning" in refused.json()["error"]["message"], refused.text
