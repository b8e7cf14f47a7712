"""prompt_lookup proposes what transformers' PromptLookupCandidateGenerator proposes, row by row."""

from __future__ import annotations

import random

import pytest
import torch

from samplechain import ConfigError, get_host
from samplechain.engine.config import parse_params

transformers = pytest.importorskip("transformers")
from transformers.generation.candidate_generator import PromptLookupCandidateGenerator  # noqa: E402


def drafter(**params):
    cls = get_host().get("drafter", "prompt_lookup")
    return cls(parse_params(cls, params, source="test", path="draft"))


def theirs(tokens: list[int], num_tokens: int, max_ngram: int) -> list[int]:
    gen = PromptLookupCandidateGenerator(
        # an end-of-sequence id outside the vocabulary: no draft is cut at one (ours never cuts; transformers before
        # 5.24 calls torch.isin on the id even where it is None)
        eos_token_id=torch.tensor([10**6]),
        num_output_tokens=num_tokens,
        max_matching_ngram_size=max_ngram,
        max_length=10**6,
    )
    ids = torch.tensor([tokens])
    candidates, _ = gen.get_candidates(ids)
    return candidates[0, len(tokens) :].tolist()


@pytest.mark.parametrize("seed", range(40))
def test_proposals_are_transformers_candidates(seed):
    rng = random.Random(seed)
    vocab = rng.choice([3, 5, 20])  # small vocabularies repeat n-grams often
    tokens = [rng.randrange(vocab) for _ in range(rng.randint(1, 60))]
    num_tokens, max_ngram = rng.randint(1, 8), rng.randint(1, 4)
    ours = drafter(num_tokens=num_tokens, max_ngram=max_ngram).propose(0, torch.tensor(tokens), 10**6)
    assert ours.tolist() == theirs(tokens, num_tokens, max_ngram)


def test_the_longest_ngram_wins_and_the_limit_caps_the_draft():
    tokens = torch.tensor([1, 2, 3, 4, 5, 9, 3, 7, 8, 2, 3])
    # the bigram (2, 3) matched at the start beats the unigram 3's first match
    assert drafter(num_tokens=4, max_ngram=2).propose(0, tokens, 10).tolist() == [4, 5, 9, 3]
    assert drafter(num_tokens=4, max_ngram=2).propose(0, tokens, 2).tolist() == [4, 5]
    assert drafter(num_tokens=4, max_ngram=1).propose(0, tokens, 10).tolist() == [4, 5, 9, 3]
    assert drafter(num_tokens=4, max_ngram=3, min_ngram=3).propose(0, tokens, 10).tolist() == []
    assert drafter().propose(0, torch.tensor([7]), 10).tolist() == []


def test_expect_names_the_match_a_proposal_comes_from():
    tokens = torch.tensor([1, 2, 3, 4, 5, 9, 3, 7, 8, 2, 3])
    assert drafter(max_ngram=2).expect(0, tokens) == ("ngram2", 0.5)
    assert drafter(max_ngram=1).expect(0, tokens) == ("ngram1", 0.15)
    assert drafter(max_ngram=3, min_ngram=3).expect(0, tokens) is None
    longer = torch.tensor([5, 1, 2, 3, 4, 6, 1, 2, 3])
    assert drafter(max_ngram=4).expect(0, longer) == ("ngram3", 0.85)
    # a row's lookup is kept for the same tokens only: another row, or other tokens, looks again
    d = drafter(num_tokens=2, max_ngram=2)
    assert d.expect(0, tokens)[0] == "ngram2" and d.propose(0, tokens, 10).tolist() == [4, 5]
    assert d.expect(1, longer)[0] == "ngram2" and d.propose(1, longer, 10).tolist() == [4, 6]
    assert d.propose(0, torch.tensor([7, 8, 7]), 10).tolist() == [8, 7]


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"num_tokens": 0}, r"draft\.num_tokens = 0: must be in \[1, inf\) \(the longest draft\)"),
        ({"max_ngram": 0}, r"draft\.max_ngram = 0: must be in \[1, inf\)"),
        ({"min_ngram": 3, "max_ngram": 2}, r"min_ngram \(= 3\) is larger than max_ngram \(= 2\)"),
    ],
)
def test_bad_parameters_name_the_culprit(params, message):
    with pytest.raises(ConfigError, match=message):
        drafter(**params)
