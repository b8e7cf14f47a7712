"""p_less.v1 against llama.cpp's test_p_less vectors (pull request #26035, tests/test-sampling.cpp) and the
paper's rule (keep p >= sum p^2) computed independently in float64.

There is no transformers class for p-less; the rule oracle below is the paper's definition, written directly.
Kept logits are bitwise the input logits, removed ones -inf.
"""

from __future__ import annotations

import math

import pytest
import torch
from transformers.generation.logits_process import TopKLogitsWarper

from samplechain import Chain, ConfigError, RequestError
from samplechain.tools.testing import (
    assert_bitwise_no_op,
    assert_kept_logits_bitwise,
    assert_probs_close,
    assert_rows_equal_alone,
    processed_scores,
    random_logits,
    sampler_chain,
)

B = 6
ATOL = 1e-5


def logits_for(seed: int, vocab: int, scale: float = 2.0) -> torch.Tensor:
    return random_logits(seed, B, vocab, scale)


def chain(before: list | None = None, **params) -> Chain:
    return sampler_chain({"use": "p_less", **params}, before=before)


def reference(logits: torch.Tensor, tolerance: float = 1e-5, min_keep: int = 1) -> torch.Tensor:
    """The paper's rule on float64 probabilities, plus the min_keep most likely (ties included)."""
    x = logits.double()
    prob = torch.softmax(x, dim=-1)
    keep = prob >= (prob**2).sum(dim=-1, keepdim=True) - tolerance
    kth = x.topk(max(min_keep, 1), dim=-1).values[:, -1:]
    return x.masked_fill(~(keep | (x >= kth)), float("-inf"))


def assert_close_to(ours: torch.Tensor, logits: torch.Tensor, ref: torch.Tensor) -> None:
    kept = assert_kept_logits_bitwise(ours, logits)
    assert torch.equal(kept, torch.isfinite(ref)), f"kept sets differ at {(kept != torch.isfinite(ref)).nonzero()[:8]}"
    assert_probs_close(ours, ref, ATOL)


# ---------------------------------------------------------------- llama.cpp test-sampling.cpp (PR #26035), verbatim
# test_p_less(probs, probs_expected) applies llama_sampler_init_p_less() then dist: the expected values are the
# renormalised probabilities of the kept tokens, in token order.
LLAMA_CPP_P_LESS = [
    ([0.1, 0.15, 0.2, 0.25, 0.3], [0.45454545, 0.54545455]),  # threshold 0.225: keeps 0.25 and 0.30
    ([0.2, 0.2, 0.2, 0.2, 0.2], [0.2, 0.2, 0.2, 0.2, 0.2]),  # threshold 0.20: a uniform row keeps every token
]


@pytest.mark.parametrize(("probs", "expected"), LLAMA_CPP_P_LESS)
def test_llama_cpp_vectors(probs, expected):
    logits = torch.tensor([[math.log(v) for v in probs]], dtype=torch.float32)
    ours = processed_scores(chain(min_keep=0), logits, process=True)[0]
    kept = torch.isfinite(ours)
    got = torch.softmax(ours[kept].double(), dim=-1).tolist()  # dist: softmax over the survivors, token order
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert abs(g - e) < 1e-5


def test_uniform_row_needs_the_tolerance():
    """Without the tolerance, float rounding of sum p^2 can put the threshold above 1/n on a uniform row (what
    llama.cpp's epsilon guards against); the top candidate (all of them here: they tie) always survives."""
    logits = torch.zeros(1, 5)
    assert int(torch.isfinite(processed_scores(chain(), logits, process=True)).sum()) == 5
    strict = int(torch.isfinite(processed_scores(chain(tolerance=0.0), logits, process=True)).sum())
    assert strict == 5  # a tie group at the top survives whole
    assert int(torch.isfinite(processed_scores(chain(tolerance=0.0, min_keep=0), logits, process=True)).sum()) == 5


# ---------------------------------------------------------------- the rule on random logits
@pytest.mark.parametrize("vocab", (50, 1000, 32000))
@pytest.mark.parametrize("seed", (0, 1))
@pytest.mark.parametrize("scale", (0.5, 2.0, 6.0))
def test_matches_the_rule_on_random_logits(vocab, seed, scale):
    logits = logits_for(seed, vocab, scale)
    for tol in (1e-5, 0.0):
        assert_close_to(processed_scores(chain(tolerance=tol), logits, process=True), logits, reference(logits, tol))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_input_with_ties(dtype):
    logits = logits_for(5, 4000, 3.0).to(dtype)
    up = logits.double()
    ours = processed_scores(chain(), logits, process=True)
    assert_close_to(ours, up, reference(up))
    kept = torch.isfinite(ours)
    # tied tokens share a fate
    lowest = torch.where(kept, up, float("inf")).amin(dim=-1, keepdim=True)
    assert torch.equal(kept, up >= lowest)


def test_minus_inf_entries_are_never_kept():
    logits = logits_for(6, 1000)
    logits[:, 1::3] = float("-inf")
    ours = processed_scores(chain(), logits, process=True)
    assert not bool(torch.isfinite(ours[:, 1::3]).any())
    assert_close_to(ours, logits, reference(logits))


@pytest.mark.parametrize("min_keep", (3, 25))
def test_min_keep(min_keep):
    logits = logits_for(3, 1000, 4.0)
    ours = processed_scores(chain(min_keep=min_keep), logits, process=True)
    assert_close_to(ours, logits, reference(logits, min_keep=min_keep))
    assert bool((torch.isfinite(ours).sum(dim=-1) >= min_keep).all())


def test_after_top_k_uses_the_survivors_distribution():
    logits = logits_for(12, 5000)
    ours = processed_scores(chain(before=[{"use": "top_k", "k": 40}]), logits, process=True)
    after_k = TopKLogitsWarper(40)(None, logits.clone())
    assert_close_to(ours, after_k, reference(after_k))


def test_top_token_always_survives():
    logits = logits_for(4, 32000, 0.05)
    ours = processed_scores(chain(tolerance=0.0, min_keep=0), logits, process=True)
    assert torch.equal(ours.argmax(dim=-1), logits.argmax(dim=-1))


# ---------------------------------------------------------------- batching, no-ops, validation
def test_per_row_params_equal_rows_alone():
    c = chain()
    key = f"{c.layout.entries[0].id}.tolerance"
    rows = [
        {"p_less": False},
        {"p_less": True},
        {"p_less": True, "min_keep": 7},
        {"p_less": True, key: 0.0},
        {"p_less": False, "min_keep": 9},
        {"p_less": True, key: 0.01},
    ]
    logits = logits_for(7, 3000, 3.0)
    batch = assert_rows_equal_alone(c, logits, rows, process=True)
    for i, params in enumerate(rows):
        if not params["p_less"]:
            assert torch.equal(batch[i], logits[i])
        else:
            ref = reference(logits[i : i + 1], params.get(key, 1e-5), params.get("min_keep", 1))
            assert_close_to(batch[i : i + 1], logits[i : i + 1], ref)


@pytest.mark.parametrize("vocab", (50, 32000))
def test_disabled_is_a_bitwise_no_op(vocab):
    logits = logits_for(9, vocab)
    assert_bitwise_no_op(chain(enabled=False, min_keep=5), logits, process=True)
    out = chain(enabled=False).sample(logits, return_scores=True)
    assert torch.equal(out.scores, logits)


@pytest.mark.parametrize(
    ("key", "value"),
    [("tolerance", -1e-3), ("tolerance", 2.0), ("tolerance", float("nan")), ("min_keep", -1), ("enabled", "yes")],
)
def test_bad_values_are_refused(key, value):
    with pytest.raises(ConfigError, match=key):
        Chain.load({"samplers": [{"use": "p_less", key: value}, {"use": "dist"}]})


def test_bad_request_value_is_refused():
    store = chain().new_store()
    with pytest.raises(RequestError, match="min_keep"):
        store.add("r", {"min_keep": -2})


def test_chain_with_dist_samples_a_kept_token():
    c = Chain.load({"samplers": [{"use": "p_less"}, {"use": "dist"}]})
    out = c.sample(logits_for(0, 1000), return_scores=True)
    assert bool(torch.isfinite(out.scores.gather(1, out.token_ids[:, None])).all())


@pytest.mark.parametrize("scale", [1.0, 3.0, 8.0])
def test_wide_rows_keep_what_the_float64_path_keeps(scale, monkeypatch):
    """Rows of >= 16384 candidates (float64, as every row; the kept mask compacted): the same kept sets as the
    plain path on random rows (-inf entries, per-row min_keep)."""
    from samplechain.tools.testing import assert_wide_path_keeps

    assert_wide_path_keeps({"use": "p_less"}, monkeypatch, [{}, {}, {"min_keep": 50}, {}], scale)
