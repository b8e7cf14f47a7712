"""Chains and criteria inside transformers' model.generate, against samplechain's own loop."""

from __future__ import annotations

import warnings

import pytest
import torch
from transformers import (
    LogitsProcessorList,
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from samplechain import Chain
from samplechain.generation import generate
from samplechain.integrations import as_custom_generate, as_logits_processor, as_stopping_criteria
from samplechain.testing import byte_bpe_tokenizer, tiny_gpt2

SAMPLING = {"samplers": [{"use": "temperature", "t": 0.8}, {"use": "top_k", "k": 20}, {"use": "top_p", "p": 0.9},
                         {"use": "dist"}]}


@pytest.fixture(scope="module")
def model():
    m = tiny_gpt2(300, seed=4)
    m.generation_config.pad_token_id = 0
    return m


@pytest.fixture(scope="module")
def batch():
    ids = torch.tensor([[0, 0, 5, 17, 42], [11, 12, 13, 14, 15], [0, 0, 0, 0, 7]])
    mask = (ids != 0).long()
    mask[1] = 1
    return ids, mask


def hf(model, ids, mask, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model.generate(input_ids=ids, attention_mask=mask, pad_token_id=0, **kw)


@pytest.mark.parametrize("spec, seed", [({"samplers": [{"use": "greedy"}]}, None), (SAMPLING, 17)])
def test_model_generate_with_the_adapters_equals_our_loop(model, batch, spec, seed):
    ids, mask = batch
    ours = generate(model, input_ids=ids, attention_mask=mask, chain=spec, seed=seed, max_new_tokens=12,
                    pad_token_id=0, ignore_eos=True)
    theirs = hf(model, ids, mask, logits_processor=as_logits_processor(Chain.load(spec), seed=seed),
                do_sample=False, max_new_tokens=12, eos_token_id=None)
    assert torch.equal(ours.sequences, theirs)


def test_select_false_equals_transformers_warpers(model, batch):
    ids, mask = batch
    chain = Chain.load({"samplers": [{"use": "temperature", "t": 0.7}, {"use": "top_k", "k": 30},
                                     {"use": "top_p", "p": 0.8}, {"use": "min_p", "p": 0.05}, {"use": "dist"}]})
    warpers = LogitsProcessorList([TemperatureLogitsWarper(0.7), TopKLogitsWarper(30), TopPLogitsWarper(0.8),
                                   MinPLogitsWarper(0.05)])
    ours = as_logits_processor(chain, select=False)
    out = hf(model, ids, mask, do_sample=False, max_new_tokens=6, output_logits=True,
             return_dict_in_generate=True)
    for step, logits in enumerate(out.logits):
        seq = out.sequences[:, : ids.shape[1] + step]
        a, b = ours(seq, logits.clone()), warpers(seq, logits.clone())
        assert torch.equal(torch.isfinite(a), torch.isfinite(b))
        torch.testing.assert_close(a[torch.isfinite(a)], b[torch.isfinite(b)])


def test_stopping_criteria_stop_the_same_rows_at_the_same_steps(model):
    tok = byte_bpe_tokenizer(300)
    free = generate(model, tok, ["The quick", "A"], max_new_tokens=10, ignore_eos=True, pad_token_id=0)
    piece = tok.decode(free.sequences[0, free.prompt_length + 3:free.prompt_length + 4])
    crits = [{"use": "stop_strings", "strings": [piece]}, {"use": "max_new_tokens", "n": 10}]
    ours = generate(model, tok, ["The quick", "A"], chain={"samplers": [{"use": "greedy"}], "stop": crits},
                    ignore_eos=True, pad_token_id=0)
    enc = [tok(p)["input_ids"] for p in ["The quick", "A"]]
    width = max(map(len, enc))
    ids = torch.tensor([[0] * (width - len(e)) + e for e in enc])
    mask = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in enc])
    stopper = as_stopping_criteria(crits, tokenizer=tok, pad_token_id=0)
    theirs = hf(model, ids, mask, do_sample=False, max_new_tokens=10, stopping_criteria=stopper, eos_token_id=None)
    assert stopper[0].finish_reasons[0] == ours.finish_reasons[0] == "stop_strings"
    n0 = int(ours.num_generated[0])
    assert torch.equal(theirs[0, : width + n0], ours.sequences[0, : width + n0])
    assert theirs.shape[1] == ours.sequences.shape[1]  # the batch ran exactly as long in both loops


def test_custom_generate_callable_runs_our_loop(model, batch):
    ids, mask = batch
    ours = generate(model, input_ids=ids, attention_mask=mask, chain=SAMPLING, seed=5, max_new_tokens=9,
                    pad_token_id=0, ignore_eos=True)
    theirs = hf(model, ids, mask, custom_generate=as_custom_generate(Chain.load(SAMPLING)), seed=5,
                max_new_tokens=9, eos_token_id=None)
    assert torch.equal(theirs, ours.sequences)
    out = hf(model, ids, mask, custom_generate=as_custom_generate(Chain.load(SAMPLING)), seed=5, max_new_tokens=9,
             eos_token_id=None, return_dict_in_generate=True)
    assert out.finish_reasons == ["max_length"] * 3 and torch.equal(out.sequences, ours.sequences)
