"""prompt_lookup proposes what transformers' PromptLookupCandidateGenerator proposes (the first occurrence), row by
row; or the last occurrence; or switches between the two where one misses; or follows the passage a row copies past
tokens of its own."""

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
    ours = drafter(num_tokens=num_tokens, max_ngram=max_ngram, occurrence="first").propose(
        0, torch.tensor(tokens), 10**6
    )
    assert ours.tolist() == theirs(tokens, num_tokens, max_ngram)


@pytest.mark.parametrize("seed", range(60))
def test_follow_drafts_what_most_occurrences_go_on_with(seed):
    rng = random.Random(seed)
    tokens = [rng.randrange(rng.choice([2, 3, 5])) for _ in range(rng.randint(1, 60))]
    num_tokens, max_ngram = rng.randint(1, 8), rng.randint(1, 4)
    first = drafter(num_tokens=num_tokens, max_ngram=max_ngram, occurrence="first").propose(0, torch.tensor(tokens), 99)
    ours = drafter(num_tokens=num_tokens, max_ngram=max_ngram).propose(0, torch.tensor(tokens), 99).tolist()
    n = next((n for n in range(min(max_ngram, len(tokens) - 1), 0, -1) if tokens[-n:] in _windows(tokens[:-1], n)), 0)
    starts = [i + n for i in range(len(tokens) - n) if n and tokens[i : i + n] == tokens[-n:]]
    assert bool(ours) == bool(starts) and len(ours) <= num_tokens
    for j in range(len(ours) + 1):
        # the occurrences that agree with the draft so far and go on: most of them go on with its next token, and
        # the draft ends at num_tokens or where none goes on
        live = [s for s in starts if tokens[s : s + j] == ours[:j] and s + j < len(tokens)]
        if j == len(ours):
            assert j == num_tokens or not live
            break
        counts = {t: sum(tokens[s + j] == t for s in live) for t in set(tokens)}
        assert counts[ours[j]] == max(counts.values())
    assert any(tokens[s : s + len(ours)] == ours for s in starts) or not ours  # one occurrence's continuation
    if len(starts) == 1:  # one occurrence: its continuation, as transformers drafts it
        assert ours == first.tolist()


def test_follow_takes_the_majority_and_breaks_a_tie_for_the_occurrence_switch_takes():
    def lookup(text: list[int], occurrence: str) -> list[int]:
        return drafter(num_tokens=3, max_ngram=2, occurrence=occurrence).propose(0, torch.tensor(text), 3).tolist()

    # (5, 6) goes on twice with 1 and once with 3; after 1, with 2 once and 9 once: a tie, kept for the first's
    text = [5, 6, 1, 2, 0, 5, 6, 3, 4, 0, 5, 6, 1, 9, 0, 5, 6]
    assert lookup(text, "follow") == lookup(text, "first") == [1, 2, 0]
    assert lookup(text, "last") == [1, 9, 0]
    # the first occurrence goes on with 3, the two later ones with 1 2 (then 0 and 7, a tie): the majority wins
    # over the first, and the tie goes to the latest of the occurrences it copies
    text = [5, 6, 3, 4, 0, 5, 6, 1, 2, 0, 5, 6, 1, 2, 7, 5, 6]
    assert lookup(text, "first") == [3, 4, 0]
    assert lookup(text, "follow") == [1, 2, 7]


def _windows(tokens: list[int], n: int) -> list[list[int]]:
    return [tokens[i : i + n] for i in range(len(tokens) - n + 1)]


@pytest.mark.parametrize("seed", range(20))
def test_the_last_occurrence_is_the_first_of_the_reversed_text(seed):
    rng = random.Random(seed)
    tokens = [rng.randrange(rng.choice([3, 5])) for _ in range(rng.randint(2, 50))]
    num_tokens, max_ngram = rng.randint(1, 6), rng.randint(1, 3)
    ours = drafter(num_tokens=num_tokens, max_ngram=max_ngram, occurrence="last").propose(0, torch.tensor(tokens), 99)
    expected: list[int] = []
    for n in range(min(max_ngram, len(tokens) - 1), 0, -1):
        starts = [i + n for i in range(len(tokens) - n) if tokens[i : i + n] == tokens[-n:]]
        if starts:
            expected = tokens[starts[-1] : starts[-1] + num_tokens]
            break
    assert ours.tolist() == expected


def test_switch_takes_the_other_occurrence_after_a_miss_and_back():
    # a numbered list that repeats one item: "1 x 9", "2 x 9", ... (number, item, newline)
    d = drafter(num_tokens=3, max_ngram=2, occurrence="switch")
    text = [1, 7, 9, 2, 8, 9, 3, 7, 9]  # items 7, 8, then 7 again
    assert d.propose(0, torch.tensor(text), 3).tolist() == [2, 8, 9]  # the first occurrence of (7, 9)
    text += [4, 7, 9]  # 4 came, not the guessed 2: the next lookup takes the last occurrence
    assert d.propose(0, torch.tensor(text), 3).tolist() == [4, 7, 9]
    text += [5, 7, 9]  # 5 came, not 4: back to the first
    assert d.propose(0, torch.tensor(text), 3).tolist() == [2, 8, 9]
    text += [2, 8, 9]  # the guess was right: it stays
    assert d.propose(0, torch.tensor(text), 3).tolist() == [3, 7, 9]
    # expect and propose of one lookup agree, and a new generation starts from the first occurrence again
    assert d.expect(0, torch.tensor(text))[0] == "ngram2"
    d.start(1, None)
    assert d.propose(0, torch.tensor([1, 7, 9, 2, 8, 9, 3, 7, 9, 4, 7, 9]), 3).tolist() == [2, 8, 9]


def test_a_checkpoint_keeps_each_rows_choice_of_occurrence():
    import json

    d = drafter(num_tokens=3, max_ngram=2, occurrence="switch")
    text = [1, 7, 9, 2, 8, 9, 3, 7, 9]
    d.propose(0, torch.tensor(text), 3)
    text += [4, 7, 9]  # a miss: row 0 now takes the last occurrence
    assert d.propose(0, torch.tensor(text), 3).tolist() == [4, 7, 9]
    saved = json.loads(json.dumps(d.checkpoint()))
    again = drafter(num_tokens=3, max_ngram=2, occurrence="switch")
    again.start(1, None)
    again.restore(saved)
    text += [4, 7, 9]  # the guess was right: the row stays on the last occurrence, as in the uninterrupted drafter
    assert again.propose(0, torch.tensor(text), 3).tolist() == d.propose(0, torch.tensor(text), 3).tolist()
    assert again.propose(0, torch.tensor(text), 3).tolist() == [4, 7, 9]


PASSAGE = list(range(20, 36))
EDITED = [*PASSAGE[:3], 60, *PASSAGE[4:7], 61, *PASSAGE[8:11], 62, *PASSAGE[12:]]  # three tokens of its own
TEXT = [*PASSAGE, 99, *EDITED]  # a passage, then the row's copy of it with three tokens changed


def _drafts(d, text: list[int], lengths: range) -> dict[int, tuple]:
    """{n: (expect, propose)} after the first n tokens of `text`, asked in order as the loop asks them."""
    return {n: (d.expect(0, torch.tensor(text[:n])), d.propose(0, torch.tensor(text[:n]), 4).tolist()) for n in lengths}


def test_follow_drafts_the_passage_on_past_a_token_of_the_rows_own():
    lengths = range(len(PASSAGE) + 2, len(TEXT))
    switch = _drafts(drafter(num_tokens=4, occurrence="switch"), TEXT, lengths)
    follow = _drafts(drafter(num_tokens=4), TEXT, lengths)  # the default
    after = {token: TEXT.index(token) + 1 for token in (60, 61, 62)}  # the row's length just after its own token
    for n in after.values():
        assert switch[n] == (None, [])  # no n-gram ending in a token of the row's own occurs earlier
    # the cursor guessed better than the lookup past the first change, so past the next two it drafts the passage
    # one token on, as it does between them
    assert follow[after[60]] == (None, [])
    assert follow[after[61]] == (("cursor", 0.5), [28, 29, 30, 31])
    assert follow[after[62]] == (("cursor", 0.5), [32, 33, 34, 35])
    assert all(proposal == switch[n][1] for n, (_, proposal) in follow.items() if n < after[60])
    # where the lookup and the cursor both guess, they guess the same text here
    assert all(follow[n][1] == switch[n][1] for n in lengths if switch[n][1] and n not in after.values())


def test_a_checkpoint_keeps_each_rows_cursor_and_record():
    import json

    d = drafter(num_tokens=4, occurrence="follow")
    middle = TEXT.index(61) + 1
    _drafts(d, TEXT, range(len(PASSAGE) + 2, middle))
    saved = json.loads(json.dumps(d.checkpoint()))
    again = drafter(num_tokens=4, occurrence="follow")
    again.start(1, None)
    again.restore(saved)
    rest = range(middle, len(TEXT))
    assert _drafts(again, TEXT, rest) == _drafts(d, TEXT, rest)
    fresh = drafter(num_tokens=4, occurrence="follow")  # without the record, the lookup drafts past the change
    assert _drafts(fresh, TEXT, rest)[middle] == (None, [])


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
    assert drafter(max_ngram=2).expect(0, tokens) == ("ngram2", 0.52)
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
        ({"occurrence": "latest"}, r"draft\.occurrence = 'latest': must be one of 'follow', 'switch', 'first', 'last'"),
    ],
)
def test_bad_parameters_name_the_culprit(params, message):
    with pytest.raises(ConfigError, match=message):
        drafter(**params)


def test_asking_again_at_the_same_length_changes_nothing():
    d = drafter(num_tokens=4)
    middle = TEXT.index(61) + 1
    _drafts(d, TEXT, range(len(PASSAGE) + 2, middle))
    before = d.checkpoint()
    first = d.propose(0, torch.tensor(TEXT[:middle]), 4).tolist()
    after_first = d.checkpoint()
    assert d.propose(0, torch.tensor(TEXT[:middle]), 4).tolist() == first  # another tensor of the same tokens
    assert d.checkpoint() == after_first != before
