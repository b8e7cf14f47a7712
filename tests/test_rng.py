"""The counter-based noise: a pure function, uniform, and exactly the 32-bit hash it claims to be."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from samplechain import rng


def mix32_reference(x: int) -> int:
    m = 0xFFFFFFFF
    x ^= x >> 16
    x = (x * 0x7FEB352D) & m
    x ^= x >> 15
    x = (x * 0x846CA68B) & m
    return x ^ (x >> 16)


def test_mix32_equals_the_pure_python_hash_on_extreme_and_random_inputs():
    values = [0, 1, 2**31 - 1, 2**31, 2**32 - 1] + list(np.random.default_rng(0).integers(0, 2**32, 2000))
    got = rng.mix32(torch.tensor(values, dtype=torch.int64)).tolist()
    assert got == [mix32_reference(int(v)) for v in values]


def test_noise_is_a_pure_function_of_seed_position_stream_and_token():
    ids = torch.arange(50)[None].repeat(3, 1)
    seed = torch.tensor([5, 5, 6])
    pos = torch.tensor([0, 0, 0])
    u = rng.uniform(seed, pos, ids, stream=2)
    assert torch.equal(u[0], u[1]) and not torch.equal(u[0], u[2])
    assert torch.equal(u, rng.uniform(seed, pos, ids, stream=2))
    assert not torch.equal(u, rng.uniform(seed, pos, ids, stream=3))
    assert not torch.equal(u, rng.uniform(seed, pos + 1, ids, stream=2))
    # keyed by token id, not by column: permuting the columns permutes the noise
    perm = torch.randperm(50)
    assert torch.equal(rng.uniform(seed, pos, ids[:, perm], 2), u[:, perm])


def test_uniform_is_uniform_and_never_zero_or_one():
    ids = torch.arange(200_000)[None]
    u = rng.uniform(torch.tensor([123]), torch.tensor([9]), ids).flatten()
    assert float(u.min()) > 0.0 and float(u.max()) < 1.0
    counts = np.histogram(u.numpy(), bins=100, range=(0, 1))[0]
    assert stats.chisquare(counts).pvalue > 1e-3


def test_consecutive_positions_are_uncorrelated():
    ids = torch.arange(50_000)[None]
    a = rng.uniform(torch.tensor([1]), torch.tensor([0]), ids).flatten().numpy()
    b = rng.uniform(torch.tensor([1]), torch.tensor([1]), ids).flatten().numpy()
    assert abs(np.corrcoef(a, b)[0, 1]) < 0.02


@pytest.mark.parametrize("seed", [0, 2**32 + 5, 2**63 - 1])
def test_large_seeds_are_valid(seed):
    u = rng.uniform(torch.tensor([seed]), torch.tensor([2**40]), torch.arange(10)[None])
    assert torch.isfinite(u).all()


@pytest.mark.parametrize("n", [1, 7, 8, 15, 1000, 70_000, 1_000_003])  # scalar tails and vectorised bodies
def test_int32_mix_is_bit_identical_to_the_int64_mix(n):
    x = torch.from_numpy(np.random.default_rng(n).integers(0, 2**32, n, dtype=np.int64))
    x[: min(n, 5)] = torch.tensor([0, 1, 2**31 - 1, 2**31, 2**32 - 1][: min(n, 5)])
    got = rng._mix32_i32(rng._as_i32(x)).to(torch.int64) & 0xFFFFFFFF
    assert torch.equal(got, rng.mix32(x))


def test_wide_noise_paths_agree_with_the_small_batch_path():
    """Above 65536 elements the noise is computed with int32 torch ops, below with numpy: the same bits."""
    ids = torch.randint(0, 2**31 - 1, (3, 40_000), generator=torch.Generator().manual_seed(1))
    seed = torch.tensor([0, 2**63 - 1, 123456789012345])
    pos = torch.tensor([0, 7, 2**40])
    wide = rng.uniform(seed, pos, ids, stream=3)  # 120000 elements: the torch path
    for row in range(3):
        alone = rng.uniform(seed[row : row + 1], pos[row : row + 1], ids[row : row + 1, :20_000], stream=3)  # numpy
        assert torch.equal(wide[row, :20_000], alone[0])


@pytest.mark.parametrize("V", [40000, 300])
@pytest.mark.parametrize("implicit", [True, False])
def test_fused_gumbel_argmax_is_the_same_index_as_argmax_of_logits_plus_noise(implicit, V):
    """rng.gumbel_argmax (in place on workspaces, M - x with argmin) against argmax(shifted(x) + gumbel): the same
    index on wide rows with -inf entries, ties at the top, huge values (a shifted row) and permuted ids."""
    g = torch.Generator().manual_seed(5)
    B = 4  # V = 40000: the in-place path; V = 300: the small one (numpy noise, torch logs)
    x = torch.randn(B, V, generator=g) * 3
    x[0, ::5] = float("-inf")
    x[1, 10] = x[1, 11] = 60.0  # a tie that the noise breaks
    x[2, ::3] = 1e30
    x[3] = float("-inf")  # every candidate masked: index 0 either way
    seed = torch.tensor([1, 2**40 + 3, 99, 7])
    ids = None if implicit else torch.stack([torch.randperm(V, generator=g) for _ in range(B)])
    full = torch.arange(V).expand(B, -1) if implicit else ids
    for pos in range(4):
        position = torch.full((B,), pos, dtype=torch.int64)
        want = (rng.shifted(x).double() + rng.gumbel(seed, position, full)).argmax(dim=-1)
        assert torch.equal(rng.gumbel_argmax(x, seed, position, ids), want), pos


def test_huge_logits_keep_their_noise():
    """Two equal logits of 1e30: float64 would absorb the Gumbel noise (ulp ~1e14) and always pick the first; the
    row is shifted by its maximum, so both are drawn, about half the time each. Rows within +-2**24 are unshifted
    (the same float64 sums as ever)."""
    x = torch.full((1, 2), 1e30)
    picks = [int(rng.gumbel_argmax(x, torch.tensor([s]), torch.tensor([0]), None)) for s in range(400)]
    assert 150 < sum(picks) < 250
    normal = torch.tensor([[3.0, -1e6, 2**23]])
    assert rng.shifted(normal) is normal
