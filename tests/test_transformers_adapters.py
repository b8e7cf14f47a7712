"""Chains and criteria inside transformers' model.generate, against samplechain's own loop."""

from __future__ import annotations

import re
import warnings

import pytest
import torch
from transformers import (
    LogitsProcessorList,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from samplechain import Chain
from samplechain.errors import ConfigError, RequestError
from samplechain.generation import generate
from samplechain.integrations import as_custom_generate, as_logits_processor, as_stopping_criteria
from samplechain.tools.testing import byte_bpe_tokenizer, tiny_gpt2

GREEDY = {"samplers": [{"use": "greedy"}]}
SAMPLING = {
    "samplers": [
        {"use": "temperature", "t": 0.8},
        {"use": "top_k", "k": 20},
        {"use": "top_p", "p": 0.9},
        {"use": "dist"},
    ]
}
PROMPTS = ["The quick", "A"]


def _docs_gpt2():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from samplechain.models import tiny_model_path

    try:
        path = tiny_model_path()
    except FileNotFoundError:
        pytest.skip("the embedded model core/samplechain/models/docs-gpt2 is not built")
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True).eval()
    return model, AutoTokenizer.from_pretrained(path, local_files_only=True)


@pytest.fixture(scope="module")
def docs_lm():
    """The embedded trained model and its tokenizer (skipped where it is not built)."""
    return _docs_gpt2()


@pytest.fixture(scope="module")
def tiny_lm():
    return tiny_gpt2(300, seed=4), byte_bpe_tokenizer(300)


@pytest.fixture(scope="module", params=["tiny-gpt2", "docs-gpt2"])
def lm(request):
    """(model, tokenizer): a random-weight 2-layer GPT-2, and the embedded trained model when it is there."""
    return request.getfixturevalue("docs_lm" if request.param == "docs-gpt2" else "tiny_lm")


@pytest.fixture(scope="module")
def model():
    return tiny_gpt2(300, seed=4)


@pytest.fixture(scope="module")
def batch():
    """Three rows, left-padded with 0."""
    ids = torch.tensor([[0, 0, 5, 17, 42], [11, 12, 13, 14, 15], [0, 0, 0, 0, 7]])
    mask = (ids != 0).long()
    mask[1] = 1
    return ids, mask


def hf(model, ids, mask, **kw):
    """transformers' model.generate with pad 0 and no eos unless given."""
    kw.setdefault("eos_token_id", None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model.generate(input_ids=ids, attention_mask=mask, pad_token_id=0, **kw)


def ours(model, ids, mask, **kw):
    return generate(model, input_ids=ids, attention_mask=mask, pad_token_id=0, ignore_eos=True, **kw)


@pytest.mark.parametrize(
    "spec, seed, do_sample",
    [(GREEDY, None, False), (SAMPLING, 17, False), (SAMPLING, 17, True), (GREEDY, None, True)],
    ids=["greedy", "seeded-sampling", "seeded-sampling-do_sample", "greedy-do_sample"],
)
def test_model_generate_with_the_chain_as_logits_processor_equals_our_loop(model, batch, spec, seed, do_sample):
    ids, mask = batch
    expected = ours(model, ids, mask, chain=spec, seed=seed, max_new_tokens=12)
    # a greedy chain defaults to select=False (transformers argmaxes the processed scores); to keep transformers'
    # sampling from choosing, a do_sample=True run needs select=True
    processor = as_logits_processor(Chain.load(spec), seed=seed, select=True if do_sample else None)
    got = hf(model, ids, mask, logits_processor=processor, do_sample=do_sample, max_new_tokens=12)
    assert torch.equal(expected.sequences, got)


@pytest.mark.parametrize("spec, seed", [(GREEDY, None), (SAMPLING, 17)], ids=["greedy", "seeded-sampling"])
def test_on_the_embedded_model_the_adapters_equal_our_loop(docs_lm, batch, spec, seed):
    model, _ = docs_lm
    ids, mask = batch
    expected = ours(model, ids, mask, chain=spec, seed=seed, max_new_tokens=8)
    got = hf(
        model,
        ids,
        mask,
        logits_processor=as_logits_processor(spec, seed=seed),
        do_sample=seed is not None,
        max_new_tokens=8,
    )
    assert torch.equal(expected.sequences, got)
    decode = as_custom_generate(spec)
    assert torch.equal(hf(model, ids, mask, custom_generate=decode, seed=seed, max_new_tokens=8), expected.sequences)


def test_num_return_sequences_gives_each_copy_the_seed_of_our_loop(model, batch):
    ids, mask = batch
    expected = ours(model, ids, mask, chain=SAMPLING, seed=3, max_new_tokens=6, num_return_sequences=2)
    got = hf(
        model,
        ids,
        mask,
        logits_processor=as_logits_processor(SAMPLING, seed=3, num_return_sequences=2),
        max_new_tokens=6,
        num_return_sequences=2,
        do_sample=True,
    )
    assert torch.equal(expected.sequences, got)
    assert not torch.equal(got[0], got[1])  # the two copies of prompt 0 drew different streams


def test_a_seed_that_is_not_an_integer_is_refused_as_in_our_loop():
    """When the processor is made, for its own seed and for a prompt's seed in params=."""
    with pytest.raises(ConfigError, match=r"seed = 1.5: an integer in \[0, 2\*\*63\)"):
        as_logits_processor(SAMPLING, seed=1.5)
    with pytest.raises(RequestError, match=r"request 'params\[1\]': dist.seed \(given as 'seed'\) = '2': expected an"):
        as_logits_processor(SAMPLING, params=[{"seed": 1}, {"seed": "2"}, {}])


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"params": 5}, ConfigError, r"params = 5: one mapping for every prompt"),
        ({"params": {"top_kk": 3}}, RequestError, r"request 'params': unknown parameter 'top_kk'"),
        ({"select": "no"}, ConfigError, r"select = 'no': True or False"),
        ({"host": "default"}, ConfigError, r"host = 'default': a samplechain PluginHost"),
    ],
    ids=["params-type", "params-key", "select", "host"],
)
def test_the_processor_refuses_bad_arguments_when_made_not_inside_model_generate(kwargs, error, message):
    with pytest.raises(error, match=message):
        as_logits_processor(SAMPLING, **kwargs)


def test_criteria_and_inputs_that_are_no_such_thing_are_one_config_error():
    with pytest.raises(ConfigError, match=r"criteria = 3: a Stopping, a criterion's name \('eos'\)"):
        as_stopping_criteria(3)
    processor = as_logits_processor(SAMPLING, seed=1)[0]
    with pytest.raises(ConfigError, match=r"input_ids = tensor\(\[1, 2\]\): a \(batch, length\) tensor"):
        processor(torch.tensor([1, 2]), torch.zeros(1, 8))


def test_the_processor_starts_fresh_requests_for_a_new_generation(model, batch):
    ids, mask = batch
    processor = as_logits_processor(SAMPLING, seed=9)
    first = hf(model, ids, mask, logits_processor=processor, max_new_tokens=5)
    again = hf(model, ids, mask, logits_processor=processor, max_new_tokens=5)
    single = hf(model, ids[1:2], mask[1:2], logits_processor=processor, max_new_tokens=5)
    assert torch.equal(first, again)
    assert torch.equal(single[0], first[1])  # a seeded row does not depend on its batch neighbours


def test_select_false_equals_transformers_warpers(lm, batch):
    model, _ = lm  # on the trained model too: its logits are peaked, unlike a random model's
    ids, mask = batch
    chain = Chain.load(
        {
            "samplers": [
                {"use": "temperature", "t": 0.7},
                {"use": "top_k", "k": 30},
                {"use": "top_p", "p": 0.8},
                {"use": "min_p", "p": 0.05},
                {"use": "dist"},
            ]
        }
    )
    warpers = LogitsProcessorList(
        [TemperatureLogitsWarper(0.7), TopKLogitsWarper(30), TopPLogitsWarper(0.8), MinPLogitsWarper(0.05)]
    )
    processor = as_logits_processor(chain, select=False)
    out = hf(model, ids, mask, do_sample=False, max_new_tokens=6, output_logits=True, return_dict_in_generate=True)
    for step, logits in enumerate(out.logits):
        seq = out.sequences[:, : ids.shape[1] + step]
        a, b = processor(seq, logits.clone()), warpers(seq, logits.clone())
        assert torch.equal(torch.isfinite(a), torch.isfinite(b))
        torch.testing.assert_close(a[torch.isfinite(a)], b[torch.isfinite(b)])


def test_select_false_accepts_the_tokens_transformers_chose(model, batch):
    ids, mask = batch
    processor = as_logits_processor(SAMPLING, select=False)
    hf(model, ids, mask, logits_processor=processor, do_sample=True, max_new_tokens=5)
    proc = processor[0]
    positions = proc.store.positions(proc.store.batch(proc.request_ids))
    assert positions.tolist() == [4, 4, 4]  # five calls: the tokens of the first four are accepted


@pytest.mark.parametrize(
    "which, steps",
    [("tiny_lm", (3, 1)), ("tiny_lm", (1, 3)), ("docs_lm", (1, 3))],
    ids=["string-then-eos", "eos-then-string", "docs-gpt2"],
)
def test_stopping_criteria_stop_the_same_rows_at_the_same_steps(request, which, steps):
    model, tok = request.getfixturevalue(which)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    free = generate(model, tok, PROMPTS, max_new_tokens=10, ignore_eos=True, pad_token_id=pad)
    at = free.prompt_length
    texts = [tok.decode([t]) for t in free.sequences[0, at:].tolist()]
    # row 0 writes it at that step (or the first step after it whose token is whole characters)
    string = next(t for t in texts[steps[0] :] if t.strip() and "\ufffd" not in t)
    eos = int(free.sequences[1, at + steps[1]])  # row 1 emits it at that step: our "eos" for this test
    crits = [
        {"use": "stop_strings", "strings": [string]},
        {"use": "eos", "ids": [eos]},
        {"use": "max_new_tokens", "n": 10},
    ]
    expected = generate(model, tok, PROMPTS, chain={"samplers": [{"use": "greedy"}], "stop": crits}, pad_token_id=pad)
    enc = [tok(p)["input_ids"] for p in PROMPTS]
    width = max(map(len, enc))
    ids = torch.tensor([[pad] * (width - len(e)) + e for e in enc])
    mask = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in enc])
    stopper = as_stopping_criteria(crits, tokenizer=tok, pad_token_id=pad)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = model.generate(
            input_ids=ids,
            attention_mask=mask,
            pad_token_id=pad,
            eos_token_id=None,
            do_sample=False,
            max_new_tokens=10,
            stopping_criteria=stopper,
        )
    assert stopper[0].finish_reasons == expected.finish_reasons
    assert set(expected.finish_reasons) == {"stop_strings", "eos"}  # both criteria took part
    for row, n in enumerate(expected.num_generated.tolist()):
        assert torch.equal(got[row, : width + n], expected.sequences[row, : width + n])
    assert got.shape == expected.sequences.shape  # the batch ran exactly as long in both loops


def test_custom_generate_callable_runs_our_loop(model, batch):
    ids, mask = batch
    expected = ours(model, ids, mask, chain=SAMPLING, seed=5, max_new_tokens=9)
    decode = as_custom_generate(Chain.load(SAMPLING))
    assert torch.equal(hf(model, ids, mask, custom_generate=decode, seed=5, max_new_tokens=9), expected.sequences)
    out = hf(model, ids, mask, custom_generate=decode, seed=5, max_new_tokens=9, return_dict_in_generate=True)
    assert out.finish_reasons == ["max_length"] * 3 and torch.equal(out.sequences, expected.sequences)


def test_custom_generate_honours_transformers_processors_and_return_sequences(model, batch):
    ids, mask = batch
    penalty = LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.5)])
    expected = ours(
        model, ids, mask, chain=SAMPLING, seed=2, max_new_tokens=6, num_return_sequences=2, logits_processor=penalty
    )
    got = hf(
        model,
        ids,
        mask,
        custom_generate=as_custom_generate(SAMPLING),
        seed=2,
        max_new_tokens=6,
        num_return_sequences=2,
        repetition_penalty=1.5,
        do_sample=True,
    )
    assert torch.equal(got, expected.sequences)


def test_custom_generate_drops_transformers_sampling_warpers_with_a_warning(model, batch):
    ids, mask = batch
    expected = ours(model, ids, mask, chain=SAMPLING, seed=4, max_new_tokens=4)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # do_sample=True alone (transformers' top_k=50): no warning
        model.generate(
            input_ids=ids,
            attention_mask=mask,
            pad_token_id=0,
            eos_token_id=None,
            custom_generate=as_custom_generate(SAMPLING),
            seed=4,
            max_new_tokens=4,
            do_sample=True,
        )
    with pytest.warns(UserWarning, match="TemperatureLogitsWarper, TopKLogitsWarper.*chain decides sampling"):
        got = model.generate(
            input_ids=ids,
            attention_mask=mask,
            pad_token_id=0,
            eos_token_id=None,
            custom_generate=as_custom_generate(SAMPLING),
            seed=4,
            max_new_tokens=4,
            do_sample=True,
            temperature=0.3,
            top_k=5,
        )
    assert torch.equal(got, expected.sequences)


def test_custom_generate_beam_search_runs_our_beam_search(model, batch):
    ids, mask = batch
    expected = ours(model, ids, mask, chain=GREEDY, max_new_tokens=5, num_beams=3, num_return_sequences=2)
    got = hf(
        model,
        ids,
        mask,
        custom_generate=as_custom_generate(GREEDY),
        max_new_tokens=5,
        num_beams=3,
        num_return_sequences=2,
    )
    assert torch.equal(got, expected.sequences)


@pytest.mark.parametrize("num_beams", [1, 3], ids=["greedy", "beam-search"])
@pytest.mark.parametrize(
    "settings",
    [
        {"repetition_penalty": 1.4},
        {"repetition_penalty": 0.8, "no_repeat_ngram_size": 3, "bad_words_ids": [[7], [20, 21]], "min_new_tokens": 3},
    ],
    ids=["repetition_penalty", "four-processors"],
)
def test_custom_generate_with_a_greedy_chain_equals_model_generate(model, num_beams, settings):
    """The processors transformers builds from model.generate's keywords run in our loop and beam search as in
    transformers' own, whatever tensor they return (repetition penalty: a slice of a wider one): the same sequences
    and scores."""
    ids = torch.tensor([[11, 12, 13, 11, 12], [40, 41, 42, 43, 44]])
    kw = dict(max_new_tokens=8, num_beams=num_beams, num_return_sequences=min(2, num_beams), do_sample=False)
    kw |= dict(settings, return_dict_in_generate=True, output_scores=True)
    ref = hf(model, ids, torch.ones_like(ids), **kw)
    got = hf(model, ids, torch.ones_like(ids), custom_generate=as_custom_generate(GREEDY), **kw)
    assert torch.equal(got.sequences, ref.sequences)
    assert len(got.scores) == len(ref.scores)
    for ours_, theirs in zip(got.scores, ref.scores):
        torch.testing.assert_close(ours_, theirs)


def test_custom_generate_passes_stop_regex_and_include_stop_str_in_output(docs_lm, batch):
    """model.generate(custom_generate=..., stop_regex=..., include_stop_str_in_output=...) runs our loop with them:
    the same tokens, finish reasons, stop texts and cut texts as samplechain's generate() (per prompt too)."""
    model, tok = docs_lm
    ids, mask = batch
    width = ids.shape[1]
    kw = dict(chain=GREEDY, max_length=width + 12)
    free = generate(model, tok, input_ids=ids, attention_mask=mask, pad_token_id=0, ignore_eos=True, **kw)
    # stops taken from the rows' own text, each spanning a few characters inside it
    stops = dict(stop_regex=[re.escape(free.texts[0][4:7])], stop_strings=[free.texts[1][5:8]])
    decode = as_custom_generate(GREEDY, tokenizer=tok)
    for include in (False, True, [True, False, False]):
        want = generate(
            model,
            tok,
            input_ids=ids,
            attention_mask=mask,
            pad_token_id=0,
            ignore_eos=True,
            include_stop_str_in_output=include,
            **stops,
            **kw,
        )
        got = hf(
            model,
            ids,
            mask,
            custom_generate=decode,
            max_new_tokens=12,
            return_dict_in_generate=True,
            include_stop_str_in_output=include,
            **stops,
        )
        assert torch.equal(got.sequences, want.sequences)
        assert got.finish_reasons == want.finish_reasons and got.stop_texts == want.stop_texts
        assert got.texts == want.texts
        assert want.finish_reasons[:2] == [f"stop_regex:{stops['stop_regex'][0]}", "stop_strings"]
        for b, flag in enumerate(include if isinstance(include, list) else [include] * 3):
            if want.stop_texts[b] is not None:  # cut at the match: before it, or right after it
                assert want.texts[b].endswith(want.stop_texts[b]) == flag


def test_custom_generate_refuses_model_inputs_it_cannot_feed(model, batch):
    ids, mask = batch
    with pytest.raises(ConfigError, match=r"model inputs \['token_type_ids'\]"):
        hf(
            model,
            ids,
            mask,
            custom_generate=as_custom_generate(GREEDY),
            max_new_tokens=2,
            token_type_ids=torch.zeros_like(ids),
        )


@pytest.mark.parametrize(
    ("defaults", "message"),
    [
        ({"tokenzer": None}, r"tokenzer=\.\.\.\): not an argument .*did you mean tokenizer="),
        ({"temperature": 0.7}, r"temperature=\.\.\.\): not an argument .*decoding settings belong in the chain"),
        ({"max_time": 3.0}, r"max_time=\.\.\.\): model.generate sets it from its own arguments"),
        ({"input_ids": torch.tensor([[1]])}, r"input_ids=\.\.\.\): model.generate sets it"),
    ],
)
def test_custom_generate_defaults_are_checked_when_it_is_made(defaults, message):
    with pytest.raises(ConfigError, match=message):
        as_custom_generate(GREEDY, **defaults)


def test_custom_generate_default_max_new_tokens_and_seed_apply():
    model = tiny_gpt2()
    ids = torch.tensor([[1, 2, 3]])
    decode = as_custom_generate(SAMPLING, max_new_tokens=4, seed=5)
    got = [model.generate(ids, attention_mask=torch.ones_like(ids), custom_generate=decode, pad_token_id=0)]
    got.append(model.generate(ids, attention_mask=torch.ones_like(ids), custom_generate=decode, pad_token_id=0))
    want = generate(model, input_ids=ids, chain=SAMPLING, max_new_tokens=4, seed=5, pad_token_id=0)
    assert got[0].shape == (1, 7) and torch.equal(got[0], got[1]) and torch.equal(got[0], want.sequences)
