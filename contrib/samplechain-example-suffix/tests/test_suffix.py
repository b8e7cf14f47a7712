"""suffix.v1: the trees count every path as the sequences hold it, drafts follow Suffix Decoding's rule (checked
against counting the sequences directly), earlier answers are drafted from, and generation keeps its tokens."""

from __future__ import annotations

import random

import pytest
import torch

import samplechain_example_suffix
from samplechain import ConfigError, PluginHost
from samplechain.drafters import DraftContext
from samplechain.generation.drafting import load_drafter
from samplechain_example_suffix import SuffixDecoding, SuffixParams, SuffixTree, _Answers, clear_answers


def count(seqs: list[list[int]], path: list[int], depth: int) -> int:
    """How often `path` occurs in `seqs` (0 past `depth` tokens: the trees hold no longer path)."""
    n = len(path)
    if n > depth:
        return 0
    return sum(s[i : i + n] == path for s in seqs for i in range(len(s) - n + 1))


def reference(seqs, pattern, depth, limit, factor=1.0, offset=0.0, min_prob=0.1) -> tuple[list[int], float]:
    """Suffix Decoding's draft, counting the sequences directly (the module's docstring)."""
    best: list[int] = []
    best_score = 0.0
    alphabet = sorted({t for s in seqs for t in s})
    for m in range(1, len(pattern)):
        path = list(pattern[len(pattern) - m :])
        if count(seqs, path, depth) == 0:
            break
        cap = min(limit, max(0, int(m * factor + offset + 1e-6)))
        draft: list[int] = []
        prob, score = 1.0, 0.0
        while len(draft) < cap:
            counts = {c: count(seqs, path + [c], depth) for c in alphabet}
            counts = {c: k for c, k in counts.items() if k}
            if not counts:
                break
            token = max(counts, key=lambda c: (counts[c], -c))
            prob *= counts[token] / count(seqs, path, depth)
            if prob < min_prob:
                break
            draft.append(token)
            score += prob
            path = path + [token]
        if score >= best_score:
            best, best_score = draft, score
    return best, best_score


def random_seqs(rng: random.Random, n: int, alphabet: int = 4) -> list[list[int]]:
    return [[rng.randrange(alphabet) for _ in range(rng.randint(0, 30))] for _ in range(n)]


def all_paths(tree: SuffixTree) -> dict[tuple[int, ...], int]:
    """Every path the tree holds with its count (each token of a node's run ends one)."""
    out: dict[tuple[int, ...], int] = {}
    stack = [((), tree.root)]
    while stack:
        path, node = stack.pop()
        for token in node.run:
            path = path + (token,)
            out[path] = node.count
        stack += [(path, child) for child in node.children.values()]
    return out


def expected_paths(seqs: list[list[int]], depth: int) -> dict[tuple[int, ...], int]:
    out: dict[tuple[int, ...], int] = {}
    for s in seqs:
        for i in range(len(s)):
            for n in range(1, min(depth, len(s) - i) + 1):
                key = tuple(s[i : i + n])
                out[key] = out.get(key, 0) + 1
    return out


@pytest.mark.parametrize("case", range(40))
def test_the_tree_counts_every_path_its_sequences_hold_as_they_grow_and_leave(case):
    """Sequences grow in turns (as a batch's rows do) and some leave midway while the others go on growing."""
    rng = random.Random(case)
    depth = rng.randint(2, 6)
    seqs = dict(enumerate(random_seqs(rng, rng.randint(2, 6), alphabet=rng.choice([2, 3, 5]))))
    tree = SuffixTree(depth)
    grown = dict.fromkeys(seqs, 0)
    while any(grown[i] < len(s) for i, s in seqs.items()):
        i = rng.choice([i for i, s in seqs.items() if grown[i] < len(s)])
        end = rng.randint(grown[i] + 1, len(seqs[i]))
        tree.extend(i, seqs[i][grown[i] : end])
        grown[i] = end
        if rng.random() < 0.2:
            gone = rng.choice(list(seqs))
            tree.remove(gone)
            del seqs[gone], grown[gone]
        held = [s[: grown[i]] for i, s in seqs.items()]
        assert all_paths(tree) == expected_paths(held, depth)
        assert tree.root.count == sum(map(len, held))
    assert sum(1 for _ in nodes(tree)) <= 2 * sum(map(len, seqs.values())) + 1  # runs are compressed


def nodes(tree: SuffixTree):
    stack = [tree.root]
    while stack:
        node = stack.pop()
        yield node
        stack += list(node.children.values())


def test_beyond_the_most_kept_the_oldest_answers_leave_the_tree():
    answers = _Answers(depth=4)
    rng = random.Random(0)
    held = {}
    for _ in range(11):
        seq = answers.begin(keep=8, tokens=[])
        held[seq] = [rng.randrange(3) for _ in range(rng.randint(1, 12))]
        answers.extend(seq, held[seq])
    assert list(answers.tree.seqs) == list(range(3, 11))  # the oldest first
    assert all_paths(answers.tree) == expected_paths([held[s] for s in answers.tree.seqs], 4)


@pytest.mark.parametrize("case", range(40))
def test_drafts_follow_the_most_frequent_continuation_as_counted_in_the_sequences(case):
    rng = random.Random(100 + case)
    depth = rng.randint(2, 8)
    seqs = random_seqs(rng, rng.randint(1, 4), alphabet=rng.choice([2, 3, 5]))
    tree = SuffixTree(depth)
    for i, s in enumerate(seqs):
        tree.extend(i, s)
    pattern = [rng.randrange(3) for _ in range(rng.randint(1, depth))]
    settings = dict(
        limit=rng.randint(1, 10),
        factor=rng.choice([0.5, 1.0, 2.0]),
        offset=rng.choice([0.0, 1.0]),
        min_prob=rng.choice([0.0, 0.1, 0.4]),
    )
    got = tree.speculate(pattern, settings["limit"], settings["factor"], settings["offset"], settings["min_prob"])
    assert got == reference(seqs, pattern, depth, **settings)


def test_a_repeated_pattern_is_drafted_whole_and_a_rare_branch_is_not():
    tree = SuffixTree(8)
    tree.extend(0, [1, 2, 3, 4, 5, 9, 1, 2, 3, 4, 5, 9, 1, 2, 3, 7])
    draft, score = tree.speculate([9, 1, 2], 5, 1.0, 2.0, 0.1)  # up to m + 2 tokens
    assert draft == [3, 4, 5, 9]  # after "1 2 3": 4 twice, 7 once
    assert score == pytest.approx(1.0 + 2 / 3 * 3)
    assert tree.speculate([6, 6], 5, 1.0, 0.0, 0.1) == ([], 0.0)


def context(vocab: int = 100) -> DraftContext:
    """What the drafter reads of a generation: its tokenizer and width."""
    return DraftContext(
        model=None,
        tokenizer=None,
        chain=None,
        store=None,
        request_ids=("a",),
        vocab_size=vocab,
        device=torch.device("cpu"),
    )


def drafter(**params) -> SuffixDecoding:
    d = SuffixDecoding(SuffixParams(**params))
    d.start(1, context())
    return d


def test_an_earlier_answer_is_drafted_from_in_a_later_generation():
    clear_answers()
    first = drafter(max_depth=8)
    prompt = [50, 51, 52]
    answer = [10, 11, 12, 13, 14, 15, 16, 17]
    for k in range(len(answer) + 1):
        first.propose(0, torch.tensor(prompt + answer[:k]), 8)
    later = drafter(max_depth=8)  # another generation: its own rows, the same earlier answers
    assert later.propose(0, torch.tensor([60, 61, 10, 11]), 8) == [12, 13]  # m = 2 allows 2 tokens
    forgetful = drafter(max_depth=8, max_cached_requests=0)
    assert forgetful.propose(0, torch.tensor([60, 61, 10, 11]), 8) == []
    clear_answers()


def test_only_the_newest_answers_are_kept():
    clear_answers()
    for answer in ([1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]):
        d = drafter(max_depth=6, max_cached_requests=2)
        for k in range(len(answer) + 1):
            d.propose(0, torch.tensor([99] + answer[:k]), 4)
    d = drafter(max_depth=6, max_cached_requests=2)  # its row's answer is one of the two: the two oldest leave
    assert d.propose(0, torch.tensor([98, 9, 10]), 4) == [11, 12]
    assert d.propose(0, torch.tensor([98, 5, 6]), 4) == []
    assert d.propose(0, torch.tensor([98, 1, 2]), 4) == []
    clear_answers()


def test_tokens_taken_back_leave_the_row_s_tree_and_its_answer():
    clear_answers()
    d = drafter(max_depth=6)
    d.propose(0, torch.tensor([1, 2]), 4)
    d.propose(0, torch.tensor([1, 2, 3, 4, 5]), 4)
    d.propose(0, torch.tensor([1, 2, 3, 7]), 4)  # 4 5 taken back (a guard's rewind), 7 came instead
    row = d._rows[0]
    assert all_paths(row.tree) == expected_paths([[1, 2, 3, 7]], 6)
    answers = d._answers
    assert list(answers.tree.seqs.values()) == [[3, 7]]  # the answer: what came after its first draft
    assert all_paths(answers.tree) == expected_paths([[3, 7]], 6)
    clear_answers()


@pytest.mark.parametrize("bad", [{"max_depth": 1}, {"min_token_prob": 1.5}, {"max_cached_requests": -1}])
def test_bad_parameters_are_one_error_naming_the_drafter_and_the_key(bad):
    host = PluginHost(use_env=False)
    host.register_plugin(samplechain_example_suffix, name="example_suffix")
    assert load_drafter({"use": "suffix"}, host).params == SuffixParams()
    key = next(iter(bad))
    with pytest.raises(ConfigError, match=rf"suffix.*{key}"):
        load_drafter({"use": "suffix", **bad}, host)


@pytest.fixture(scope="module")
def tiny():
    pytest.importorskip("transformers")
    from samplechain.models import load_model, tiny_model_path

    return load_model(tiny_model_path())


@pytest.mark.parametrize("chain", ["preset:greedy", "preset:llama.cpp"])
def test_generation_with_the_drafter_gives_the_tokens_of_generation_without_it(tiny, chain):
    from samplechain.generation import generate

    clear_answers()
    model, tok = tiny
    prompts = ["def f(x):\n    return x * x + x\n\ndef f(x):", "a b c d a b c d a b"]
    n = 1 if chain == "preset:greedy" else 2
    kwargs = dict(chain=chain, seed=5, max_new_tokens=40, pad_token_id=0, num_return_sequences=n)
    plain = generate(model, tok, prompts, **kwargs)
    first = generate(model, tok, prompts, draft=SuffixDecoding(), **kwargs)
    again = generate(model, tok, prompts, draft={"use": SuffixDecoding(), "adaptive": False}, **kwargs)
    for out in (first, again):
        assert out.sequences.tolist() == plain.sequences.tolist()
        torch.testing.assert_close(out.logprobs, plain.logprobs, atol=1e-4, rtol=1e-4)  # a check's summation order
    assert int(again.kept.sum()) > int(first.kept.sum())  # the first generation's answers drafted from
    assert int(again.model_calls.sum()) < int(first.model_calls.sum())
    clear_answers()
