"""The generation loop against transformers' model.generate, with real (small) models and tokenizers."""

from __future__ import annotations

import warnings

import pytest
import torch

import samplechain
from samplechain import Chain, ConfigError
from samplechain.generation import GenerationWarning, IncrementalDecoder, generate, stream
from samplechain.tools.testing import ScriptedLM, byte_bpe_tokenizer, tiny_gpt2

TEMP_TOPK_TOPP = {
    "samplers": [
        {"use": "temperature", "t": 0.8},
        {"use": "top_k", "k": 20},
        {"use": "top_p", "p": 0.9},
        {"use": "dist"},
    ]
}


@pytest.fixture(scope="module")
def tok():
    return byte_bpe_tokenizer(300)


@pytest.fixture(scope="module")
def model():
    return tiny_gpt2(300, seed=0)


def left_padded(rows: list[list[int]], pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), pad, dtype=torch.int64)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, width - len(r) :] = torch.tensor(r)
        mask[i, width - len(r) :] = 1
    return ids, mask


def hf_generate(model, ids, mask, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model.generate(input_ids=ids, attention_mask=mask, do_sample=False, **kwargs)


# ----------------------------------------------------------------- greedy equals transformers
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("eos", [None, "frequent"])
def test_greedy_equals_model_generate_batched_with_left_padding(seed, eos):
    model = tiny_gpt2(300, seed=seed, eos_token_id=None)
    rows = [[5, 17, 42, 9], [11, 12], [200, 201, 202, 203, 204, 205, 206], [7]]
    ids, mask = left_padded(rows)
    if eos == "frequent":  # an eos the model actually emits, so rows finish at different steps
        first = hf_generate(model, ids, mask, max_new_tokens=8, pad_token_id=0)[:, ids.shape[1] :]
        model.generation_config.eos_token_id = int(first[0, 2])
    ref = hf_generate(model, ids, mask, max_new_tokens=14, pad_token_id=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GenerationWarning)
        out = generate(model, input_ids=ids, attention_mask=mask, max_new_tokens=14, pad_token_id=0)
    assert torch.equal(out.sequences, ref)
    if eos == "frequent":
        assert "eos" in out.finish_reasons


@pytest.mark.parametrize(
    "pads, pad_token_id, limit",
    [
        ([2], 0, {"max_new_tokens": 6}),
        ([3, 1, 2], 0, {"max_new_tokens": 6}),
        ([3, 1, 2], 0, {"max_length": 10}),
        ([2, 4], 7, {"max_length": 9}),
    ],
    ids=["one-row", "every-row", "max_length", "other-pad-id"],
)
def test_input_ids_keep_their_width_where_every_row_is_padded(model, pads, pad_token_id, limit):
    """input_ids padded further than their longest row (padded to a multiple, or a row cut from a batch) keep
    their width and their pad ids, as transformers keeps them: sequences[:, input_ids.shape[1]:] are the new tokens,
    and max_length counts the padding."""
    rows = [[5, 17, 42, 9, 3, 8][: 6 - p] for p in pads]
    ids, mask = left_padded([[0] * p + r for p, r in zip(pads, rows)])
    mask = (torch.arange(6) >= torch.tensor(pads)[:, None]).to(torch.int64)
    ids = torch.where(mask.bool(), ids, torch.full_like(ids, 3))  # padded with an id other than the pad token
    ref = hf_generate(model, ids, mask, pad_token_id=pad_token_id, **limit)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GenerationWarning)
        out = generate(model, input_ids=ids, attention_mask=mask, pad_token_id=pad_token_id, **limit)
    assert torch.equal(out.sequences, ref)
    assert out.prompt_length == ids.shape[1]
    assert torch.equal(out.sequences[:, : ids.shape[1]], ids)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_input_ids_on_the_device_generate_as_on_the_host():
    """input_ids and an attention mask on the model's GPU, as a transformers user passes them: model.generate's
    greedy tokens, and with a seeded chain the tokens of the same rows given on the host."""
    gpu = tiny_gpt2(300, seed=0).to("cuda")
    ids, mask = left_padded([[3, 4, 5], [9], [7, 7]])
    ids, mask = ids.cuda(), mask.cuda()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GenerationWarning)
        greedy = generate(gpu, input_ids=ids, attention_mask=mask, max_new_tokens=8, pad_token_id=0)
        sampled = {
            device: generate(
                gpu,
                input_ids=ids.to(device),
                attention_mask=mask.to(device),
                chain=TEMP_TOPK_TOPP,
                seed=3,
                max_new_tokens=8,
                pad_token_id=0,
            )
            for device in ("cuda", "cpu")
        }
    assert torch.equal(greedy.sequences, hf_generate(gpu, ids, mask, max_new_tokens=8, pad_token_id=0))
    assert torch.equal(sampled["cuda"].sequences, sampled["cpu"].sequences)


def test_greedy_scores_and_logits_equal_transformers(model):
    ids, mask = left_padded([[3, 4, 5], [9]])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=5,
            do_sample=False,
            pad_token_id=0,
            output_scores=True,
            output_logits=True,
            return_dict_in_generate=True,
        )
        out = generate(
            model,
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=5,
            pad_token_id=0,
            output_scores=True,
            output_logits=True,
            ignore_eos=True,
        )
    assert torch.equal(out.sequences, ref.sequences)
    for ours, theirs in zip(out.logits, ref.logits):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
    for ours, theirs in zip(out.scores, ref.scores):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


def test_text_prompts_are_left_padded_and_pad_falls_back_to_eos(model, tok):
    with pytest.warns(GenerationWarning, match="no pad token.*eos id 0"):
        out = generate(model, tok, ["The quick brown fox", "A"], max_new_tokens=6)
    enc = [tok(p)["input_ids"] for p in ["The quick brown fox", "A"]]
    ids, mask = left_padded(enc, pad=0)
    ref = hf_generate(model, ids, mask, max_new_tokens=6, pad_token_id=0)
    assert torch.equal(out.sequences, ref)
    assert out.texts == [
        tok.decode(r[ids.shape[1] : ids.shape[1] + n], skip_special_tokens=True)
        for r, n in zip(ref.tolist(), out.num_generated.tolist())
    ]


# ----------------------------------------------------------------- outputs
def test_logprobs_are_the_processed_distribution_at_the_chosen_tokens(model):
    ids, mask = left_padded([[1, 2, 3], [4, 5]])
    out = generate(
        model,
        input_ids=ids,
        attention_mask=mask,
        chain=TEMP_TOPK_TOPP,
        seed=3,
        max_new_tokens=6,
        output_scores=True,
        top_logprobs=3,
        ignore_eos=True,
        pad_token_id=0,
    )
    new = out.sequences[:, out.prompt_length :]
    for step, scores in enumerate(out.scores):
        lp = torch.log_softmax(scores, dim=-1)
        torch.testing.assert_close(out.logprobs[:, step], lp.gather(1, new[:, step : step + 1]).squeeze(1))
        values, top_ids = out.top_logprobs[step]
        ref_values, ref_ids = lp.topk(3, dim=-1)
        torch.testing.assert_close(values, ref_values)
        finite = ref_values > float("-inf")  # past the kept tokens any removed id may fill the -inf places
        assert torch.equal(top_ids[finite], ref_ids[finite])
    assert out.finish_reasons == ["max_new_tokens", "max_new_tokens"]
    assert out.num_generated.tolist() == [6, 6]


def an_eos_one_row_emits_mid_run(new: list[list[int]]) -> tuple[int, int, int]:
    """From a free run's new tokens (one list per row), (row, step, token) for an eos id the test below can use: the
    token that row first emits at that step, 1 <= step <= len - 2 (so the row makes a token before it and is padded
    after it), and that another row never emits (so that row runs to the end). The earliest such step, then the
    first row: it depends on what the model generates, not on which weights it has."""
    for k in range(1, len(new[0]) - 1):
        for r, row in enumerate(new):
            token = row[k]
            if token not in row[:k] and any(token not in other for o, other in enumerate(new) if o != r):
                return r, k, token
    raise AssertionError(
        f"no row emits a token first at a step in 1..{len(new[0]) - 2} that another row never emits: {new}"
    )


def test_a_finished_row_is_padded_and_keeps_its_reason(model):
    """A row that emits eos ends there: its reason is "eos", its tokens after it are the pad, its log-probs after it
    0; a row that never emits it runs on unchanged. The eos id is chosen from a free run of the same model (the
    free run's tokens are the expectation), so the test holds whatever the random weights."""
    ids, mask = left_padded([[5, 17, 42, 9], [11, 12]])
    width, n_new = ids.shape[1], 8
    free = generate(model, input_ids=ids, attention_mask=mask, max_new_tokens=n_new, ignore_eos=True, pad_token_id=0)
    new = free.sequences[:, width:].tolist()
    r, k, eos = an_eos_one_row_emits_mid_run(new)
    out = generate(model, input_ids=ids, attention_mask=mask, max_new_tokens=n_new, eos_token_id=eos, pad_token_id=299)
    assert out.finish_reasons[r] == "eos" and out.num_generated[r] == k + 1  # a token, then eos, then pads
    assert set(out.finish_reasons) == {"eos", "max_new_tokens"}
    for b, row in enumerate(new):
        got = out.sequences[b, width:]
        if eos in row:  # ends at its first eos, then the pad
            n = row.index(eos) + 1
            assert out.finish_reasons[b] == "eos" and out.num_generated[b] == n
            assert got[:n].tolist() == row[:n] and bool((got[n:] == 299).all())
            torch.testing.assert_close(out.logprobs[b, :n], free.logprobs[b, :n])
            assert out.logprobs[b, n:].abs().sum() == 0
        else:  # runs on unchanged
            assert out.finish_reasons[b] == "max_new_tokens" and out.num_generated[b] == n_new
            assert got.tolist() == row
            torch.testing.assert_close(out.logprobs[b], free.logprobs[b])


class _MaskAfterPad(samplechain.Sampler):
    """Masks every token of a row whose last token is 299 (the pad of the test below): a chain that fails at a
    finished row's pad-fed positions."""

    name = "mask_after_pad"
    stage = samplechain.Stage.FILTER

    def needs_history(self) -> bool:
        return True

    def apply(self, cand, ctx):
        return cand.masked(~(ctx.history[:, -1:] == 299).expand(-1, cand.width))


class _MaskAfterPadPlugin:
    @samplechain.hookimpl
    def register_samplers(self, register):
        register(_MaskAfterPad)


@pytest.mark.parametrize("extra", [{}, {"output_scores": True}, {"top_logprobs": 2}], ids=["plain", "scores", "tops"])
def test_a_finished_rows_chain_failing_on_its_pad_leaves_the_other_rows_going(model, extra):
    """A finished row runs on, fed the pad; where its chain masks every token there, that is no row of the caller's
    to fail: the rows still going get the tokens of a run without that failure, the finished row the pad (and -inf
    scores and top logprobs, with token id 0, at those steps). A row still going whose chain fails is an error, as
    ever."""
    host = samplechain.PluginHost(use_env=False)
    host.register_plugin(_MaskAfterPadPlugin(), "mask-after-pad")
    chain = Chain.load({"samplers": [{"use": "mask_after_pad"}, {"use": "greedy"}]}, host=host)
    ids, mask = left_padded([[5, 17, 42, 9], [11, 12]])
    width, n_new = ids.shape[1], 8
    free = generate(model, input_ids=ids, attention_mask=mask, max_new_tokens=n_new, ignore_eos=True, pad_token_id=0)
    r, k, eos = an_eos_one_row_emits_mid_run(free.sequences[:, width:].tolist())
    kwargs = {"input_ids": ids, "attention_mask": mask, "max_new_tokens": n_new, "eos_token_id": eos}
    out = generate(model, chain=chain, pad_token_id=299, host=host, **extra, **kwargs)
    assert out.finish_reasons[r] == "eos" and out.num_generated[r] == k + 1
    going = 1 - r
    assert out.sequences[going, width:].tolist() == free.sequences[going, width:].tolist()
    assert bool((out.sequences[r, width + k + 1 :] == 299).all())
    if "output_scores" in extra:
        assert bool(torch.isinf(out.scores[-1][r]).all()) and bool(torch.isfinite(out.scores[-1][going]).any())
    if "top_logprobs" in extra:
        values, ids = out.top_logprobs[-1]
        assert ids.dtype == torch.int64 and ids[r].tolist() == [0, 0] and ids[going, 0] == out.sequences[going, -1]
        assert bool(torch.isneginf(values[r]).all()) and bool(torch.isfinite(values[going]).all())
    ids, mask = left_padded([[5, 17, 42, 299], [11, 12]])  # a row going whose chain masks every token
    with pytest.raises(samplechain.SamplingError, match="every token is masked"):
        generate(model, chain=chain, input_ids=ids, attention_mask=mask, pad_token_id=299, host=host)


# ----------------------------------------------------------------- sampling
def test_seeded_sampling_is_reproducible_and_seeds_differ(model):
    ids, mask = left_padded([[1, 2, 3]])
    kw = dict(
        input_ids=ids, attention_mask=mask, chain=TEMP_TOPK_TOPP, max_new_tokens=12, ignore_eos=True, pad_token_id=0
    )
    a = generate(model, seed=11, **kw).sequences
    b = generate(model, seed=11, **kw).sequences
    c = generate(model, seed=12, **kw).sequences
    assert torch.equal(a, b) and not torch.equal(a, c)


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"seed": [1, 2]}, r"seed = \[1, 2\]: an integer in \[0, 2\*\*63\) \(give a seed per prompt as params="),
        ({"seed": 1.5}, r"seed = 1.5: an integer"),  # not rounded to 1
        ({"seed": True}, r"seed = True: an integer"),
        ({"seed": "7"}, r"seed = '7': an integer"),
        ({"params": {"seed": -3}}, r"params\['seed'\] = -3: an integer"),
        ({"params": [{"seed": 1}, {"seed": 2.0}]}, r"params\[1\]\['seed'\] = 2.0: an integer"),
        ({"seed": 2**63 - 1, "num_return_sequences": 2}, r"return sequence 1 draws with seed \+ 1"),
    ],
    ids=["list", "float", "bool", "string", "params-negative", "params-row-float", "past-the-range"],
)
def test_a_seed_that_is_not_an_integer_is_one_error_naming_where_it_was_given(model, given, message):
    ids, mask = left_padded([[1, 2, 3], [4, 5]])
    kw = dict(input_ids=ids, attention_mask=mask, chain=TEMP_TOPK_TOPP, max_new_tokens=2, pad_token_id=0)
    with pytest.raises(samplechain.ConfigError, match=message):
        generate(model, **kw, **given)


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"ignore_eos": "no"}, r"ignore_eos = 'no': True or False"),  # a truthy string would ignore eos
        ({"output_scores": "yes"}, r"output_scores = 'yes': True or False"),
        ({"cuda_graphs": "off"}, r"cuda_graphs = 'off': True or False"),
        ({"max_time": "5"}, r"max_time = '5': seconds, a number > 0"),
        ({"stop_strings": 5}, r"stop_strings = 5: a string or a list of strings"),
        ({"stop_regex": 5}, r"stop_regex = 5: a string or a list of strings"),
        ({"eos_token_id": [1, "2"]}, r"eos_token_id = \[1, '2'\]: a token id of the model or a list of them"),
        ({"pad_token_id": 300}, r"pad_token_id = 300: a token id of the model \(in \[0, 300\)\)"),
        ({"pad_token_id": -1}, r"pad_token_id = -1: a token id of the model"),
        ({"pad_token_id": []}, r"pad_token_id = \[\]: a token id of the model, not an empty list"),
        ({"eos_token_id": 10**20}, r"eos_token_id = 100000000000000000000: a token id of the model"),
        (
            {"eos_token_id": [2, 300]},
            r"eos_token_id = \[2, 300\]: a token id of the model or a list of them \(in \[0, 300\)\)",
        ),
        ({"output_logits": torch.zeros(2, 3)}, r"(?s)output_logits = tensor\(.*\): True or False"),
        ({"include_stop_str_in_output": torch.zeros(2)}, r"include_stop_str_in_output = tensor\(.*\): give one bool"),
        ({"input_ids": {"ids": [1, 2]}}, r"input_ids = \{'ids': \[1, 2\]\}: a \(batch, length\) integer tensor"),
        ({"attention_mask": [[1, "x", 1], [0, 1, 1]]}, r"attention_mask = \[\[1, 'x', 1\], .*: a tensor of input_ids"),
        ({"params": 5}, r"params = 5: one mapping for every prompt"),
        ({"params": [{"seed": 1}, "top_k=3"]}, r"params\[1\] = 'top_k=3': a mapping of chain parameters for prompt 1"),
        ({"logits_processor": 5}, r"logits_processor = 5: a callable fn\(input_ids, scores\) -> scores"),
        ({"generation_config": {"do_sample": True}}, r"generation_config = \{'do_sample': True\}: a transformers"),
        ({"host": "default"}, r"host = 'default': a samplechain PluginHost"),
        ({"stop": 5}, r"stop = 5: a list of stopping criteria .* stop strings go in stop_strings="),
        ({"progress": 5}, r"progress = 5: a callable progress\(step, max_new_tokens\)"),
        (
            {"num_beams": 2, "length_penalty": "1", "chain": {"samplers": [{"use": "greedy"}]}},
            r"length_penalty = '1': a finite number",
        ),
    ],
    ids=lambda v: next(iter(v)) if isinstance(v, dict) else "",
)
def test_a_bad_argument_is_one_error_naming_it_before_the_model_runs(model, given, message):
    ids, mask = left_padded([[1, 2, 3], [4, 5]])
    kw = {"input_ids": ids, "attention_mask": mask, "chain": TEMP_TOPK_TOPP, "max_new_tokens": 2, "pad_token_id": 0}
    with pytest.raises(ConfigError, match=message):
        generate(model, **{**kw, **given})


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"result": {}}, r"result = \{\}: a list the final GenerationOutput is appended to"),
        (
            {"num_beams": 2},
            r"num_beams = 2: stream\(\) yields each token as it is drawn.*use generate\(\.\.\., num_beams=N\)",
        ),
        ({"progress": "bar"}, r"progress = 'bar': a callable"),
        ({"max_new_tokens": 0}, r"max_new_tokens.n = 0: must be in \[1, inf\)"),
        ({"seed": -1}, r"seed = -1: an integer in \[0, 2\*\*63\)"),
    ],
    ids=["result", "num_beams", "progress", "max_new_tokens", "seed"],
)
def test_stream_refuses_what_it_cannot_do_when_called_before_the_model_runs(tok, given, message):
    """The call raises, not the first next(): a caller that shows something before the first event (the CLI echoes
    the prompt) shows nothing for a request that cannot run."""
    model = tiny_gpt2(len(tok), seed=0)
    with pytest.raises(ConfigError, match=message):
        stream(model, tok, "a b", **{"max_new_tokens": 2, **given})
    assert len(list(stream(model, tok, "a b", max_new_tokens=2, num_beams=1))) == 2  # num_beams=1 is no beam search


def test_a_plain_list_of_logits_processors_runs_in_order_as_model_generate_runs_one(model):
    ids, mask = left_padded([[1, 2, 3], [4, 5]])
    calls: list[str] = []

    def ban(token: int, name: str):
        def processor(input_ids, scores):
            calls.append(name)
            return scores.index_fill(1, torch.tensor([token]), float("-inf"))

        return processor

    kw = {"input_ids": ids, "attention_mask": mask, "max_new_tokens": 3, "pad_token_id": 0, "ignore_eos": True}
    plain = generate(model, **kw).sequences[:, ids.shape[1] :]
    first = int(plain[0, 0])
    banned = generate(model, **kw, logits_processor=[ban(first, "a"), ban(7, "b")]).sequences[:, ids.shape[1] :]
    assert calls[:2] == ["a", "b"]
    assert first not in banned[0].tolist() and 7 not in banned.flatten().tolist()
    assert generate(model, **kw, logits_processor=[]).sequences.tolist() == generate(model, **kw).sequences.tolist()


def test_a_seeded_request_gives_the_same_tokens_in_any_batch_row(model):
    """Same prompt length everywhere (no padding), so the model's logits are the same in every row."""
    prompts = torch.tensor([[1, 2, 3], [4, 5, 6], [7, 8, 9], [10, 11, 12]])
    kw = dict(chain=TEMP_TOPK_TOPP, max_new_tokens=10, ignore_eos=True, pad_token_id=0)
    alone = generate(model, input_ids=prompts[2:3], params=[{"seed": 99}], **kw).sequences[0]
    params = [{"seed": 5}, {"seed": 6}, {"seed": 99}, {"seed": 7}]
    together = generate(model, input_ids=prompts, params=params, **kw).sequences
    assert torch.equal(together[2], alone)
    reordered = generate(model, input_ids=prompts[[2, 0, 3, 1]], params=[params[i] for i in (2, 0, 3, 1)], **kw)
    assert torch.equal(reordered.sequences[0], alone)


def test_per_request_parameters(model):
    """Row 1 at temperature 0 must pick exactly what greedy picks; row 0 samples."""
    ids, mask = left_padded([[1, 2, 3], [1, 2, 3]])
    greedy = generate(model, input_ids=ids[:1], max_new_tokens=8, ignore_eos=True, pad_token_id=0).sequences[0]
    out = generate(
        model,
        input_ids=ids,
        attention_mask=mask,
        chain=TEMP_TOPK_TOPP,
        max_new_tokens=8,
        ignore_eos=True,
        pad_token_id=0,
        params=[{"temperature": 5.0, "seed": 1}, {"temperature": 0.0}],
    )
    assert torch.equal(out.sequences[1], greedy)
    assert not torch.equal(out.sequences[0], greedy)


def test_num_return_sequences_samples_distinct_continuations(model):
    ids = torch.tensor([[1, 2, 3]])
    out = generate(
        model,
        input_ids=ids,
        chain=TEMP_TOPK_TOPP,
        seed=4,
        num_return_sequences=3,
        max_new_tokens=10,
        ignore_eos=True,
        pad_token_id=0,
    )
    assert out.sequences.shape[0] == 3 and len({tuple(r) for r in out.sequences.tolist()}) == 3
    with pytest.raises(ConfigError, match="num_return_sequences = 2 with a greedy chain"):
        generate(model, input_ids=ids, num_return_sequences=2, max_new_tokens=3)


def test_chain_defaults_follow_the_generation_config(model):
    from transformers import GenerationConfig

    greedy = samplechain.generation.chain_from_generation_config(GenerationConfig())
    assert [s.name for s in greedy.samplers] == ["greedy"]
    cfg = GenerationConfig(do_sample=True, temperature=0.7, top_k=30, top_p=0.9, min_p=0.05)
    chain = samplechain.generation.chain_from_generation_config(cfg)
    assert [s["name"] for s in chain.describe()] == ["temperature.v1", "top_k.v1", "top_p.v1", "min_p.v1", "dist.v1"]


@pytest.mark.parametrize(
    ("setting", "value", "message"),
    [
        ("top_k", float("inf"), r"generation_config.top_k = inf: expected an integer, as transformers takes it"),
        ("temperature", "hot", r"generation_config.temperature = 'hot': expected a number"),
        ("bad_words_ids", 3, r"generation_config.bad_words_ids = 3: expected a list of token-id lists"),
        ("bad_words_ids", [[5], []], r"bad_words_ids = \[\[5\], \[\]\]: .*each of at least one id"),
        ("suppress_tokens", "ab", r"generation_config.suppress_tokens = 'ab': expected a list of token ids"),
        ("begin_suppress_tokens", [1.5], r"begin_suppress_tokens = \[1.5\]: expected a list of token ids"),
        ("sequence_bias", {(1,): "x"}, r"sequence_bias = \{\(1,\): 'x'\}: expected .*each bias a number"),
        ("sequence_bias", [[1, 0.5]], r"sequence_bias = \[\[1, 0.5\]\]: expected \{\(token ids\): bias\}"),
        ("exponential_decay_length_penalty", (4,), r"length_penalty = \(4,\): expected \(start, factor\)"),
        ("forced_eos_token_id", [2.5], r"forced_eos_token_id = \[2.5\]: expected a token id or a list"),
        ("eos_token_id", "2", r"generation_config.eos_token_id = '2': expected a token id"),
    ],
)
def test_a_generation_config_setting_of_the_wrong_kind_is_one_error_naming_it(setting, value, message):
    from transformers import GenerationConfig

    cfg = GenerationConfig(do_sample=True, top_k=40.0, max_length=20)  # a whole float is an integer setting
    assert [s.name for s in samplechain.generation.chain_from_generation_config(cfg).samplers] == ["top_k", "dist"]
    setattr(cfg, setting, value)
    with pytest.raises(ConfigError, match=message):
        samplechain.generation.chain_from_generation_config(cfg)


def test_length_limit_defaults_to_the_generation_config(model):
    ids = torch.tensor([[1, 2, 3]])
    model.generation_config.max_length = 9
    try:
        out = generate(model, input_ids=ids, ignore_eos=True, pad_token_id=0)
    finally:
        model.generation_config.max_length = 20
    assert out.sequences.shape[1] == 9 and out.finish_reasons == ["max_length"]


def test_stop_strings_from_the_chain_file_and_the_call(model, tok):
    free = generate(model, tok, "The quick", max_new_tokens=12, ignore_eos=True, pad_token_id=0)
    new = free.sequences[0, free.prompt_length :].tolist()
    pieces = [tok.decode([t]) for t in new]
    k = next(i for i, p in enumerate(pieces) if p.strip() and p.isascii())  # a stop string the model will emit
    stop = pieces[k]
    out = generate(model, tok, "The quick", max_new_tokens=12, ignore_eos=True, pad_token_id=0, stop_strings=[stop])
    first = next(i for i, p in enumerate(pieces) if stop in "".join(pieces[: i + 1]))
    assert out.finish_reasons == ["stop_strings"] and out.num_generated.tolist() == [first + 1]
    assert torch.equal(
        out.sequences[0, : out.prompt_length + first + 1], free.sequences[0, : free.prompt_length + first + 1]
    )
    chain = Chain.load(
        {
            "samplers": [{"use": "greedy"}],
            "stop": [{"use": "stop_strings", "strings": [stop]}, {"use": "max_new_tokens", "n": 12}],
        }
    )
    assert generate(model, tok, "The quick", chain=chain, ignore_eos=True, pad_token_id=0).texts == out.texts


def test_a_plain_callable_criterion(model):
    ids = torch.tensor([[1, 2, 3], [4, 5, 6]])

    def row0_after_three(ctx):
        return torch.tensor([ctx.step >= 3, False])

    out = generate(model, input_ids=ids, stop=[row0_after_three], max_new_tokens=7, ignore_eos=True, pad_token_id=0)
    assert out.finish_reasons == ["row0_after_three", "max_new_tokens"]
    assert out.num_generated.tolist() == [3, 7]


# ----------------------------------------------------------------- streaming
def test_stream_deltas_concatenate_to_the_final_text(model, tok):
    result: list = []
    events = list(
        stream(
            model,
            tok,
            "The quick brown",
            chain=TEMP_TOPK_TOPP,
            seed=2,
            max_new_tokens=25,
            ignore_eos=True,
            result=result,
        )
    )
    text = "".join(e.text for e in events)
    assert text == result[0].texts[0]
    assert events[-1].finish_reason == "max_new_tokens"
    assert {e.index for e in events} == {0}


@pytest.mark.parametrize("draft", [None, "prompt_lookup"])
def test_a_stream_read_step_by_step_leaves_its_reader_outside_inference_mode(model, tok, draft):
    """The model runs under inference mode only while the stream computes a step: between steps, and after a reader
    stops early, the reader's own tensors can be changed in place."""
    kw = {"chain": TEMP_TOPK_TOPP, "seed": 2, "max_new_tokens": 8, "ignore_eos": True, "draft": draft}
    events = stream(model, tok, "The quick brown The quick brown The", **kw)
    for _ in range(3):
        next(events)
        assert not torch.is_inference_mode_enabled()
        torch.zeros(2).add_(1)  # an inference tensor made here would refuse this
    events.close()
    assert not torch.is_inference_mode_enabled()
    with torch.inference_mode():  # a reader inside inference mode stays in it
        assert len(list(stream(model, tok, "The quick", max_new_tokens=3, ignore_eos=True))) == 3
        assert torch.is_inference_mode_enabled()


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"draft": "prompt_lookup"},
        {"num_beams": 2},
        {"output_scores": True, "output_logits": True, "top_logprobs": 2},
    ],
)
def test_the_output_tensors_are_ordinary_tensors_as_model_generate_returns(model, tok, kwargs):
    """The model runs under inference mode, whose tensors refuse in-place changes and autograd outside it: what
    generate() returns works as model.generate's output does (a trainer takes gradients through the sequences)."""
    out = generate(model, tok, ["The quick brown The quick", "A"], max_new_tokens=5, pad_token_id=0, **kwargs)
    tensors = [v for v in out.values() if isinstance(v, torch.Tensor)]
    for steps in (out.scores, out.logits, out.top_logprobs):
        for item in steps or ():
            tensors.extend(item if isinstance(item, tuple) else [item])
    assert len(tensors) >= 3 and not any(t.is_inference() for t in tensors)
    model(out.sequences).logits.logsumexp(-1).mean().backward()
    out.sequences[:, -1] = 0
    model.zero_grad()


def test_stream_yields_one_event_per_token_also_within_a_character(tok):
    """A byte-level tokenizer spells 日 and 🎉 over several tokens: each token gets its event, the first ones with
    an empty delta, so the events' token ids are the generated tokens (vLLM streams every token too)."""
    rows = [tok("日本 🎉 x")["input_ids"], tok("é🎉🎉")["input_ids"]]
    assert any(tok.decode([i]) == "\ufffd" for i in rows[0]) and len(rows[1]) > len("é🎉🎉")
    result: list = []
    kwargs = {"chain": "preset:greedy", "pad_token_id": 0, "ignore_eos": True, "result": result}
    events = list(stream(ScriptedLM(rows, len(tok)), tok, ["a", "b"], max_new_tokens=len(rows[0]), **kwargs))
    out = result[0]
    for b, ids in enumerate(rows):
        mine = [e for e in events if e.index == b]
        n = int(out.num_generated[b])
        assert [e.token_id for e in mine] == out.sequences[b, out.sequences.shape[1] - n :].tolist()
        assert [e.token_id for e in mine][: len(ids)] == ids
        assert "".join(e.text for e in mine) == out.texts[b] and not any("\ufffd" in e.text for e in mine)
        assert "" in [e.text for e in mine] and mine[-1].finish_reason == "max_new_tokens"


@pytest.mark.parametrize("text", ["naïve café — 日本語のテキスト 🎉!", "🎉🎉 ümlauts\n\nZürich", "plain ascii"])
def test_incremental_decoder_never_splits_a_character(tok, text):
    ids = tok(text)["input_ids"]
    assert any("\ufffd" in tok.decode([i]) for i in ids) or text == "plain ascii"  # really split across tokens
    dec = IncrementalDecoder(tok)
    deltas = [dec.push(i) for i in ids] + [dec.flush()]
    assert "".join(deltas) == tok.decode(ids, skip_special_tokens=True) == text
    assert not any("\ufffd" in d for d in deltas)


def test_incremental_decoder_flushes_a_dangling_partial_character(tok):
    ids = tok("日")["input_ids"][:-1]  # the first bytes of a 3-byte character only
    dec = IncrementalDecoder(tok)
    deltas = [dec.push(i) for i in ids] + [dec.flush()]
    assert "".join(deltas) == tok.decode(ids)


# ----------------------------------------------------------------- bad input
def test_empty_prompt_starts_from_bos_with_a_warning(model, tok):
    with pytest.warns(GenerationWarning, match="prompt 1 is empty: starting it from the bos token 0"):
        out = generate(model, tok, ["Hello", ""], max_new_tokens=3, pad_token_id=0)
    assert out.sequences.shape[0] == 2


def test_empty_prompt_without_bos_is_an_error(model):
    with pytest.raises(ConfigError, match="prompt 0 is empty and the model has no bos token"):
        generate(
            tiny_gpt2(300, bos_token_id=None),
            input_ids=torch.zeros((1, 0), dtype=torch.int64),
            max_new_tokens=3,
            pad_token_id=0,
        )


def test_prompt_longer_than_the_model_positions(model):
    with pytest.raises(ConfigError, match="prompt 0 has 130 tokens but the model has 128 positions"):
        generate(model, input_ids=torch.ones((1, 130), dtype=torch.int64), max_new_tokens=3, pad_token_id=0)


@pytest.mark.parametrize("draft", [None, "prompt_lookup"])
def test_rows_that_would_run_past_the_model_positions_end_at_the_last_one(model, draft):
    ids = torch.tensor([[5, 6, 7, 8] * 30, [0] * 10 + [9, 10] * 55])  # 120 positions, the second row left-padded
    mask = (torch.arange(120) >= torch.tensor([[0], [10]])).to(torch.int64)
    kwargs = {"input_ids": ids, "attention_mask": mask, "ignore_eos": True, "pad_token_id": 0, "draft": draft}
    with pytest.warns(UserWarning, match="max_new_tokens = 20 after a 120-token prompt runs past the model's 128 "):
        out = generate(model, max_new_tokens=20, **kwargs)
    assert out.finish_reasons == ["max_length", "max_length"] and out.num_generated.tolist() == [8, 8]
    fits = generate(model, max_new_tokens=8, **kwargs)
    assert torch.equal(out.sequences, fits.sequences)


def test_a_wider_negative_prompt_ends_the_rows_at_its_last_position(model):
    kwargs = {"input_ids": torch.tensor([[5, 6, 7, 8, 9, 10]]), "ignore_eos": True, "pad_token_id": 0, "seed": 1}
    kwargs |= {
        "negative_prompt_ids": torch.tensor([[11, 12] * 55]),
        "chain": {"samplers": [{"use": "cfg", "scale": 1.5}, {"use": "dist"}]},
    }
    out = generate(model, max_new_tokens=30, **kwargs)  # the negative context reaches 128 positions after 18
    assert out.finish_reasons == ["max_length"] and out.num_generated.tolist() == [18]
    assert torch.equal(out.sequences, generate(model, max_new_tokens=18, **kwargs).sequences)


def test_a_max_length_past_the_positions_gives_way_to_them(model):
    ids = torch.tensor([[5, 6, 7, 8] * 25])
    kwargs = {"input_ids": ids, "ignore_eos": True, "pad_token_id": 0}
    with pytest.warns(GenerationWarning, match="max_length = 200 runs past the model's 128 positions: the rows end"):
        out = generate(model, max_length=200, **kwargs)
    assert out.finish_reasons == ["max_length"] and out.num_generated.tolist() == [28]
    assert torch.equal(out.sequences, generate(model, max_new_tokens=28, **kwargs).sequences)


def test_a_prompt_token_outside_the_vocabulary_is_one_error(model):
    vocab = model.config.vocab_size
    with pytest.raises(ConfigError, match=rf"prompt 1 has token id {vocab} at position 2: not a token of the model"):
        generate(model, input_ids=torch.tensor([[1, 2, 3], [4, 5, vocab]]), max_new_tokens=2, pad_token_id=0)


def test_extra_logit_columns_beyond_the_tokenizer_are_masked(tok):
    model = tiny_gpt2(320, seed=1)
    with torch.no_grad():  # make the columns the tokenizer cannot decode the most likely ones
        model.lm_head.weight[300:] *= 40
    ids = torch.tensor([tok("The quick")["input_ids"]])
    raw = generate(model, input_ids=ids, max_new_tokens=8, ignore_eos=True, pad_token_id=0)
    assert (raw.sequences[0, ids.shape[1] :] >= 300).any(), "the test needs the extra columns to win"
    with pytest.warns(GenerationWarning, match="320 logit columns but the tokenizer only 300 tokens"):
        out = generate(model, tok, "The quick", max_new_tokens=8, ignore_eos=True, pad_token_id=0)
    assert (out.sequences[0, ids.shape[1] :] < 300).all()


def test_no_eos_anywhere_warns(tok):
    model = tiny_gpt2(300, eos_token_id=None)
    with pytest.warns(GenerationWarning, match="no eos token"):
        generate(model, input_ids=torch.tensor([[1, 2]]), max_new_tokens=2, pad_token_id=0)


def test_right_padding_is_refused(model):
    ids = torch.tensor([[1, 2, 3], [4, 0, 0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    with pytest.raises(ConfigError, match="right-padded.*padding_side = 'left'"):
        generate(model, input_ids=ids, attention_mask=mask, max_new_tokens=2)


def test_conflicting_length_limits_are_refused(model):
    chain = Chain.load({"samplers": [{"use": "greedy"}], "stop": [{"use": "max_new_tokens", "n": 4}]})
    with pytest.raises(ConfigError, match="max_new_tokens.v1 is given twice with different parameters"):
        generate(model, input_ids=torch.tensor([[1]]), chain=chain, max_new_tokens=5, pad_token_id=0)
    out = generate(model, input_ids=torch.tensor([[1]]), chain=chain, max_new_tokens=4, pad_token_id=0, ignore_eos=True)
    assert out.num_generated.tolist() == [4]


# ----------------------------------------------------------------- the embedded model
@pytest.fixture(scope="module")
def embedded():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from samplechain.models import tiny_model_path

    path = tiny_model_path()
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


def test_embedded_model_greedy_equals_model_generate_on_text_prompts(embedded):
    model, tok = embedded
    prompts = ["The function", "A list is a mutable sequence and", "In Python,"]
    out = generate(model, tok, prompts, max_new_tokens=20, pad_token_id=tok.eos_token_id)
    enc = [tok(p)["input_ids"] for p in prompts]
    ids, mask = left_padded(enc, pad=tok.eos_token_id)
    ref = hf_generate(model, ids, mask, max_new_tokens=20, pad_token_id=tok.eos_token_id)
    assert torch.equal(out.sequences, ref)
    assert all(t.strip() for t in out.texts)


def test_embedded_model_streams_the_same_text_it_returns(embedded):
    model, tok = embedded
    result: list = []
    text = "".join(
        e.text
        for e in stream(model, tok, "A list is", chain="preset:llama.cpp", seed=3, max_new_tokens=40, result=result)
    )
    assert text == result[0].texts[0] and len(text) > 40


def test_without_a_mask_pad_tokens_are_padding_as_transformers_infers(model):
    ids = torch.tensor([[7, 7, 5, 17, 42], [11, 12, 13, 14, 15]])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = model.generate(input_ids=ids, max_new_tokens=5, do_sample=False, pad_token_id=7, eos_token_id=0)
    out = generate(model, input_ids=ids, max_new_tokens=5, pad_token_id=7, eos_token_id=0)
    assert torch.equal(out.sequences, ref)


def test_generation_config_settings_no_chain_applies_are_named(model):
    from transformers import GenerationConfig

    with pytest.warns(GenerationWarning, match=r"encoder_repetition_penalty=1.3.*no samplechain sampler carries"):
        samplechain.generation.chain_from_generation_config(GenerationConfig(encoder_repetition_penalty=1.3))
    saved = model.generation_config
    model.generation_config = GenerationConfig(do_sample=True, top_k=5)
    try:
        with pytest.warns(GenerationWarning, match=r"do_sample=True.*the chain given replaces it"):
            generate(
                model,
                input_ids=torch.tensor([[1, 2]]),
                chain={"samplers": [{"use": "greedy"}]},
                max_new_tokens=2,
                pad_token_id=0,
            )
    finally:
        model.generation_config = saved


@pytest.mark.parametrize(
    "settings, limit, rows, forced",
    [
        ({"forced_eos_token_id": 77}, {"max_new_tokens": 5}, [[5, 17, 42], [11, 12, 13]], True),
        ({"forced_eos_token_id": [77, 78]}, {"max_new_tokens": 6}, [[5, 17, 42, 9], [11]], True),
        ({"forced_eos_token_id": 77}, {"max_length": 9}, [[5, 17, 42, 9], [11, 12]], True),
        ({"forced_bos_token_id": 66}, {"max_new_tokens": 4}, [[5, 17, 42], [11]], False),
        ({"forced_bos_token_id": 66}, {"max_new_tokens": 4}, [[5], [11]], True),
    ],
    ids=[
        "forced-eos",
        "forced-eos-padded",
        "forced-eos-max-length",
        "forced-bos-longer-prompt",
        "forced-bos-one-token",
    ],
)
def test_forced_tokens_of_a_generation_config_follow_the_generation_as_transformers(
    model, settings, limit, rows, forced
):
    """transformers forces a config's forced_eos_token_id at the last token the generation's length limit allows
    (its max_length is set from max_new_tokens), and forced_bos_token_id only where the input is one token."""
    from transformers import GenerationConfig

    cfg = GenerationConfig(eos_token_id=2, **settings)
    ids, mask = left_padded(rows)
    ref = hf_generate(model, ids, mask, generation_config=cfg, pad_token_id=0, **limit)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GenerationWarning)
        out = generate(model, input_ids=ids, attention_mask=mask, generation_config=cfg, pad_token_id=0, **limit)
    assert torch.equal(out.sequences, ref)
    token = settings.get("forced_eos_token_id", settings.get("forced_bos_token_id"))
    assert bool(torch.isin(out.sequences[:, ids.shape[1] :], torch.tensor(token)).any(dim=1).all()) is forced


def test_transformers_decoding_keywords_are_taken_as_model_generate_takes_them(model):
    """generate(..., repetition_penalty=1.3, min_new_tokens=4, ...) sets them on a copy of the model's generation
    config, whose chain runs, as model.generate does: the same tokens and scores greedy, the same processed scores
    of the first step sampling; the model's own config is left as it was."""
    ids, mask = left_padded([[5, 17, 42, 9, 5, 17], [11, 12, 13, 11, 12, 13]])
    greedy = dict(repetition_penalty=1.3, no_repeat_ngram_size=2, min_new_tokens=4, suppress_tokens=[7, 8])
    before = model.generation_config.to_dict()
    ref = hf_generate(model, ids, mask, max_new_tokens=8, return_dict_in_generate=True, output_scores=True, **greedy)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GenerationWarning)
        out = generate(model, input_ids=ids, attention_mask=mask, max_new_tokens=8, output_scores=True, **greedy)
        sampled = dict(do_sample=True, temperature=0.7, top_k=20, top_p=0.9, use_cache=True)
        first = generate(model, input_ids=ids, attention_mask=mask, max_new_tokens=1, output_scores=True, **sampled)
    assert torch.equal(out.sequences, ref.sequences)
    for a, b in zip(out.scores, ref.scores, strict=True):
        torch.testing.assert_close(torch.softmax(a, -1), torch.softmax(b, -1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=1, return_dict_in_generate=True, output_scores=True,
            **sampled,
        )  # fmt: skip
    assert torch.equal(torch.isfinite(first.scores[0]), torch.isfinite(theirs.scores[0]))
    torch.testing.assert_close(torch.softmax(first.scores[0], -1), torch.softmax(theirs.scores[0], -1))
    assert model.generation_config.to_dict() == before


def test_a_bad_decoding_keyword_is_one_config_error_naming_it(model):
    with pytest.raises(ConfigError, match=r"the generation config's chain: samplers\[0\]\.repeat = -1\.0: must be in"):
        generate(model, input_ids=torch.tensor([[5, 17]]), max_new_tokens=2, repetition_penalty=-1.0)
    with pytest.raises(
        ConfigError, match=r"temprature=0\.7\): not an argument of generate\(\); did you mean temperature="
    ):
        generate(model, input_ids=torch.tensor([[5, 17]]), max_new_tokens=2, temprature=0.7)
    with pytest.raises(ConfigError, match=r"output_attentions=True\): a GenerationConfig field that generate\(\) does"):
        generate(model, input_ids=torch.tensor([[5, 17]]), max_new_tokens=2, output_attentions=True)


def test_a_generation_config_maps_to_transformers_processors_in_their_order(model):
    """Every mapped GenerationConfig setting at once: the chain's processed scores equal the LogitsProcessorList that
    model.generate builds for the same config (probabilities within 1e-5), step after step of a real history."""
    from transformers import GenerationConfig

    cfg = GenerationConfig(
        do_sample=True,
        temperature=0.9,
        top_k=40,
        top_p=0.95,
        min_p=0.02,
        typical_p=0.97,
        epsilon_cutoff=1e-4,
        eta_cutoff=1e-4,
        repetition_penalty=1.3,
        no_repeat_ngram_size=3,
        bad_words_ids=[[5], [7, 8]],
        sequence_bias={(3,): 1.5, (4, 9): -2.0},
        suppress_tokens=[11, 12],
        exponential_decay_length_penalty=(2, 1.1),
        min_new_tokens=3,
        eos_token_id=2,
        renormalize_logits=True,
    )
    chain = samplechain.generation.chain_from_generation_config(cfg)
    names = [s.name for s in chain.samplers]
    assert names == [
        "sequence_bias",
        "penalties",
        "no_repeat_ngram",
        "bad_words",
        "min_new_tokens",
        "length_decay",
        "suppress_tokens",
        "temperature",
        "top_k",
        "top_p",
        "min_p",
        "typical",
        "epsilon",
        "eta",
        "renormalize",
        "dist",
    ]
    prompt = torch.tensor([[1, 4, 3, 6, 5, 6]])
    ids = prompt.clone()
    model._prepare_special_tokens(cfg, kwargs_has_attention_mask=False, device="cpu")
    for step in range(5):
        processors = model._get_logits_processor(
            generation_config=cfg,
            input_ids_seq_length=prompt.shape[1],
            encoder_input_ids=prompt,
            prefix_allowed_tokens_fn=None,
            logits_processor=None,
            device="cpu",
        )
        logits = model(ids).logits[:, -1, :].detach()
        ref = processors(ids, logits.clone())
        ours = chain.process(logits.clone(), history=ids, prompt_lengths=torch.tensor([prompt.shape[1]]))
        assert torch.equal(torch.isfinite(ours), torch.isfinite(ref)), step
        assert torch.allclose(torch.softmax(ours, -1), torch.softmax(ref, -1), atol=1e-5), step
        ids = torch.cat([ids, ref.argmax(-1, keepdim=True)], dim=-1)


@pytest.mark.parametrize("architecture", ["gpt2", "llama"])
def test_batch_invariant_passes_give_a_prompt_the_same_outputs_alone_and_in_any_batch(architecture, monkeypatch):
    """TransformersRunner.batch_invariant: a prompt's tokens, logprobs and scores, seeded sampling, are the same bit for
    bit alone and in batches of other prompts of other lengths (left padding), in any order; a GPT-2 (Conv1D layers,
    one key/value head per query head) and a Llama (linear layers, shared key/value heads)."""
    from samplechain.generation.model import TransformersRunner
    from samplechain.tools.tiny_models import tiny_llama

    transformers = pytest.importorskip("transformers")
    path = samplechain.models.tiny_model_path()
    tok = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
    if architecture == "gpt2":
        model = transformers.AutoModelForCausalLM.from_pretrained(path, local_files_only=True).eval()
    else:
        model = tiny_llama(vocab_size=len(tok))
    monkeypatch.setattr(TransformersRunner, "batch_invariant", True)
    prompts = ["In Python,", "The list is: apple, pear, plum. Again: apple,", "A", "def add(a, b):\n    return"]
    kwargs = {"chain": "preset:llama.cpp", "seed": 11, "max_new_tokens": 12, "output_scores": True, "pad_token_id": 0}
    alone = generate(model, tok, prompts[0], **kwargs)
    for batch in (prompts, prompts[::-1], prompts[1:2] + prompts[:1]):
        out = generate(model, tok, batch, params=[{"seed": 11}] * len(batch), **kwargs)
        b = batch.index(prompts[0])
        n = int(alone.num_generated[0])
        assert int(out.num_generated[b]) == n
        new = out.sequences[b, -len(out.scores) :][:n]
        assert torch.equal(new, alone.sequences[0, -len(alone.scores) :][:n])
        assert out.texts[b] == alone.texts[0]
        assert torch.equal(out.logprobs[b, :n], alone.logprobs[0, :n])
        assert all(torch.equal(out.scores[t][b], alone.scores[t][0]) for t in range(n))
