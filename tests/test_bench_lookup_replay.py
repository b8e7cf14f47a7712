"""benchmarks/bench_lookup_replay.py replays the loop at a fixed draft length: on the tiny model its counts are the
ones generate() reports with the same drafter (never how fast anything is)."""

from __future__ import annotations

import math

import pytest
import torch

from samplechain import rng
from samplechain.generation import generate

pytest.importorskip("transformers")

BENCH = "bench_lookup_replay"  # the `bench` fixture loads benchmarks/bench_lookup_replay.py
PROMPT = "The list is: apple, pear, plum, fig. Again: apple, pear, plum, fig. Again: apple,"


@pytest.mark.parametrize("setting", ["greedy", "sampling"])
@pytest.mark.parametrize("occurrence", ["first", "last", "switch", "follow"])
@pytest.mark.parametrize("num_tokens", [2, 10])
def test_the_replay_counts_what_generate_counts(bench, tiny_lm, setting, occurrence, num_tokens):
    model, tok = tiny_lm
    ids = torch.tensor([tok.encode(PROMPT)])
    chain = bench.bs._chain(setting)
    kw = {"max_new_tokens": 40, "chain": chain, "seed": 3, "pad_token_id": 0}
    plain = generate(model, tok, input_ids=ids, **kw)
    draft = {"use": "prompt_lookup", "num_tokens": num_tokens, "occurrence": occurrence, "adaptive": False}
    out = generate(model, tok, input_ids=ids, draft=draft, **kw)
    assert out.sequences.tolist() == plain.sequences.tolist()
    text = bench.Text(ids[0].tolist(), plain.sequences[0, ids.shape[1] :].tolist(), 3, len(chain["samplers"]) - 1)
    counts = bench.replay(text, bench.lookup(occurrence, num_tokens), num_tokens, 40)
    assert (counts.calls, counts.drafted, counts.kept) == (
        int(out.model_calls[0]),
        int(out.drafted[0]),
        int(out.kept[0]),
    )
    assert counts.drafted > 0 and (counts.kept > 0 or setting == "sampling")  # greedy, the tiny model repeats


def test_every_occurrence_keeps_the_best_branch_and_counts_the_trees_tokens(bench):
    # after "1 2" the earlier occurrences go on "3 4" and "5 6"; the text goes on "5 6 9"
    text = bench.Text([1, 2, 3, 4, 1, 2, 5, 6, 7, 1], [2, 5, 6, 9], seed=0, stream=0)
    propose = bench.every_occurrence(text)
    tokens = torch.tensor(text.prompt + text.generated[:1])
    draft, fed = propose(tokens, 3)
    assert draft.tolist() == [5, 6, 7]  # the branch the text follows longest
    assert fed == 6  # "3 4 1" and "5 6 7": six distinct tokens of the tree
    # the copying bound copies from anywhere: "5 6" occurs earlier, "5 6 9" does not
    assert bench.copying_bound(text)(tokens, 3)[0].tolist() == [5, 6]


def test_every_ngram_also_takes_the_branches_of_shorter_matches(bench):
    # "1 2" occurs once earlier, going on "3 4 1"; "2" also occurs after 7, going on "8 8 1"; the text goes on "8 8 5"
    text = bench.Text([7, 2, 8, 8, 1, 2, 3, 4, 1], [2, 8, 8, 5], seed=0, stream=0)
    tokens = torch.tensor(text.prompt + text.generated[:1])
    assert bench.every_occurrence(text)(tokens, 3)[0].tolist() == [3, 4, 1]  # the longest match's only branch
    draft, fed = bench.every_occurrence(text, every_n=True)(tokens, 3)
    assert draft.tolist() == [8, 8, 1] and fed == 6


def test_the_noise_is_the_draws_and_its_buckets_count_checked_tokens(bench):
    # a text drawn with known noise: at each position the token of highest noise among 0..9 (uniform logits)
    seed, stream = 11, 4
    ids = torch.arange(10)[None, :].expand(30, -1)
    noise = rng.gumbel(torch.full((30,), seed), torch.arange(30), ids, stream)
    generated = noise.argmax(dim=1).tolist()
    text = bench.Text([0, 1, 2], generated, seed, stream)
    assert bench.drawn_noise([text]) > 1.5  # the largest of ten Gumbels: mean about 2.9
    assert bench._noise(text, 0, generated) == pytest.approx(noise.max(dim=1).values.tolist())
    counts = bench.replay(text, bench.lookup("first", 4), 4, 30, noise=True)
    checked = sum(c for _, c in counts.by_noise.values())
    kept = sum(k for k, _ in counts.by_noise.values())
    assert kept == counts.kept and counts.kept <= checked <= counts.drafted
    assert bench._bucket(-3.0) == -1 and bench._bucket(0.49) == 0 and bench._bucket(math.inf) == 3


def test_the_copying_bounds_tokens_are_sorted_by_where_their_run_occurs(bench):
    # the row copies "2 3 4" (after its last token, 1), goes on "6 7 8" and "60 61" in the passage, writes "42 43"
    # of its own in place of "70", copies "71 72" a token later than the passage's cursor (near), writes "99" and
    # copies "5 6", which nothing it just wrote leads to (elsewhere)
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 50, 60, 61, 70, 71, 72]
    text = bench.Text(prompt, [1, 2, 3, 4, 9, 6, 7, 8, 9, 60, 61, 42, 43, 71, 72, 99, 5, 6, 0], seed=0, stream=0)
    sources = bench.bound_sources(text, 10, 100)
    assert sources == {"goes on": [2, 5], "near": [1, 2], "after its last token": [1, 3], "elsewhere": [1, 2]}
    bound = bench.replay(text, bench.copying_bound(text), 10, 100)
    assert bound.kept == sum(kept for _, kept in sources.values())
    assert bound.calls == 1 + sum(calls for calls, _ in sources.values()) + 1  # the prefill, and a call keeping none
