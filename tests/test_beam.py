"""Beam search against transformers' model.generate(num_beams=...), token for token."""

from __future__ import annotations

import itertools
import warnings

import pytest
import torch

from samplechain import ConfigError
from samplechain.generation import generate
from samplechain.testing import byte_bpe_tokenizer, tiny_gpt2

IDS = torch.tensor([[0, 0, 5, 17, 42], [11, 12, 13, 14, 15], [0, 0, 0, 0, 7]])
MASK = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 0, 1]])


def model_with_frequent_eos(seed: int):
    """A random GPT-2 whose eos is a token it actually emits, so beams finish at different steps."""
    model = tiny_gpt2(120, seed=seed, eos_token_id=None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        free = model.generate(input_ids=IDS, attention_mask=MASK, max_new_tokens=4, do_sample=False, pad_token_id=0)
    model.generation_config.eos_token_id = int(free[0, IDS.shape[1] + 1])
    return model


def hf_beams(model, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model.generate(input_ids=IDS, attention_mask=MASK, do_sample=False, pad_token_id=0,
                              return_dict_in_generate=True, output_scores=True, **kw)


CASES = list(itertools.product([2, 3, 4], [0.5, 1.0, 2.0], [True, False, "never"]))


@pytest.mark.parametrize("num_beams, length_penalty, early_stopping", CASES)
def test_equals_transformers_beam_search(num_beams, length_penalty, early_stopping):
    model = model_with_frequent_eos(seed=num_beams)
    for n in sorted({1, num_beams}):
        kw = dict(max_new_tokens=10, num_beams=num_beams, length_penalty=length_penalty,
                  early_stopping=early_stopping, num_return_sequences=n)
        ref = hf_beams(model, **kw)
        out = generate(model, input_ids=IDS, attention_mask=MASK, pad_token_id=0, output_scores=True, **kw)
        assert torch.equal(out.sequences, ref.sequences)
        torch.testing.assert_close(out.sequences_scores, ref.sequences_scores)
        assert torch.equal(out.beam_indices.long(), ref.beam_indices.long())
        for ours, theirs in zip(out.scores, ref.scores):
            torch.testing.assert_close(ours, theirs)


def test_logprobs_are_transformers_transition_scores_and_reasons_are_named():
    model = model_with_frequent_eos(seed=7)
    ref = hf_beams(model, max_new_tokens=8, num_beams=3, num_return_sequences=3)
    out = generate(model, input_ids=IDS, attention_mask=MASK, pad_token_id=0, max_new_tokens=8, num_beams=3,
                   num_return_sequences=3)
    transition = model.compute_transition_scores(ref.sequences, ref.scores, ref.beam_indices, normalize_logits=False)
    torch.testing.assert_close(out.logprobs, transition)
    eos = model.generation_config.eos_token_id
    for row, reason, n in zip(out.sequences, out.finish_reasons, out.num_generated.tolist()):
        last = int(row[IDS.shape[1] + n - 1])
        assert reason == ("eos" if last == eos else "max_new_tokens")


def test_text_prompts_and_the_stop_strings_criterion():
    tok = byte_bpe_tokenizer(300)
    model = tiny_gpt2(300, seed=1)
    out = generate(model, tok, ["The quick", "A list"], num_beams=3, max_new_tokens=6, pad_token_id=0,
                   ignore_eos=True)
    assert out.finish_reasons == ["max_new_tokens"] * 2 and len(out.texts) == 2
    piece = tok.decode(out.sequences[0, out.prompt_length + 2: out.prompt_length + 3])
    if piece and piece != "\ufffd":
        stopped = generate(model, tok, ["The quick", "A list"], num_beams=3, max_new_tokens=6, pad_token_id=0,
                           ignore_eos=True, stop_strings=[piece])
        assert "stop_strings" in stopped.finish_reasons


def test_bad_beam_arguments():
    model = tiny_gpt2(120)
    with pytest.raises(ConfigError, match="num_return_sequences = 3: beam search returns at most num_beams = 2"):
        generate(model, input_ids=IDS, attention_mask=MASK, num_beams=2, num_return_sequences=3, max_new_tokens=3)
    with pytest.raises(ConfigError, match="the chain must end in greedy, not dist.v1"):
        generate(model, input_ids=IDS, attention_mask=MASK, num_beams=2, chain="preset:llama.cpp", max_new_tokens=3)
    with pytest.raises(ConfigError, match="early_stopping = 'sometimes'"):
        generate(model, input_ids=IDS, attention_mask=MASK, num_beams=2, early_stopping="sometimes", max_new_tokens=3)


def test_embedded_model_beam_search_equals_model_generate():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from samplechain.models import default_model_path

    model = AutoModelForCausalLM.from_pretrained(default_model_path()).eval()
    tok = AutoTokenizer.from_pretrained(default_model_path())
    prompts = ["The function", "A list is a mutable sequence and"]
    enc = [tok(p)["input_ids"] for p in prompts]
    width = max(map(len, enc))
    ids = torch.tensor([[tok.eos_token_id] * (width - len(e)) + e for e in enc])
    mask = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in enc])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, num_beams=4, max_new_tokens=16,
                             num_return_sequences=2, pad_token_id=tok.eos_token_id, return_dict_in_generate=True,
                             output_scores=True)
    out = generate(model, tok, prompts, num_beams=4, max_new_tokens=16, num_return_sequences=2,
                   pad_token_id=tok.eos_token_id)
    assert torch.equal(out.sequences, ref.sequences)
    torch.testing.assert_close(out.sequences_scores, ref.sequences_scores)
