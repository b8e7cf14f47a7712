"""top_a.v1 against text-generation-webui's `TopALogitsWarper` (modules/sampler_hijack.py), re-implemented below in
plain torch as the oracle (koboldcpp's `sample_top_a` keeps the same set).

- Kept set: the oracle's, run on the float64 logits, except for tokens within EPS of the threshold (ours compares
  in logit space: logit >= log(a) + 2 max - logsumexp); kept logits bitwise, removed ones -inf.
- Random logits with ties, -inf entries, float16 / bfloat16 input, after top_k (sorted, compacted candidates).
- Per-row parameters equal each row alone; a = 0 is a bitwise no-op; min_keep; bad values refused.
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
    top_k_only,
)

NEG_INF = float("-inf")
EPS = 1e-5


def webui_top_a(scores: torch.Tensor, top_a: float, min_tokens_to_keep: int = 1) -> torch.Tensor:
    """text-generation-webui's TopALogitsWarper.__call__, written out (the oracle)."""
    sorted_logits, sorted_indices = torch.sort(scores, descending=True)
    probs = sorted_logits.softmax(dim=-1)
    probs_max = probs[..., 0, None]
    sorted_remove = probs < probs_max * probs_max * top_a
    if min_tokens_to_keep > 1:
        sorted_remove[..., :min_tokens_to_keep] = False
    remove = sorted_remove.scatter(1, sorted_indices, sorted_remove)
    return scores.masked_fill(remove, NEG_INF)


def chain(a: float = 0.0, min_keep: int = 1, before: list | None = None) -> Chain:
    return sampler_chain({"use": "top_a", "a": a, "min_keep": min_keep}, before=before)


def logits_for(seed: int, B: int = 6, V: int = 500, scale: float = 1.5) -> torch.Tensor:
    x = random_logits(seed, B, V, scale)
    x[0, 3:60] = NEG_INF
    x[1, :] = torch.round(x[1, :] * 2) / 2  # ties
    x[2, 0:3] = x[2].max() + 2.0  # a tie at the top
    return x


def assert_matches(ours: torch.Tensor, logits: torch.Tensor, a: float, min_keep: int = 1) -> None:
    ref = webui_top_a(logits.double(), a, min_keep)
    kept, want = torch.isfinite(ours), torch.isfinite(ref)
    x = logits.double()
    lse = torch.logsumexp(x, dim=-1, keepdim=True)
    threshold = math.log(a) + 2 * x.amax(dim=-1, keepdim=True) - lse
    band = ((x - threshold).abs() <= EPS) & torch.isfinite(x)
    assert int(band.sum(dim=-1).max()) <= 4, "the rounding band holds too many tokens"
    if min_keep > 1:  # which of equal logits at the min_keep-th place survives is each sort's choice
        kth = x.topk(min(min_keep, x.shape[1]), dim=-1).values[:, -1:]
        band |= (x == kth) & (kept.sum(dim=-1, keepdim=True) == want.sum(dim=-1, keepdim=True))
    bad = (kept != want) & ~band
    assert not bool(bad.any()), f"a={a}: kept sets differ at (row, token) {bad.nonzero()[:8].tolist()}"
    assert torch.equal(ours[kept], logits[kept]), "kept logits must be the input logits, bitwise"
    assert not bool(torch.isfinite(ours[~kept]).any())


@pytest.mark.parametrize("seed", (0, 1, 2))
@pytest.mark.parametrize("a", (0.01, 0.1, 0.2, 0.5, 1.0))
def test_matches_webui(seed, a):
    logits = logits_for(seed)
    assert_matches(processed_scores(chain(a), logits), logits, a)


@pytest.mark.parametrize("scale", (4.0, 8.0))
def test_peaked_distributions_match_webui(scale):
    logits = logits_for(7, scale=scale)
    for a in (0.05, 0.3, 0.9):
        assert_matches(processed_scores(chain(a), logits), logits, a)


@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16))
def test_half_precision_input(dtype):
    logits = logits_for(3).to(dtype)
    assert_matches(processed_scores(chain(0.2), logits), logits.float(), 0.2)


@pytest.mark.parametrize(("a", "min_keep"), [(1.0, 5), (0.5, 3), (0.2, 40)])
def test_min_keep_matches_webui(a, min_keep):
    logits = logits_for(4, scale=4.0)
    assert_matches(processed_scores(chain(a, min_keep), logits), logits, a, min_keep)


def test_after_top_k_matches_webui_pipeline():
    logits = logits_for(5)
    ours = processed_scores(chain(0.3, before=[{"use": "top_k", "k": 40}]), logits)
    after_k = top_k_only(logits, 40)
    assert_matches(ours, after_k, 0.3)


def test_a_zero_is_a_bitwise_no_op():
    logits = logits_for(6)
    assert_bitwise_no_op(chain(0.0), logits)
    assert_bitwise_no_op(chain(0.0, 9), logits)


@pytest.mark.parametrize("seed", (0, 1))
def test_per_row_parameters_equal_rows_alone(seed):
    rows = [
        {"top_a": 0.0},
        {"top_a": 0.2},
        {"top_a": 1.0, "min_keep": 4},
        {"top_a": 0.05},
        {"top_a": 0.0, "min_keep": 8},
        {"top_a": 0.6},
    ]
    logits = logits_for(seed, scale=3.0)
    batch = assert_rows_equal_alone(chain(), logits, rows)
    for i, params in enumerate(rows):
        if params["top_a"] == 0.0:
            assert torch.equal(batch[i], logits[i])
        else:
            assert_matches(batch[i : i + 1], logits[i : i + 1], params["top_a"], params.get("min_keep", 1))


@pytest.mark.parametrize(
    ("entry", "key"),
    [
        ({"a": 1.5}, "a"),
        ({"a": -0.1}, "a"),
        ({"a": float("nan")}, "a"),
        ({"a": 0.2, "min_keep": -1}, "min_keep"),
    ],
)
def test_bad_values_are_refused(entry, key):
    with pytest.raises(ConfigError, match=rf"\.{key} ="):
        Chain.load({"samplers": [{"use": "top_a", **entry}, {"use": "greedy"}]})


def test_bad_request_value_is_refused():
    store = chain(0.2).new_store()
    with pytest.raises(RequestError, match="top_a.a"):
        store.add("r", {"top_a": 2.0})


@pytest.mark.parametrize("scale", [1.0, 3.0, 8.0])
def test_wide_rows_keep_what_the_float64_path_keeps(scale, monkeypatch):
    """Rows of >= 16384 candidates bound the threshold by float32 exponentials summed in float64 (the float64
    threshold decides a row with a logit inside the bound): the same kept sets as the float64 path on random rows
    (-inf entries, per-row min_keep)."""
    from samplechain.tools.testing import assert_wide_path_keeps

    assert_wide_path_keeps({"use": "top_a", "a": 0.05}, monkeypatch, [{}, {}, {"min_keep": 50}, {}], scale)
