"""generate()'s features on the llama.cpp runner: stream, seeded sampling, checkpoints, stop strings, logprobs."""

from __future__ import annotations

import warnings

import pytest
import torch

from samplechain.generation import Generation, generate, stream

pytestmark = [pytest.mark.llama_cpp, pytest.mark.slow]

PROMPTS = ["The capital of France is", "Once upon a time"]


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def test_stream_text_is_generate_text(llama_model):
    model, tok = llama_model
    out = generate(model, tok, PROMPTS[0], chain="preset:greedy", max_new_tokens=16)
    text = "".join(e.text for e in stream(model, tok, PROMPTS[0], chain="preset:greedy", max_new_tokens=16))
    assert text == out.texts[0]


def test_seeded_sampling_repeats(llama_model):
    model, tok = llama_model
    first = generate(model, tok, PROMPTS, chain="preset:llama.cpp", seed=7, max_new_tokens=12)
    second = generate(model, tok, PROMPTS, chain="preset:llama.cpp", seed=7, max_new_tokens=12)
    assert torch.equal(first.sequences, second.sequences)


def test_resume_from_a_checkpoint_gives_the_uninterrupted_tokens(llama_model):
    model, tok = llama_model
    gen = Generation(model, tok, PROMPTS, chain="preset:llama.cpp", seed=5, max_new_tokens=10)
    it = gen.steps()
    for _ in range(5):
        next(it)
    ckpt = gen.checkpoint()
    for _ in it:
        pass
    full = gen.output()
    resumed = generate(model, tok, resume=ckpt, chain="preset:llama.cpp", max_new_tokens=10)
    assert torch.equal(resumed.sequences, full.sequences)
    assert torch.equal(resumed.logprobs, full.logprobs)
    assert resumed.texts == full.texts


def test_stop_strings_and_logprobs(llama_model):
    model, tok = llama_model
    out = generate(model, tok, PROMPTS[0], chain="preset:greedy", max_new_tokens=30, stop_strings=["."], top_logprobs=3)
    n = int(out.num_generated[0])
    assert n < 30 and out.finish_reasons[0] != "max_new_tokens"
    assert tok.decode(out.sequences[0, out.prompt_length :][:n]).endswith(".")
    assert "." not in out.texts[0]  # the text stops before the stop string
    lp = out.logprobs[0, :n]
    assert bool(torch.isfinite(lp).all()) and bool((lp <= 0).all())
    assert out.top_logprobs is not None


def test_rows_end_at_their_context_instead_of_filling_the_cache(llama_model):
    from samplechain_llama_cpp import load_gguf

    model, tok = llama_model
    small, _ = load_gguf(model.path, n_ctx=64, tokenizer=tok)  # llama.cpp rounds a context up to 256 cells
    try:
        limit = small.config.max_position_embeddings
        prompts = [" ".join([p] * 40) for p in PROMPTS]  # 200-odd tokens: a few new ones fill the context
        kwargs = {"chain": "preset:greedy", "ignore_eos": True}
        with pytest.warns(UserWarning, match=f"runs past the model's {limit} positions"):
            out = generate(small, tok, prompts, max_new_tokens=limit, **kwargs)
        n = limit - out.prompt_length
        assert out.finish_reasons == ["max_length", "max_length"] and out.num_generated.tolist() == [n, n]
        assert 0 < n < 64
        assert torch.equal(out.sequences, generate(small, tok, prompts, max_new_tokens=n, **kwargs).sequences)
    finally:
        small.close()
