"""early_exit: the generation's own model cut after its first layers drafts, with the model's weights, on the
generation's own cache (passes taken back) or a cache of its own; the tokens are those of generation without a
drafter, coupled noise keeps more drafts than independent noise, and a model it cannot cut is one error."""

from __future__ import annotations

import contextlib

import attrs
import pytest
import torch

from samplechain import Chain, ConfigError, get_host
from samplechain.drafters import DraftContext
from samplechain.engine.config import parse_params
from samplechain.errors import GenerationWarning
from samplechain.generation import TransformersRunner, generate
from samplechain.models import tiny_model_path
from samplechain_draft_model_base import RowCache
from samplechain_early_exit import EarlyExit, EarlyExitParams

transformers = pytest.importorskip("transformers")

PROMPTS = ["In Python, a list is", "The module provides", "Return the"]
SAMPLING = {
    "samplers": [
        {"use": "penalties", "repeat": 1.2, "last_n": 32},
        {"use": "top_k", "k": 50},
        {"use": "temperature", "t": 0.9},
        {"use": "min_p", "p": 0.02},
        {"use": "dist"},
    ]
}
GREEDY = {"samplers": [{"use": "greedy"}]}
PLAIN = {"samplers": [{"use": "dist"}]}


@pytest.fixture(scope="module")
def tiny():
    path = tiny_model_path()
    model = transformers.AutoModelForCausalLM.from_pretrained(path, local_files_only=True).eval()
    return model, transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)


@pytest.fixture(scope="module")
def tiny_llama(tiny):
    """A randomly initialised Llama of the tiny model's vocabulary (its layers are `model.layers`)."""
    from samplechain.tools.tiny_models import tiny_llama

    return tiny_llama(), tiny[1]


def run(model, tok, prompts, **kwargs):
    """generate(); a drafter's draft lengths at a fixed cost, so that they do not follow the machine's timing."""
    draft = kwargs.get("draft")
    if draft is not None:
        kwargs["draft"] = {"cost": 0.1, **(draft if isinstance(draft, dict) else {"use": draft})}
    return generate(model, tok, prompts, pad_token_id=0, **kwargs)


def rate(out) -> float:
    return int(out.kept.sum()) / max(1, int(out.drafted.sum()))


@pytest.mark.parametrize(
    ("chain", "batch", "layers"), [(SAMPLING, 3, 3), (GREEDY, 1, 2)], ids=["sampling-B3", "greedy-B1"]
)
def test_the_tokens_are_those_of_generation_without_a_drafter(tiny, chain, batch, layers):
    model, tok = tiny
    kwargs = {"chain": chain, "seed": 4, "max_new_tokens": 16}
    reference = run(model, tok, PROMPTS[:batch], **kwargs)
    ours = run(model, tok, PROMPTS[:batch], draft={"use": "early_exit", "layers": layers}, **kwargs)
    assert ours.sequences.tolist() == reference.sequences.tolist()
    assert ours.finish_reasons == reference.finish_reasons
    assert int(ours.drafted.sum()) > 0 and int(ours.kept.sum()) > 0
    assert len(model.transformer.h) == 4, "the model is whole again"


def test_a_llama_drafts_with_its_first_layers(tiny_llama):
    model, tok = tiny_llama
    kwargs = {"chain": SAMPLING, "seed": 4, "max_new_tokens": 12}
    reference = run(model, tok, PROMPTS[:2], **kwargs)
    ours = run(model, tok, PROMPTS[:2], draft={"use": "early_exit", "layers": 2}, **kwargs)
    assert ours.sequences.tolist() == reference.sequences.tolist()
    assert int(ours.drafted.sum()) > 0
    assert len(model.model.layers) == 3


class Watched:
    """TransformersRunner.lookahead wrapped: counts the blocks and checks that each leaves the runner as it found it
    (the cache's very tensors, the tokens, the mask and positions)."""

    def __init__(self, monkeypatch):
        self.blocks = 0
        original = TransformersRunner.lookahead

        def lookahead(runner):
            ahead = original(runner)
            return None if ahead is None else self._watched(runner, ahead)

        monkeypatch.setattr(TransformersRunner, "lookahead", lookahead)

    @staticmethod
    def _state(runner):
        cache = runner.kwargs[runner.cache_key]
        tensors = [(id(layer.keys), id(layer.values)) for layer in cache.layers]
        masks = {k: v.clone() for k, v in runner.kwargs.items() if isinstance(v, torch.Tensor)}
        return tensors, runner.input_ids.clone(), None if runner.live is None else runner.live.clone(), masks

    @contextlib.contextmanager
    def _watched(self, runner, ahead):
        before = self._state(runner)
        with ahead:
            yield
        after = self._state(runner)
        self.blocks += 1
        assert before[0] == after[0], "the cache holds the tensors it held"
        for a, b in zip(before[1:3], after[1:3]):
            assert (a is None and b is None) or torch.equal(a, b)
        assert before[3].keys() == after[3].keys() and all(torch.equal(before[3][k], after[3][k]) for k in before[3])


@pytest.mark.parametrize(("chain", "batch"), [(SAMPLING, 3), (GREEDY, 1)], ids=["sampling-B3", "greedy-B1"])
def test_drafts_run_on_the_generations_cache_and_are_taken_back(tiny, chain, batch, monkeypatch):
    """No cache of the drafter's own: each proposal runs its tokens on the generation's cache inside lookahead(),
    which leaves the runner as it was; the tokens are those of generation without a drafter."""
    model, tok = tiny
    kwargs = {"chain": chain, "seed": 4, "max_new_tokens": 16}
    reference = run(model, tok, PROMPTS[:batch], **kwargs)
    watched = Watched(monkeypatch)
    drafter = EarlyExit(EarlyExitParams(layers=2))
    ours = run(model, tok, PROMPTS[:batch], draft={"use": drafter, "adaptive": False}, **kwargs)
    assert ours.sequences.tolist() == reference.sequences.tolist()
    assert int(ours.kept.sum()) > 0 and watched.blocks > 0
    assert drafter._batch is None and not any(drafter._rows), "the drafter opened no cache of its own"


def test_a_draft_failing_midway_is_taken_back_and_the_tokens_unchanged(tiny):
    """A drafted token's pass that raises: the generation's cache is as it was before the proposal, the row goes on
    without drafts (a warning names the drafter), the tokens are those of generation without a drafter."""

    class Failing(EarlyExit):
        fed = 0

        def _feed(self, rows, tokens):
            out = super()._feed(rows, tokens)
            self.fed += 1
            if self.fed == 6:  # in the second proposal
                raise RuntimeError("broken in its second draft")
            return out

    model, tok = tiny
    kwargs = {"chain": SAMPLING, "seed": 4, "max_new_tokens": 16}
    reference = run(model, tok, PROMPTS[:1], **kwargs)
    with pytest.warns(GenerationWarning, match="broken in its second draft"):
        ours = run(
            model, tok, PROMPTS[:1], draft={"use": Failing(EarlyExitParams(layers=2)), "adaptive": False}, **kwargs
        )
    assert ours.sequences.tolist() == reference.sequences.tolist()
    assert int(ours.drafted.sum()) > 0


@torch.no_grad()
def test_a_draft_on_the_generations_cache_gives_the_first_layers_logits(tiny):
    """The first pass of a proposal on the generation's cache: the logits after the row's tokens of the first two
    layers, the final norm and the head, as the model computes them over the whole row."""
    model, tok = tiny
    drafter = EarlyExit(EarlyExit.Params(layers=2))
    tokens = torch.tensor(tok(PROMPTS[0])["input_ids"])
    runner = TransformersRunner(model, tokens[None, :-1], None)
    runner.prefill()
    context = context_for(model, tok)
    drafter.start(1, attrs.evolve(context, generation_runner=lambda: runner))
    with runner.lookahead(), drafter.running():
        drafter._shared = runner
        (logits,) = drafter._logits_after([0], [tokens])
    assert drafter._sharing
    hidden = model(tokens[None], output_hidden_states=True).hidden_states[2][0, -1]
    torch.testing.assert_close(logits, model.lm_head(model.transformer.ln_f(hidden)), atol=1e-4, rtol=1e-4)
    assert torch.equal(runner.holds(0), tokens[:-1]), "the pass was taken back"


@pytest.mark.slow
def test_coupled_noise_keeps_more_drafts_than_independent_noise(tiny):
    model, tok = tiny
    kwargs = {"chain": PLAIN, "seed": 2, "max_new_tokens": 40, "ignore_eos": True}
    coupled = run(model, tok, PROMPTS[:1], draft={"use": "early_exit", "layers": 3}, **kwargs)
    independent = run(
        model, tok, PROMPTS[:1], draft={"use": "early_exit", "layers": 3, "noise": "independent"}, **kwargs
    )
    assert coupled.sequences.tolist() == independent.sequences.tolist()
    assert rate(coupled) > 1.5 * rate(independent), (
        coupled.kept,
        coupled.drafted,
        independent.kept,
        independent.drafted,
    )


def test_p_min_ends_drafts_at_unsure_tokens_and_keeps_the_tokens(tiny):
    model, tok = tiny
    kwargs = {"chain": PLAIN, "seed": 2, "max_new_tokens": 40, "ignore_eos": True}
    draft = {"use": "early_exit", "layers": 3, "noise": "independent", "num_tokens": 6, "adaptive": False}
    every = run(model, tok, PROMPTS[:2], draft=draft, **kwargs)
    sure = run(model, tok, PROMPTS[:2], draft={**draft, "p_min": 0.5}, **kwargs)
    assert sure.sequences.tolist() == every.sequences.tolist()
    assert int(sure.drafted.sum()) < int(every.drafted.sum())


def context_for(model, tok, chain=PLAIN):
    chain = Chain.load(chain)
    chain.prepare(tokenizer=tok, model_config=model.config)
    store = chain.new_store()
    store.add("r", {"seed": 1})
    from samplechain.generation import runner_for
    from samplechain.models import load_model

    return DraftContext(
        model, tok, chain, store, ("r",), model.config.vocab_size, torch.device("cpu"), runner_for, load_model
    )


@torch.no_grad()
@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_the_draft_runs_the_first_layers_then_the_final_norm_and_head(kind, tiny, tiny_llama):
    model, tok = tiny if kind == "gpt2" else tiny_llama
    base, norm = (model.transformer, model.transformer.ln_f) if kind == "gpt2" else (model.model, model.model.norm)
    drafter = EarlyExit(EarlyExit.Params(layers=2))
    drafter.start(1, context_for(model, tok))
    tokens = torch.tensor(tok(PROMPTS[0])["input_ids"])
    with drafter.running():
        logits = RowCache(TransformersRunner, model).logits_after(tokens)
    hidden = model(tokens[None], output_hidden_states=True).hidden_states[2][0, -1]  # after the second layer
    torch.testing.assert_close(logits, model.lm_head(norm(hidden)), atol=1e-4, rtol=1e-4)
    assert len(getattr(base, "h" if kind == "gpt2" else "layers")) == (4 if kind == "gpt2" else 3)


# ----------------------------------------------------------------- refusals
def test_a_model_without_a_layer_list_is_refused_with_the_alternatives(tiny):
    config = transformers.OPTConfig(
        vocab_size=4096,
        hidden_size=16,
        num_hidden_layers=2,
        ffn_dim=32,
        num_attention_heads=2,
        word_embed_proj_dim=16,
        max_position_embeddings=64,
    )
    model = transformers.OPTForCausalLM(config).eval()
    with pytest.raises(ConfigError, match=r"OPTForCausalLM has no decoder layer list.*prompt_lookup.*draft_model"):
        run(
            model, tiny[1], PROMPTS[:1], chain=PLAIN, seed=1, max_new_tokens=4, draft={"use": "early_exit", "layers": 1}
        )


def test_as_many_layers_as_the_model_has_is_refused(tiny):
    model, tok = tiny
    with pytest.raises(ConfigError, match=r"layers = 4: GPT2LMHeadModel has 4 decoder layers; give 1 to 3"):
        run(model, tok, PROMPTS[:1], chain=PLAIN, seed=1, max_new_tokens=4, draft={"use": "early_exit", "layers": 4})


def drafter(**params):
    cls = get_host().get("drafter", "early_exit")
    return cls(parse_params(cls, params, source="draft", path="draft[early_exit]"))


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({}, r"draft\[early_exit\]\.layers = None: give how many of the model's decoder layers draft"),
        ({"layers": 0}, r"\.layers = 0: must be in \[1, inf\)"),
        ({"layers": 2, "num_tokens": 0}, r"\.num_tokens = 0: must be in \[1, inf\)"),
        ({"layers": 2, "noise": "none"}, r"\.noise = 'none': must be one of 'coupled', 'independent', 'greedy'"),
        ({"layers": 2, "p_min": -0.1}, r"\.p_min = -0\.1: must be in \[0, 1\] \(0 disables\)"),
    ],
)
def test_bad_parameters_name_the_culprit(params, message):
    with pytest.raises(ConfigError, match=message):
        drafter(**params)


@pytest.mark.llama_cpp
def test_the_llama_cpp_runners_model_is_refused(open_gguf):
    model, tok = open_gguf(n_ctx=256)
    with pytest.raises(ConfigError, match=r"llama_cpp runner's model cannot run part of itself.*prompt_lookup"):
        generate(model, tok, "Hi", chain=PLAIN, max_new_tokens=2, draft={"use": "early_exit", "layers": 4})
