"""The cpu backend's chunked top-k against torch.topk: identical values in identical order, distinct positions that
hold those values, on ties, -inf, extreme values and reduced precision; each row's result independent of the batch."""

from __future__ import annotations

import pytest
import torch

import samplechain_cpu as cpu
import samplechain_cpu_torch as ops

BACKEND = cpu.CpuBackend()


def _logits(kind: str, batch: int, vocab: int, dtype=torch.float32, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, vocab, generator=g) * 3
    if kind == "ties":
        x = torch.round(x)  # a handful of distinct values: ties everywhere, at the k-th place too
    elif kind == "masked":
        x[torch.rand(batch, vocab, generator=g) < 0.999] = float("-inf")  # ~100 finite per row, fewer than some k
    elif kind == "extreme":
        x[:, ::97] = 3e38
        x[:, 5::101] = -3e38
        x[:, 7::89] = float("inf")
    return x.to(dtype)


def _check(x: torch.Tensor, k: int) -> None:
    values, index = BACKEND.topk(x, k)
    ref = torch.topk(x, k, dim=-1)
    assert torch.equal(values, ref.values)
    assert torch.equal(x.gather(1, index), values)
    assert (index.sort(dim=1).values.diff(dim=1) > 0).all(), "positions repeat"


@pytest.mark.parametrize("kind", ["randn", "ties", "masked", "extreme"])
@pytest.mark.parametrize("vocab", [16384, 50257, 128256, 151936])
@pytest.mark.parametrize("k", [1, 40, 64, 300, 1000])
def test_chunked_topk_equals_torch_topk(kind, vocab, k):
    _check(_logits(kind, 5, vocab, seed=vocab + k), k)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_chunked_topk_other_dtypes(dtype):
    _check(_logits("randn", 4, 50257, dtype), 40)
    _check(_logits("ties", 4, 50257, dtype), 40)


def test_chunk_width_rules():
    assert ops.chunk_width(128256, 40) == 64
    assert ops.chunk_width(128256, 512) == 32
    assert ops.chunk_width(4096, 40) == 0  # narrow rows take torch.topk
    assert ops.chunk_width(128256, 5000) == 0  # too much of the row would be gathered
    for vocab, k in [(16384, 1), (50257, 200), (128256, 2004), (151936, 1)]:
        width = ops.chunk_width(vocab, k)
        assert width == 0 or k * width * 4 <= vocab


def test_falls_back_on_non_contiguous_and_wide_k():
    x = _logits("randn", 64, 50257).t().contiguous().t()[:3]  # a strided view
    assert not x.is_contiguous()
    _check(x, 40)
    _check(_logits("randn", 2, 20000), 19000)


def test_rows_do_not_depend_on_the_batch():
    x = _logits("ties", 9, 128256)
    values, index = BACKEND.topk(x, 40)
    for row in (0, 4, 8):
        v, i = BACKEND.topk(x[row : row + 1].clone(), 40)
        assert torch.equal(v[0], values[row]) and torch.equal(i[0], index[row])


def test_nan_rows_rank_nan_first_like_torch():
    x = _logits("randn", 2, 50257)
    x[1, 1234] = float("nan")
    values, index = BACKEND.topk(x, 40)
    assert torch.isnan(values[1, 0]) and index[1, 0] == 1234
    assert torch.equal(values[0], torch.topk(x[0], 40).values)


@pytest.mark.parametrize("kind", ["randn", "ties", "masked", "extreme"])
@pytest.mark.parametrize("vocab", [1000, 50257, 128256])
@pytest.mark.parametrize(("gap", "k"), [(0.0, 0), (2.0, 0), (6.0, 5), (1.0, 300), (30.0, 0)])
def test_at_least_equals_the_plain_count_and_top_k(kind, vocab, gap, k):
    """Per row: every entry >= threshold, in descending order, at least the k best, and the counts; the chunked
    path (wide rows) against the contract's default (count, then torch.topk)."""
    x = _logits(kind, 6, vocab, seed=vocab + k)
    finite_top = torch.where(torch.isfinite(x), x, -3e38).amax(dim=-1)
    threshold = finite_top - gap
    threshold[2] = float("-inf")  # a row where everything qualifies
    values, index, counts = BACKEND.at_least(x, threshold, k)
    want_counts = (x >= threshold[:, None]).sum(dim=-1)
    assert torch.equal(counts, want_counts)
    assert values.shape[1] >= min(max(int(want_counts.max()), k, 1), vocab)
    for row in range(x.shape[0]):
        n = min(max(int(counts[row]), k), vocab)
        assert torch.equal(values[row, :n], torch.topk(x[row], n).values)
        assert torch.equal(x[row].gather(0, index[row, :n]), values[row, :n])
        assert index[row, :n].unique().numel() == n


def test_at_least_takes_the_chunked_path_only_when_it_reads_little():
    x = _logits("randn", 3, 128256)
    assert cpu.chunked_at_least(x, x.amax(dim=-1) - 1.0, 0, 64) is not None
    assert cpu.chunked_at_least(x, x.amax(dim=-1) - 100.0, 0, 64) is None  # everything qualifies


def test_compacted_at_least_keeps_positions_unique_in_short_rows():
    x = _logits("randn", 4, 50257)
    threshold = x.amax(dim=-1) - torch.tensor([9.0, 2.0, 0.0, 6.0])  # very different counts per row
    values, index, counts = ops.compacted_at_least(x, threshold, 1)
    for row in range(4):
        n = int(counts[row])
        assert torch.equal(values[row, :n], torch.topk(x[row], n).values)
        assert torch.equal(x[row].gather(0, index[row, :n]), values[row, :n])
        assert index[row].unique().numel() == index.shape[1], "a spare slot repeats a token"
        assert not bool(torch.isfinite(values[row, n:]).any())
        assert not bool((x[row].gather(0, index[row, n:]) >= threshold[row]).any()), "a spare slot holds a survivor"


def _ranked_reference(x: torch.Tensor, k: int) -> list[list[int]]:
    """The k best positions of each row by (logit descending, position ascending), by Python's sort."""
    return [sorted(range(x.shape[1]), key=lambda j: (-row[j], j))[:k] for row in x.float().tolist()]


@pytest.mark.parametrize("kind", ["randn", "ties", "masked", "bf16"])
@pytest.mark.parametrize("vocab", [16384, 50257, 128256])
@pytest.mark.parametrize("k", [1, 40, 300, 2000])
def test_ranked_topk_keeps_the_lowest_ids_of_equal_logits(kind, vocab, k):
    # chunked (k small), threshold (k large) and key-based paths: the set is the reference's, values descending
    x = _logits("randn" if kind == "bf16" else kind, 3, vocab, seed=vocab * k)
    if kind == "bf16":
        x = x.bfloat16().float()  # bf16-rounded logits: ties at the k-th place in most rows
    values, index = BACKEND.ranked_topk(x, k)
    assert torch.equal(x.gather(1, index), values)
    assert (values.diff(dim=1) <= 0).all() or not torch.isfinite(values).all()
    ref = _ranked_reference(x, k)
    assert [sorted(r) for r in index.tolist()] == [sorted(r) for r in ref]
    _, keyed = super(cpu.CpuBackend, BACKEND).ranked_topk(x, k)  # contracts.ranked_topk: one top-k over keys
    assert [sorted(r) for r in keyed.tolist()] == [sorted(r) for r in ref]


def test_ranked_topk_rows_do_not_depend_on_the_batch():
    x = _logits("randn", 6, 50257, seed=7).bfloat16().float()
    values, index = BACKEND.ranked_topk(x, 50)
    for b in range(6):
        v1, i1 = BACKEND.ranked_topk(x[b : b + 1].contiguous(), 50)
        assert torch.equal(v1[0], values[b]) and set(i1[0].tolist()) == set(index[b].tolist())
