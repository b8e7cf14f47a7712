"""Beam search against transformers' model.generate(num_beams=...), token for token."""

from __future__ import annotations

import functools
import itertools
import warnings

import pytest
import torch

from samplechain import ConfigError
from samplechain.generation import generate
from samplechain.tools.testing import tiny_gpt2

IDS = torch.tensor([[0, 0, 5, 17, 42], [11, 12, 13, 14, 15], [0, 0, 0, 0, 7]])
MASK = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 0, 1]])


@pytest.fixture(autouse=True)
def _one_thread():
    # models this small gain nothing from a second thread, and on a shared machine two threads are ~10x slower
    torch.set_num_threads(1)
    yield


@functools.cache
def model_with_frequent_eos(seed: int, n_eos: int = 1):
    """A random GPT-2 whose eos ids are tokens it actually emits, so beams finish at different steps."""
    model = tiny_gpt2(120, seed=seed, eos_token_id=None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        free = model.generate(input_ids=IDS, attention_mask=MASK, max_new_tokens=4, do_sample=False, pad_token_id=0)
    eos = [int(free[0, IDS.shape[1] + 1]), int(free[1, IDS.shape[1] + 2]), int(free[2, IDS.shape[1] + 3])][:n_eos]
    model.generation_config.eos_token_id = eos[0] if n_eos == 1 else eos
    return model


def hf_beams(model, ids=IDS, mask=MASK, **kw):
    kw.setdefault("pad_token_id", 0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=False,
            return_dict_in_generate=True,
            output_scores=True,
            output_logits=True,
            **kw,
        )


def ours(model, ids=IDS, mask=MASK, **kw):
    kw.setdefault("pad_token_id", 0)
    return generate(model, input_ids=ids, attention_mask=mask, output_scores=True, output_logits=True, **kw)


def assert_same(out, ref, model):
    """Everything transformers returns for beam search, and our transition log-probs against its own."""
    assert torch.equal(out.sequences, ref.sequences)
    torch.testing.assert_close(out.sequences_scores, ref.sequences_scores)
    assert torch.equal(out.beam_indices.long(), ref.beam_indices.long())
    assert len(out.scores) == len(ref.scores) == len(out.logits) == len(ref.logits)
    for a, b in zip(out.scores, ref.scores):
        torch.testing.assert_close(a, b)
    for a, b in zip(out.logits, ref.logits):
        assert torch.equal(a, b)
    transition = model.compute_transition_scores(ref.sequences, ref.scores, ref.beam_indices)
    torch.testing.assert_close(out.logprobs, transition)


CASES = list(itertools.product([2, 3, 4], [0.5, 1.0, 2.0], [True, False, "never"]))


@pytest.mark.parametrize("num_beams, length_penalty, early_stopping", CASES)
def test_equals_transformers_beam_search(num_beams, length_penalty, early_stopping):
    model = model_with_frequent_eos(seed=num_beams)
    for n in sorted({1, num_beams}):
        kw = dict(
            max_new_tokens=10,
            num_beams=num_beams,
            length_penalty=length_penalty,
            early_stopping=early_stopping,
            num_return_sequences=n,
        )
        out = ours(model, **kw)
        assert_same(out, hf_beams(model, **kw), model)
        assert len(out.finish_reasons) == IDS.shape[0] * n


def test_the_grid_really_finishes_beams_at_eos():
    """The models of the grid above do emit their eos: hypotheses end early, at different lengths."""
    reasons, lengths = set(), set()
    for nb in (2, 3, 4):
        out = ours(model_with_frequent_eos(seed=nb), max_new_tokens=10, num_beams=nb, num_return_sequences=nb)
        reasons |= set(out.finish_reasons)
        lengths |= set(out.num_generated.tolist())
    assert reasons == {"eos", "max_new_tokens"} and len(lengths) >= 3


@pytest.mark.parametrize("num_beams, n_eos, early_stopping", [(2, 2, False), (4, 3, True), (3, 3, "never")])
def test_several_eos_ids_widen_the_candidates(num_beams, n_eos, early_stopping):
    """transformers keeps max(2, 1 + #eos) * num_beams candidates per step."""
    model = model_with_frequent_eos(seed=num_beams, n_eos=n_eos)
    kw = dict(max_new_tokens=9, num_beams=num_beams, num_return_sequences=num_beams, early_stopping=early_stopping)
    assert_same(ours(model, **kw), hf_beams(model, **kw), model)


@pytest.mark.parametrize(
    "kw",
    [
        dict(max_length=12, early_stopping="never"),
        dict(length_penalty=0.0),
        dict(length_penalty=-1.0, early_stopping="never"),
        dict(),
    ],
    ids=["max_length", "lp0", "lp-neg", "default-length"],
)
def test_length_limits_and_penalties(kw):
    """max_length counts the padded prompt; with no limit at all transformers 5 makes 20 new tokens."""
    model = model_with_frequent_eos(seed=5)
    kw = dict(kw, num_beams=3, num_return_sequences=2)
    if kw.keys() & {"length_penalty"}:
        kw["max_new_tokens"] = 8
    out = ours(model, **kw)
    assert_same(out, hf_beams(model, **kw), model)
    if "max_length" in kw:
        assert out.sequences.shape[1] <= 12 and "max_length" in out.finish_reasons


@pytest.mark.parametrize("limit", [{"max_new_tokens": 8}, {"max_length": 11}], ids=["max_new_tokens", "max_length"])
def test_input_ids_padded_in_every_row_keep_their_width(limit):
    """Left padding wider than the longest prompt stays, as transformers keeps it (max_length counts it)."""
    model = model_with_frequent_eos(seed=2)
    ids, mask = IDS[[0, 2]], MASK[[0, 2]]  # both rows padded
    kw = dict(limit, num_beams=3, num_return_sequences=2, early_stopping="never")
    out = ours(model, ids=ids, mask=mask, **kw)
    assert_same(out, hf_beams(model, ids=ids, mask=mask, **kw), model)
    assert out.prompt_length == ids.shape[1]


def test_single_prompt_without_mask_and_a_non_zero_pad():
    model = model_with_frequent_eos(seed=2)
    kw = dict(max_new_tokens=8, num_beams=4, num_return_sequences=4)
    assert_same(ours(model, ids=IDS[1:2], mask=None, **kw), hf_beams(model, ids=IDS[1:2], mask=None, **kw), model)
    ids = IDS.masked_fill(MASK == 0, 99)  # finished hypotheses are filled with the pad (not eos) past their end
    kw["pad_token_id"] = 99
    assert_same(ours(model, ids=ids, **kw), hf_beams(model, ids=ids, **kw), model)


@pytest.mark.parametrize(
    "chain, processors",
    [
        ([{"use": "top_k", "k": 5}], lambda t: [t.TopKLogitsWarper(5)]),
        (
            [{"use": "temperature", "t": 1.5}, {"use": "top_p", "p": 0.8}],
            lambda t: [t.TemperatureLogitsWarper(1.5), t.TopPLogitsWarper(0.8)],
        ),
        ([{"use": "min_p", "p": 0.1}], lambda t: [t.MinPLogitsWarper(0.1)]),
    ],
    ids=["top_k", "temperature-top_p", "min_p"],
)
def test_chain_processing_equals_transformers_logits_processors(chain, processors):
    """The chain's transforms and filters run on the beams' log-probabilities as a LogitsProcessorList does."""
    import transformers

    model = model_with_frequent_eos(seed=3)
    kw = dict(max_new_tokens=8, num_beams=3, num_return_sequences=3)
    ref = hf_beams(model, logits_processor=transformers.LogitsProcessorList(processors(transformers)), **kw)
    assert_same(ours(model, chain={"samplers": chain + [{"use": "greedy"}]}, **kw), ref, model)


@pytest.mark.parametrize(
    "sampler, processor",
    [
        (
            {"use": "penalties", "repeat": 1.8, "scope": "transformers"},
            lambda t: t.RepetitionPenaltyLogitsProcessor(1.8),
        ),
        ({"use": "no_repeat_ngram", "n": 2}, lambda t: t.NoRepeatNGramLogitsProcessor(2)),
    ],
    ids=["penalties", "no_repeat_ngram"],
)
def test_history_reading_samplers_see_each_beams_own_tokens(sampler, processor):
    """Unpadded prompts: transformers' processors count left padding as history, ours do not."""
    import transformers

    from samplechain import get_host

    if sampler["use"] not in get_host().plugins:
        pytest.skip(f"plugin {sampler['use']} is not installed")
    ids = torch.tensor([[11, 12, 13, 14, 15], [3, 3, 9, 4, 3], [7, 7, 7, 7, 7]])
    model = model_with_frequent_eos(seed=3)
    kw = dict(max_new_tokens=10, num_beams=3, num_return_sequences=3)
    ref = hf_beams(
        model,
        ids,
        torch.ones_like(ids),
        logits_processor=transformers.LogitsProcessorList([processor(transformers)]),
        **kw,
    )
    assert_same(
        ours(model, ids, torch.ones_like(ids), chain={"samplers": [sampler, {"use": "greedy"}]}, **kw), ref, model
    )


@pytest.mark.parametrize(
    "processors",
    [
        lambda t: [t.RepetitionPenaltyLogitsProcessor(1.8)],
        lambda t: [t.NoRepeatNGramLogitsProcessor(2), t.RepetitionPenaltyLogitsProcessor(0.7)],
    ],
    ids=["repetition_penalty", "no_repeat_ngram-repetition_penalty"],
)
def test_transformers_processors_given_as_logits_processor_run_on_the_beams(processors):
    """logits_processor= holding transformers' own processors, whatever the layout of the tensor they return
    (repetition penalty returns a slice of a wider one): the beams of model.generate with the same list."""
    import transformers

    model = model_with_frequent_eos(seed=3)
    kw = dict(max_new_tokens=8, num_beams=3, num_return_sequences=2)
    listed = transformers.LogitsProcessorList(processors(transformers))
    ref = hf_beams(model, logits_processor=listed, **kw)
    assert_same(ours(model, chain={"samplers": [{"use": "greedy"}]}, logits_processor=listed, **kw), ref, model)


def test_per_request_parameters_apply_to_every_beam_of_their_prompt():
    model = model_with_frequent_eos(seed=3)
    kw = dict(
        max_new_tokens=8,
        num_beams=3,
        num_return_sequences=3,
        chain={"samplers": [{"use": "top_k", "k": 40}, {"use": "greedy"}]},
    )
    mixed = ours(model, params=[{"top_k": 2}, {"top_k": 3}, {}], **kw)
    for i, k in enumerate((2, 3, 40)):
        alone = ours(model, params={"top_k": k}, **kw)
        rows = slice(3 * i, 3 * i + 3)
        assert torch.equal(mixed.sequences[rows], alone.sequences[rows])
        torch.testing.assert_close(mixed.sequences_scores[rows], alone.sequences_scores[rows])


def stop_at(token: int):
    """A stop= callable (reason "stop_token"): the rows whose last token is `token`."""

    def stop_token(ctx):
        return ctx.input_ids[:, -1] == token

    return stop_token


def an_eos_and_a_stop_token_that_end_beams_all_three_ways(model, **kw) -> tuple[int, int]:
    """(eos id, stop token) for the test below: two tokens that the model's beams emit (a first run, with no eos),
    with which the returned hypotheses end at eos, at the stop token and at max_new_tokens. Searched over the
    emitted tokens in order, each pair checked by a run: what the model generates decides, not which weights it has
    (a few runs as a rule; 35 the most seen over 40 seeds of the model, transformers 5.12 to 5.23)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no eos anywhere: the GenerationWarning that says so
        first = ours(model, **kw)
    assert set(first.finish_reasons) == {"max_new_tokens"}
    emitted = list(dict.fromkeys(first.sequences[:, IDS.shape[1] :].flatten().tolist()))
    for eos, token in itertools.islice(itertools.permutations(emitted, 2), 200):
        reasons = ours(model, eos_token_id=eos, stop=[stop_at(token)], **kw).finish_reasons
        if set(reasons) == {"eos", "stop_token", "max_new_tokens"}:
            return eos, token
    raise AssertionError(
        f"no pair of the tokens {emitted} ends the beams at eos, at a stop token and at max_new_tokens"
    )


def test_custom_criterion_runs_on_the_candidates_as_transformers_stopping_criteria():
    """A stop= callable sees every candidate, as a transformers StoppingCriteria does in beam search: the same
    beams, scores and finished hypotheses, and each one's reason is the way it ended. The eos id and the stop token
    come from the model's own beams, so the test holds whatever the random weights."""
    from transformers import StoppingCriteria, StoppingCriteriaList

    class EndsIn(StoppingCriteria):
        def __init__(self, token):
            self.token = token

        def __call__(self, input_ids, scores, **kwargs):
            return input_ids[:, -1] == self.token

    model = tiny_gpt2(120, seed=3, eos_token_id=None)
    kw = dict(max_new_tokens=8, num_beams=3, num_return_sequences=3)
    eos, token = an_eos_and_a_stop_token_that_end_beams_all_three_ways(model, **kw)
    out = ours(model, eos_token_id=eos, stop=[stop_at(token)], **kw)
    ref = hf_beams(model, eos_token_id=eos, stopping_criteria=StoppingCriteriaList([EndsIn(token)]), **kw)
    assert_same(out, ref, model)
    assert {"eos", "stop_token", "max_new_tokens"} == set(out.finish_reasons)
    for row, reason, n in zip(out.sequences, out.finish_reasons, out.num_generated.tolist()):
        last = int(row[IDS.shape[1] + n - 1])
        expected = "eos" if last == eos else "stop_token" if last == token else None
        assert reason == (expected or "max_new_tokens")


def test_bad_beam_arguments():
    model = tiny_gpt2(120)
    model.generation_config.pad_token_id = 0
    with pytest.raises(ConfigError, match="num_return_sequences = 3: beam search returns at most num_beams = 2"):
        generate(model, input_ids=IDS, attention_mask=MASK, num_beams=2, num_return_sequences=3, max_new_tokens=3)
    with pytest.raises(ConfigError, match="the chain must end in greedy, not dist.v1"):
        generate(model, input_ids=IDS, attention_mask=MASK, num_beams=2, chain="preset:llama.cpp", max_new_tokens=3)
    with pytest.raises(ConfigError, match="early_stopping = 'sometimes'"):
        generate(model, input_ids=IDS, attention_mask=MASK, num_beams=2, early_stopping="sometimes", max_new_tokens=3)
    with pytest.raises(ConfigError, match="top_logprobs is not available with beam search"):
        generate(model, input_ids=IDS, attention_mask=MASK, num_beams=2, top_logprobs=3, max_new_tokens=3)
    with pytest.raises(ConfigError, match="num_beams = 0"):
        generate(model, input_ids=IDS, attention_mask=MASK, num_beams=0, max_new_tokens=3)


# --------------------------------------------------------------------------- the embedded model, text prompts
PROMPTS = ["The function", "A list is a mutable sequence and"]


@pytest.fixture(scope="module")
def embedded():
    from samplechain.models import TINY_MODEL, tiny_model_path

    if not (TINY_MODEL / "model.safetensors").is_file():
        pytest.skip("the embedded model is not built (scripts/train_default_model.py)")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path()).eval()
    tok = AutoTokenizer.from_pretrained(tiny_model_path())
    enc = [tok(p)["input_ids"] for p in PROMPTS]
    width = max(map(len, enc))
    ids = torch.tensor([[tok.eos_token_id] * (width - len(e)) + e for e in enc])
    mask = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in enc])
    return model, tok, ids, mask


def test_embedded_model_beam_search_equals_model_generate(embedded):
    model, tok, ids, mask = embedded
    kw = dict(num_beams=4, max_new_tokens=12, num_return_sequences=2, pad_token_id=tok.eos_token_id)
    ref = hf_beams(model, ids, mask, **kw)
    out = generate(model, tok, PROMPTS, output_scores=True, output_logits=True, **kw)
    assert_same(out, ref, model)
    new = out.sequences[:, out.prompt_length :]
    assert out.texts == [tok.decode(r[:n], skip_special_tokens=True) for r, n in zip(new, out.num_generated.tolist())]


def vllm_text(tok, tokens: list[int], stop: str | None, include: bool) -> str:
    """vLLM's output text of a sequence a stop string ended in its last token (the detokenizer's
    check_stop_strings): cut before the stop string's first occurrence ending in that token's text, or right after
    it with include_stop_str_in_output; the whole text when nothing stopped it (stop None)."""
    text = tok.decode(tokens, skip_special_tokens=True)
    if stop is None:
        return text
    before = tok.decode(tokens[:-1], skip_special_tokens=True)
    at = text.find(stop, max(len(before) - len(stop) + 1, 0))
    assert at >= 0, (text, stop)
    return text[: at + len(stop)] if include else text[:at]


def hypotheses(out):
    """Each returned hypothesis' generated tokens."""
    new = out.sequences[:, out.prompt_length :]
    return [row[:n].tolist() for row, n in zip(new, out.num_generated.tolist())]


@pytest.mark.parametrize("stop, num_beams, early_stopping", [("\n", 3, False), (" of", 2, True), (".", 3, "never")])
def test_embedded_model_stop_strings_equal_model_generate(embedded, stop, num_beams, early_stopping):
    model, tok, ids, mask = embedded
    kw = dict(
        num_beams=num_beams,
        max_new_tokens=12,
        num_return_sequences=num_beams,
        early_stopping=early_stopping,
        pad_token_id=tok.eos_token_id,
        stop_strings=[stop],
    )
    out = generate(model, tok, PROMPTS, output_scores=True, output_logits=True, **kw)
    assert_same(out, hf_beams(model, ids, mask, tokenizer=tok, **kw), model)
    assert "stop_strings" in out.finish_reasons
    for reason, text, found, tokens in zip(out.finish_reasons, out.texts, out.stop_texts, hypotheses(out)):
        assert reason in ("stop_strings", "max_new_tokens", "eos")
        assert found == (stop if reason == "stop_strings" else None)
        assert text == vllm_text(tok, tokens, found, include=False)  # the text is cut as sampling cuts it


# --------------------------------------------------------------------------- min_new_tokens, the text cut
@pytest.mark.parametrize("n", [3, 5])
def test_min_new_tokens_equals_transformers_min_new_tokens(n):
    """The min_new_tokens sampler masks eos in the beams' log-probabilities as MinNewTokensLengthLogitsProcessor
    does (per prompt, with params), and the eos criterion waits for the n-th token: the same beams."""
    model = model_with_frequent_eos(seed=4)
    kw = dict(max_new_tokens=8, num_beams=3, num_return_sequences=3)
    assert min(ours(model, **kw).num_generated.tolist()) < n  # without it, hypotheses end earlier
    chain = {"samplers": [{"use": "min_new_tokens"}, {"use": "greedy"}]}
    out = ours(model, chain=chain, params={"min_new_tokens": n}, **kw)
    assert_same(out, hf_beams(model, min_new_tokens=n, **kw), model)
    least = [0, n, 2 * n]  # per prompt: each prompt's beams as transformers gives them with its own minimum
    mixed = ours(model, chain=chain, params=[{"min_new_tokens": m} for m in least], **kw)
    for i, m in enumerate(least):
        ref = hf_beams(model, min_new_tokens=m, **kw)
        for b in range(3 * i, 3 * i + 3):
            end = IDS.shape[1] + int(mixed.num_generated[b])
            assert torch.equal(mixed.sequences[b, :end], ref.sequences[b, :end])
            assert mixed.num_generated[b] >= min(m, 8)
        torch.testing.assert_close(mixed.sequences_scores[3 * i : 3 * i + 3], ref.sequences_scores[3 * i : 3 * i + 3])


def test_min_new_tokens_holds_back_an_eos_the_chain_does_not_mask():
    """vLLM's min_tokens on the stopping side: with eos left a possible token (the sampler bans another id), a
    candidate ending in eos before its n-th token is no finished hypothesis; it runs on as any other."""
    model = model_with_frequent_eos(seed=4)
    eos = model.generation_config.eos_token_id
    kw = dict(max_new_tokens=8, num_beams=3, num_return_sequences=3)
    n = 4
    chain = {"samplers": [{"use": "min_new_tokens", "eos_ids": [(eos + 1) % 120]}, {"use": "greedy"}]}
    free = ours(model, chain=chain, **kw)
    assert any(r == "eos" and g < n for r, g in zip(free.finish_reasons, free.num_generated.tolist()))
    out = ours(model, chain=chain, params={"min_new_tokens": n}, **kw)
    assert "eos" in out.finish_reasons
    for reason, tokens in zip(out.finish_reasons, hypotheses(out)):
        assert reason != "eos" or (len(tokens) >= n and tokens[-1] == eos)
    assert any(eos in tokens[: n - 1] for tokens in hypotheses(out))  # an early eos did not end its hypothesis


@pytest.mark.parametrize(
    "stops", [dict(stop_strings=[" "]), dict(stop_regex=[" "])], ids=["stop_strings", "stop_regex"]
)
def test_embedded_model_min_new_tokens_holds_back_text_stops_per_prompt(embedded, stops):
    """A stop string / stop_regex match must end in a token after the prompt's first n (vLLM's detokenizer): with
    " " as the stop nearly every first token would end a hypothesis."""
    model, tok, _, _ = embedded
    kw = dict(
        num_beams=3,
        num_return_sequences=3,
        max_new_tokens=12,
        pad_token_id=tok.eos_token_id,
        chain={"samplers": [{"use": "min_new_tokens"}, {"use": "greedy"}]},
        **stops,
    )
    free = generate(model, tok, PROMPTS, **kw)
    assert free.num_generated[:3].tolist() == [1, 1, 1]
    least = [2, 5]
    out = generate(model, tok, PROMPTS, params=[{"min_new_tokens": n} for n in least], **kw)
    for b, (reason, found, tokens) in enumerate(zip(out.finish_reasons, out.stop_texts, hypotheses(out))):
        assert reason.startswith("stop_") and found == " " and len(tokens) > least[b // 3]
        assert " " not in tok.decode(tokens[least[b // 3] : -1])  # it ended at the first match after the first n
    assert out.texts[:3] != free.texts[:3]


@pytest.mark.parametrize("include", [False, True, [True, False]], ids=["cut", "include", "per-prompt"])
@pytest.mark.parametrize("how", ["stop_strings", "stop_regex"])
def test_embedded_model_hypotheses_are_cut_at_their_stop_match(embedded, how, include):
    """As sampling's output: a hypothesis a stop string / stop_regex ended keeps its tokens, its text ends before
    the match (or after it with its prompt's include_stop_str_in_output) and stop_texts names the match."""
    model, tok, _, _ = embedded
    stop = "."
    kw = dict(num_beams=3, num_return_sequences=3, max_new_tokens=12, pad_token_id=tok.eos_token_id)
    kw["stop_strings" if how == "stop_strings" else "stop_regex"] = [stop if how == "stop_strings" else r"\."]
    out = generate(model, tok, PROMPTS, include_stop_str_in_output=include, **kw)
    reason = "stop_strings" if how == "stop_strings" else "stop_regex:\\."
    assert reason in out.finish_reasons
    flags = include if isinstance(include, list) else [include] * len(PROMPTS)
    for b, (why, found, text, tokens) in enumerate(zip(out.finish_reasons, out.stop_texts, out.texts, hypotheses(out))):
        assert found == (stop if why == reason else None)
        assert text == vllm_text(tok, tokens, found, flags[b // 3])
    plain = generate(model, tok, PROMPTS, **kw)
    assert torch.equal(out.sequences, plain.sequences)  # only the text is cut


def test_without_eos_short_hypotheses_are_padded_with_the_pad_not_minus_one(embedded):
    """The one difference from transformers: with no eos it fills positions past a hypothesis' end with -1 (not
    a token); we fill them with the pad id."""
    model, tok, ids, mask = embedded
    pad = tok.eos_token_id
    kw = dict(num_beams=3, max_new_tokens=10, num_return_sequences=3, pad_token_id=pad, stop_strings=["\n"])
    out = generate(model, tok, PROMPTS[:1], ignore_eos=True, **kw)
    saved = model.generation_config.eos_token_id, model.config.eos_token_id
    model.generation_config.eos_token_id = model.config.eos_token_id = None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref = model.generate(
                input_ids=tok(PROMPTS[0], return_tensors="pt")["input_ids"], do_sample=False, tokenizer=tok, **kw
            )
    finally:
        model.generation_config.eos_token_id, model.config.eos_token_id = saved
    assert bool((ref == -1).any())
    assert torch.equal(out.sequences, torch.where(ref == -1, pad, ref))
