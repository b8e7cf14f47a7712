"""The llama.cpp runner at B = 1 against llama-cpp-python's own decoding, its choice, its loader's errors."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from samplechain.errors import ConfigError
from samplechain.generation import generate
from samplechain.generation.model import runner_for

pytestmark = pytest.mark.llama_cpp

PROMPT = "The capital of France is"


def own_logits(llama, tokens: list[int]) -> np.ndarray:
    """llama-cpp-python's logits after `tokens` (its eval keeps the last token's)."""
    llama.eval(tokens)
    return np.ctypeslib.as_array(llama._ctx.get_logits(), shape=(llama.n_vocab(),)).copy()


def test_logits_at_b1_are_llama_cpp_pythons_own_bit_for_bit(llama_model):
    from samplechain_llama_cpp import LlamaCppRunner

    model, tok = llama_model
    ids = tok(PROMPT)["input_ids"]
    runner = LlamaCppRunner(model, torch.tensor([ids]), None)
    model.llama.reset()
    ours = runner.prefill()
    assert ours.shape == (1, model.config.vocab_size) and ours.dtype == torch.float32
    assert np.array_equal(ours[0].numpy(), own_logits(model.llama, ids))
    seq = torch.tensor([ids])
    for token in (1797, 314, 253):
        seq = torch.cat([seq, torch.tensor([[token]])], dim=1)
        assert np.array_equal(runner.step(seq)[0].numpy(), own_logits(model.llama, [token]))
    model.llama.reset()


def test_a_prompt_of_64_tokens_or_more_gives_llama_cpp_pythons_own_logits_and_so_do_the_steps_after_it(llama_model):
    """A prompt runs in llama.cpp's own passes, as llama-cpp-python runs it, though from 64 tokens of a sequence on
    llama.cpp attends through another kernel than a check of drafted tokens may use."""
    from samplechain_llama_cpp import LlamaCppRunner

    model, _ = llama_model
    ids = [int(t) for t in (torch.arange(150) * 53 + 400) % 20000]
    runner = LlamaCppRunner(model, torch.tensor([ids]), None)
    model.llama.reset()
    assert np.array_equal(runner.prefill()[0].numpy(), own_logits(model.llama, ids))
    seq = torch.tensor([ids])
    for token in (1797, 314):
        seq = torch.cat([seq, torch.tensor([[token]])], dim=1)
        assert np.array_equal(runner.step(seq)[0].numpy(), own_logits(model.llama, [token]))
    model.llama.reset()


def test_a_step_with_active_rows_decodes_only_them(llama_model):
    from samplechain_llama_cpp import LlamaCppRunner

    model, tok = llama_model
    ids = torch.tensor([tok(PROMPT)["input_ids"]] * 3)
    full, part = LlamaCppRunner(model, ids, None), LlamaCppRunner(model, ids, None)
    full.prefill(), part.prefill()
    seq = torch.cat([ids, torch.tensor([[1797], [314], [253]])], dim=1)
    everyone = full.step(seq)
    some = part.step(seq, active=torch.tensor([True, False, True]))
    assert torch.equal(some[[0, 2]], everyone[[0, 2]]) and not some[1].any()
    assert part.n.tolist() == [full.n[0], full.n[1] - 1, full.n[2]]  # the inactive row's sequence did not advance


def test_rows_that_finish_early_are_not_decoded_and_the_tokens_do_not_change(llama_model, monkeypatch):
    from samplechain_llama_cpp import LlamaCppRunner

    model, tok = llama_model
    prompts = [[{"role": "user", "content": c}] for c in ("What is 12 times 12?", "Write a short story about a cat.")]
    calls: list[int] = []
    decode = LlamaCppRunner._decode

    def counting(self, seq, pos, tokens, want):
        calls.append(len(tokens))
        return decode(self, seq, pos, tokens, want)

    monkeypatch.setattr(LlamaCppRunner, "_decode", counting)
    skipping = generate(model, tok, prompts, chain="preset:greedy", max_new_tokens=48)
    decoded = sum(calls)
    calls.clear()
    monkeypatch.setattr(LlamaCppRunner, "skips_inactive", False)
    every = generate(model, tok, prompts, chain="preset:greedy", max_new_tokens=48)
    first, last = sorted(skipping.num_generated.tolist())
    assert first < last, "one row ends first"
    assert skipping.sequences.tolist() == every.sequences.tolist()
    assert skipping.texts == every.texts
    assert sum(calls) - decoded == last - first  # the finished row's steps, no longer decoded


@pytest.mark.slow
def test_greedy_generate_is_llama_cpp_pythons_greedy_decoding(llama_model):
    model, tok = llama_model
    ids = tok(PROMPT)["input_ids"]
    out = generate(model, tok, input_ids=torch.tensor([ids]), chain="preset:greedy", max_new_tokens=40)
    eos = set(np.atleast_1d(model.generation_config.eos_token_id).tolist())
    theirs: list[int] = []
    for token in model.llama.generate(ids, top_k=1, temp=0.0, reset=True):
        if token in eos:
            break
        theirs.append(token)
        if len(theirs) == 40:
            break
    assert out.sequences[0, len(ids) :].tolist()[: len(theirs)] == theirs
    assert int(out.num_generated[0]) in (len(theirs), len(theirs) + 1)  # + the eos token llama.cpp stops before
    completion = model.llama.create_completion(ids, temperature=0, top_k=1, max_tokens=40)
    assert completion["choices"][0]["text"] == tok.decode(theirs, skip_special_tokens=True)


def test_runner_for_picks_the_llama_cpp_runner(llama_model):
    from samplechain_llama_cpp import LlamaCppRunner

    model, _ = llama_model
    assert runner_for(model) is LlamaCppRunner
    assert not LlamaCppRunner.accepts(object())


def test_model_has_what_generation_reads(llama_model):
    model, tok = llama_model
    assert model.config.vocab_size == model.llama.n_vocab() == 49152
    assert model.config.max_position_embeddings == 1024 and model.config.is_encoder_decoder is False
    assert model.config.model_type == "llama.cpp" and model.config.name_or_path == str(model.path)
    assert model.llama.token_eos() in list(np.atleast_1d(model.generation_config.eos_token_id))
    assert model.device == torch.device("cpu")


def test_load_model_runs_a_gguf_file_on_llama_cpp():
    pytest.importorskip("llama_cpp")
    from samplechain.models import default_gguf_path, load_model
    from samplechain_llama_cpp import LlamaCppModel

    try:
        path = default_gguf_path()
    except ConfigError as exc:
        pytest.skip(str(exc))
    model, tok = load_model(path, n_ctx=256)
    try:
        assert isinstance(model, LlamaCppModel) and model.config.max_position_embeddings == 256
        assert len(tok) == model.config.vocab_size
    finally:
        model.close()


def test_without_llama_cpp_python_loading_says_how_to_install_it(monkeypatch):
    from samplechain.models import default_gguf_path
    from samplechain_llama_cpp import load_gguf

    try:
        path = default_gguf_path()
    except ConfigError as exc:
        pytest.skip(str(exc))
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import llama_cpp now raises ImportError
    with pytest.raises(ConfigError, match="pip install llama-cpp-python"):
        load_gguf(path)


def test_a_missing_file_is_one_config_error(tmp_path):
    pytest.importorskip("llama_cpp")
    from samplechain_llama_cpp import load_gguf

    with pytest.raises(ConfigError, match="does not exist"):
        load_gguf(tmp_path / "absent.gguf")


def test_a_file_that_is_not_gguf_is_one_config_error(tmp_path):
    pytest.importorskip("llama_cpp")
    from samplechain.models import load_model

    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"PK\x03\x04 not a model")
    with pytest.raises(ConfigError, match="not a GGUF model"):
        load_model(bad)


def test_a_truncated_gguf_file_is_one_config_error(tmp_path):
    pytest.importorskip("llama_cpp")
    from samplechain_llama_cpp import load_gguf

    bad = tmp_path / "cut.gguf"
    bad.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\x00" * 8)
    with pytest.raises(ConfigError, match="could not load"):
        load_gguf(bad)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n_ctxx": 512}, r"n_ctxx=512 is not an argument of llama_cpp.Llama; did you mean 'n_ctx'\?"),
        ({"n_ctx": -5}, r"n_ctx=-5: expected an integer >= 0 \(0: the model's training context\)"),
        ({"n_threads": "2"}, r"n_threads='2': expected an integer >= 1"),
        ({"model_path": "other.gguf"}, r"model_path='other.gguf': the model file is the loader's first argument"),
    ],
)
def test_loader_arguments_llama_cpp_would_ignore_or_fail_on_later_are_refused(kwargs, message):
    """llama_cpp.Llama takes **kwargs and drops what it does not know: a misspelt argument would set nothing."""
    pytest.importorskip("llama_cpp")
    from samplechain.models import default_gguf_path, load_model

    with pytest.raises(ConfigError, match=message):
        load_model(default_gguf_path(), engine="llama.cpp", **kwargs)


def test_the_sampling_step_runs_on_one_thread_and_the_count_comes_back(llama_model):
    from samplechain.generation import Generation

    model, tok = llama_model
    before = torch.get_num_threads()
    gen = Generation(model, tok, "Hello", chain="preset:greedy", max_new_tokens=3)
    inside, one_step = [], gen._one_step

    def counted(*args):
        inside.append(torch.get_num_threads())
        return one_step(*args)

    gen._one_step = counted  # type: ignore[method-assign]
    between = [torch.get_num_threads() for _ in gen.steps()]  # the reader's code between steps keeps its threads
    assert inside == [1, 1, 1] and between == [before] * 3 and torch.get_num_threads() == before
