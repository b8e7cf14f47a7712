"""Speculative decoding's `rejection` mode: the drafted token kept with probability min(1, p / q), else a draw from
the residual, gives the chain's distribution p whatever q the drafter draws its guesses from (chi-square, with the
power to see a 1% bias); seeded, batch-invariant, and equal to `match` on greedy chains."""

from __future__ import annotations

import warnings

import pytest
import torch
from scipy import stats

from samplechain import ConfigError
from samplechain.drafters import Draft, Drafter
from samplechain.errors import GenerationWarning
from samplechain.generation import generate
from samplechain.generation.speculative import rejection_draw
from samplechain.models import tiny_model_path

transformers = pytest.importorskip("transformers")

P = torch.tensor([0.30, 0.25, 0.20, 0.15, 0.07, 0.03], dtype=torch.float64)
N = 400_000


def draws(q_row: torch.Tensor, position: int = 0) -> torch.Tensor:
    """N requests (seeds 0..N-1), each testing a guess drawn from the drafter's q under p = P; -> the count of each
    token that comes out."""
    logp = P.log().expand(N, -1)
    q = q_row.to(torch.float64).expand(N, -1)
    guesses = torch.multinomial(q_row.double(), N, replacement=True, generator=torch.Generator().manual_seed(0))
    tokens = rejection_draw(logp, q, guesses, torch.arange(N, dtype=torch.int64), torch.full((N,), position))
    return torch.bincount(tokens, minlength=len(P)).double()


def chi2_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    return float(stats.chisquare(counts.numpy(), (probs * counts.sum()).numpy()).pvalue)


@pytest.mark.parametrize(
    "q",
    [
        torch.tensor([0.0, 0.0, 1.0, 0.0, 0.0, 0.0]),  # a certain guess (prompt lookup's)
        torch.tensor([0.05, 0.05, 0.05, 0.05, 0.2, 0.6]),  # a drafter that overrates rare tokens
        torch.tensor([0.3, 0.25, 0.2, 0.15, 0.07, 0.03]),  # q = p: every guess kept
        torch.tensor([0.0, 0.6, 0.4, 0.0, 0.0, 0.0]),
    ],
)
def test_rejection_gives_the_chains_distribution_whatever_the_drafter(q):
    counts = draws(q)
    assert chi2_pvalue(counts, P) > 1e-3, counts / N
    biased = P.clone()  # one percent of the mass moved between two tokens: the same test must see it
    biased[0] += 0.01
    biased[1] -= 0.01
    assert chi2_pvalue(counts, biased) < 1e-6


def test_rejection_noise_is_seeded_and_per_position():
    q = torch.tensor([0.05, 0.05, 0.05, 0.05, 0.2, 0.6])
    a, b = draws(q, position=3), draws(q, position=3)
    assert torch.equal(a, b)
    assert not torch.equal(a, draws(q, position=4))


# ----------------------------------------------------------------- through generate()
@pytest.fixture(scope="module")
def tiny():
    path = tiny_model_path()
    model = transformers.AutoModelForCausalLM.from_pretrained(path, local_files_only=True).eval()
    return model, transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)


class Guess(Drafter):
    """Draws its guess from q, uniform over a few tokens, and says so (Draft.probs)."""

    name = "guess"

    def __init__(self, among: list[int], extra: int = 0):
        super().__init__()
        self.among, self.extra, self.rng = among, extra, torch.Generator().manual_seed(0)

    def start(self, rows, context):
        self.q = torch.zeros(context.vocab_size + self.extra, dtype=torch.float64)  # wider than the logits: padding
        self.q[self.among] = 1.0 / len(self.among)

    def propose(self, row, tokens, limit):
        guess = torch.multinomial(self.q, 1, generator=self.rng)
        return Draft(guess, self.q[None])


def first_two(out) -> list[tuple[int, int]]:
    new = out.sequences[:, -out.logprobs.shape[1] :]
    return [tuple(r) for r in new[:, :2].tolist()]


@pytest.mark.parametrize(("extra", "guided"), [(0, False), (64, False), (0, True)], ids=["plain", "padded", "cfg"])
def test_rejection_mode_samples_the_chain_through_generate(tiny, extra, guided):
    """The second token (the first drafted position) of 3000 seeded rows: the joint distribution of the first two
    tokens equals generation without a drafter's (a two-sample chi-square), also where the drafter's
    probabilities have more columns than the model's logits (a padded vocabulary), and under classifier-free
    guidance (p: the guided distribution)."""
    from samplechain.generation import Generation
    from samplechain.generation.speculative import Speculation

    model, tok = tiny
    chain = {"samplers": [{"use": "top_k", "k": 3}, {"use": "dist"}]}
    kwargs = {"chain": chain, "max_new_tokens": 3, "num_return_sequences": 3000, "pad_token_id": 0}
    if guided:
        chain["samplers"].insert(0, {"use": "cfg", "scale": 3.0})
        kwargs["negative_prompt"] = "A list"
    reference = generate(model, tok, ["The"], seed=1, **kwargs)
    gen = Generation(model, tok, ["The"], seed=100_000, **kwargs)
    seconds = torch.tensor([b for _, b in first_two(reference)])
    common = torch.bincount(seconds).topk(3).indices.tolist()  # q puts mass where p does, and on one it does not
    gen.speculation = Speculation([Guess([*common, 5], extra)] * 3000, gen, mode="rejection")
    for _ in gen.steps():
        pass
    ours = gen.output()
    pairs = sorted(set(first_two(reference)) | set(first_two(ours)))
    table = [[first_two(out).count(p) for p in pairs] for out in (reference, ours)]
    assert stats.chi2_contingency(table).pvalue > 1e-3, table
    assert int(ours.drafted.sum()) == 3000 and 0 < int(ours.kept.sum()) < 3000


def test_rejection_mode_is_match_on_a_greedy_chain_and_batch_invariant(tiny):
    model, tok = tiny
    prompts = ["In Python,", "A list is"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        greedy = generate(model, tok, prompts, chain="preset:greedy", max_new_tokens=12, pad_token_id=0)
        drafted = generate(
            model,
            tok,
            prompts,
            chain="preset:greedy",
            max_new_tokens=12,
            pad_token_id=0,
            draft={"use": "prompt_lookup", "mode": "rejection"},
        )
    assert drafted.sequences.tolist() == greedy.sequences.tolist()
    chain = {"samplers": [{"use": "temperature", "t": 0.9}, {"use": "dist"}]}
    # the same drafts alone and in the batch: lengths chosen from timed calls could differ, and other drafts give
    # other draws of the same distribution
    draft = {"use": "prompt_lookup", "num_tokens": 3, "adaptive": False, "mode": "rejection"}
    both = generate(model, tok, prompts, chain=chain, seed=5, max_new_tokens=12, pad_token_id=0, draft=draft)
    alone = generate(model, tok, prompts[1:], chain=chain, params=[{"seed": 5}], max_new_tokens=12, draft=draft)
    assert both.texts[1] == alone.texts[0]


def test_rejection_mode_samples_each_rows_chain_in_a_mixed_batch(tiny):
    """One chain per prompt: each prompt's first two tokens over 1500 seeded rows follow its own chain's
    distribution (a two-sample chi-square against generation without a drafter), the test drawing each row's
    p through its chain and its noise from its chain's seed."""
    from samplechain.generation import Generation
    from samplechain.generation.speculative import Speculation

    model, tok = tiny
    chains = [
        {"samplers": [{"use": "top_k", "k": 3}, {"use": "dist"}]},
        {"samplers": [{"use": "temperature", "t": 0.6}, {"use": "top_k", "k": 5}, {"use": "dist"}]},
    ]
    n = 1500
    kwargs = {"chain": chains, "max_new_tokens": 3, "num_return_sequences": n, "pad_token_id": 0}
    reference = generate(model, tok, ["The", "The"], seed=1, **kwargs)
    gen = Generation(model, tok, ["The", "The"], seed=100_000, **kwargs)
    seconds = torch.tensor([b for _, b in first_two(reference)])
    common = torch.bincount(seconds).topk(3).indices.tolist()
    gen.speculation = Speculation([Guess([*common, 5])] * (2 * n), gen, mode="rejection")
    for _ in gen.steps():
        pass
    ours = gen.output()
    for prompt in range(2):
        rows = slice(prompt * n, (prompt + 1) * n)
        theirs, mine = first_two(reference)[rows], first_two(ours)[rows]
        pairs = sorted(set(theirs) | set(mine))
        table = [[part.count(p) for p in pairs] for part in (theirs, mine)]
        assert stats.chi2_contingency(table).pvalue > 1e-3, (prompt, table)
        assert 0 < int(ours.kept[rows].sum()) < n
    # the two chains' second tokens differ (temperature 0.6 sharpens): the test tells them apart
    split = [[first_two(ours)[i * n : (i + 1) * n].count(p) for p in sorted(set(first_two(ours)))] for i in range(2)]
    assert stats.chi2_contingency(split).pvalue < 1e-6


def test_rejection_mode_in_a_mixed_batch_gives_each_prompt_what_it_gives_alone(tiny):
    """Seeded rejection draws are batch-invariant in a mixed batch too (fixed draft lengths: the same drafts); a
    greedy chain's rows take the match, and a row whose chain ends in a selector of its own is refused, naming its
    prompt."""
    model, tok = tiny
    sampled = {"samplers": [{"use": "top_k", "k": 30}, {"use": "temperature", "t": 0.9}, {"use": "dist"}]}
    penalised = {"samplers": [{"use": "penalties", "repeat": 1.2}, {"use": "min_p", "p": 0.05}, {"use": "dist"}]}
    chains = [sampled, "preset:greedy", penalised]
    prompts = [
        "def add(a, b):\n    return a + b\n\ndef add(a, b):",
        "The list is: apple, pear, plum. Again: apple,",
        "A list is a list is a",
    ]
    draft = {"use": Next(), "mode": "rejection", "adaptive": False}
    params = [{"seed": 11}, {}, {"seed": 33}]
    kwargs = {"max_new_tokens": 12, "draft": draft, "pad_token_id": 0}
    both = generate(model, tok, prompts, chain=chains, params=params, **kwargs)
    greedy = generate(model, tok, prompts[1], chain="preset:greedy", max_new_tokens=12, pad_token_id=0)
    assert both.texts[1] == greedy.texts[0]
    for i, chain in enumerate(chains):
        alone = generate(model, tok, prompts[i], chain=chain, params=[params[i]], **kwargs)
        assert both.texts[i] == alone.texts[0], i
        assert (int(both.drafted[i]), int(both.kept[i])) == (int(alone.drafted[0]), int(alone.kept[0])), i
    assert all(both.drafted > 0)
    mirostat = {"samplers": [{"use": "mirostat", "tau": 5.0}]}
    with pytest.raises(ConfigError, match=r"rejection.*prompt 1's chain's selector mirostat.*end the chain in dist"):
        generate(model, tok, prompts[:2], chain=[sampled, mirostat], **kwargs)


@pytest.mark.parametrize("stage", ["raw", "top_k", ["penalties", "raw:logits"]])
def test_rejection_mode_reports_logprobs_at_any_stage(tiny, stage):
    """logprobs_mode other than the processed distribution the test draws from: the same tokens (the stage never
    changes them), each token's logprob at that stage as score() gives it for the same tokens through the same
    chain; one stage for the batch, or one per prompt, in a mixed batch too."""
    from samplechain.generation import score

    model, tok = tiny
    prompts = ["def add(a, b):\n    return a + b\n\ndef add(a, b):", "A list is a list is a"]
    sampled = {"samplers": [{"use": "penalties", "repeat": 1.3}, {"use": "top_k", "k": 8}, {"use": "dist"}]}
    chain = sampled if isinstance(stage, str) else [sampled, {"samplers": [sampled["samplers"][0], {"use": "dist"}]}]
    draft = {"use": "prompt_lookup", "num_tokens": 3, "mode": "rejection", "adaptive": False}
    kwargs = {"chain": chain, "params": [{"seed": 7}, {"seed": 8}], "max_new_tokens": 16, "pad_token_id": 0}
    processed = generate(model, tok, prompts, draft=draft, **kwargs)
    out = generate(model, tok, prompts, draft=draft, logprobs_mode=stage, **kwargs)
    assert out.sequences.tolist() == processed.sequences.tolist()
    assert int(out.drafted.sum()) > 0
    lengths = out.num_generated.tolist()
    new = [row[-out.logprobs.shape[1] :][:n].tolist() for row, n in zip(out.sequences, lengths)]
    scored = score(model, tok, prompts, new, logprobs_at=stage, chain=chain, params=kwargs["params"], pad_token_id=0)
    for i, n in enumerate(lengths):
        torch.testing.assert_close(out.logprobs[i, :n], scored.logprobs[i], rtol=1e-5, atol=1e-5)
    assert not torch.equal(out.logprobs, processed.logprobs)


def test_rejection_mode_refuses_a_selector_with_a_distribution_of_its_own(tiny):
    model, tok = tiny
    with pytest.raises(ConfigError, match=r"rejection.*mirostat.*end the chain in dist"):
        generate(
            model,
            tok,
            ["Hi"],
            chain={"samplers": [{"use": "mirostat", "tau": 5.0}]},
            max_new_tokens=2,
            draft={"use": "prompt_lookup", "mode": "rejection"},
        )
    out = generate(
        model,
        tok,
        ["Hi"],
        chain="preset:llama.cpp",
        max_new_tokens=2,
        logprobs_mode=["processed"],
        draft={"use": "prompt_lookup", "mode": "rejection"},
    )
    assert out.num_generated.tolist() == [2]


class Next(Drafter):
    """Guesses the last token's successor id, every position: a certain guess the model hardly ever draws."""

    name = "next"

    def propose(self, row, tokens, limit):
        return [int(tokens[-1]) + 1] * limit


def test_rejection_mode_tests_against_what_the_logits_processor_leaves(tiny):
    model, tok = tiny
    allowed = tok.encode(" the")[0]

    def only_the(input_ids, scores):
        out = torch.full_like(scores, float("-inf"))
        out[:, allowed] = 0.0
        return out

    chain = {"samplers": [{"use": "temperature", "t": 1.0}, {"use": "dist"}]}
    draft = {"use": Next(), "mode": "rejection", "adaptive": False}
    out = generate(model, tok, ["Hi"], chain=chain, seed=3, max_new_tokens=10, logits_processor=only_the, draft=draft)
    assert out.sequences[0, -10:].tolist() == [allowed] * 10
    assert int(out.drafted[0]) > 0


@pytest.mark.parametrize("occurrence", ["first", "switch"])
def test_a_resumed_rejection_generation_gives_the_same_tokens_for_the_same_drafts(tiny, occurrence):
    """Fixed draft lengths: the resumed run drafts where the whole run did, and what it drafts (prompt_lookup's
    choice of occurrence per row goes into the checkpoint), so the test draws the same tokens."""
    import json

    from samplechain.generation import Generation

    model, tok = tiny
    prompts = [
        "def add(a, b):\n    return a + b\n\ndef add(a, b):",
        "The list is: apple, pear, plum. Again: apple,",
        "In Python,",
        "A list is a list is a",
    ]
    chain = {
        "samplers": [{"use": "penalties", "repeat": 1.2}, {"use": "top_k", "k": 30}, {"use": "temperature", "t": 0.9}]
        + [{"use": "dist"}]
    }
    draft = {"use": "prompt_lookup", "num_tokens": 4, "mode": "rejection", "adaptive": False, "occurrence": occurrence}
    kwargs = {"chain": chain, "max_new_tokens": 30, "draft": draft, "pad_token_id": 0}
    params = [{"seed": 11}, {"seed": 22}, {"seed": 33}, {"seed": 44}]
    whole = generate(model, tok, prompts, params=params, **kwargs)
    assert int(whole.drafted.sum()) > 0
    for stop_after in (1, 7, 8, 15):
        gen = Generation(model, tok, prompts, params=params, **kwargs)
        for i, _ in enumerate(gen.steps(), start=1):
            if i == stop_after:
                break
        again = Generation(model, tok, resume=json.loads(json.dumps(gen.checkpoint())), **kwargs)
        for _ in again.steps():
            pass
        out = again.output()
        assert out.sequences.tolist() == whole.sequences.tolist(), stop_after
        assert out.model_calls.tolist() == whole.model_calls.tolist(), stop_after


class BadProbs(Drafter):
    """Guesses the last token's successor with a Draft.probs that is no distribution of its guess."""

    name = "bad_probs"

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind

    def start(self, rows, context):
        self.vocab = context.vocab_size

    def propose(self, row, tokens, limit):
        guess = int(tokens[-1]) + 1
        probs = torch.zeros((1, self.vocab), dtype=torch.float64)
        probs[0, guess] = 1.0
        if self.kind == "nan":
            probs[0, 0] = float("nan")
        elif self.kind == "negative":
            probs[0, 0] = -0.5
        elif self.kind == "unnormalised":
            probs[0, 0] = 1.0
        elif self.kind == "narrow":
            probs = probs[:, :guess]
        elif self.kind == "no-chance":
            probs[0, guess], probs[0, guess - 1] = 0.0, 1.0
        return Draft([guess], probs)


@pytest.mark.parametrize("kind", ["nan", "negative", "unnormalised", "narrow", "no-chance"])
def test_a_draft_whose_probs_are_no_distribution_of_it_is_switched_off(tiny, kind):
    """The rejection test divides by q(guess) and draws from p - q: a Draft.probs that is not finite, negative, not
    summing to 1 or without mass on its guess would bias it (always keep the guess, or draw a filtered token), so
    the drafter is switched off for the row and the row draws as without a drafter."""
    model, tok = tiny
    kwargs = {"chain": {"samplers": [{"use": "top_k", "k": 3}, {"use": "dist"}]}, "max_new_tokens": 6, "seed": 4}
    reference = generate(model, tok, ["The"], pad_token_id=0, **kwargs)
    with pytest.warns(GenerationWarning, match=r"bad_probs\.v1 failed on row 0 \(ValueError: Draft\.probs"):
        ours = generate(
            model, tok, ["The"], pad_token_id=0, draft={"use": BadProbs(kind), "mode": "rejection"}, **kwargs
        )
    assert ours.sequences.tolist() == reference.sequences.tolist()
    assert int(ours.kept[0]) == 0
