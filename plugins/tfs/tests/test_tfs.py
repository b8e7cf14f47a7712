"""tfs.v1 (tail-free sampling) against its two references.

- variant "llama.cpp": llama.cpp's `test_tfs` vectors (tests/test-sampling.cpp before tail-free's removal),
  verbatim: the kept tokens' probabilities (not renormalised, as `llama_sampler_tail_free_apply` leaves them);
  and `llama_sampler_tail_free_apply` written out below in plain Python as the oracle on random logits.
- variant "webui": text-generation-webui's `TailFreeLogitsWarper` re-implemented below in plain torch as the
  oracle, run on the full vocabulary (float64), also after a top_k (compacted candidates: the plugin stands the
  removed tokens in as probability-0 tokens, as webui sees them).
- The kept set is compared as the multiset of kept logits (equal logits at the cut may be either token).
- Per-row parameters equal each row alone; z = 1 is a bitwise no-op; bad values refused.
"""

from __future__ import annotations

import math

import pytest
import torch

from samplechain import Chain, ConfigError, RequestError
from samplechain.tools.testing import (
    assert_bitwise_no_op,
    assert_rows_equal_alone,
    processed_scores,
    random_logits,
    sampler_chain,
)

NEG_INF = float("-inf")


# ----------------------------------------------------------------- the references, written out
def llama_tfs_count(row: list[float], z: float, min_keep: int) -> int:
    """llama_sampler_tail_free_apply on one row: how many of the (finite, sorted) candidates are kept."""
    x = sorted((v for v in row if v != NEG_INF), reverse=True)
    n = len(x)
    if z >= 1.0 or n <= 2:
        return n
    top = x[0]
    e = [math.exp(v - top) for v in x]
    total = sum(e)
    p = [v / total for v in e]
    d1 = [p[i] - p[i + 1] for i in range(n - 1)]
    d2 = [abs(d1[i] - d1[i + 1]) for i in range(n - 2)]
    s = sum(d2)
    d2 = [v / s for v in d2] if s > 1e-6 else [1.0 / len(d2)] * len(d2)
    cum = 0.0
    for i, v in enumerate(d2):
        cum += v
        if cum > z and i >= min_keep:
            return max(i, 1)
    return n


def webui_tfs(scores: torch.Tensor, tfs: float, min_tokens_to_keep: int = 1) -> torch.Tensor:
    """text-generation-webui's TailFreeLogitsWarper.__call__, written out (the oracle)."""
    sorted_logits, sorted_indices = torch.sort(scores, descending=True)
    probs = sorted_logits.softmax(dim=-1)
    d2 = probs.diff().diff().abs()
    normalized_d2 = d2 / d2.sum(dim=-1, keepdim=True)
    cdf = normalized_d2.cumsum(dim=-1)
    sorted_remove = cdf > tfs
    sorted_remove = torch.cat(
        (
            torch.zeros(scores.shape[0], 1, dtype=torch.bool),
            sorted_remove,
            torch.ones(scores.shape[0], 1, dtype=torch.bool),
        ),
        dim=-1,
    )
    if min_tokens_to_keep > 1:
        sorted_remove[..., :min_tokens_to_keep] = False
    remove = sorted_remove.scatter(1, sorted_indices, sorted_remove)
    return scores.masked_fill(remove, NEG_INF)


# ----------------------------------------------------------------- helpers
def chain(z: float = 1.0, min_keep: int = 1, variant: str = "llama.cpp", before: list | None = None) -> Chain:
    return sampler_chain({"use": "tfs", "z": z, "min_keep": min_keep, "variant": variant}, before=before)


def logits_for(seed: int, B: int = 6, V: int = 400, scale: float = 2.0) -> torch.Tensor:
    x = random_logits(seed, B, V, scale)
    x[0, 10:90] = NEG_INF
    x[1] = x[1] * 2.5
    x[2, 1::3] = NEG_INF
    return x


def assert_kept(ours: torch.Tensor, logits: torch.Tensor, counts: list[int]) -> None:
    """Row b keeps exactly its counts[b] largest logits (as a multiset), bitwise, the rest -inf."""
    for b, count in enumerate(counts):
        kept = torch.isfinite(ours[b])
        got = ours[b][kept].sort(descending=True).values
        want = logits[b].sort(descending=True).values[:count]
        want = want[torch.isfinite(want)]
        assert torch.equal(got, want), f"row {b}: kept {int(kept.sum())} tokens, want {count}"
        assert torch.equal(ours[b][kept], logits[b][kept])


# ----------------------------------------------------------------- llama.cpp
@pytest.mark.parametrize(
    ("probs", "expected", "z"),
    [
        ([0.1, 0.15, 0.2, 0.25, 0.3], [0.3], 0.25),
        ([0.1, 0.15, 0.2, 0.25, 0.3], [0.3, 0.25], 0.75),
        ([0.1, 0.15, 0.2, 0.25, 0.3], [0.3, 0.25], 0.99),
    ],
)
def test_llama_cpp_vectors(probs, expected, z):
    logits = torch.tensor(probs, dtype=torch.float32).log()[None, :]
    out = processed_scores(chain(z, min_keep=1), logits)[0]
    kept = torch.isfinite(out)
    p = torch.softmax(logits[0], dim=-1)[kept].sort(descending=True).values  # llama.cpp does not renormalise
    assert p.shape[0] == len(expected)
    assert torch.allclose(p, torch.tensor(expected), atol=1e-5, rtol=0), p.tolist()


@pytest.mark.parametrize("seed", (0, 1, 2))
@pytest.mark.parametrize("z", (0.0, 0.2, 0.5, 0.9, 0.95, 0.999))
def test_matches_llama_cpp_formula(seed, z):
    logits = logits_for(seed)
    counts = [llama_tfs_count(row, z, 1) for row in logits.double().tolist()]
    assert_kept(processed_scores(chain(z), logits), logits, counts)


@pytest.mark.parametrize(("z", "min_keep"), [(0.3, 5), (0.9, 30), (0.0, 0)])
def test_min_keep_matches_llama_cpp(z, min_keep):
    logits = logits_for(3)
    counts = [llama_tfs_count(row, z, min_keep) for row in logits.double().tolist()]
    assert_kept(processed_scores(chain(z, min_keep), logits), logits, counts)


def test_flat_second_derivative_is_uniform_and_tiny_rows_pass():
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0, 0.0], [1.0, 0.5, NEG_INF, NEG_INF, NEG_INF]])
    out = processed_scores(chain(0.5), logits)
    # row 0: d2 = 0 -> weights 1/3 each; cdf 1/3, 2/3: cut at i = 1 -> one token
    assert int(torch.isfinite(out[0]).sum()) == 1
    assert torch.equal(out[1], logits[1])  # two candidates: a no-op


@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16))
def test_half_precision_input(dtype):
    logits = logits_for(4).to(dtype)
    x = logits.float()
    counts = [llama_tfs_count(row, 0.9, 1) for row in x.double().tolist()]
    assert_kept(processed_scores(chain(0.9), logits), x, counts)


# ----------------------------------------------------------------- text-generation-webui
@pytest.mark.parametrize("seed", (0, 1, 2))
@pytest.mark.parametrize(("z", "min_keep"), [(0.0, 1), (0.3, 1), (0.9, 1), (0.95, 3), (0.5, 40)])
def test_webui_variant_matches_webui(seed, z, min_keep):
    logits = logits_for(seed)
    ref = webui_tfs(logits.double(), z, min_keep)
    counts = torch.isfinite(ref).sum(dim=-1).tolist()
    assert_kept(processed_scores(chain(z, min_keep, "webui"), logits), logits, counts)


@pytest.mark.parametrize("k", (3, 40, 399))
def test_webui_variant_after_top_k_matches_webui_on_the_full_vocabulary(k):
    logits = logits_for(5)
    after_k = torch.full_like(logits, NEG_INF)
    idx = logits.topk(k, dim=-1).indices
    after_k.scatter_(1, idx, logits.gather(1, idx))
    ref = webui_tfs(after_k.double(), 0.8)
    ours = processed_scores(chain(0.8, variant="webui", before=[{"use": "top_k", "k": k}]), logits)
    assert_kept(ours, after_k, torch.isfinite(ref).sum(dim=-1).tolist())


def test_variants_differ_by_the_token_at_the_cut():
    logits = logits_for(6)
    a = torch.isfinite(processed_scores(chain(0.7), logits)).sum(dim=-1)
    b = torch.isfinite(processed_scores(chain(0.7, variant="webui"), logits)).sum(dim=-1)
    assert not torch.equal(a, b)


# ----------------------------------------------------------------- no-ops, per-row parameters, validation
@pytest.mark.parametrize("variant", ("llama.cpp", "webui"))
def test_z_one_is_a_bitwise_no_op(variant):
    logits = logits_for(7)
    assert_bitwise_no_op(chain(1.0, variant=variant), logits)
    assert_bitwise_no_op(chain(1.0, 9, variant), logits)


@pytest.mark.parametrize("variant", ("llama.cpp", "webui"))
def test_per_row_parameters_equal_rows_alone(variant):
    rows = [
        {"tfs": 1.0},
        {"tfs": 0.5},
        {"tfs": 0.95, "min_keep": 12},
        {"tfs": 0.0},
        {"tfs": 1.0, "min_keep": 3},
        {"tfs": 0.8},
    ]
    logits = logits_for(8)
    c = chain(variant=variant)
    batch = assert_rows_equal_alone(c, logits, rows)
    for i, params in enumerate(rows):
        z, keep = params["tfs"], params.get("min_keep", 1)
        if z >= 1.0:
            assert torch.equal(batch[i], logits[i])
        elif variant == "llama.cpp":
            assert_kept(batch[i : i + 1], logits[i : i + 1], [llama_tfs_count(logits[i].double().tolist(), z, keep)])
        else:
            ref = webui_tfs(logits[i : i + 1].double(), z, keep)
            assert_kept(batch[i : i + 1], logits[i : i + 1], torch.isfinite(ref).sum(dim=-1).tolist())


def _zipf_rows(seed: int, B: int, V: int, slope: float) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    ranks = torch.stack([torch.randperm(V, generator=g) for _ in range(B)]).double() + 1
    return (-slope * ranks.log() + 0.05 * torch.randn(B, V, generator=g, dtype=torch.float64)).float()


@pytest.mark.parametrize("variant", ["llama.cpp", "webui"])
def test_wide_rows_bracket_the_normaliser_and_keep_what_the_full_sort_keeps(variant, monkeypatch):
    """Rows of >= 16384 candidates: the cut decided from the 256 / 4096 best (the unseen tail's d2 bounded by
    telescoping) equals the full-sort cut; per-row z, min_keep, off rows, -inf entries, a near-flat row (which
    sends the batch to the full sort) all agree."""
    import samplechain_tfs as tfs

    logits = _zipf_rows(4, 6, 30000, 1.5)
    logits[1, ::2] = float("-inf")
    logits[3] = _zipf_rows(5, 1, 30000, 1.1)[0]  # a slower decay: the cut lies deeper
    per_row = [
        {"tfs": 0.95},
        {"tfs": 0.5},
        {"tfs": 1.0},
        {"tfs": 0.95, "min_keep": 30},
        {"tfs": 0.2},
        {"tfs": 0.9, "min_keep": 3},
    ]
    c = chain(z=0.95, variant=variant)
    calls = []
    real = tfs.bracketed_counts
    monkeypatch.setattr(tfs, "bracketed_counts", lambda *a: calls.append(real(*a)) or calls[-1])
    fast = processed_scores(c, logits, per_row)
    assert calls and calls[-1] is not None  # decided without the full sort
    monkeypatch.setattr("samplechain.filters.WIDE", 10**9)
    ref = processed_scores(c, logits, per_row)
    assert torch.equal(fast, ref)
    flat = torch.randn(6, 30000, generator=torch.Generator().manual_seed(1))
    monkeypatch.setattr("samplechain.filters.WIDE", 16384)
    calls.clear()
    fast = processed_scores(c, flat, per_row)
    assert calls[-1] is None  # undecided: the full sort ran
    monkeypatch.setattr("samplechain.filters.WIDE", 10**9)
    assert torch.equal(fast, processed_scores(c, flat, per_row))


@pytest.mark.parametrize(
    ("entry", "key"),
    [
        ({"z": 1.5}, "z"),
        ({"z": -0.1}, "z"),
        ({"z": float("nan")}, "z"),
        ({"z": 0.5, "min_keep": -1}, "min_keep"),
        ({"z": 0.5, "variant": "kobold"}, "variant"),
    ],
)
def test_bad_values_are_refused(entry, key):
    with pytest.raises(ConfigError, match=rf"\.{key} ="):
        Chain.load({"samplers": [{"use": "tfs", **entry}, {"use": "greedy"}]})


def test_bad_request_value_is_refused():
    store = chain(0.9).new_store()
    with pytest.raises(RequestError, match="tfs.z"):
        store.add("r", {"tfs": 1.2})
