"""SamplechainLogitsProcessor as llama-cpp-python's `logits_processor`, on the default GGUF model.

llama-cpp-python calls it as a custom sampler, first in llama.cpp's chain, on the candidates array it views as a
numpy record array (llama.py: "NOTE: This is probably broken"). The replay test checks that view: the scores the
processor gets are, entry for entry, llama.cpp's logits of that position in token-id order (`Llama.eval` of the
same tokens with logits_all), and the token the chain picks from them is the one llama.cpp emits.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

from samplechain import Chain

llama_cpp = pytest.importorskip("llama_cpp")

from samplechain_llama_cpp import SamplechainLogitsProcessor  # noqa: E402
from samplechain_llama_cpp.reference import open_llama  # noqa: E402

pytestmark = [pytest.mark.llama_cpp, pytest.mark.slow]

PROMPT = "Once upon a time, in a small village,"
N = 16
PARAMS = {"temperature": 1.0, "top_p": 0.9, "repeat_penalty": 1.1}  # repeat_penalty reads input_ids as history


@pytest.fixture(scope="module")
def llm() -> Iterator[Any]:
    from samplechain.models import default_gguf_path

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        path = default_gguf_path()
    except Exception as exc:  # noqa: BLE001 - the model is an optional download
        pytest.skip(f"the default GGUF model is not installed: {exc}")
    model = open_llama(path, n_ctx=512, logits_all=True, n_threads=1, seed=0)
    try:
        yield model
    finally:
        model.close()
        torch.set_num_threads(threads)


class Spy:
    """A processor before the chain's: the arguments llama-cpp-python passes, copied."""

    def __init__(self) -> None:
        self.calls: list[tuple[np.ndarray, np.ndarray]] = []

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        self.calls.append((np.array(input_ids, dtype=np.int64), np.array(scores, dtype=np.float32)))
        return scores


def complete(llm: Any, proc: SamplechainLogitsProcessor, **settings: Any) -> str:
    out = llm.create_completion(PROMPT, max_tokens=N, logits_processor=[proc], **settings)
    return str(out["choices"][0]["text"])


def test_same_tokens_as_samplechain_on_the_same_logits(llm: Any) -> None:
    spy = Spy()
    proc = SamplechainLogitsProcessor("preset:llama.cpp", PARAMS, seed=7, llama=llm)
    out = llm.create_completion(PROMPT, max_tokens=N, temperature=0.8, logits_processor=[spy, proc])
    tokens = proc.tokens
    assert len(tokens) == len(proc.logprobs) == len(spy.calls) > 0
    assert out["choices"][0]["text"] == llm.detokenize(tokens).decode("utf-8", errors="ignore")
    prompt = spy.calls[0][0].tolist()
    assert proc.prompt_length == len(prompt)

    chain = Chain.load("preset:llama.cpp")
    store = chain.new_store()
    store.add("replay", {**PARAMS, "seed": 7})
    llm.reset()
    llm.eval(prompt)
    for step, token in enumerate(tokens):
        input_ids, scores = spy.calls[step]
        logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
        # the custom sampler's view: the whole sequence so far, and the logits in token-id order
        assert input_ids.tolist() == prompt + tokens[:step]
        assert np.array_equal(scores, logits)
        replay = chain.sample(
            torch.from_numpy(logits)[None],
            store,
            ["replay"],
            history=torch.tensor([prompt + tokens[:step]]),
            prompt_lengths=torch.tensor([len(prompt)]),
        )
        assert int(replay.token_ids[0]) == token
        assert float(replay.logprobs[0]) == pytest.approx(proc.logprobs[step], abs=1e-6)
        llm.eval([token])


@pytest.mark.parametrize(
    "settings",
    [
        {"temperature": 0.0},
        {"temperature": 0.8, "top_k": 40},
        {"temperature": 1.5, "top_k": 5, "top_p": 0.5, "min_p": 0.3, "repeat_penalty": 1.5, "seed": 3},
        {"temperature": 0.8, "typical_p": 0.5},
        {"temperature": 0.8, "mirostat_mode": 2},
    ],
    ids=["greedy", "temp-top_k", "strict", "typical", "mirostat"],
)
def test_llama_cpp_settings_do_not_change_the_output(llm: Any, settings: dict[str, Any]) -> None:
    reference = SamplechainLogitsProcessor("preset:llama.cpp", PARAMS, seed=11)
    text = complete(llm, reference, temperature=0.8)
    proc = SamplechainLogitsProcessor("preset:llama.cpp", PARAMS, seed=11)
    assert complete(llm, proc, **settings) == text
    assert proc.tokens == reference.tokens


def test_chat_completion(llm: Any) -> None:
    proc = SamplechainLogitsProcessor("preset:llama.cpp", {"temperature": 0.7}, seed=5, llama=llm)
    out = llm.create_chat_completion(
        messages=[{"role": "user", "content": "Name three colours."}], max_tokens=N, logits_processor=[proc]
    )
    message = out["choices"][0]["message"]["content"]
    assert proc.tokens and message.strip()
    assert llm.detokenize(proc.tokens).decode("utf-8", errors="ignore").strip().startswith(message.strip()[:8])
    assert all(lp <= 0.0 for lp in proc.logprobs)


def test_two_requests_with_their_own_parameters_and_seeds(llm: Any) -> None:
    make = SamplechainLogitsProcessor.factory("preset:llama.cpp", llama=llm)
    a, b = make({"temperature": 1.5}, seed=1), make({"temperature": 1.5, "top_k": 100}, seed=2)
    assert a.chain is b.chain
    text_a, text_b = complete(llm, a), complete(llm, b)
    assert a.tokens != b.tokens
    again_a, again_b = make({"temperature": 1.5}, seed=1), make({"temperature": 1.5, "top_k": 100}, seed=2)
    assert complete(llm, again_b) == text_b  # in the other order: a request depends on nothing but its own
    assert complete(llm, again_a) == text_a


def test_a_new_sequence_is_a_new_request(llm: Any) -> None:
    """A processor used again starts a new request at the new prompt: the same parameters and seed give what a
    fresh processor gives."""
    proc = SamplechainLogitsProcessor("preset:llama.cpp", {"temperature": 1.2}, seed=4)
    first = complete(llm, proc)
    tokens = list(proc.tokens)
    llm.create_completion("A different prompt", max_tokens=4, logits_processor=[proc])
    assert proc.tokens != tokens
    assert complete(llm, proc) == first
    assert proc.tokens == tokens and proc.error is None


def test_an_error_ends_the_request(llm: Any) -> None:
    """llama-cpp-python swallows a processor's exception (a ctypes callback): the processor keeps it and ends the
    request with the end-of-sequence token."""
    bad = {"chain": {"samplers": [{"use": "logit_bias", "bias": [[10**6, 1.0]]}, {"use": "greedy"}]}}
    proc = SamplechainLogitsProcessor(bad, llama=llm)
    out = llm.create_completion(PROMPT, max_tokens=N, logits_processor=[proc])
    assert proc.error is not None and "1000000" in str(proc.error)
    assert out["choices"][0]["finish_reason"] == "stop" and out["choices"][0]["text"] == ""


def test_greedy_chain_gives_llama_cpp_greedy(llm: Any) -> None:
    out = llm.create_completion(PROMPT, max_tokens=N, temperature=0.0)
    proc = SamplechainLogitsProcessor("preset:greedy")
    assert complete(llm, proc, temperature=0.8, top_k=40) == out["choices"][0]["text"]


def test_logprobs_at(llm: Any) -> None:
    """`.logprobs` follow `logprobs_at`: "raw" is the model's log-softmax of the chosen token; "processed" (the
    default) is under the chain's distribution, here truncated at temperature 1, so never below it."""
    spy = Spy()
    raw = SamplechainLogitsProcessor("preset:llama.cpp", {"temperature": 1.0}, seed=9, logprobs_at="raw")
    llm.create_completion(PROMPT, max_tokens=6, logits_processor=[spy, raw])
    processed = SamplechainLogitsProcessor("preset:llama.cpp", {"temperature": 1.0}, seed=9)
    llm.create_completion(PROMPT, max_tokens=6, logits_processor=[processed])
    assert processed.tokens == raw.tokens
    for (_, scores), token, logprob, kept in zip(spy.calls, raw.tokens, raw.logprobs, processed.logprobs, strict=True):
        # float32 log-sum-exps of 49,152 logits, summed in another order: within 1e-4
        assert logprob == pytest.approx(float(torch.log_softmax(torch.from_numpy(scores), -1)[token]), abs=1e-4)
        assert kept >= logprob - 1e-6


def test_logit_bias_drops_the_processor(llm: Any) -> None:
    """llama-cpp-python's `_create_completion` sets `logits_processor = logits_processor.extend(bias)`, list.extend's
    None, when `logit_bias` is given: the processor is never called (docs/llama_cpp.md says to use the chain's
    logit_bias sampler). This fails when llama-cpp-python fixes it, and the docs need updating then."""
    proc = SamplechainLogitsProcessor("preset:greedy")
    llm.create_completion(PROMPT, max_tokens=2, logits_processor=[proc], logit_bias={42: 1.0})
    assert proc.tokens == []


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"chain": 3}, "ConfigError", r"chain source = 3: expected a chain file's path"),
        ({"params": [("top_k", 5)]}, "TypeError", r"params = \[\('top_k', 5\)\]: expected a mapping"),
        ({"params": {"top_kk": 5}}, "RequestError", r"unknown parameter 'top_kk'"),
        ({"seed": -1}, "RequestError", r"\(given as 'seed'\) = -1: must be an integer in \[0, 2\*\*63\)"),
        ({"logprobs_at": "tmep"}, "ConfigError", r"logprobs_at = 'tmep': the chain has no entry of that name"),
        ({"llama": "model.gguf"}, "TypeError", r"llama = 'model.gguf': expected the llama_cpp.Llama"),
    ],
)
def test_bad_arguments_are_refused_when_the_processor_is_made(kwargs: Any, error: str, message: str) -> None:
    """Inside llama.cpp's callback an error only ends the request, so whatever can be checked before is checked
    by the constructor, with the culprit named."""
    with pytest.raises(Exception, match=message) as info:
        SamplechainLogitsProcessor(**kwargs)
    assert type(info.value).__name__ == error


def test_scores_of_more_than_one_row_are_refused() -> None:
    proc = SamplechainLogitsProcessor("preset:greedy")
    with pytest.raises(ValueError, match=r"scores of shape \(2, 8\): expected one row of logits"):
        proc(np.arange(3), np.zeros((2, 8), dtype=np.float32))
    assert proc.tokens == []
