"""Speculative decoding (`draft=`, the `match` mode): the tokens equal generation without a drafter, token for token,
whatever the chain, the batch, the drafter and its draft lengths; the counts say what the drafter saved."""

from __future__ import annotations

import copy
import math
import random
import warnings
from collections.abc import Sequence
from typing import Any

import attrs
import pytest
import torch

from samplechain import Chain, ConfigError, UnknownPluginError
from samplechain.drafters import Drafter
from samplechain.errors import GenerationWarning
from samplechain.generation import Generation, generate, score, stream
from samplechain.models import tiny_model_path
from samplechain.tools.tiny_models import tiny_llama
from samplechain_prompt_lookup import OCCURRENCES

transformers = pytest.importorskip("transformers")

PROMPTS = [
    "def add(a, b):\n    return a + b\n\ndef add(a, b):",
    "The list is: apple, pear, plum. Again: apple,",
    "In Python,",
    "A list is a list is a",
]


@pytest.fixture(scope="module")
def tiny(tiny_lm):
    return tiny_lm


def run(model, tok, prompts, **kwargs):
    """The output and the Generation behind it (its prompt lengths)."""
    gen = Generation(model, tok, prompts, pad_token_id=0, **kwargs)
    for _ in gen.steps():
        pass
    return gen.output(), gen


class Scripted(Drafter):
    """Knows each row's reference tokens (prompt and continuation) and proposes them: `shortest` to `longest` of
    them (at most the limit), with chance `wrong_rate` one of them replaced by another token."""

    name = "scripted"

    def __init__(
        self,
        rows: Sequence[list[int]],
        vocab: int,
        *,
        seed=0,
        shortest=1,
        longest=6,
        wrong_rate=0.0,
        always_wrong=False,
    ):
        super().__init__()
        self.rows, self.vocab, self.rng = rows, vocab, random.Random(seed)
        self.shortest, self.longest, self.wrong_rate, self.always_wrong = shortest, longest, wrong_rate, always_wrong
        self.calls = 0

    def propose(self, row, tokens, limit):
        self.calls += 1
        full = self.rows[row]
        n = len(tokens)
        assert tokens.tolist() == full[:n], "the drafter sees the row's prompt and tokens so far"
        draft = full[n : n + min(limit, self.rng.randint(self.shortest, self.longest))]
        if self.always_wrong:
            return [(t + 1) % self.vocab for t in draft]
        if draft and self.rng.random() < self.wrong_rate:
            i = self.rng.randrange(len(draft))
            draft[i] = (draft[i] + 1 + self.rng.randrange(self.vocab - 1)) % self.vocab
        return draft


def reference_rows(out, gen) -> list[list[int]]:
    """Each row's prompt (without padding) and generated tokens."""
    width = gen.attention_mask.shape[1]
    return [
        out.sequences[b, width - int(gen.prompt_lengths[b]) : width + int(out.num_generated[b])].tolist()
        for b in range(out.sequences.shape[0])
    ]


def assert_same_tokens(ours, reference):
    assert ours.sequences.tolist() == reference.sequences.tolist()
    assert ours.num_generated.tolist() == reference.num_generated.tolist()
    assert ours.finish_reasons == reference.finish_reasons
    torch.testing.assert_close(ours.logprobs, reference.logprobs, atol=1e-4, rtol=1e-4)


# ----------------------------------------------------------------- random chains from the catalogue
TRANSFORMS = [
    {"use": "penalties", "repeat": 1.3, "frequency": 0.2, "presence": 0.1, "last_n": 32},
    {"use": "dry", "multiplier": 0.8, "base": 1.75, "allowed_length": 2},
    {"use": "no_repeat_ngram", "n": 3},
    {"use": "logit_bias", "bias": {"14": 2.0, "199": -3.0}},
    {"use": "temperature", "t": 0.8},
    {"use": "temperature", "t": 1.3},
    {"use": "temp_ext", "t": 1.1, "delta": 0.3},
]
HISTORY = 4  # TRANSFORMS[:HISTORY] read the history or bias the logits; the others scale them
FILTERS = [
    {"use": "top_k", "k": 40},
    {"use": "top_p", "p": 0.9},
    {"use": "min_p", "p": 0.05},
    {"use": "xtc", "probability": 0.5, "threshold": 0.1},
    {"use": "typical", "p": 0.9},
    {"use": "top_n_sigma", "n": 1.5},
    {"use": "top_h", "top_h": 0.6},
]
SELECTORS = [
    {"use": "dist"},
    {"use": "greedy"},
    {"use": "mirostat", "tau": 5.0},
    {"use": "mirostat_v2", "tau": 5.0},
    {"use": "adaptive_p", "target": 0.5},
]


def random_chain(rng: random.Random) -> dict:
    selector = rng.choice(SELECTORS)
    history, temperatures = TRANSFORMS[:HISTORY], TRANSFORMS[HISTORY:]
    transforms = rng.sample(history, rng.randint(0, 2)) + rng.sample(temperatures, rng.randint(0, 1))
    filters = rng.sample(FILTERS, rng.randint(0, 2)) if selector["use"] == "dist" else []
    if selector["use"] == "greedy":
        transforms = [t for t in transforms if t["use"] != "temperature"]
    return {"samplers": [*transforms, *filters, selector]}


@pytest.mark.parametrize("case", range(8))
def test_drafts_never_change_the_tokens_of_random_chains(tiny, case):
    """B = 1..8 (prompts drawn with repeats), each built-in drafter (draft_model and early_exit drafting with the
    model itself or its first layers) and a scripted one with wrong tokens at random places."""
    model, tok = tiny
    rng = random.Random(case)
    chain = random_chain(rng)
    prompts = rng.choices(PROMPTS, k=1 + case)
    kwargs = {"chain": chain, "max_new_tokens": 24, "seed": 100 + case}
    builtin = [
        {"use": "prompt_lookup", "num_tokens": rng.randint(1, 8), "occurrence": OCCURRENCES[case % len(OCCURRENCES)]},
        {"use": "draft_model", "model": str(tiny_model_path()), "num_tokens": rng.randint(1, 6)},
        {"use": "early_exit", "layers": rng.randint(1, model.config.num_hidden_layers - 1)},
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # chain pitfalls a random chain may have
        reference, gen = run(model, tok, prompts, **kwargs)
        rows = reference_rows(reference, gen)
        drafter = Scripted(rows, model.config.vocab_size, seed=case, longest=7, wrong_rate=0.4)
        ours, _ = run(model, tok, prompts, draft=drafter, **kwargs)
        for draft in builtin:
            assert_same_tokens(run(model, tok, prompts, draft=draft, **kwargs)[0], reference)
    assert_same_tokens(ours, reference)
    assert drafter.calls > 0 and int(ours.kept.sum()) > 0, chain
    assert bool((ours.model_calls < reference.num_generated).any()), "some row saved a model call"


def catalogue_chain(entry: dict) -> dict:
    """`entry` with what it needs around it: a selector after temperature 0.9 (greedy alone), a transform or filter
    before top_k 40 (min_p 0.02 after top_k) and dist."""
    if entry in SELECTORS:
        return {"samplers": [{"use": "temperature", "t": 0.9}, entry] if entry["use"] != "greedy" else [entry]}
    cut = {"use": "min_p", "p": 0.02} if entry["use"] == "top_k" else {"use": "top_k", "k": 40}
    return {"samplers": [entry, cut, {"use": "dist"}]}


@pytest.mark.parametrize("entry", TRANSFORMS + FILTERS + SELECTORS, ids=lambda e: e["use"])
def test_every_sampler_of_the_random_chains_keeps_the_tokens(tiny, entry):
    """Each sampler the random chains draw from, alone in a chain, at B = 3 with per-row seeds: prompt lookup and a
    drafter with wrong tokens at random places give the tokens of generation without a drafter."""
    model, tok = tiny
    seeds = [{}] * 3 if entry["use"] == "greedy" else [{"seed": s} for s in (1, 2, 3)]
    kwargs = {"chain": catalogue_chain(entry), "max_new_tokens": 24, "params": seeds}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # chain pitfalls (a filter before mirostat)
        reference, gen = run(model, tok, PROMPTS[:3], **kwargs)
        drafter = Scripted(reference_rows(reference, gen), model.config.vocab_size, seed=5, wrong_rate=0.4)
        looked_up, _ = run(model, tok, PROMPTS[:3], draft={"use": "prompt_lookup", "adaptive": False}, **kwargs)
        scripted, _ = run(model, tok, PROMPTS[:3], draft={"use": drafter, "cost": 0.1}, **kwargs)
    assert_same_tokens(looked_up, reference)
    assert_same_tokens(scripted, reference)
    assert int(scripted.kept.sum()) > 0, "drafted tokens were kept"


# ----------------------------------------------------------------- what the counts say
def test_the_exact_continuation_is_kept_whole(tiny):
    model, tok = tiny
    kwargs = {"chain": "preset:greedy", "max_new_tokens": 24}
    reference, gen = run(model, tok, PROMPTS[:1], **kwargs)
    k = 3
    drafter = Scripted(reference_rows(reference, gen), model.config.vocab_size, longest=k)
    drafter.rng = random.Random()
    drafter.rng.randint = lambda a, b: k  # type: ignore[method-assign]  # always k tokens
    ours, _ = run(model, tok, PROMPTS[:1], draft={"use": drafter, "adaptive": False}, **kwargs)
    assert_same_tokens(ours, reference)
    n, calls, kept = int(ours.num_generated[0]), int(ours.model_calls[0]), int(ours.kept[0])
    assert n - calls <= kept <= n - calls + 1  # each call: its kept drafts and the chain's own token
    assert calls <= 1 + math.ceil((n - 1) / (k + 1))
    assert kept == int(ours.drafted[0]) or reference.finish_reasons[0] != "max_new_tokens"


def test_wrong_drafts_are_never_kept_and_cost_no_token(tiny):
    model, tok = tiny
    kwargs = {"chain": {"samplers": [{"use": "top_k", "k": 20}, {"use": "dist"}]}, "max_new_tokens": 16, "seed": 7}
    reference, gen = run(model, tok, PROMPTS[:3], **kwargs)
    drafter = Scripted(reference_rows(reference, gen), model.config.vocab_size, always_wrong=True)
    ours, _ = run(model, tok, PROMPTS[:3], draft=drafter, **kwargs)
    assert_same_tokens(ours, reference)
    assert ours.kept.tolist() == [0, 0, 0]
    assert ours.model_calls.tolist() == reference.num_generated.tolist()  # one token per call, as without drafts
    assert bool((ours.drafted > 0).all())


def test_without_a_drafter_there_are_no_counts(tiny):
    model, tok = tiny
    out, _ = run(model, tok, PROMPTS[:1], chain="preset:greedy", max_new_tokens=4)
    assert out.drafted is None and out.kept is None and out.model_calls is None


# ----------------------------------------------------------------- every way in
def test_a_name_a_table_and_an_object_draft_alike(tiny):
    model, tok = tiny
    kwargs = {"chain": "preset:llama.cpp", "max_new_tokens": 20, "seed": 5}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GenerationWarning)
        reference = generate(model, tok, PROMPTS[:2], **kwargs)
        named = generate(model, tok, PROMPTS[:2], draft="prompt_lookup", **kwargs)
        table = generate(model, tok, PROMPTS[:2], draft={"use": "prompt_lookup.v1", "max_ngram": 2}, **kwargs)
    assert_same_tokens(named, reference)
    assert_same_tokens(table, reference)
    assert named.kept is not None and named.kept.shape == (2,)


def test_stream_with_a_drafter_emits_the_same_events(tiny):
    model, tok = tiny
    kwargs = {"chain": "preset:llama.cpp", "max_new_tokens": 30, "seed": 3, "stop_strings": ["apple, pear"]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GenerationWarning)
        plain = list(stream(model, tok, PROMPTS[:2], **kwargs))
        result: list = []
        drafted = list(stream(model, tok, PROMPTS[:2], draft="prompt_lookup", result=result, **kwargs))
    assert drafted == plain
    out = result[0]
    for b in range(2):
        assert "".join(e.text for e in drafted if e.index == b) == out.texts[b]
        n = int(out.num_generated[b])
        generated = out.sequences[b, out.sequences.shape[1] - n :].tolist() if n else []
        assert [e.token_id for e in drafted if e.index == b] == generated  # one event per kept token


# ----------------------------------------------------------------- stops, counts, what a processor sees
@pytest.mark.parametrize(
    "stops",
    [
        {"ignore_eos": True},
        {
            "chain": {
                "samplers": [{"use": "temperature", "t": 1.5}, {"use": "dist"}],
                "stop": [{"use": "eos", "ids": [5]}],
            }
        },
        {
            "chain": {
                "samplers": [
                    {"use": "min_new_tokens", "n": 20, "eos_ids": [5]},
                    {"use": "temperature", "t": 1.5},
                    {"use": "dist"},
                ]
            },
            "seed": 7,  # row 2 draws eos at its 12th and 19th tokens
        },
    ],
    ids=["ignore_eos", "other-eos-ids", "eos-before-min-new-tokens"],
)
def test_a_drawn_eos_that_does_not_stop_its_row_keeps_the_row_drawing(tiny, stops):
    """The tokenizer's eos (id 0) drawn where it ends nothing (ignored, not the stop list's, before the row's
    min_new_tokens): the row stays in the runner's batch and draws on, as without a drafter."""
    model, tok = tiny
    kwargs = {"chain": {"samplers": [{"use": "temperature", "t": 1.5}, {"use": "dist"}]}, "max_new_tokens": 40}
    kwargs |= {"seed": 3, **stops}
    reference, gen = run(model, tok, PROMPTS[:3], **kwargs)
    rows = reference_rows(reference, gen)
    width = gen.attention_mask.shape[1]
    assert any(0 in reference.sequences[b, width : width + 30].tolist() for b in range(3)), "an eos drawn, no stop"
    drafter = Scripted(rows, model.config.vocab_size, seed=3, longest=8, wrong_rate=0.3)
    for draft in (drafter, {"use": "prompt_lookup", "cost": 0.01}):
        assert_same_tokens(run(model, tok, PROMPTS[:3], draft=draft, **kwargs)[0], reference)


class Nudge:
    """A logits processor whose boost depends on what it is shown: the width of input_ids, the row's index in the
    batch and its last token (as transformers' MinLength- or PrefixConstrainedLogitsProcessor read them)."""

    def __call__(self, input_ids, scores):
        width = input_ids.shape[-1]
        for b in range(input_ids.shape[0]):
            scores[b, (31 * width + 17 * b + int(input_ids[b, -1])) % scores.shape[-1]] += 4.0
        return scores


def test_a_logits_processor_sees_the_batch_as_the_plain_loop_shows_it(tiny):
    model, tok = tiny
    kwargs = {"chain": "preset:greedy", "max_new_tokens": 24, "logits_processor": Nudge()}
    reference, gen = run(model, tok, PROMPTS[:3], **kwargs)
    drafter = Scripted(reference_rows(reference, gen), model.config.vocab_size, seed=2, longest=8, wrong_rate=0.3)
    ours, _ = run(model, tok, PROMPTS[:3], draft=[None, drafter, drafter], **kwargs)  # rows at different steps
    assert_same_tokens(ours, reference)
    assert int(ours.kept.sum()) > 0


def test_kept_counts_only_drafted_tokens_that_come_out(tiny):
    """Drafted tokens drawn past a stop string are dropped, and not counted as kept."""
    model, tok = tiny
    free, gen = run(model, tok, PROMPTS[:1], chain="preset:greedy", max_new_tokens=30)
    width = gen.attention_mask.shape[1]
    stop = tok.decode(free.sequences[0, width + 2 : width + 3].tolist())  # the third token's text
    kwargs = {"chain": "preset:greedy", "max_new_tokens": 30, "stop_strings": [stop]}
    reference, _ = run(model, tok, PROMPTS[:1], **kwargs)
    drafter = Scripted(reference_rows(free, gen), model.config.vocab_size, longest=10)
    drafter.rng.randint = lambda a, b: b  # type: ignore[method-assign]  # always the longest
    ours, _ = run(model, tok, PROMPTS[:1], draft={"use": drafter, "adaptive": False}, **kwargs)
    assert_same_tokens(ours, reference)
    n = int(ours.num_generated[0])
    assert int(ours.drafted[0]) >= 10 and int(ours.kept[0]) == n - 1, (ours.drafted, ours.kept, n)


def test_drafter_objects_in_tables_are_each_asked_for_their_rows(tiny):
    model, tok = tiny
    kwargs = {"chain": "preset:greedy", "max_new_tokens": 12}
    reference, gen = run(model, tok, PROMPTS[:2], **kwargs)
    rows = reference_rows(reference, gen)
    a, b = (Scripted(rows, model.config.vocab_size, longest=3) for _ in range(2))
    ours, _ = run(model, tok, PROMPTS[:2], draft=[{"use": a, "cost": 0.1}, {"use": b, "cost": 0.1}], **kwargs)
    assert_same_tokens(ours, reference)
    assert a.calls > 0 and b.calls > 0


def test_rows_in_match_and_rejection_mode_share_a_batch(tiny):
    model, tok = tiny
    kwargs = {"chain": {"samplers": [{"use": "top_k", "k": 40}, {"use": "dist"}]}, "max_new_tokens": 24, "seed": 1}
    reference, gen = run(model, tok, PROMPTS[:2], **kwargs)
    drafter = Scripted(reference_rows(reference, gen), model.config.vocab_size, longest=4)

    class Repeat(Drafter):
        """Proposes the newest token again, whatever was drawn: the rejection row drafts at every step (a drafter
        that depends on the draws, such as prompt lookup, may find nothing on a machine whose draws differ)."""

        name = "repeat"

        def propose(self, row, tokens, limit):
            return [int(tokens[-1])] * min(limit, 3)

    draft = [{"use": Repeat(), "mode": "rejection", "cost": 0.01}, {"use": drafter, "mode": "match"}]
    ours, _ = run(model, tok, PROMPTS[:2], draft=draft, **kwargs)
    assert ours.sequences[1].tolist() == reference.sequences[1].tolist()  # the match row: the tokens
    assert int(ours.drafted[0]) > 0 and int(ours.drafted[1]) > 0


# ----------------------------------------------------------------- bad input
def test_an_unknown_drafter_is_one_error_before_generation(tiny):
    model, tok = tiny
    with pytest.raises(UnknownPluginError, match=r"unknown drafter 'prompt_lookpu'.*did you mean 'prompt_lookup'"):
        Generation(model, tok, "Hi", draft="prompt_lookpu", pad_token_id=0)


def test_a_sampler_that_cannot_fork_its_state_is_refused_before_generation(tiny, monkeypatch):
    model, tok = tiny
    chain = Chain.load({"chain": {"name": "c", "samplers": [{"use": "top_k", "k": 5}, {"use": "dist"}]}})
    monkeypatch.setattr(type(chain.samplers[0]), "forkable", False)
    with pytest.raises(ConfigError, match=r"top_k\.v1 cannot fork its state \(forkable = False\).*draft=False"):
        Generation(model, tok, "Hi", chain=chain, draft="prompt_lookup", pad_token_id=0)
    Generation(model, tok, "Hi", chain=chain, pad_token_id=0)  # without a drafter it runs


@pytest.mark.parametrize(
    ("draft", "message"),
    [
        ({"use": "prompt_lookup", "num_tokens": 0}, r"draft\[prompt_lookup\]\.num_tokens = 0: must be in \[1, inf\)"),
        ({"use": "prompt_lookup", "num_token": 4}, r"num_token.*unknown parameter.*did you mean 'num_tokens'"),
        ({"use": "prompt_lookup", "min_ngram": 4, "max_ngram": 2}, r"prompt_lookup: min_ngram \(= 4\).*max_ngram"),
        ({"num_tokens": 4}, r"names its drafter with `use`"),
        (3, r"draft = 3: pass a drafter's name"),
    ],
)
def test_bad_drafter_parameters_are_one_error_naming_them(tiny, draft, message):
    model, tok = tiny
    with pytest.raises(ConfigError, match=message):
        Generation(model, tok, "Hi", draft=draft, pad_token_id=0)


@pytest.mark.parametrize("n", [0, -3, 2.5, True])
def test_a_drafter_whose_params_do_not_check_num_tokens_is_refused_for_a_bad_one(tiny, n):
    """A third party's Params may not check num_tokens: the generation does, before it starts."""
    model, tok = tiny

    @attrs.frozen
    class Loose:
        num_tokens: Any = 4

    class Repeats(Drafter):
        name = "repeats"
        Params = Loose

        def propose(self, row, tokens, limit):
            return [int(tokens[-1])] * limit

    with pytest.raises(ConfigError, match=rf"drafter repeats\.v1: num_tokens = {n!r}; give the longest draft"):
        Generation(model, tok, "Hi", draft=Repeats(Loose(n)), pad_token_id=0)


class Scribbles(Scripted):
    """Scripted, but it writes into the tokens it is given before it proposes."""

    name = "scribbles"

    def propose(self, row, tokens, limit):
        draft = super().propose(row, tokens, limit)
        tokens[-1] = 7
        return draft


def test_a_drafter_that_writes_into_its_tokens_leaves_the_generation_s_tokens_alone(tiny):
    model, tok = tiny
    kwargs = {"chain": "preset:greedy", "max_new_tokens": 16}
    reference, gen = run(model, tok, PROMPTS[:2], **kwargs)
    drafter = Scribbles(reference_rows(reference, gen), model.config.vocab_size, longest=4)
    ours, _ = run(model, tok, PROMPTS[:2], draft={"use": drafter, "adaptive": False}, **kwargs)
    assert_same_tokens(ours, reference)
    assert int(ours.kept.sum()) > 0


def test_draft_with_beam_search_is_refused(tiny):
    model, tok = tiny
    with pytest.raises(ConfigError, match=r"beam search .* does not draft"):
        generate(model, tok, "Hi", num_beams=2, draft="prompt_lookup", pad_token_id=0)


class Failing(Scripted):
    name = "failing"

    def propose(self, row, tokens, limit):
        if self.calls == 3:
            self.calls += 1
            raise RuntimeError("index out of range")
        return super().propose(row, tokens, limit)


def test_a_drafter_that_raises_leaves_its_row_without_drafts_and_the_tokens_unchanged(tiny):
    model, tok = tiny
    kwargs = {"chain": "preset:greedy", "max_new_tokens": 20}
    reference, gen = run(model, tok, PROMPTS[:1], **kwargs)
    drafter = Failing(reference_rows(reference, gen), model.config.vocab_size)
    with pytest.warns(GenerationWarning, match=r"drafter failing\.v1 failed on row 0 \(RuntimeError: index out"):
        ours, _ = run(model, tok, PROMPTS[:1], draft={"use": drafter, "cost": 0.1}, **kwargs)  # lengths untimed
    assert_same_tokens(ours, reference)
    assert drafter.calls == 4  # never asked again
    assert int(ours.kept[0]) > 0


class FailingOn(Scripted):
    """Scripted, but from its second proposal for row `bad` on it raises."""

    name = "failing_on"

    def __init__(self, *args, bad: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.bad, self.asked = bad, 0

    def propose(self, row, tokens, limit):
        if row == self.bad:
            self.asked += 1
            if self.asked >= 2:
                raise RuntimeError(f"boom on row {row}")
        return super().propose(row, tokens, limit)


def test_a_drafter_failing_on_one_row_leaves_the_rows_it_shares_drafting(tiny):
    model, tok = tiny
    kwargs = {"chain": "preset:greedy", "max_new_tokens": 20}
    reference, gen = run(model, tok, PROMPTS[:3], **kwargs)
    drafter = FailingOn(reference_rows(reference, gen), model.config.vocab_size, longest=3, bad=1)
    with pytest.warns(GenerationWarning, match=r"failing_on\.v1 failed on row 1 \(RuntimeError: boom on row 1\)"):
        ours, _ = run(model, tok, PROMPTS[:3], draft={"use": drafter, "adaptive": False}, **kwargs)
    assert_same_tokens(ours, reference)
    drafted = ours.drafted.tolist()
    assert drafted[0] > drafted[1] and drafted[2] > drafted[1], drafted


def test_a_drafter_whose_start_fails_is_switched_off_and_the_tokens_unchanged(tiny):
    model, tok = tiny

    class Broken(Drafter):
        name = "broken"

        def start(self, rows, context):
            raise RuntimeError("no such file")

        def propose(self, row, tokens, limit):
            raise AssertionError("never asked")

    reference, _ = run(model, tok, PROMPTS[:2], chain="preset:greedy", max_new_tokens=8)
    with pytest.warns(GenerationWarning, match=r"broken\.v1 failed on rows \[0, 1\] \(RuntimeError: no such file"):
        ours, _ = run(model, tok, PROMPTS[:2], chain="preset:greedy", max_new_tokens=8, draft=Broken())
    assert_same_tokens(ours, reference)


@pytest.mark.parametrize("nothing", [[], (), None, torch.zeros(0)], ids=["list", "tuple", "none", "float-tensor"])
def test_an_empty_proposal_is_no_guess_and_the_drafter_stays_on(tiny, nothing):
    model, tok = tiny
    kwargs = {"chain": "preset:greedy", "max_new_tokens": 20}
    reference, gen = run(model, tok, PROMPTS[:1], **kwargs)
    rows = reference_rows(reference, gen)

    class Sometimes(Drafter):
        name = "sometimes"
        calls = 0

        def propose(self, row, tokens, limit):
            self.calls += 1
            return nothing if self.calls % 2 else rows[row][len(tokens) : len(tokens) + 3]

    drafter = Sometimes()
    with warnings.catch_warnings():
        warnings.simplefilter("error", GenerationWarning)
        ours, _ = run(model, tok, PROMPTS[:1], draft={"use": drafter, "adaptive": False}, **kwargs)
    assert_same_tokens(ours, reference)
    assert drafter.calls > 2 and int(ours.drafted[0]) > 0


@pytest.mark.parametrize("proposal", [[1.7], [True]], ids=["float", "bool"])
def test_a_drafter_proposing_what_is_not_a_token_id_is_switched_off(tiny, proposal):
    model, tok = tiny

    class NotIds(Drafter):
        name = "not_ids"

        def propose(self, row, tokens, limit):
            return proposal

    reference, _ = run(model, tok, PROMPTS[:1], chain="preset:greedy", max_new_tokens=8)
    with pytest.warns(GenerationWarning, match=r"not_ids\.v1 failed on row 0.*integer token ids expected"):
        ours, _ = run(model, tok, PROMPTS[:1], chain="preset:greedy", max_new_tokens=8, draft=NotIds())
    assert_same_tokens(ours, reference)


@pytest.mark.filterwarnings("ignore:max_new_tokens = 20 after a 250-token prompt runs past")
def test_drafts_stay_within_the_models_positions(tiny):
    """A prompt a few tokens short of the model's positions, a stop that comes before them: drafts are cut to the
    positions left, so the run ends as without a drafter."""
    model, tok = tiny
    limit = model.config.n_positions
    ids = torch.tensor([(tok.encode("A list is a list is a list is a list is a ") * limit)[: limit - 6]])
    kwargs = {"chain": "preset:greedy", "max_new_tokens": 20, "stop_strings": ["list"]}
    kwargs |= {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    reference, _ = run(model, tok, None, **kwargs)
    assert reference.finish_reasons == ["stop_strings"]
    for draft in ("prompt_lookup", {"use": "prompt_lookup", "adaptive": False, "num_tokens": 10}):
        ours, _ = run(model, tok, None, draft=draft, **kwargs)
        assert_same_tokens(ours, reference)
        assert int(ours.drafted[0]) > 0


class Proposes(Drafter):
    """Proposes each row's `drafts[row]` at its first call, nothing after."""

    name = "proposes"

    def __init__(self, drafts):
        super().__init__()
        self.drafts, self.asked = drafts, set()

    def propose(self, row, tokens, limit):
        if row in self.asked:
            return []
        self.asked.add(row)
        return self.drafts[row][:limit]


def _dead_end(allowed):
    """A greedy chain over `allowed` that never repeats a token: its draw after len(allowed) tokens masks every
    token, a SamplingError."""
    return {"samplers": [{"use": "allowed_tokens", "ids": allowed}, {"use": "no_repeat_ngram", "n": 1},
                         {"use": "greedy"}]}  # fmt: skip


@pytest.mark.parametrize("stop", ["string", "eos"])
def test_a_stop_inside_a_drawn_run_ends_the_row_there_and_nothing_past_it_can_fail(tiny, stop):
    """Positions past a stop that a draft reaches are never the plain loop's: where the chain fails there (a chain
    that masks every token after three), the generation ends at the stop as without a drafter."""
    model, tok = tiny
    allowed = [3000, 3001, 3002]
    order = generate(model, tok, PROMPTS[2], chain=_dead_end(allowed), max_new_tokens=3, pad_token_id=0)
    t1, t2, t3 = order.sequences[0, -3:].tolist()
    kwargs = {"max_new_tokens": 10, "pad_token_id": 0}
    chain = _dead_end(allowed)
    if stop == "string":
        kwargs["stop_strings"] = [tok.decode([t2])]
    else:
        chain["stop"] = [{"use": "eos", "ids": [t2]}]
    reference = generate(model, tok, PROMPTS[2], chain=chain, **kwargs)
    assert reference.sequences[0, -2:].tolist() == [t1, t2]
    for draft in ({"use": Proposes({0: [t2, t3, t1]}), "adaptive": False}, "prompt_lookup"):
        assert_same_tokens(generate(model, tok, PROMPTS[2], chain=chain, draft=draft, **kwargs), reference)


def test_a_row_drawn_past_its_stop_waits_while_the_batch_goes_on(tiny):
    """Row 0 draws past its stop string ahead of row 1 (which does not draft), into positions where its chain
    fails: it waits for its stop to be committed, and row 1 goes on to its own length limit."""
    model, tok = tiny
    allowed = [3000, 3001, 3002, 3003]
    order = generate(model, tok, PROMPTS[2], chain=_dead_end(allowed), max_new_tokens=4, pad_token_id=0)
    t1, t2, t3, t4 = order.sequences[0, -4:].tolist()
    kwargs = {"chain": [_dead_end(allowed), "preset:greedy"], "max_new_tokens": 12, "pad_token_id": 0}
    kwargs["stop_strings"] = [tok.decode([t3])]
    reference = generate(model, tok, PROMPTS[2:4], **kwargs)
    assert reference.finish_reasons == ["stop_strings", "max_new_tokens"]
    assert reference.num_generated.tolist() == [3, 12]
    # row 0 draws t2 and t3 and then t4 past the draft in one call, while row 1 draws one token a call: its next
    # call's first position, past t3, is where its chain fails
    ours = generate(
        model, tok, PROMPTS[2:4], draft=[{"use": Proposes({0: [t2, t3]}), "adaptive": False}, None], **kwargs
    )
    assert_same_tokens(ours, reference)
    assert ours.kept.tolist() == [2, 0]


def test_a_drafter_proposing_what_is_no_token_is_switched_off(tiny):
    model, tok = tiny

    class OutOfVocabulary(Drafter):
        name = "out_of_vocabulary"

        def propose(self, row, tokens, limit):
            return [10**9]

    reference, _ = run(model, tok, PROMPTS[:1], chain="preset:greedy", max_new_tokens=8)
    with pytest.warns(GenerationWarning, match=r"out_of_vocabulary\.v1 failed on row 0.*token ids in \[0, "):
        ours, _ = run(model, tok, PROMPTS[:1], chain="preset:greedy", max_new_tokens=8, draft=OutOfVocabulary())
    assert_same_tokens(ours, reference)


@pytest.mark.parametrize("answer", [("guess", 1.5), "guess", ("guess", "high")], ids=["chance", "no-pair", "no-number"])
def test_a_drafter_whose_expect_fails_is_switched_off_and_the_tokens_unchanged(tiny, answer):
    model, tok = tiny

    class Unsure(Drafter):
        name = "unsure"

        def expect(self, row, tokens):
            return answer  # no (kind, chance in [0, 1])

        def propose(self, row, tokens, limit):
            return tokens[-1:]

    reference, _ = run(model, tok, PROMPTS[:1], chain="preset:greedy", max_new_tokens=8)
    with pytest.warns(GenerationWarning, match=r"unsure\.v1 failed on row 0.*a chance in \[0, 1\]"):
        ours, _ = run(model, tok, PROMPTS[:1], chain="preset:greedy", max_new_tokens=8, draft=Unsure())
    assert_same_tokens(ours, reference)
    assert int(ours.drafted[0]) == 0


def test_a_drafter_whose_checkpoint_fails_is_one_error_naming_it_and_the_generation_goes_on(tiny):
    from samplechain.errors import PluginError

    model, tok = tiny

    class Forgetful(Drafter):
        name = "forgetful"

        def propose(self, row, tokens, limit):
            return tokens[-1:]

        def checkpoint(self):
            return {"rows": {1, 2}}  # a set: not JSON

    kwargs = {"chain": "preset:greedy", "max_new_tokens": 8}
    reference, _ = run(model, tok, PROMPTS[:2], **kwargs)
    gen = Generation(model, tok, PROMPTS[:2], pad_token_id=0, draft=Forgetful(), **kwargs)
    steps = gen.steps()
    next(steps)
    with pytest.raises(
        PluginError, match=r"drafter forgetful\.v1: checkpoint\(\) failed or gave data that is not plain"
    ):
        gen.checkpoint()
    for _ in steps:
        pass
    assert_same_tokens(gen.output(), reference)


# ----------------------------------------------------------------- llama.cpp
@pytest.fixture(scope="module")
def smollm(open_gguf):
    """SmolLM2 on llama.cpp with flash attention, under which a multi-token decode gives the logits of one-token
    steps bit for bit within 256 tokens (docs/speculative.md)."""
    return open_gguf(n_ctx=1024, flash_attn=True)


QUOTING = [
    [{"role": "user", "content": "Rename x to y in: def f(x):\n    return x * x + x"}],
    [{"role": "user", "content": "Repeat exactly: the quick brown fox jumps over the lazy dog, twice."}],
]


@pytest.mark.llama_cpp
@pytest.mark.slow
def test_on_llama_cpp_prompt_lookup_gives_the_same_tokens(smollm):
    model, tok = smollm
    for chain in ("preset:greedy", "preset:llama.cpp"):
        kwargs = {"chain": chain, "max_new_tokens": 24, "seed": 11, "output_logits": True}
        reference = generate(model, tok, QUOTING, **kwargs)
        draft = {"use": "prompt_lookup", "num_tokens": 6, "cost": 0.1}
        ours = generate(model, tok, QUOTING, draft=draft, **kwargs)
        assert_same_tokens(ours, reference)
        assert ours.texts == reference.texts
        for j, (a, b) in enumerate(zip(ours.logits, reference.logits)):  # bit for bit while a row generates
            rows = reference.num_generated > j
            assert torch.equal(a[rows], b[rows]), (chain, j)
        if chain == "preset:greedy":  # the quoting answers repeat their prompts: lookups hit
            assert bool((ours.model_calls < ours.num_generated).all()), ours.model_calls


@pytest.mark.llama_cpp
@pytest.mark.slow
def test_on_llama_cpp_drafts_of_64_tokens_keep_the_logits_of_steps(smollm, monkeypatch):
    """A check that feeds a row 64 tokens or more, which llama.cpp's float16 KV cache would attend with another
    kernel than one-token steps: drafts of 63 and 64 tokens, some with a wrong token, give the tokens and logits of
    generation without a drafter bit for bit."""
    from samplechain_llama_cpp import LlamaCppRunner

    model, tok = smollm
    kwargs = {"chain": "preset:llama.cpp", "max_new_tokens": 100, "seed": 4, "ignore_eos": True, "output_logits": True}
    reference, gen = run(model, tok, QUOTING, **kwargs)
    feeds = []
    extend_rows = LlamaCppRunner.extend_rows

    def counted(self, rows, tokens):
        feeds.extend(len(t) for t in tokens)
        return extend_rows(self, rows, tokens)

    monkeypatch.setattr(LlamaCppRunner, "extend_rows", counted)
    rows = reference_rows(reference, gen)
    drafter = Scripted(rows, model.config.vocab_size, seed=1, shortest=63, longest=64, wrong_rate=0.3)
    ours, _ = run(model, tok, QUOTING, draft={"use": drafter, "adaptive": False}, **kwargs)
    assert_same_tokens(ours, reference)
    for a, b in zip(ours.logits, reference.logits):
        assert torch.equal(a, b)
    assert max(feeds) == 65  # a row's newest token and a draft of 64


def rows_keep_their_own_drafts(model, tok, case):
    """Each row keeps its own number of drafted tokens per call (its own model-call count), and the tokens stay
    those of generation without a drafter."""
    rng = random.Random(50 + case)
    chain = random_chain(rng)
    prompts = rng.sample(PROMPTS, 2 + case % 3)  # B = 2..4
    kwargs = {"chain": chain, "max_new_tokens": 20, "seed": 7 + case}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # chain pitfalls a random chain may have
        reference, gen = run(model, tok, prompts, **kwargs)
        drafter = Scripted(reference_rows(reference, gen), model.config.vocab_size, seed=case, wrong_rate=0.5)
        ours, _ = run(model, tok, prompts, draft={"use": drafter, "cost": 0.1}, **kwargs)
    assert_same_tokens(ours, reference)
    assert int(ours.kept.sum()) > 0, chain
    # rows advancing together draft and keep the same number of tokens in every call (until one finishes)
    counts = {(d, k) for d, k in zip(ours.drafted.tolist(), ours.kept.tolist())}
    assert len(counts) > 1, "rows drafted and kept their own numbers of tokens"


@pytest.mark.parametrize("case", range(4))
def test_each_row_keeps_its_own_drafts_and_the_tokens(tiny, case):
    # the transformers runner holds the drafts a row did not keep as masked holes in the common cache
    rows_keep_their_own_drafts(*tiny, case)


def test_rows_with_every_token_drawn_leave_the_transformers_batch(tiny):
    """A row whose drawn tokens reach the length limit is released from the runner's batch: the passes after it
    run fewer rows, and the tokens stay those of generation without a drafter."""
    model, tok = tiny
    kwargs = {"chain": "preset:greedy", "max_new_tokens": 24}
    reference, gen = run(model, tok, PROMPTS[:3], **kwargs)
    rows = reference_rows(reference, gen)
    drafter = Scripted(rows, model.config.vocab_size, seed=3, longest=8, wrong_rate=0.6)
    widths = []
    hook = model.register_forward_pre_hook(
        lambda _, args, kw: widths.append(kw["input_ids"].shape[0]), with_kwargs=True
    )
    try:
        ours, _ = run(model, tok, PROMPTS[:3], draft=drafter, **kwargs)
    finally:
        hook.remove()
    assert_same_tokens(ours, reference)
    assert widths[0] == 3 and min(widths) < 3, widths
    assert widths == sorted(widths, reverse=True), "a released row never comes back"


def test_a_finished_row_out_of_the_batch_is_not_sampled_in_the_steps_after(tiny):
    """Row 0 ends at an eos and leaves the runner's batch while row 1 drafts on; the plain steps after that give row
    0 no logits (zeros), which its chain (temperature 0, then no_repeat_ngram over its pad tokens) would mask
    entirely: the steps draw only the rows still going, as generation without a drafter gives them."""
    model, tok = tiny
    chain = {"samplers": [{"use": "temperature", "t": 0.4}, {"use": "no_repeat_ngram", "n": 2}, {"use": "dist"}]}
    kwargs = {"chain": chain, "max_new_tokens": 20, "params": [{"temperature": 0.0}, {"seed": 5}]}
    prompts = [PROMPTS[1]] * 2
    reference, _ = run(model, tok, prompts, **kwargs)
    assert reference.finish_reasons == ["eos", "max_new_tokens"], "row 0 ends first"
    ours, _ = run(model, tok, prompts, draft=[None, {"use": "prompt_lookup", "adaptive": False}], **kwargs)
    assert_same_tokens(ours, reference)
    assert int(ours.drafted[1]) > 0


def test_scores_logits_and_top_logprobs_are_the_plain_loops_while_a_row_goes(tiny):
    """Each step's scores, raw logits and top logprobs of a row still going are those of generation without a
    drafter; after a row finished (it is drawn no more) they are -inf, the top logprobs' ids 0."""
    model, tok = tiny
    chain = {"samplers": [{"use": "temperature", "t": 0.4}, {"use": "top_k", "k": 30}, {"use": "dist"}]}
    kwargs = {"chain": chain, "max_new_tokens": 20, "params": [{"temperature": 0.0}, {"seed": 5}], "top_logprobs": 3}
    kwargs |= {"output_scores": True, "output_logits": True}
    prompts = [PROMPTS[1]] * 2
    reference, _ = run(model, tok, prompts, **kwargs)
    ours, _ = run(model, tok, prompts, draft={"use": "prompt_lookup", "adaptive": False}, **kwargs)
    assert_same_tokens(ours, reference)
    assert int(ours.kept.sum()) > 0
    ended = int(reference.num_generated[0])
    assert reference.finish_reasons[0] == "eos" and ended < len(reference.scores), "row 0 ends first"
    for step, (values, ids) in enumerate(ours.top_logprobs):
        rows = [0, 1] if step < ended else [1]
        for name, mine, theirs in (
            ("scores", ours.scores[step], reference.scores[step]),
            ("logits", ours.logits[step], reference.logits[step]),
            ("top logprobs", values, reference.top_logprobs[step][0]),
        ):
            torch.testing.assert_close(mine[rows], theirs[rows], atol=1e-4, rtol=1e-4, msg=f"{name} at {step}")
        assert ids.dtype == torch.int64 and ids[rows].tolist() == reference.top_logprobs[step][1][rows].tolist()
        if step >= ended:
            assert bool(torch.isneginf(ours.scores[step][0]).all()) and bool(torch.isneginf(values[0]).all())
            assert ids[0].tolist() == [0, 0, 0]


@pytest.mark.parametrize("chain", ["preset:greedy", {"samplers": [{"use": "top_k", "k": 20}, {"use": "dist"}]}])
def test_drafts_never_change_the_tokens_with_fast_steps(tiny, chain, monkeypatch):
    """Steps in the runner's products (`fast_steps`): a drafter keeps the tokens of generation without one on the same
    setting, rows released along the way."""
    from samplechain.generation.model import TransformersRunner

    monkeypatch.setattr(TransformersRunner, "fast_steps", True)
    model, tok = tiny
    kwargs = {"chain": chain, "max_new_tokens": 24, "seed": 5}
    reference, gen = run(model, tok, PROMPTS[:3], **kwargs)
    drafter = Scripted(reference_rows(reference, gen), model.config.vocab_size, seed=2, longest=6, wrong_rate=0.4)
    ours, _ = run(model, tok, PROMPTS[:3], draft=drafter, **kwargs)
    assert_same_tokens(ours, reference)
    assert int(ours.kept.sum()) > 0


class WrongFor(Scripted):
    """Scripted, but the rows in `wrong` get drafts that are never kept."""

    def __init__(self, *args, wrong: set[int], **kwargs):
        super().__init__(*args, **kwargs)
        self.wrong = wrong

    def propose(self, row, tokens, limit):
        draft = super().propose(row, tokens, limit)
        return [(t + 1) % self.vocab for t in draft] if row in self.wrong else draft


def test_on_a_padded_batch_a_row_far_ahead_draws_on_and_leaves(tiny):
    """On the transformers runner every held row's columns run in each pass, so a row whose drafts are kept goes on
    drawing however far ahead of the batch's last step it is, and leaves the batch once it has drawn all its tokens,
    long before the row whose drafts all miss has committed them."""
    model, tok = tiny
    kwargs = {"chain": "preset:greedy", "max_new_tokens": 100, "ignore_eos": True}
    prompts = PROMPTS[:2]
    reference, gen = run(model, tok, prompts, **kwargs)
    rows = reference_rows(reference, gen)
    assert reference.num_generated.tolist() == [100, 100]
    drafter = WrongFor(rows, model.config.vocab_size, seed=5, longest=10, wrong={1})
    widths = []
    hook = model.register_forward_pre_hook(
        lambda _, args, kw: widths.append(kw["input_ids"].shape[0]), with_kwargs=True
    )
    try:
        ours, _ = run(model, tok, prompts, draft={"use": drafter, "cost": 0.1}, **kwargs)  # lengths untimed
    finally:
        hook.remove()
    assert_same_tokens(ours, reference)
    assert ours.kept.tolist()[1] == 0 and ours.model_calls.tolist()[1] == 100
    # row 0 drew its 100 tokens in few calls, more than 64 ahead of row 1, which commits one a call; every pass of
    # both rows (the prefill among them) fed row 0, which then left the batch
    calls = ours.model_calls.tolist()[0]
    assert calls <= 30, ours.model_calls
    assert widths.count(2) <= calls, f"row 0 waited in the batch: {calls} calls of row 0, passes {widths}"


@pytest.mark.llama_cpp
@pytest.mark.slow
@pytest.mark.parametrize("case", range(4))
def test_on_llama_cpp_each_row_keeps_its_own_drafts_and_the_tokens(smollm, case):
    # the llama.cpp runner cuts each row's sequence on its own
    rows_keep_their_own_drafts(*smollm, case)


@pytest.mark.llama_cpp
@pytest.mark.slow
def test_on_llama_cpp_only_the_rows_behind_draft_in_a_call_of_several(smollm):
    """A batch calls until its last row is done, so a call of several rows saves one only where every row that
    holds the next step back keeps drafted tokens: a row whose partner cannot draft drafts nothing while it goes
    (its drafts would only take it ahead), and rows behind draft together, as far as the shortest draft."""
    model, tok = smollm
    kwargs = {"chain": "preset:greedy", "max_new_tokens": 24, "ignore_eos": True}
    reference, gen = run(model, tok, QUOTING, **kwargs)
    rows, vocab = reference_rows(reference, gen), model.config.vocab_size
    right = Scripted(rows, vocab, shortest=6, longest=6)  # always right: a row alone would keep every draft
    ours, _ = run(model, tok, QUOTING, draft=[{"use": right, "cost": 0.1}, None], **kwargs)
    assert_same_tokens(ours, reference)
    assert ours.drafted.tolist() == [0, 0], ours.drafted
    long, short = Scripted(rows, vocab, shortest=6, longest=6), Scripted(rows, vocab, shortest=2, longest=2)
    draft = [{"use": long, "cost": 0.1}, {"use": short, "cost": 0.1}]
    ours, _ = run(model, tok, QUOTING, draft=draft, **kwargs)
    assert_same_tokens(ours, reference)
    assert ours.drafted.tolist() == ours.kept.tolist() and ours.drafted[0] == ours.drafted[1] > 0, ours.drafted
    assert int(ours.model_calls.max()) < 24, ours.model_calls  # every call that drafted saved the batch calls


# ----------------------------------------------------------------- checkpoints
def resumed(model, tok, prompts, stop_after, **kwargs):
    """Run until `stop_after` steps, checkpoint (through JSON), resume in a new Generation, run to the end."""
    import json

    gen = Generation(model, tok, prompts, pad_token_id=0, **kwargs)
    for i, _ in enumerate(gen.steps(), start=1):
        if i == stop_after:
            break
    saved = json.loads(json.dumps(gen.checkpoint()))
    for key in ("prompts", "seed", "params", "negative_prompt"):
        kwargs.pop(key, None)
    again = Generation(model, tok, resume=saved, pad_token_id=0, **kwargs)
    for _ in again.steps():
        pass
    return again.output(), saved


def test_a_resumed_speculative_generation_gives_the_same_tokens(tiny):
    model, tok = tiny
    chain = {"samplers": [{"use": "penalties", "repeat": 1.2}, {"use": "mirostat", "tau": 5.0}]}
    draft = {"use": "prompt_lookup", "num_tokens": 4, "cost": 0.1}  # a fixed cost: the same drafts in both runs
    kwargs = {"chain": chain, "max_new_tokens": 20, "seed": 3, "draft": draft}
    whole, _ = run(model, tok, PROMPTS[:3], **kwargs)
    for stop_after in (1, 5, 11):
        out, saved = resumed(model, tok, PROMPTS[:3], stop_after, **dict(kwargs))
        assert_same_tokens(out, whole)
        assert out.kept.tolist() == whole.kept.tolist()
    with pytest.raises(ConfigError, match="draft="):
        gen = Generation(model, tok, PROMPTS[:3], pad_token_id=0, **kwargs)
        steps = gen.steps()
        next(steps)
        saved = gen.checkpoint()
        if not any(saved["speculation"]["pending"]):  # the refusal needs tokens drawn past the step
            saved["speculation"]["pending"][0] = [1]
            saved["speculation"]["pending_logprobs"][0] = [0.0]
            saved["speculation"]["pending_kept"][0] = [False]
        Generation(model, tok, resume=saved, pad_token_id=0, chain=chain, max_new_tokens=20)


def _shorter(saved, key):
    row = next(b for b, p in enumerate(saved["pending"]) if p)
    saved[key][row] = saved[key][row][:-1]


def _first_drawn(saved, value):
    row = next(b for b, p in enumerate(saved["pending"]) if p)
    saved["pending"][row][0] = value


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda s: s.update(kept=s["kept"][:-1]), r"'kept' is not a list of 3 rows"),
        (lambda s: s.pop("model_calls"), r"'model_calls' is not a list of 3 rows"),
        (lambda s: _shorter(s, "pending_logprobs"), r"row \d's drawn tokens and their logprobs differ in number"),
        (lambda s: _first_drawn(s, 99_999), r"drawn tokens \[99999.*not token ids of the model"),
        (lambda s: s["lengths"].update(keeps=s["lengths"]["keeps"][:-1]), r"lengths\['keeps'\] holds 2 rows, not 3"),
    ],
    ids=["counts", "missing", "logprobs", "token-id", "lengths"],
)
def test_a_damaged_speculation_checkpoint_is_one_error_before_the_resume(tiny, damage, message):
    import json

    model, tok = tiny
    draft = {"use": "prompt_lookup", "num_tokens": 4, "cost": 0.1}
    kwargs = {"chain": "preset:greedy", "max_new_tokens": 20, "draft": draft}
    gen = Generation(model, tok, PROMPTS[:3], pad_token_id=0, **kwargs)
    saved = None
    for _ in gen.steps():
        saved = json.loads(json.dumps(gen.checkpoint()))
        if any(saved["speculation"]["pending"]):  # a row holds drawn tokens past the step
            break
    assert saved is not None and any(saved["speculation"]["pending"])
    damage(saved["speculation"])
    with pytest.raises(ConfigError, match=r"speculation is damaged .*" + message):
        Generation(model, tok, resume=saved, pad_token_id=0, **kwargs)


def test_a_checkpoint_without_a_drafter_resumed_with_one_counts_every_call(tiny):
    model, tok = tiny
    kwargs = {"chain": "preset:greedy", "max_new_tokens": 20}
    whole, _ = run(model, tok, PROMPTS[:2], draft={"use": "prompt_lookup", "cost": 0.1}, **kwargs)
    gen = Generation(model, tok, PROMPTS[:2], pad_token_id=0, **kwargs)
    for i, _ in enumerate(gen.steps(), start=1):
        if i == 8:
            break
    again = Generation(model, tok, resume=gen.checkpoint(), pad_token_id=0, draft="prompt_lookup", **kwargs)
    for _ in again.steps():
        pass
    out = again.output()
    assert_same_tokens(out, whole)
    assert bool((out.model_calls >= 8).all()) and int(out.drafted.sum()) >= 0  # the 8 steps before count as calls
    assert bool((out.model_calls <= out.num_generated).all())


class Counting(Scripted):
    """Scripted, with its count of proposals as the state a checkpoint keeps."""

    def checkpoint(self):
        return {"calls": self.calls}

    def restore(self, state):
        self.restored = state


def test_a_checkpoint_keeps_each_drafters_state(tiny):
    model, tok = tiny
    kwargs = {"chain": "preset:greedy", "max_new_tokens": 16}
    reference, gen = run(model, tok, PROMPTS[:2], **kwargs)
    first = Counting(reference_rows(reference, gen), model.config.vocab_size, longest=3)
    gen = Generation(model, tok, PROMPTS[:2], pad_token_id=0, draft=[first, "prompt_lookup"], **kwargs)
    for i, _ in enumerate(gen.steps(), start=1):
        if i == 5:
            break
    saved = gen.checkpoint()
    states = saved["speculation"]["drafters"]  # one per drafter, in the order of the rows that use them
    assert len(states) == 2 and states[0] == {"calls": first.calls} and "side" in states[1]
    again = Counting(reference_rows(reference, gen), model.config.vocab_size, longest=3)
    resumed = Generation(model, tok, resume=saved, pad_token_id=0, draft=[again, "prompt_lookup"], **kwargs)
    for _ in resumed.steps():
        pass
    assert again.restored == {"calls": first.calls} and first.calls > 0
    assert_same_tokens(resumed.output(), reference)


@pytest.mark.llama_cpp
@pytest.mark.slow
def test_on_llama_cpp_a_resumed_generation_keeps_each_rows_drawn_tokens(smollm):
    """Rows ahead of the batch's last step hold drawn tokens at a checkpoint: the resume feeds them back."""
    model, tok = smollm
    draft = {"use": "prompt_lookup", "num_tokens": 4, "cost": 0.1}  # a fixed cost: the same drafts in every run
    kwargs = {"chain": "preset:greedy", "max_new_tokens": 24, "draft": draft}
    whole, _ = run(model, tok, QUOTING, **kwargs)
    ahead = False
    for stop_after in (2, 5, 8, 11, 14):
        out, saved = resumed(model, tok, QUOTING, stop_after, **dict(kwargs))
        assert_same_tokens(out, whole)
        ahead |= any(saved["speculation"]["pending"])
    assert ahead, "some checkpoint caught a row ahead of the others"


# ----------------------------------------------------------------- grammars and thinking budgets
def constrained_chains(tok) -> list[dict]:
    """A grammar, a thinking budget (its markers: tokens the tiny model writes often), and both, with sampling."""
    start, end = tok.encode(" the")[0], tok.encode(".")[0]
    budget = {"use": "reasoning_budget", "budget": 3, "start_ids": [start], "end_ids": [end]}
    grammar = {"use": "grammar", "regex": "[a-z ,.()=:\\n]{1,200}"}
    tail = [{"use": "penalties", "repeat": 1.2}, {"use": "temperature", "t": 0.9}, {"use": "dist"}]
    return [{"samplers": [grammar, *tail]}, {"samplers": [budget, *tail]}, {"samplers": [budget, grammar, *tail]}]


@pytest.mark.parametrize("which", range(3))
def test_drafts_never_change_the_tokens_under_a_grammar_or_a_thinking_budget(tiny, which):
    model, tok = tiny
    chain = constrained_chains(tok)[which]
    kwargs = {"chain": chain, "max_new_tokens": 24, "seed": 21 + which}
    reference, gen = run(model, tok, PROMPTS[:3], **kwargs)
    drafter = Scripted(reference_rows(reference, gen), model.config.vocab_size, seed=which, wrong_rate=0.4)
    ours, _ = run(model, tok, PROMPTS[:3], draft=drafter, **kwargs)
    looked_up, _ = run(model, tok, PROMPTS[:3], draft="prompt_lookup", **kwargs)
    assert_same_tokens(ours, reference)
    assert_same_tokens(looked_up, reference)
    assert int(ours.kept.sum()) > 0


# ----------------------------------------------------------------- classifier-free guidance
GUIDED = [
    {"samplers": [{"use": "cfg", "scale": 1.5}, {"use": "greedy"}]},
    {"samplers": [{"use": "cfg"}, {"use": "penalties", "repeat": 1.2}, {"use": "top_k", "k": 40}, {"use": "dist"}]},
    {"samplers": [{"use": "cfg", "scale": 0.5}, {"use": "temperature", "t": 0.9}, {"use": "mirostat", "tau": 5.0}]},
]
NEGATIVE = ["Bye.", "A list of fruit", "x = 1"]


@pytest.mark.parametrize("which", range(len(GUIDED)))
@pytest.mark.parametrize("window", [False, True], ids=["rows", "together"])
def test_drafts_keep_the_outputs_under_classifier_free_guidance(tiny, windowed, which, window):
    """A negative prompt per row, whose unconditional context is fed and cut with the model's own (rows cut on
    their own, and together on a sliding-window model), B = 3 with a guidance scale per row: a drafter that knows the
    reference's tokens (40% of its drafts wrong) and each built-in drafter give the tokens, logprobs, top logprobs
    and scores of generation without a drafter, and a checkpoint resumes to them."""
    model = windowed if window else tiny[0]
    tok = tiny[1]
    chain = GUIDED[which]
    scales = [{"guidance_scale": s} for s in (1.5, 3.0, 1.0)] if which == 1 else None
    kwargs = {"chain": chain, "max_new_tokens": 24, "seed": 7 + which, "negative_prompt": NEGATIVE, "params": scales}
    kwargs |= {"output_scores": True, "top_logprobs": 2}
    prompts = PROMPTS[:3]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # chain pitfalls (cfg before mirostat)
        reference, gen = run(model, tok, prompts, **kwargs)
        drafter = Scripted(reference_rows(reference, gen), model.config.vocab_size, seed=which, wrong_rate=0.4)
        drafts = [
            {"use": drafter, "adaptive": False},
            {"use": "prompt_lookup", "num_tokens": 4, "adaptive": False},
            {"use": "early_exit", "layers": 1, "num_tokens": 3, "adaptive": False},
        ]
        if not window:
            drafts.append({"use": "draft_model", "model": str(tiny_model_path()), "num_tokens": 4})
        outputs = [run(model, tok, prompts, draft=draft, **kwargs)[0] for draft in drafts]
        again, _ = resumed(model, tok, prompts, 5, draft={"use": "prompt_lookup", "num_tokens": 4}, **kwargs)
        unguided, _ = run(model, tok, prompts, **(kwargs | {"negative_prompt": None, "params": None}))
    for ours in outputs:
        assert_same_outputs(ours, reference)
    assert_same_outputs(again, reference, 5)
    assert int(outputs[0].kept.sum()) > 0 and bool((outputs[0].model_calls < reference.num_generated).any())
    assert unguided.sequences.tolist() != reference.sequences.tolist(), "the negative prompts change the text"


def random_chains(rng: random.Random, tok, batch: int, constrained: float) -> tuple[Any, list[dict]]:
    """A random chain (a grammar or a thinking budget with chance `constrained`) for `batch` prompts, or, a quarter
    of the time where there are several, one per prompt (a mixed batch) -> (generate()'s chain=, each prompt's)."""

    def pick() -> dict:
        return random_chain(rng) if rng.random() >= constrained else rng.choice(constrained_chains(tok))

    chain = pick()
    if batch > 1 and rng.random() < 0.25:
        chains = [chain] + [pick() for _ in range(batch - 1)]
        return chains, chains
    return chain, [chain] * batch


def random_row_params(rng: random.Random, chain: dict, temperatures: bool) -> dict:
    """One request's parameters on `chain`: a seed where it draws at random, and (temperatures=True) a temperature
    where it has a temperature stage: a request sets only what its chain has."""
    selector = chain["samplers"][-1]["use"]
    params: dict[str, Any] = {} if selector == "greedy" else {"seed": rng.randint(0, 999)}
    if temperatures and selector == "dist" and any(s["use"] == "temperature" for s in chain["samplers"]):
        params["temperature"] = rng.choice([0.0, 0.6, 1.2])
    return params


def random_generation(rng: random.Random, tok, batch: int) -> dict:
    """generate()'s settings drawn at random around a random chain, or one per prompt: per-row seeds (and
    temperatures where the chain has a temperature stage), stop strings and a stop pattern, ignore_eos, several
    return sequences, top logprobs (half the time) and scores, another logprobs stage, a phrase ban, a fifth of the
    time classifier-free guidance with a negative prompt per prompt, and a fifth transformers' logits processors."""
    chain, per_prompt = random_chains(rng, tok, batch, constrained=0.3)
    sampling = any(c["samplers"][-1]["use"] == "dist" for c in per_prompt)
    kwargs = {"chain": chain, "max_new_tokens": rng.randint(4, 32)}
    if sampling and rng.random() < 0.5:
        kwargs["params"] = [random_row_params(rng, c, temperatures=True) for c in per_prompt]
    else:
        kwargs["seed"] = rng.randint(0, 999)
    if rng.random() < 0.4:
        kwargs |= {
            "stop_strings": rng.sample([" a", "(", "\n", "return", "is"], 2),
            "include_stop_str_in_output": rng.random() < 0.5,
        }
    options = {
        "stop_regex": ["[0-9]{2}"],
        "ignore_eos": True,
        "num_return_sequences": 2 if sampling else 1,
        "output_scores": True,
        "logprobs_mode": rng.choice(["raw", "processed_logits"]),
        "guards": [{"use": "banned_strings", "phrases": rng.sample(["list", "return", " the", "pear"], 2)}],
    }
    if rng.random() < 0.5:
        kwargs["top_logprobs"] = rng.randint(1, 3)
    kwargs |= {key: value for key, value in options.items() if rng.random() < 0.25}
    if rng.random() < 0.2:
        kwargs |= guided(rng, kwargs["chain"], batch)
    if rng.random() < 0.2:
        forcing = {"grammar", "reasoning_budget"}  # their forced tokens an n-gram ban could mask
        masks = not any(s["use"] in forcing for c in per_prompt for s in c["samplers"])
        kwargs["logits_processor"] = transformers_processors(rng, masks)
    return kwargs


def transformers_processors(rng: random.Random, masks: bool) -> Any:
    """logits_processor=: transformers' repetition penalty, Nudge and (`masks`) transformers' n-gram ban, some of
    them, which read what input_ids the loop shows them at each position."""
    from transformers import LogitsProcessorList, NoRepeatNGramLogitsProcessor, RepetitionPenaltyLogitsProcessor

    pool = [RepetitionPenaltyLogitsProcessor(rng.choice([0.8, 1.3])), Nudge()]
    pool += [NoRepeatNGramLogitsProcessor(3)] if masks else []
    return LogitsProcessorList(rng.sample(pool, rng.randint(1, len(pool))))


def guided(rng: random.Random, chain: Any, batch: int) -> dict:
    """Classifier-free guidance for random_generation's chain (in a mixed batch the first prompt's chain and each
    other's with chance 2/3): cfg first with a random scale, and a negative prompt per prompt."""
    scale = rng.choice([0.5, 1.5, 3.0])

    def with_cfg(c: dict) -> dict:
        return c | {"samplers": [{"use": "cfg", "scale": scale}, *c["samplers"]]}

    if isinstance(chain, list):
        chain = [with_cfg(c) if i == 0 or rng.random() < 2 / 3 else c for i, c in enumerate(chain)]
    else:
        chain = with_cfg(chain)
    return {"chain": chain, "negative_prompt": rng.choices(NEGATIVE, k=batch)}


def assert_same_outputs(ours, reference, resumed_at: int = 0, exact: bool = False):
    """The tokens, and each step's top logprobs and scores while a row goes (after it: -inf, ids 0); a resumed run
    has those of the steps since `resumed_at` (its tokens drawn before the checkpoint carry none: -inf). `exact`:
    the logprobs, top logprobs and scores bit for bit."""
    assert_same_tokens(ours, reference)
    if exact and not resumed_at:
        assert torch.equal(ours.logprobs, reference.logprobs)
    for field in ("top_logprobs", "scores"):
        if getattr(reference, field) is None:
            continue
        steps = getattr(ours, field)
        assert len(steps) == len(getattr(reference, field)) - resumed_at, field
        for step, (mine, theirs) in enumerate(zip(steps, getattr(reference, field)[resumed_at:]), start=resumed_at):
            values, ids = mine if field == "top_logprobs" else (mine, None)
            expected, expected_ids = theirs if field == "top_logprobs" else (theirs, None)
            for b, going in enumerate((step < reference.num_generated).tolist()):
                if not going:
                    assert bool(torch.isneginf(values[b]).all()), (field, step, b)
                    assert ids is None or ids[b].tolist() == [0] * len(ids[b]), (field, step, b)
                    continue
                if resumed_at and bool(torch.isneginf(values[b]).all()):
                    continue  # drawn before the checkpoint
                live = torch.isfinite(expected[b])
                if exact:
                    assert torch.equal(values[b], expected[b]), (field, step, b)
                torch.testing.assert_close(values[b][live], expected[b][live], atol=1e-4, rtol=1e-4)
                assert ids is None or ids[b][live].tolist() == expected_ids[b][live].tolist(), (field, step, b)


def keeps_outputs_of_random_generations(
    model, tok, case: int, seed: int, drafts, drop: tuple[str, ...] = (), exact: bool = False
) -> None:
    """A random generation (random_generation, less the settings in `drop`) of 1-5 prompts, without a drafter and
    with drafts(rng, reference, gen)[case % len], a quarter of them checkpointed and resumed: the same outputs
    (assert_same_outputs; `exact`: bit for bit)."""
    rng = random.Random(seed)
    prompts = rng.choices(PROMPTS, k=rng.randint(1, 5))
    kwargs = random_generation(rng, tok, len(prompts))
    for key in drop:
        kwargs.pop(key, None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # chain pitfalls a random chain may have
        reference, gen = run(model, tok, prompts, **kwargs)
        choices = drafts(rng, reference, gen)
        draft = choices[case % len(choices)]
        if case % 4 == 3:
            stop_after = rng.randint(1, 6)
            ours, _ = resumed(model, tok, prompts, stop_after, draft=draft, **kwargs)
            assert_same_outputs(ours, reference, min(stop_after, len(reference.logprobs[0])), exact=exact)
        else:
            ours, _ = run(model, tok, prompts, draft=draft, **kwargs)
            assert_same_outputs(ours, reference, exact=exact)


def every_drafter(model, case: int):
    """drafts(rng, reference, gen) for keeps_outputs_of_random_generations: each built-in drafter with random
    settings (the model drafters' p_min among them), and a scripted one that knows the reference's tokens and gets 40% of its drafts wrong."""

    def drafts(rng, reference, gen):
        return [
            {
                "use": "prompt_lookup",
                "num_tokens": rng.randint(1, 10),
                "adaptive": rng.random() < 0.5,
                "occurrence": OCCURRENCES[case % len(OCCURRENCES)],
            },
            {
                "use": "draft_model",
                "model": str(tiny_model_path()),
                "num_tokens": rng.randint(1, 6),
                "p_min": rng.choice([0.0, 0.3]),
            },
            {
                "use": "early_exit",
                "layers": rng.randint(1, model.config.num_hidden_layers - 1),
                "p_min": rng.choice([0.0, 0.3]),
            },
            {"use": Scripted(reference_rows(reference, gen), model.config.vocab_size, seed=case, wrong_rate=0.4)},
        ]

    return drafts


@pytest.mark.parametrize("case", range(12))
def test_drafts_keep_the_outputs_of_random_generations(tiny, case):
    """Random chains in random settings (random_generation), B = 1-5, each built-in drafter or a scripted one, a
    quarter of them checkpointed and resumed: the tokens, finish reasons, logprobs, top logprobs and scores of
    generation without a drafter."""
    model, tok = tiny
    keeps_outputs_of_random_generations(model, tok, case, 1000 + case, every_drafter(model, case))


@pytest.mark.parametrize("case", range(8))
def test_with_batch_invariant_passes_drafts_keep_the_outputs_bit_for_bit(tiny, case, monkeypatch):
    """TransformersRunner.batch_invariant: a check gives a one-token step's logits bit for bit, so over random chains
    and settings and every drafter, the logprobs, top logprobs and scores are those of generation without a drafter
    exactly, not only within float32's summation order."""
    from samplechain.generation.model import TransformersRunner

    monkeypatch.setattr(TransformersRunner, "batch_invariant", True)
    model, tok = tiny
    keeps_outputs_of_random_generations(model, tok, case, 4000 + case, every_drafter(model, case), exact=True)


@pytest.mark.parametrize("case", range(4))
def test_with_batch_invariant_passes_drafts_keep_the_outputs_bit_for_bit_on_a_sliding_window(
    tiny, windowed, case, monkeypatch
):
    """The same where the rows advance together (a sliding-window model), without guards."""
    from samplechain.generation.model import TransformersRunner

    monkeypatch.setattr(TransformersRunner, "batch_invariant", True)
    _, tok = tiny

    def drafts(rng, reference, gen):
        rows = reference_rows(reference, gen)
        return [
            {"use": "prompt_lookup", "num_tokens": rng.randint(1, 10), "cost": 0.02},
            {"use": Scripted(rows, windowed.config.vocab_size, seed=case, wrong_rate=0.4), "cost": 0.02},
        ]

    keeps_outputs_of_random_generations(windowed, tok, case, 4100 + case, drafts, drop=("guards",), exact=True)


def test_with_batch_invariant_passes_a_drafting_model_in_half_precision_drafts(tiny, monkeypatch):
    """Batch-invariant passes are the generation's model's: a drafting model needs none (its draws choose drafts,
    which the model checks), so one in bfloat16 drafts, and the outputs are still those without a drafter."""
    from samplechain.generation.model import TransformersRunner
    from samplechain_draft_model import DraftModel

    monkeypatch.setattr(TransformersRunner, "batch_invariant", True)
    model, tok = tiny
    half = copy.deepcopy(model).to(torch.bfloat16)
    kwargs = {"chain": "preset:llama.cpp", "seed": 3, "max_new_tokens": 16, "output_scores": True}
    reference, _ = run(model, tok, PROMPTS[:2], **kwargs)
    ours, _ = run(model, tok, PROMPTS[:2], draft=DraftModel.from_model(half, tok), **kwargs)
    assert_same_outputs(ours, reference, exact=True)
    assert int(ours.drafted.sum()) > 0


@pytest.mark.parametrize("case", [1, 2, 4, 5])
def test_with_batch_invariant_passes_scoring_gives_a_generations_logprobs_bit_for_bit(tiny, case, monkeypatch):
    """score() of a random generation's tokens in chunks of several tokens, all or three (a pass of several tokens a
    row): every token kept, with the generation's logprob bit for bit."""
    from samplechain.generation.model import TransformersRunner

    monkeypatch.setattr(TransformersRunner, "batch_invariant", True)
    model, tok = tiny
    scoring_keeps_a_random_generation(model, tok, case, 4200 + case, exact=True)


@pytest.mark.parametrize("case", range(8))
def test_a_stream_with_drafts_emits_the_events_of_one_without_over_random_generations(tiny, case):
    """stream() of a random generation (random_generation: stop strings and patterns, guards, several return
    sequences ...) with each drafter emits event for event what it emits without one: no token taken back is
    shown, no text held back differently; its final output is the generate() one's."""
    model, tok = tiny
    rng = random.Random(60000 + case)
    prompts = rng.choices(PROMPTS, k=rng.randint(1, 4))
    kwargs = random_generation(rng, tok, len(prompts)) | {"pad_token_id": 0}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # chain pitfalls a random chain may have
        plain = list(stream(model, tok, prompts, **kwargs))
        reference, gen = run(model, tok, prompts, **{k: v for k, v in kwargs.items() if k != "pad_token_id"})
        choices = every_drafter(model, case)(rng, reference, gen)
        out: list = []
        drafted = list(stream(model, tok, prompts, draft=choices[case % len(choices)], result=out, **kwargs))
    assert drafted == plain
    assert_same_outputs(out[0], reference)


@pytest.fixture(scope="module")
def tiny_on_gpu(tiny):
    """The tiny model in float32 on the GPU (a copy: the shared tiny model stays on the CPU for the other tests)."""
    model, tok = tiny
    return copy.deepcopy(model).to("cuda"), tok


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("case", range(8))
def test_on_a_gpu_drafts_keep_the_outputs_of_random_generations(tiny_on_gpu, case):
    """As on the CPU, on CUDA tensors in float32: the chains on the cuda backend (its Triton kernels), the plain
    loop's steps replayed from a CUDA graph where the chain allows one, the checks drawing each position eagerly."""
    model, tok = tiny_on_gpu
    keeps_outputs_of_random_generations(model, tok, case, 30000 + case, every_drafter(model, case))


@pytest.mark.llama_cpp
@pytest.mark.slow
@pytest.mark.parametrize("case", range(8))
def test_on_llama_cpp_drafts_keep_the_outputs_of_random_generations(smollm, case):
    """As on transformers, on the llama.cpp runner (each row its own sequence): prompt lookup and a scripted
    drafter, cheap enough to draft at most positions."""
    model, tok = smollm

    def drafts(rng, reference, gen):
        lookup = {"use": "prompt_lookup", "num_tokens": rng.randint(1, 10), "adaptive": rng.random() < 0.5}
        rows = reference_rows(reference, gen)
        scripted = Scripted(rows, model.config.vocab_size, seed=case, wrong_rate=0.4)
        return [
            lookup | {"occurrence": OCCURRENCES[case % len(OCCURRENCES)], "cost": 0.05},
            {"use": scripted, "cost": 0.05},
        ]

    keeps_outputs_of_random_generations(model, tok, case, 7000 + case, drafts)


@pytest.fixture(scope="module")
def windowed():
    """The tiny llama with a sliding window of 16 tokens."""
    return tiny_llama(sliding_window=16)


@pytest.mark.parametrize("case", range(12))
def test_on_a_sliding_window_model_drafts_keep_the_outputs_of_random_generations(tiny, windowed, case):
    """As above where the rows advance together (a sliding window: the runner cuts every row to one length, so a
    call ends where any row's draw differs), without guards, which need rows cut on their own."""
    _, tok = tiny
    model = windowed

    def drafts(rng, reference, gen):
        rows = reference_rows(reference, gen)
        return [
            {"use": "prompt_lookup", "num_tokens": rng.randint(1, 10), "adaptive": rng.random() < 0.5, "cost": 0.02},
            {"use": Scripted(rows, model.config.vocab_size, seed=case, wrong_rate=0.4), "cost": 0.02},
            {"use": "early_exit", "layers": 1, "num_tokens": 3, "cost": 0.0},
        ]

    keeps_outputs_of_random_generations(model, tok, case, 20000 + case, drafts, drop=("guards",))


@pytest.mark.parametrize("case", range(16))
def test_scoring_a_random_generations_tokens_keeps_each_with_its_logprob(tiny, case):
    """score() of what a random chain (a grammar, a thinking budget, penalties, mirostat ...) generated, with the
    same seeds, in one pass, in chunks or in one-token steps: every token kept, with the generation's logprob at
    the same stage (bit for bit in steps)."""
    model, tok = tiny
    scoring_keeps_a_random_generation(model, tok, case, 9000 + case)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("case", range(6))
def test_on_a_gpu_scoring_a_random_generations_tokens_keeps_each_with_its_logprob(tiny_on_gpu, case):
    """As on the CPU, the model and its chains on CUDA tensors in float32."""
    model, tok = tiny_on_gpu
    scoring_keeps_a_random_generation(model, tok, case, 40000 + case)


def scoring_keeps_a_random_generation(model, tok, case: int, seed: int, exact: bool = False) -> None:
    """A random chain's generation (or one chain per prompt's) of 1-4 prompts (per-row or one seed, a random logprobs
    stage, several return sequences, a fifth of the time classifier-free guidance and a fifth transformers' logits
    processors), then score() of its tokens with
    chunks of 1, all or 3 (by case): each token kept, with the generation's logprob (`exact`: bit for bit at every
    chunk size)."""
    rng = random.Random(seed)
    prompts = rng.choices(PROMPTS, k=rng.randint(1, 4))
    chain, per_prompt = random_chains(rng, tok, len(prompts), constrained=0.4)
    kwargs: dict[str, Any] = {"chain": chain, "pad_token_id": 0}
    sampling = any(c["samplers"][-1]["use"] == "dist" for c in per_prompt)
    if rng.random() < 0.5 and any(c["samplers"][-1]["use"] != "greedy" for c in per_prompt):
        kwargs["params"] = [random_row_params(rng, c, temperatures=False) for c in per_prompt]
    else:
        kwargs["seed"] = rng.randint(0, 999)
    mode = rng.choice(["processed", "raw", "processed_logits"])
    n = 2 if sampling and rng.random() < 0.3 else 1
    chunk = [1, None, 3][case % 3]
    if rng.random() < 0.2:
        kwargs |= guided(rng, chain, len(prompts))
    if rng.random() < 0.2:
        masks = not any(s["use"] in ("grammar", "reasoning_budget") for c in per_prompt for s in c["samplers"])
        kwargs["logits_processor"] = transformers_processors(rng, masks)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # chain pitfalls a random chain may have
        out = generate(
            model, tok, prompts, max_new_tokens=rng.randint(3, 20), logprobs_mode=mode, num_return_sequences=n, **kwargs
        )
        rows = [
            out.sequences[b, out.prompt_length : out.prompt_length + int(k)].tolist()
            for b, k in enumerate(out.num_generated)
        ]
        got = score(model, tok, prompts, rows, logprobs_at=mode, chunk_size=chunk, num_return_sequences=n, **kwargs)
    scored: dict[tuple[str, int | None], Any] = {}

    def rescored(at: str, size: int | None) -> Any:
        if (at, size) not in scored:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                scored[(at, size)] = score(
                    model, tok, prompts, rows, logprobs_at=at, chunk_size=size, num_return_sequences=n, **kwargs
                )
        return scored[(at, size)]

    for b, row in enumerate(rows):
        want = out.logprobs[b, : len(row)].cpu()
        assert got.token_ids[b].tolist() == row
        if chunk == 1 or exact:
            assert bool(got.kept[b].all()), (b, got.kept[b], chain)
            assert torch.equal(got.logprobs[b].cpu(), want), (b, chain)
            continue
        apart = (got.logprobs[b].cpu() - want).abs() > 1e-4
        if bool(apart.any()):
            # a filter's edge (a token at typical's or top-p's cut) that a pass's summation order moved: the processed
            # logprobs of that position move by about that token's share of what the filter keeps, while the model's
            # own agree as closely as elsewhere, and one-token steps, the generation's own passes, give its logprobs;
            # a near tie, so one position in a row
            assert int(apart.sum()) == 1, (b, got.logprobs[b], want, chain)
            raw, raw_steps = rescored("raw", chunk).logprobs[b].cpu(), rescored("raw", 1).logprobs[b].cpu()
            torch.testing.assert_close(raw, raw_steps, atol=1e-4, rtol=0)
            assert torch.equal(rescored(mode, 1).logprobs[b].cpu(), want), (b, chain)
        if not bool(got.kept[b].all()):
            # a near tie that a pass's summation order flipped (about 1e-5 on the logprobs; guidance scales it): at
            # most one in a row, and one-token steps, the generation's own passes, keep it
            assert int((~got.kept[b]).sum()) == 1, (b, got.kept[b], chain)
            assert bool(rescored(mode, 1).kept[b].all()), (b, rescored(mode, 1).kept[b], chain)


@pytest.mark.llama_cpp
@pytest.mark.slow
@pytest.mark.parametrize(
    "load",
    [
        pytest.param({"n_threads": 1, "n_threads_batch": 1}, id="one-thread"),
        pytest.param({"n_threads": 2, "n_threads_batch": 2, "type_k": 8, "type_v": 8}, id="two-threads-q8_0-cache"),
    ],
)
def test_on_llama_cpp_past_256_tokens_the_tokens_stay_exact(open_gguf, load):
    """Past 256 tokens of a sequence, llama.cpp's one-token decode on several threads with a float16 KV cache splits
    its attention over the threads, which a decode of several tokens does not (docs/speculative.md). On one thread,
    or with a Q8_0 KV cache (GGML_TYPE_Q8_0 = 8: no split) on two, the two agree and the tokens are exact."""
    model, tok = open_gguf(n_ctx=2048, flash_attn=True, **load)
    asks = long_code_asks()
    for chain, rows in (("preset:greedy", asks[:1]), ("preset:llama.cpp", asks)):
        kwargs = {"chain": chain, "max_new_tokens": 40, "seed": 2}
        reference, gen = run(model, tok, rows, **kwargs)
        assert gen.attention_mask.shape[1] > 256
        with warnings.catch_warnings():
            warnings.simplefilter("error", GenerationWarning)  # exact here: nothing to warn about
            ours, _ = run(model, tok, rows, draft="prompt_lookup", **kwargs)
        assert_same_tokens(ours, reference)
        assert int(ours.kept.sum()) > 0


def long_code_asks(n: int = 2) -> list[list[dict]]:
    """Requests to rename a variable in a 24-line function (prompts of ~370 tokens), which SmolLM2 copies."""
    code = "\n".join(f"    total_{i} = values[{i}] * factor + offset" for i in range(24))
    ask = "Rewrite this Python function with the variable `{}` renamed to `{}` everywhere. Reply with the whole "
    ask += f"function only.\n\n```python\ndef compute(values, factor, offset):\n{code}\n```"
    names = (("factor", "scale"), ("offset", "shift"), ("values", "items"), ("factor", "weight"))
    return [[{"role": "user", "content": ask.format(*pair)}] for pair in names[:n]]


@pytest.mark.slow
@pytest.mark.parametrize("case", range(2))
def test_on_the_default_model_batch_invariant_passes_keep_every_bit_alone_in_a_batch_and_with_drafts(case, monkeypatch):
    """SmolLM2-135M-Instruct on transformers with TransformersRunner.batch_invariant: a random chain's generation of
    three ~370-token requests that copy their prompt gives, with prompt lookup and with a drafter that gets 30% of
    its tokens wrong, the tokens, logprobs and scores of generation without a drafter bit for bit; and the first
    request alone gives them too."""
    from samplechain.generation.model import TransformersRunner
    from samplechain.models import load_model

    monkeypatch.setattr(TransformersRunner, "batch_invariant", True)
    model, tok = load_model()
    rng = random.Random(700 + case)
    chain, prompts = random_chain(rng), long_code_asks(3)
    kwargs = {"chain": chain, "max_new_tokens": 24, "seed": 70 + case, "output_scores": True}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # chain pitfalls a random chain may have
        reference, gen = run(model, tok, prompts, **kwargs)
        looked_up, _ = run(model, tok, prompts, draft={"use": "prompt_lookup", "cost": 0.02}, **kwargs)
        drafter = Scripted(reference_rows(reference, gen), len(tok), seed=case, longest=8, wrong_rate=0.3)
        scripted, _ = run(model, tok, prompts, draft={"use": drafter, "cost": 0.02}, **kwargs)
        alone, _ = run(model, tok, prompts[:1], **kwargs)
    assert_same_outputs(looked_up, reference, exact=True)
    assert_same_outputs(scripted, reference, exact=True)
    assert int(scripted.kept.sum()) > 0, chain
    n = int(reference.num_generated[0])
    assert int(alone.num_generated[0]) == n and alone.texts[0] == reference.texts[0]
    assert torch.equal(alone.logprobs[0, :n], reference.logprobs[0, :n])


@pytest.mark.llama_cpp
@pytest.mark.slow
@pytest.mark.parametrize("case", range(4))
def test_on_llama_cpp_random_chains_past_256_tokens_keep_the_tokens(open_gguf, case):
    """Two threads and a Q8_0 KV cache: random chains (penalties, DRY, mirostat, xtc, filters), B = 1-4, prompt
    lookup at random lengths and a drafter with wrong tokens at random places, on sequences past 256 tokens. (A
    chain that writes no text of the prompt leaves prompt lookup nothing to find: the other drafter always drafts.)"""
    model, tok = open_gguf(n_ctx=4096, flash_attn=True, n_threads=2, n_threads_batch=2, type_k=8, type_v=8)
    rng = random.Random(500 + case)
    chain, prompts = random_chain(rng), long_code_asks(1 + case)
    kwargs = {"chain": chain, "max_new_tokens": 32, "seed": 40 + case}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # chain pitfalls a random chain may have
        reference, gen = run(model, tok, prompts, **kwargs)
        draft = {"use": "prompt_lookup", "num_tokens": rng.randint(2, 10), "cost": 0.02}  # cheap: drafts often
        looked_up, _ = run(model, tok, prompts, draft=draft, **kwargs)
        drafter = Scripted(
            reference_rows(reference, gen), model.config.vocab_size, seed=case, longest=8, wrong_rate=0.3
        )
        scripted, _ = run(model, tok, prompts, draft={"use": drafter, "cost": 0.02}, **kwargs)
    assert gen.attention_mask.shape[1] > 256
    assert_same_tokens(looked_up, reference)
    assert_same_tokens(scripted, reference)
    assert int(scripted.kept.sum()) > 0, chain


@pytest.mark.llama_cpp
@pytest.mark.slow
def test_on_llama_cpp_drafts_warn_once_where_a_check_is_not_a_step(open_gguf):
    """Where a check of drafted tokens runs other attention code than one-token steps (no flash attention; past
    256 tokens on two threads with a float16 KV cache), a generation that drafts says so, once a model."""

    def said(model, tok, prompts):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = generate(model, tok, prompts, chain="preset:greedy", max_new_tokens=16, draft="prompt_lookup")
        assert int(out.drafted.sum()) > 0
        return [str(w.message) for w in caught if issubclass(w.category, GenerationWarning)]

    two = {"n_ctx": 2048, "n_threads": 2, "n_threads_batch": 2}
    model, tok = open_gguf(**two)  # flash attention: load_gguf's default
    assert said(model, tok, QUOTING) == []
    (split,) = said(model, tok, long_code_asks())
    assert "on 2 threads with a float KV cache" in split and "GGML_TYPE_Q8_0 or n_threads=1" in split
    assert said(model, tok, long_code_asks()) == []  # once a model
    model, tok = open_gguf(**two, type_k=8, type_v=8)  # Q8_0
    assert said(model, tok, long_code_asks()) == []
    model, tok = open_gguf(n_ctx=512, flash_attn=False)
    (no_flash,) = said(model, tok, QUOTING)
    assert "without flash attention" in no_flash and "flash_attn=True" in no_flash


def half_precision_warnings(call) -> list[str]:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        call()
    return [str(w.message) for w in seen if "rounds its products" in str(w.message)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_half_precision_model_that_checks_several_tokens_warns_once(tiny, dtype):
    """A model in bfloat16 or float16 rounds a pass of several tokens otherwise than one-token steps: its first
    generation that checks drafts (and its first scoring) says the tokens can change and names float32, once a
    model; a float32 model and a half-precision drafting model say nothing."""
    model, tok = tiny
    half, other, drafter = (copy.deepcopy(model).to(dtype) for _ in range(3))
    lookup = {"use": "prompt_lookup", "num_tokens": 4, "adaptive": False}

    def drafting(m, draft=lookup):
        return lambda: generate(m, tok, PROMPTS[:2], max_new_tokens=12, pad_token_id=0, draft=draft)

    (message,) = half_precision_warnings(drafting(half))
    assert str(dtype) in message and "dtype=torch.float32" in message
    assert half_precision_warnings(drafting(half)) == []  # once a model
    assert len(half_precision_warnings(lambda: score(other, tok, PROMPTS[:1], [[5, 6, 7]]))) == 1
    assert half_precision_warnings(drafting(model)) == []
    assert half_precision_warnings(drafting(model, {"use": "draft_model", "model": drafter, "adaptive": False})) == []


@pytest.mark.parametrize("batch", [1, 3])
def test_a_sliding_window_model_speculates_past_its_window(tiny, batch):
    """Drafts taken back after the sequence passed a sliding window: the cache was cut back past states the
    window had dropped (transformers' crop refused). The target's cache keeps them while drafts are checked, and
    early_exit's cache, whose deeper layers it never fills, is cut layer by layer."""
    from samplechain_draft_model import DraftModel

    _, tok = tiny
    model = tiny_llama(sliding_window=16)
    chain = {"samplers": [{"use": "penalties", "repeat": 1.2}, {"use": "temperature", "t": 0.7}, {"use": "dist"}]}
    kwargs = {"chain": chain, "seed": 4, "max_new_tokens": 40, "ignore_eos": True}
    reference, _ = run(model, tok, PROMPTS[:batch], **kwargs)
    drafts = [
        {"use": "prompt_lookup", "adaptive": False},
        {"use": "early_exit", "layers": 2, "num_tokens": 4, "cost": 0.0},
        {"use": DraftModel.from_model(model, tok, num_tokens=4), "adaptive": False},
    ]
    for draft in drafts:
        with warnings.catch_warnings():
            warnings.simplefilter("error", GenerationWarning)  # no drafter switched off
            ours, _ = run(model, tok, PROMPTS[:batch], draft=draft, **kwargs)
        assert_same_tokens(ours, reference)
    assert int(ours.kept.sum()) > 0


def test_a_sliding_window_model_resumes_a_speculative_generation(tiny):
    """The resume's replay is cut back by one token before the first draw: past the window, its cache keeps what
    that needs."""
    _, tok = tiny
    model = tiny_llama(sliding_window=16)
    kwargs = {"chain": "preset:greedy", "max_new_tokens": 30, "ignore_eos": True}
    kwargs |= {"draft": {"use": "prompt_lookup", "adaptive": False}}
    reference, _ = run(model, tok, PROMPTS[:1], **kwargs)
    assert_same_tokens(resumed(model, tok, PROMPTS[:1], 5, **kwargs)[0], reference)
