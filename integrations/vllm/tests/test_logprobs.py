"""Logprobs of samplechain rows in vLLM: the processor scores the rows that ask for logprobs with the chain
(`Chain.sample(logprobs_at=...)`) and its wrapper around vLLM's `Sampler.forward` writes them into the step's
LogprobsTensors. Checked through vLLM's real Sampler against the distributions computed with transformers'
processors, for the engine's logprobs_mode and a request's own `logprobs_at`."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm", reason="needs vLLM: run `make test-vllm`")

from transformers.generation import logits_process as tp  # noqa: E402
from vllm import SamplingParams  # noqa: E402
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessors  # noqa: E402
from vllm.v1.sample.metadata import SamplingMetadata  # noqa: E402
from vllm.v1.sample.sampler import Sampler  # noqa: E402

from samplechain_vllm import RequestSpecError, SamplechainLogitsProcessor, parse_request  # noqa: E402

from processors import make_processor  # noqa: E402

pytestmark = pytest.mark.vllm
V, TOP = 4096, 3
CHAIN = {
    "samplers": [
        {"use": "temperature", "t": 0.7, "id": "temp"},
        {"use": "top_k", "k": 20},
        {"use": "top_p", "p": 0.9},
        {"use": "dist"},
    ]
}


def metadata(proc: SamplechainLogitsProcessor, batch: int) -> SamplingMetadata:
    """A greedy batch asking for TOP logprobs, with the processor as vLLM's InputBatch would hold it."""
    zeros = torch.zeros(batch)
    return SamplingMetadata(
        temperature=None,
        all_greedy=True,
        all_random=False,
        top_p=None,
        top_k=None,
        generators={},
        max_num_logprobs=TOP,
        no_penalties=True,
        prompt_token_ids=None,
        frequency_penalties=zeros,
        presence_penalties=zeros,
        repetition_penalties=zeros + 1,
        output_token_ids=[[] for _ in range(batch)],
        allowed_token_ids_mask=None,
        bad_words_token_ids={},
        logitsprocs=LogitsProcessors([proc]),
    )


def stages(logits: torch.Tensor) -> dict[str, torch.Tensor]:
    """The chain's distributions, computed with transformers' processors one by one."""
    temp = tp.TemperatureLogitsWarper(0.7)(None, logits.clone())
    top_k = tp.TopKLogitsWarper(20)(None, temp.clone())
    return {"raw": logits, "temp": temp, "top_k": top_k, "processed": tp.TopPLogitsWarper(0.9)(None, top_k.clone())}


def step(mode: str, xargs: list[dict], logprobs: list[int | None]):
    proc = make_processor(mode)
    added = [
        (i, SamplingParams(seed=i + 1, extra_args=x, max_tokens=4, logprobs=n), [5, 6, 7], [])
        for i, (x, n) in enumerate(zip(xargs, logprobs))
    ]
    proc.update_state(BatchUpdate(batch_size=len(added), removed=[], added=added, moved=[]))
    logits = torch.randn(len(added), V, generator=torch.Generator().manual_seed(7)) * 3
    out = Sampler(logprobs_mode=mode)(logits.clone(), metadata(proc, len(added)))
    return logits, out.sampled_token_ids[:, 0].long(), out.logprobs_tensors


def expect(tensors, row: int, stage: torch.Tensor, token: int, as_logits: bool) -> None:
    dist = stage[row].double() if as_logits else torch.log_softmax(stage[row].double(), dim=-1)
    values, ids = dist.topk(TOP)
    assert int(tensors.logprob_token_ids[row, 0]) == token
    torch.testing.assert_close(tensors.logprobs[row, 0].double(), dist[token], atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(tensors.logprobs[row, 1:].double(), values, atol=2e-5, rtol=1e-5)
    assert tensors.logprob_token_ids[row, 1:].tolist() == ids.tolist()
    assert int(tensors.selected_token_ranks[row]) == int((dist >= dist[token]).sum())


@pytest.mark.parametrize(
    "mode, stage, as_logits",
    [("processed_logprobs", "processed", False), ("processed_logits", "processed", True), ("raw_logits", "raw", True)],
)
def test_the_engine_logprobs_mode_is_honoured_for_samplechain_rows(mode, stage, as_logits):
    logits, tokens, tensors = step(mode, [{"samplechain": {"chain": CHAIN}}] * 2, [TOP, TOP])
    ref = stages(logits)[stage]
    for row in range(2):
        expect(tensors, row, ref, int(tokens[row]), as_logits)


def test_the_default_raw_logprobs_are_vllms_own_and_equal_samplechains_raw():
    logits, tokens, tensors = step("raw_logprobs", [{"samplechain": {"chain": CHAIN}}], [TOP])
    expect(tensors, 0, logits, int(tokens[0]), False)


def test_a_request_names_its_own_stage_and_rows_without_logprobs_are_left_alone():
    xargs = [
        {"samplechain": {"chain": CHAIN, "logprobs_at": "temp"}},
        {"samplechain": {"chain": CHAIN}, "samplechain.logprobs_at": "top_k:logits"},
        {"samplechain": {"chain": CHAIN}},
    ]
    logits, tokens, tensors = step("raw_logprobs", xargs, [TOP, TOP, None])
    ref = stages(logits)
    expect(tensors, 0, ref["temp"], int(tokens[0]), False)
    expect(tensors, 1, ref["top_k"], int(tokens[1]), True)
    expect(tensors, 2, logits, int(tokens[2]), False)  # vLLM's own values (its raw logprobs) where none was asked


def test_a_chain_with_guards_is_refused_when_the_request_arrives():
    guarded = {**CHAIN, "guards": [{"use": "banned_strings", "phrases": ["a testament to"]}]}
    with pytest.raises(RequestSpecError, match=r"the chain's guards \(banned_strings\) take text back"):
        SamplechainLogitsProcessor.validate_params(SamplingParams(extra_args={"samplechain": {"chain": guarded}}))


def test_a_bad_stage_is_refused_when_the_request_arrives():
    with pytest.raises(RequestSpecError, match="logprobs_at = 'tmp'.*did you mean 'temp'"):
        SamplechainLogitsProcessor.validate_params(
            SamplingParams(extra_args={"samplechain": {"chain": CHAIN}, "samplechain.logprobs_at": "tmp"})
        )
    with pytest.raises(RequestSpecError, match="logprobs_at must be a string"):
        parse_request({"samplechain": {"preset": "llama.cpp", "logprobs_at": 3}})
    with pytest.raises(RequestSpecError, match="given both"):
        parse_request({"samplechain": {"preset": "llama.cpp", "logprobs_at": "raw"}, "samplechain.logprobs_at": "raw"})
    assert parse_request({"samplechain": "llama.cpp", "samplechain.logprobs_at": "temp_ext"}).logprobs_at == "temp_ext"
