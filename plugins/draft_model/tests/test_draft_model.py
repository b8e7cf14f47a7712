"""draft_model: the tokens are those of generation without a drafter; coupled noise keeps (almost) every draft of
the same model, independent noise far fewer; the drafts' probabilities are the chain's processed distribution; a
draft model of another vocabulary is one error."""

from __future__ import annotations

import pytest
import torch

from samplechain import Chain, ConfigError, get_host
from samplechain.drafters import DraftContext
from samplechain.engine.config import parse_params
from samplechain.generation import TransformersRunner, generate
from samplechain.models import tiny_model_path
from samplechain_draft_model import DraftModel
from samplechain_draft_model_base import BatchCache, RowCache

transformers = pytest.importorskip("transformers")

PROMPTS = ["In Python, a list is", "The module provides", "Return the"]
SAMPLING = {
    "samplers": [
        {"use": "penalties", "repeat": 1.2, "frequency": 0.1, "last_n": 32},
        {"use": "top_k", "k": 50},
        {"use": "temperature", "t": 0.9},
        {"use": "min_p", "p": 0.02},
        {"use": "dist"},
    ]
}
GREEDY = {"samplers": [{"use": "penalties", "repeat": 1.3, "last_n": 16}, {"use": "greedy"}]}
PLAIN = {"samplers": [{"use": "dist"}]}  # temperature 1: the model's own distribution


@pytest.fixture(scope="module")
def tiny(tiny_lm):
    return tiny_lm


def run(model, tok, prompts, **kwargs):
    """generate(); a drafter's draft lengths at a fixed cost, so that they do not follow the machine's timing."""
    draft = kwargs.get("draft")
    if draft is not None:
        kwargs["draft"] = {"cost": 0.1, **(draft if isinstance(draft, dict) else {"use": draft})}
    return generate(model, tok, prompts, pad_token_id=0, **kwargs)


def rate(out) -> float:
    return int(out.kept.sum()) / max(1, int(out.drafted.sum()))


@pytest.mark.parametrize(
    ("chain", "batch", "by_path"),
    [(SAMPLING, 1, False), (SAMPLING, 3, True), (GREEDY, 1, True), (GREEDY, 3, False)],
    ids=["sampling-B1", "sampling-B3-path", "greedy-B1-path", "greedy-B3"],
)
def test_the_tokens_are_those_of_generation_without_a_drafter(tiny, chain, batch, by_path):
    model, tok = tiny
    kwargs = {"chain": chain, "seed": 11, "max_new_tokens": 16}
    draft = {"use": "draft_model", "model": str(tiny_model_path())} if by_path else DraftModel.from_model(model, tok)
    reference = run(model, tok, PROMPTS[:batch], **kwargs)
    ours = run(model, tok, PROMPTS[:batch], draft=draft, **kwargs)
    assert ours.sequences.tolist() == reference.sequences.tolist()
    assert ours.finish_reasons == reference.finish_reasons
    assert int(ours.drafted.sum()) > 0
    assert (ours.model_calls < ours.num_generated).all(), "the same model as drafter saves model calls"


def test_a_mixed_batch_drafts_each_row_through_its_own_chain(tiny):
    model, tok = tiny
    kwargs = {"chain": [SAMPLING, GREEDY], "seed": 5, "max_new_tokens": 12}
    reference = run(model, tok, PROMPTS[:2], **kwargs)
    ours = run(model, tok, PROMPTS[:2], draft=DraftModel.from_model(model, tok), **kwargs)
    assert ours.sequences.tolist() == reference.sequences.tolist()
    assert rate(ours) > 0.9


@pytest.mark.slow
def test_coupled_noise_keeps_almost_every_draft_and_independent_noise_far_fewer(tiny):
    """The same model drafting: with the request's own noise its draw is the verifying draw (up to float32
    summation order), with another seed stream a draw from the same distribution, which at temperature 1 on a
    small model agrees far less often."""
    model, tok = tiny
    kwargs = {"chain": PLAIN, "seed": 2, "max_new_tokens": 40, "ignore_eos": True}
    coupled = run(model, tok, PROMPTS[:1], draft=DraftModel.from_model(model, tok), **kwargs)
    independent = run(model, tok, PROMPTS[:1], draft=DraftModel.from_model(model, tok, noise="independent"), **kwargs)
    assert coupled.sequences.tolist() == independent.sequences.tolist()
    assert rate(coupled) > 0.95, (coupled.kept, coupled.drafted)
    assert rate(independent) < 0.5 * rate(coupled), (independent.kept, independent.drafted)


# ----------------------------------------------------------------- the drafter's own methods
def context_for(model, tok, chain, seed=5, position=0):
    chain = Chain.load(chain)
    chain.prepare(tokenizer=tok, model_config=model.config)
    store = chain.new_store()
    store.add("r", {"seed": seed})
    store.set_position("r", position)
    from samplechain.generation import runner_for
    from samplechain.models import load_model

    return DraftContext(
        model, tok, chain, store, ("r",), model.config.vocab_size, torch.device("cpu"), runner_for, load_model
    )


@torch.no_grad()
def test_the_draft_is_the_chains_draw_and_its_probabilities_the_processed_distribution(tiny):
    model, tok = tiny
    context = context_for(model, tok, SAMPLING)
    prompt = torch.tensor(tok(PROMPTS[0])["input_ids"])
    drafter = DraftModel.from_model(model, tok, num_tokens=6)
    drafter.start(1, context)
    draft = drafter.propose_rows([0], [prompt], [4])[0]
    assert len(draft.tokens) == 4, "the limit caps the draft"
    assert context.store.snapshot(["r"])["r"]["position"] == 0, "the generation's store is never changed"
    torch.testing.assert_close(draft.probs.sum(dim=-1), torch.ones(4))
    chain, store = context.chain, context.chain.new_store()
    store.add("r", {"seed": 5})
    for j in range(4):
        seq = torch.cat([prompt, draft.tokens[:j]])[None]
        logits = model(seq).logits[:, -1].float()
        store.set_position("r", j)  # the request's position after j drafted tokens
        processed = chain.process(logits, store, ["r"], history=seq)
        torch.testing.assert_close(draft.probs[j], torch.softmax(processed[0], dim=-1), atol=1e-5, rtol=1e-4)
        assert draft.probs[j, draft.tokens[j]] > 0
        drawn = chain.sample(logits, store, ["r"], history=seq, accept=False).token_ids
        assert int(drawn) == int(draft.tokens[j]), "coupled: the drafter draws the verifying draw"


@torch.no_grad()
@pytest.mark.parametrize("p_min", [0.05, 0.3, 0.7])
def test_a_draft_ends_after_its_first_token_below_p_min(tiny, p_min):
    """p_min (transformers' assistant_confidence_threshold, llama.cpp's --draft-p-min): every drafted token but the
    last has at least p_min under the drafting chain; a draft shorter than asked ends with one below it."""
    model, tok = tiny
    ended = 0
    for i, prompt in enumerate(PROMPTS):
        context = context_for(model, tok, SAMPLING)
        drafter = DraftModel.from_model(model, tok, num_tokens=8, p_min=p_min)
        drafter.start(1, context)
        draft = drafter.propose_rows([0], [torch.tensor(tok(prompt)["input_ids"])], [8])[0]
        chances = draft.probs[torch.arange(len(draft.tokens)), draft.tokens].tolist()
        assert all(c >= p_min for c in chances[:-1]), (i, chances)
        if len(draft.tokens) < 8:
            assert chances[-1] < p_min, (i, chances)
            ended += 1
    assert ended, "some draft ended early"


def test_p_min_drafts_fewer_tokens_and_keeps_the_tokens(tiny):
    model, tok = tiny
    kwargs = {"chain": PLAIN, "seed": 3, "max_new_tokens": 40}
    reference = run(model, tok, PROMPTS[:2], **kwargs)
    counts = []
    for p_min in (0.0, 0.5):
        draft = {"use": "draft_model", "model": str(tiny_model_path()), "num_tokens": 6, "p_min": p_min}
        out = run(model, tok, PROMPTS[:2], draft={**draft, "noise": "independent", "adaptive": False}, **kwargs)
        assert out.sequences.tolist() == reference.sequences.tolist()
        counts.append(int(out.drafted.sum()))
    assert counts[1] < counts[0], counts


@torch.no_grad()
def test_greedy_noise_drafts_the_processed_argmax_without_probabilities(tiny):
    model, tok = tiny
    context = context_for(model, tok, SAMPLING, position=3)
    prompt = torch.tensor(tok(PROMPTS[1])["input_ids"])
    drafter = DraftModel.from_model(model, tok, noise="greedy")
    drafter.start(1, context)
    draft = drafter.propose(0, prompt, 3)
    assert draft.probs is None
    store = context.chain.new_store()
    store.add("r", {"seed": 5})
    for j in range(3):
        seq = torch.cat([prompt, draft.tokens[:j]])[None]
        store.set_position("r", 3 + j)
        processed = context.chain.process(model(seq).logits[:, -1].float(), store, ["r"], history=seq)
        assert int(processed.argmax()) == int(draft.tokens[j])


@torch.no_grad()
def test_a_rows_cache_follows_its_tokens_cut_back_and_changed(tiny):
    model, _ = tiny
    seq = torch.randint(1, model.config.vocab_size, (40,), generator=torch.Generator().manual_seed(0))
    other = seq.clone()
    other[15:] = (other[15:] + 7) % model.config.vocab_size
    cache = RowCache(TransformersRunner, model)
    for tokens in (seq[:20], seq[:12], seq[:12], other[:18], seq[:30], seq[:1], seq[:3]):
        expected = model(tokens[None]).logits[0, -1]
        torch.testing.assert_close(cache.logits_after(tokens), expected, atol=1e-4, rtol=1e-4)
        assert cache.held.tolist() == tokens.tolist()
    expected = model(torch.cat([seq[:3], seq[5:6]])[None]).logits[0, -1]
    torch.testing.assert_close(cache.feed(int(seq[5])), expected, atol=1e-4, rtol=1e-4)


@torch.no_grad()
def test_a_batchs_cache_rows_follow_their_own_tokens_in_one_pass(tiny):
    """Rows of different lengths cut back, changed, fed and left alone, each row's logits those of its tokens
    alone; every call is at most one extend_rows."""
    model, _ = tiny
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randint(1, model.config.vocab_size, (40,), generator=g) for _ in range(3)]
    cache = BatchCache.open(TransformersRunner, model, [0, 1, 2], [seqs[0][:9], seqs[1][:14], seqs[2][:5]])
    assert cache is not None, "the transformers runner cuts rows on their own"
    passes = []
    handle = model.register_forward_hook(lambda *_: passes.append(1))
    try:
        calls = [
            ([0, 1, 2], [seqs[0][:12], seqs[1][:10], seqs[2][:5]]),  # grow, cut back, unchanged
            ([1], [seqs[1][:20]]),  # one row only
            ([0, 2], [torch.cat([seqs[0][:6], seqs[2][:4]]), seqs[2][:9]]),  # changed past 6, grown
            ([2, 0, 1], [seqs[2][:3], seqs[0][:2], seqs[1][:20]]),
        ]
        for rows, tokens in calls:
            before = len(passes)
            got = cache.logits_after(rows, tokens)
            assert len(passes) - before <= 1
            for row, t, logits in zip(rows, tokens, got):
                torch.testing.assert_close(logits, model(t[None]).logits[0, -1], atol=1e-4, rtol=1e-4)
                assert cache.held[cache.index[row]].tolist() == t.tolist()
        got = cache.feed([1, 0], [7, 8])
        torch.testing.assert_close(got[0], model(torch.cat([seqs[1][:20], torch.tensor([7])])[None]).logits[0, -1])
        torch.testing.assert_close(got[1], model(torch.cat([seqs[0][:2], torch.tensor([8])])[None]).logits[0, -1])
    finally:
        handle.remove()


def test_the_rows_of_a_batch_draft_in_one_pass_per_position(tiny, monkeypatch):
    """Four rows drafting together take a third of the model passes of rows drafting one by one, with the same
    drafts and the tokens of generation without a drafter."""
    model, tok = tiny
    prompts = [*PROMPTS, "A dict maps"]
    kwargs = {"chain": PLAIN, "seed": 3, "max_new_tokens": 30}
    passes = []
    handle = model.register_forward_hook(lambda *_: passes.append(1))
    try:
        together = run(model, tok, prompts, draft=DraftModel.from_model(model, tok), **kwargs)
        batched = len(passes)
        monkeypatch.setattr(BatchCache, "open", classmethod(lambda cls, *args: None))
        passes.clear()
        one_by_one = run(model, tok, prompts, draft=DraftModel.from_model(model, tok), **kwargs)
        per_row = len(passes)
    finally:
        handle.remove()
    reference = run(model, tok, prompts, **kwargs)
    assert together.sequences.tolist() == reference.sequences.tolist() == one_by_one.sequences.tolist()
    assert together.drafted.tolist() == one_by_one.drafted.tolist()
    assert together.kept.tolist() == one_by_one.kept.tolist()
    assert int(together.drafted.sum()) > 0
    assert batched * 2 < per_row, (batched, per_row)


# ----------------------------------------------------------------- refusals
def test_drafts_stay_within_the_draft_models_positions_row_by_row(tiny):
    """A draft model with 40 positions: the row whose sequence passes them stops drafting there, the other row
    drafts on, and no row's drafter is switched off (a row past them had failed every row's shared call)."""
    import copy
    import warnings

    from samplechain.errors import GenerationWarning

    model, tok = tiny
    small = copy.deepcopy(model)
    small.transformer.wpe.weight.data = small.transformer.wpe.weight.data[:40].clone()
    small.transformer.wpe.num_embeddings = small.config.n_positions = 40
    prompts = ["The module provides a set of functions that work on lists, dicts and sets; each of them returns", "Hi"]
    kwargs = {"chain": {"samplers": [{"use": "dist"}]}, "seed": 3, "max_new_tokens": 24, "ignore_eos": True}
    reference = run(model, tok, prompts, **kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("error", GenerationWarning)
        ours = run(model, tok, prompts, draft={"use": DraftModel.from_model(small, tok), "adaptive": False}, **kwargs)
    assert ours.sequences.tolist() == reference.sequences.tolist()
    assert 0 < int(ours.drafted[0]) < int(ours.drafted[1])


def test_a_failed_pass_of_the_batchs_cache_leaves_each_row_a_cache_of_its_own(tiny, monkeypatch):
    """A pass of the batch's drafting cache that fails may leave its rows cut or fed in part: the rows go on with
    caches of their own and draft the same tokens, instead of every later call failing on the stale cache."""
    model, tok = tiny
    kwargs = {"chain": GREEDY, "max_new_tokens": 24, "ignore_eos": True}
    reference = run(
        model, tok, PROMPTS[:3], draft={"use": DraftModel.from_model(model, tok), "adaptive": False}, **kwargs
    )
    feed, calls = BatchCache.feed, []

    def failing_once(self, rows, tokens):
        calls.append(list(rows))
        if len(calls) == 2:
            self.held = [t[:1] for t in self.held]  # the damage a half-done pass can leave
            raise RuntimeError("a pass that failed")
        return feed(self, rows, tokens)

    monkeypatch.setattr(BatchCache, "feed", failing_once)
    ours = run(model, tok, PROMPTS[:3], draft={"use": DraftModel.from_model(model, tok), "adaptive": False}, **kwargs)
    assert len(calls) == 2, "after the failure no row uses the batch's cache"
    assert ours.sequences.tolist() == reference.sequences.tolist()
    assert ours.drafted.tolist() == reference.drafted.tolist() and ours.kept.tolist() == reference.kept.tolist()


def test_rows_that_finish_leave_the_drafting_models_batch(tiny):
    """Rows 0-1 end after two tokens, row 2 runs on: the drafting model's passes after that run row 2 alone
    (`Drafter.finish`), where they ran every row of the first call to the end."""
    import copy

    model, tok = tiny
    small, shapes = copy.deepcopy(model), []
    small.transformer.wte.register_forward_pre_hook(lambda module, args: shapes.append(tuple(args[0].shape)))
    limit = torch.tensor([2, 2, 40])
    kwargs = {"chain": PLAIN, "seed": 3, "max_new_tokens": 40, "ignore_eos": True}
    kwargs["stop"] = [lambda ctx: ctx.new_tokens.shape[1] >= limit]
    reference = run(model, tok, PROMPTS, **kwargs)
    ours = run(
        model, tok, PROMPTS, draft={"use": DraftModel.from_model(small, tok, num_tokens=4), "adaptive": False}, **kwargs
    )
    assert ours.sequences.tolist() == reference.sequences.tolist() and ours.num_generated.tolist() == [2, 2, 40]
    rows = [shape[0] for shape in shapes]
    assert rows[:4] == [3] * 4 and set(rows[4:]) == {1}, rows  # the prefill and the first draft's three passes


def test_another_vocabulary_is_one_error_naming_both_sizes(tiny):
    model, tok = tiny
    config = transformers.GPT2Config(vocab_size=300, n_embd=32, n_layer=1, n_head=2, n_positions=64)
    other = transformers.GPT2LMHeadModel(config).eval()
    with pytest.raises(ConfigError, match=r"draft model \(300 logit columns\).*\(4096 logit columns, a tokenizer of"):
        run(model, tok, PROMPTS[:1], chain=PLAIN, seed=1, max_new_tokens=4, draft=DraftModel.from_model(other))
    with pytest.raises(ConfigError, match=r"a tokenizer of 3 tokens\).*a tokenizer of 4096 tokens"):
        DraftModel.from_model(model, ["a", "b", "c"]).start(1, context_for(model, tok, PLAIN))


def test_a_folder_that_holds_no_model_is_one_error_naming_it(tiny, tmp_path):
    model, tok = tiny
    (tmp_path / "README").write_text("not a model")
    with pytest.raises(ConfigError, match=r"draft\[draft_model\]\.model = '.*': cannot be opened as a model"):
        run(
            model,
            tok,
            PROMPTS[:1],
            chain=PLAIN,
            seed=1,
            max_new_tokens=4,
            draft={"use": "draft_model", "model": str(tmp_path)},
        )


def drafter(**params):
    cls = get_host().get("drafter", "draft_model")
    return cls(parse_params(cls, params, source="draft", path="draft[draft_model]"))


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({}, r"draft\[draft_model\]\.model = None: give the draft model: a transformers model folder"),
        ({"model": "/no/such/model"}, r"\.model = '/no/such/model': no such folder or file"),
        ({"model": str(tiny_model_path()), "num_tokens": 0}, r"\.num_tokens = 0: must be in \[1, inf\)"),
        ({"model": str(tiny_model_path()), "noise": "shared"}, r"\.noise = 'shared': must be one of 'coupled'"),
        ({"model": str(tiny_model_path()), "p_min": 1.5}, r"\.p_min = 1\.5: must be in \[0, 1\] \(0 disables\)"),
    ],
)
def test_bad_parameters_name_the_culprit(params, message):
    with pytest.raises(ConfigError, match=message):
        drafter(**params)


def test_from_model_names_the_bad_parameter(tiny):
    model, tok = tiny
    with pytest.raises(ConfigError, match=r"DraftModel\.from_model: num_tokens = 0: must be in \[1, inf\)"):
        DraftModel.from_model(model, tok, num_tokens=0)


# ----------------------------------------------------------------- llama.cpp
@pytest.mark.llama_cpp
@pytest.mark.slow
def test_a_gguf_draft_model_drafts_on_llama_cpp(open_gguf):
    model, tok = open_gguf(n_ctx=512, flash_attn=True)
    path = model.path
    kwargs = {"chain": PLAIN, "seed": 3, "max_new_tokens": 12, "ignore_eos": True}
    prompts = ["def add(a, b):", "The three primary colours are"]  # two rows: one drafting pass for both
    reference = generate(model, tok, prompts, **kwargs)
    ours = generate(model, tok, prompts, draft={"use": "draft_model", "model": str(path), "cost": 0.1}, **kwargs)
    assert ours.sequences.tolist() == reference.sequences.tolist()
    assert rate(ours) > 0.9


@pytest.mark.llama_cpp
def test_the_drafting_models_runner_leaves_numerics_warnings_to_the_generations_model(open_gguf):
    """A GGUF draft model's logits only choose drafts, which the generation's model checks: its runner does not
    warn that several-token decodes could change the tokens (the warning named the draft model's file, as though
    the generation's model had been loaded wrongly)."""
    import warnings

    from samplechain.errors import GenerationWarning
    from samplechain_draft_model_base import drafting_runner
    from samplechain_llama_cpp import LlamaCppRunner

    model, tok = open_gguf(n_ctx=256, flash_attn=False)  # a several-token decode warns without flash attention
    ids = torch.tensor([tok("The three primary colours are")["input_ids"]])
    runner = drafting_runner(LlamaCppRunner, model, ids, None)
    runner.prefill()
    with warnings.catch_warnings():
        warnings.simplefilter("error", GenerationWarning)
        runner.extend(torch.tensor([[30, 31]]))
    runner = LlamaCppRunner(model, ids, None)
    runner.prefill()
    with pytest.warns(GenerationWarning, match="without flash attention"):
        runner.extend(torch.tensor([[30, 31]]))
