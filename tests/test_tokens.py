"""samplechain.tokens (per-token reductions over histories) and the sparse paths of penalties and DRY built on it:
bitwise the same processed logits as their dense (B, V) paths, which run on compacted candidates; the sequences a
row's next token would complete, against a brute-force search; which candidates hold given token ids."""

from __future__ import annotations

import pytest
import torch

from samplechain import Candidates, Chain, SamplingError
from samplechain.tokens import SequenceMatcher, per_token_reduce, write_tokens

V = 120


def test_per_token_reduce_equals_brute_force():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 9, (4, 30), generator=g)
    values = torch.randint(0, 7, (4, 30), generator=g)
    targets = torch.rand(4, 30, generator=g) > 0.3
    include = torch.rand(4, 30, generator=g) > 0.4
    for reduce in ("sum", "amax"):
        got = per_token_reduce(ids, values, targets, include, reduce)
        for b in range(4):
            for pos in range(30):
                same = [
                    values[b, j].item()
                    for j in range(30)
                    if ids[b, j] == ids[b, pos] and include[b, j] and targets[b, j]
                ]
                want = (
                    (sum(same) if reduce == "sum" else max(same, default=-1))
                    if targets[b, pos]
                    else (0 if reduce == "sum" else -1)
                )
                assert got[b, pos].item() == want, (reduce, b, pos)
    with pytest.raises(ValueError, match="reduce"):
        per_token_reduce(ids, values, targets, include, "mean")


def test_write_tokens_writes_only_masked_positions():
    logits = torch.zeros(2, 5)
    write_tokens(
        logits,
        torch.tensor([[1, 1, 3], [0, 4, 4]]),
        torch.tensor([[7.0, 7.0, 9.0], [1.0, 2.0, 2.0]]),
        torch.tensor([[True, True, False], [False, True, True]]),
    )
    assert logits.tolist() == [[0, 7, 0, 0, 0], [0, 0, 0, 0, 2]]


def _history(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    h = torch.randint(0, 25, (5, 40), generator=g)
    h[1, 30:40] = h[1, 10:20]  # the context ends in a long repeat: DRY penalises what followed it
    h[4, 36:40] = h[4, 2:6]
    h[2, :6] = -1  # left padding
    return h


def _dense_and_sparse(entry: dict, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + seed)
    logits = torch.randn(5, V, generator=g) * 3
    logits[0, 3] = float("-inf")
    history, prompt = _history(seed), torch.tensor([20, 30, 25, 40, 10])
    sparse = Chain.load({"samplers": [entry, {"use": "greedy"}]})
    # allowed_tokens with every id compacts the candidates (ids given, K = V): the penalty runs its dense path
    dense = Chain.load({"samplers": [{"use": "allowed_tokens", "ids": list(range(V))}, entry, {"use": "greedy"}]})
    kw = dict(history=history, prompt_lengths=prompt)
    return sparse.process(logits.clone(), **kw), dense.process(logits.clone(), **kw)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize(
    "entry",
    [
        {"use": "penalties", "repeat": 1.3, "frequency": 0.4, "presence": 0.2, "last_n": 16, "scope": "llama.cpp"},
        {"use": "penalties", "repeat": 0.8, "frequency": 0.1, "last_n": -1, "scope": "llama.cpp"},
        {"use": "penalties", "repeat": 1.5, "frequency": 0.3, "presence": 0.5, "scope": "transformers"},
        {"use": "penalties", "repeat": 1.2, "frequency": 0.6, "presence": 0.3, "scope": "vllm"},
        {"use": "dry", "multiplier": 0.8, "base": 1.75, "allowed_length": 2, "breakers": [], "breaker_ids": [[7]]},
        {"use": "dry", "multiplier": 2.0, "base": 3.0, "allowed_length": 1, "penalty_last_n": 25, "breakers": []},
    ],
    ids=["llama-window", "llama-all", "transformers", "vllm", "dry", "dry-window"],
)
def test_sparse_path_equals_dense_path_bitwise(entry, seed):
    sparse, dense = _dense_and_sparse(entry, seed)
    assert torch.equal(sparse, dense)
    assert not torch.equal(sparse, _dense_and_sparse({"use": "temperature", "t": 1.0}, seed)[0]), "nothing changed"


def test_first_occurrence_marks_each_token_once_per_row():
    from samplechain.tokens import TokenGroups, first_occurrence

    ids = torch.tensor([[5, 3, 5, 7, 3, 5], [1, 1, 1, 2, 2, 9]])
    mask = torch.tensor([[True, True, True, False, True, True], [False, True, True, True, True, True]])
    want = torch.tensor([[True, True, False, False, False, False], [False, True, False, True, False, True]])
    assert torch.equal(first_occurrence(ids, mask), want)
    groups = TokenGroups.of(ids, mask)
    assert torch.equal(groups.first(), want)
    counts = groups.reduce(torch.ones(ids.shape), mask)
    assert counts[0].tolist() == [3, 2, 3, 0, 2, 3] and counts[1].tolist() == [0, 2, 2, 2, 2, 1]
    empty = torch.zeros(2, 0, dtype=torch.int64)
    assert first_occurrence(empty, empty.bool()).shape == (2, 0)


def test_sequence_matcher_sums_the_values_of_the_sequences_a_token_completes():
    g = torch.Generator().manual_seed(3)
    vocab = 6
    pairs = [((2,), -1.0), ((1, 2), 0.5), ((0, 1, 3), 2.0), ((1, 3), 0.25), ((4, 4, 4, 5), 3.0), ((1, 2), 1.0)]
    history = torch.randint(0, 5, (12, 7), generator=g)
    history[0, :4] = -1  # left padding: matches no token
    history[1] = torch.tensor([-1, -1, -1, -1, -1, 0, 1])
    got = SequenceMatcher(pairs, "test").bias(history, vocab, 12, "cpu")
    want = torch.zeros(12, vocab)
    for b, row in enumerate(history.tolist()):
        real = [t for t in row if t >= 0]
        for seq, value in pairs:
            prefix = list(seq[:-1])
            if len(real) >= len(prefix) and (not prefix or real[len(real) - len(prefix) :] == prefix):
                want[b, seq[-1]] += value
    assert torch.equal(got, want)
    # after (0, 1): (0, 1, 3) and (1, 3) complete with 3; (2,) always, and both (1, 2) add up
    assert got[1, 3] == 2.25 and got[1, 2] == -1.0 + 0.5 + 1.0


def test_sequence_matcher_names_its_owner_for_a_token_outside_the_vocabulary():
    matcher = SequenceMatcher([((1, 9), 1.0)], "sequence_bias.v1")
    with pytest.raises(SamplingError, match=r"sequence_bias.v1: token id 9 is outside the vocabulary \(size 8\)"):
        matcher.bias(torch.zeros(1, 3, dtype=torch.int64), 8, 1, "cpu")


def test_candidates_holding_ids_mark_the_same_tokens_full_or_compacted():
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(3, V, generator=g)
    ids = torch.tensor([0, 7, 55, 119, V, V + 40])  # ids past the vocabulary hold nothing
    full = Candidates(logits, None, V)
    index = torch.stack([torch.randperm(V, generator=g)[:30] for _ in range(3)])
    index[:, 0] = 7  # every row keeps token 7 among its candidates
    compact = full.take(logits.gather(1, index), index, is_sorted=False)
    on_full, on_compact = full.holding(ids), compact.holding(ids)
    assert on_full.shape == (1, V) and on_full[0].nonzero().flatten().tolist() == [0, 7, 55, 119]
    assert on_compact.shape == (3, 30)
    assert torch.equal(on_compact, on_full.expand(3, -1).gather(1, index))
    assert bool(on_compact[:, 0].all())
