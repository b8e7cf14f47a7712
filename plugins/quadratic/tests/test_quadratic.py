"""quadratic.v1 against text-generation-webui's QuadraticSamplingLogitsWarper (modules/sampler_hijack.py).

The oracle below is webui's __call__ transcribed in plain torch and run on one row at a time (webui takes the max
over the whole tensor; it runs batch 1). With float32-representable factor / curve the result is bitwise equal;
for other values within 1e-5 on probabilities (our per-row values are stored in float32).
"""

from __future__ import annotations

import pytest
import torch

from samplechain import Chain, ConfigError
from samplechain.tools.testing import (
    assert_bitwise_no_op,
    assert_rows_equal_alone,
    processed_scores,
    random_logits,
    sampler_chain,
)

B = 8


def logits_for(seed: int, vocab: int, scale: float = 3.0) -> torch.Tensor:
    return random_logits(seed, B, vocab, scale)


def webui_quadratic(scores: torch.Tensor, smoothing_factor: float, smoothing_curve: float) -> torch.Tensor:
    """QuadraticSamplingLogitsWarper.__call__, as in text-generation-webui."""
    max_logit = scores.max()
    diff = scores - max_logit
    k = (3 - smoothing_curve) / 2
    s = (smoothing_curve - 1) / 2
    return torch.where(
        scores != float("-inf"),
        -(k * smoothing_factor * diff**2) + (s * smoothing_factor * diff**3) + max_logit,
        scores,
    )


def webui_rows(logits: torch.Tensor, factor: float, curve: float) -> torch.Tensor:
    return torch.stack([webui_quadratic(logits[b : b + 1], factor, curve)[0] for b in range(logits.shape[0])])


def chain(**params) -> Chain:
    return sampler_chain({"use": "quadratic", **params})


def with_edges(logits: torch.Tensor) -> torch.Tensor:
    logits = logits.clone()
    logits[0, ::4] = float("-inf")  # masked candidates stay masked
    logits[1, 2] = logits[1].max()  # a tie at the top
    logits[2, 5:9] = logits[2, 4]  # ties below
    return logits


@pytest.mark.parametrize("vocab", (50, 1000, 32000))
@pytest.mark.parametrize("seed", (0, 1))
@pytest.mark.parametrize(("factor", "curve"), [(0.25, 1.0), (0.5, 1.0), (1.0, 2.0), (3.0, 1.5), (0.125, 4.0)])
def test_bitwise_equals_webui_for_representable_values(seed, vocab, factor, curve):
    logits = with_edges(logits_for(seed, vocab))
    ours = processed_scores(chain(factor=factor, curve=curve), logits)
    assert torch.equal(ours, webui_rows(logits, factor, curve))


@pytest.mark.parametrize(("factor", "curve"), [(0.3, 1.0), (0.23, 2.7), (1.7, 1.1)])
def test_other_values_match_webui_probabilities(factor, curve):
    logits = with_edges(logits_for(3, 1000))
    ours = torch.softmax(processed_scores(chain(factor=factor, curve=curve), logits).double(), dim=-1)
    ref = torch.softmax(webui_rows(logits, factor, curve).double(), dim=-1)
    assert torch.allclose(ours, ref, atol=1e-5)


def test_hand_computed_vector():
    """logits (2, 1, 0), factor 0.5, curve 1 (k = 1, s = 0): 2 - 0.5 * d**2 = (2, 1.5, 0)."""
    logits = torch.tensor([[2.0, 1.0, 0.0, float("-inf")]])
    assert processed_scores(chain(factor=0.5, curve=1.0), logits).tolist() == [[2.0, 1.5, 0.0, float("-inf")]]
    # curve 3: k = 0, s = 1: 2 + 0.5 * d**3 = (2, 1.5, -2)
    assert processed_scores(chain(factor=0.5, curve=3.0), logits).tolist() == [[2.0, 1.5, -2.0, float("-inf")]]


def test_half_precision_input():
    logits = logits_for(4, 1000).to(torch.bfloat16)
    ours = processed_scores(chain(factor=0.5, curve=1.5), logits)
    assert ours.dtype == torch.float32
    assert torch.equal(ours, webui_rows(logits.float(), 0.5, 1.5))


@pytest.mark.parametrize("vocab", (50, 32000))
@pytest.mark.parametrize("curve", (1.0, 2.5))
def test_factor_zero_is_a_bitwise_no_op(vocab, curve):
    logits = with_edges(logits_for(9, vocab))
    assert_bitwise_no_op(chain(factor=0.0, curve=curve), logits)


def test_per_row_equals_rows_alone_and_webui():
    rows = [
        {"smoothing_factor": 0.0},
        {"smoothing_factor": 0.5},
        {"smoothing_factor": 0.25, "smoothing_curve": 2.0},
        {"smoothing_factor": 0.0, "smoothing_curve": 3.0},
        {"smoothing_factor": 2.0, "smoothing_curve": 1.5},
        {"smoothing_factor": 1.0},
        {"smoothing_factor": 0.125, "smoothing_curve": 4.0},
        {"smoothing_factor": 4.0, "smoothing_curve": 1.25},
    ]
    logits = with_edges(logits_for(5, 1000))
    c = chain()
    batch = assert_rows_equal_alone(c, logits, rows)
    for i, params in enumerate(rows):
        factor, curve = params["smoothing_factor"], params.get("smoothing_curve", 1.0)
        want = logits[i] if factor == 0.0 else webui_quadratic(logits[i : i + 1], factor, curve)[0]
        assert torch.equal(batch[i], want), f"row {i} {params} differs from webui"


@pytest.mark.parametrize(("factor", "curve"), [(0.5, 1.0), (1.0, 2.5)])
def test_top_token_keeps_its_logit_and_stays_on_top(factor, curve):
    logits = logits_for(6, 1000)
    out = chain(factor=factor, curve=curve).sample(logits, return_scores=True)
    assert torch.equal(out.token_ids, logits.argmax(dim=-1))
    assert torch.equal(out.scores.amax(dim=-1), logits.amax(dim=-1))


@pytest.mark.parametrize(
    ("params", "key"),
    [
        ({"factor": -0.1}, "factor"),
        ({"factor": float("inf")}, "factor"),
        ({"factor": 0.5, "curve": 0.5}, "curve"),
        ({"factor": 0.5, "curve": float("nan")}, "curve"),
        ({"smoothing": 0.5}, "smoothing"),
    ],
)
def test_bad_values_are_refused_naming_the_key(params, key):
    with pytest.raises(ConfigError, match=key):
        chain(**params)
