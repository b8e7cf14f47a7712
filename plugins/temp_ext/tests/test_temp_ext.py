"""temp_ext.v1 against llama.cpp's llama_sampler_temp_ext_apply and text-generation-webui's dynamic temperature.

- llama.cpp tests/test-sampling.cpp test_temp_ext vectors, verbatim (temp_ext then dist: the probabilities).
- A step-by-step float32 port of llama_sampler_temp_ext_apply (sort, softmax, entropy, powf, temp_impl) as the
  oracle for delta > 0, within 1e-5 on probabilities.
- webui's DynamicTemperatureLogitsWarper.__call__ transcribed below (plain torch, one row at a time).
- delta <= 0 is the temperature plugin bitwise; t = 1, delta = 0 is a bitwise no-op; per-row = rows alone.
"""

from __future__ import annotations

import math

import numpy as np
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


def chain(**params) -> Chain:
    return sampler_chain({"use": "temp_ext", **params})


# --------------------------------------------------------------------------- references
def llama_temp_ext_probs(row: torch.Tensor, t: float, delta: float, exponent: float) -> np.ndarray:
    """llama_sampler_temp_ext_apply then llama_sampler_dist's softmax, in float32 as the C++ does; probabilities
    returned in token order (0 where removed). -inf candidates count as removed (not part of cur_p)."""
    f32 = np.float32
    x = row.numpy().astype(f32)
    live = np.isfinite(x)
    ids = np.nonzero(live)[0]
    logits = x[ids].copy()
    order = np.argsort(-logits, kind="stable")
    ids, logits = ids[order], logits[order]

    def temp_impl(lg: np.ndarray, temp: float) -> np.ndarray:
        if temp <= 0:
            out = np.full_like(lg, -np.inf)
            out[int(np.argmax(lg))] = lg[int(np.argmax(lg))]
            return out
        return (lg / f32(temp)).astype(f32)

    if delta > 0:
        if len(logits) > 1:
            min_t = max(f32(0), f32(t) - f32(delta))
            max_t = f32(t) + f32(delta)
            max_ent = -np.log(f32(1) / f32(len(logits)))
            p = np.exp(logits - logits[0]).astype(f32)
            p = (p / np.cumsum(p, dtype=f32)[-1]).astype(f32)
            ent = f32(0)
            for q in p:
                if q > 0:
                    ent = f32(ent - f32(q * np.log(q)))
            norm = f32(ent / max_ent)
            dyn = f32(min_t + (max_t - min_t) * f32(np.power(norm, f32(exponent))))
            logits = temp_impl(logits, float(dyn))
    else:
        logits = temp_impl(logits, t)
    # dist: softmax over the candidates
    p = np.exp((logits - logits.max()).astype(np.float64))
    p /= p.sum()
    out = np.zeros(x.shape[0])
    out[ids] = p
    return out


def webui_dynatemp(scores_row: torch.Tensor, low: float, high: float, exponent: float) -> torch.Tensor:
    """text-generation-webui modules/sampler_hijack.py DynamicTemperatureLogitsWarper.__call__ (batch of 1)."""
    scores = scores_row[None].clone()
    probs = torch.softmax(scores, dim=-1)
    entropy = -1.0 * torch.where(probs > 0, probs * torch.log(probs), torch.zeros_like(probs)).sum()
    entropy = max(entropy, torch.tensor(1e-10))
    num_valid_tokens = torch.sum(scores > -float("inf")).item()
    max_entropy = math.log(num_valid_tokens)
    max_entropy = max_entropy if max_entropy > 0.0 else 1e-10
    normalized_entropy = entropy / max_entropy
    dyn_temp = low + (high - low) * (normalized_entropy.pow(exponent))
    return (scores / dyn_temp)[0]


def probs_of(s: torch.Tensor) -> torch.Tensor:
    return torch.softmax(s.double(), dim=-1)


# --------------------------------------------------------------------------- llama.cpp vectors
@pytest.mark.parametrize(
    ("probs", "expected", "t", "delta", "exponent"),
    [
        # tests/test-sampling.cpp, verbatim
        ([0.1, 0.2, 0.3, 0.4], [0.1, 0.2, 0.3, 0.4], 1.0, 0.0, 1.0),
        ([0.1, 0.2, 0.3, 0.4], [0.0, 0.0, 0.0, 1.0], 0.0, 0.0, 1.0),
    ],
)
def test_llama_cpp_test_sampling_vectors(probs, expected, t, delta, exponent):
    logits = torch.tensor([probs], dtype=torch.float32).log()
    got = torch.softmax(processed_scores(chain(t=t, delta=delta, exponent=exponent), logits), dim=-1)[0]
    assert torch.allclose(got.double(), torch.tensor(expected, dtype=torch.float64), atol=1e-5)


@pytest.mark.parametrize("formula", ("llama.cpp", "webui"))
def test_hand_computed_uniform_vector(formula):
    """Uniform 4 tokens: H / log n = 1, so T = t + delta: still uniform; the logits are divided by t + delta."""
    logits = torch.full((1, 4), 2.0)
    out = processed_scores(chain(t=1.0, delta=0.5, exponent=1.0, formula=formula), logits)
    assert torch.allclose(out, torch.full((1, 4), 2.0 / 1.5), atol=1e-6)


def test_hand_computed_two_token_vector():
    """p = (0.8, 0.2): H = 0.500402, H / ln 2 = 0.721928; t = 1, delta = 1, exponent = 2: T = 2 * 0.521180."""
    logits = torch.tensor([[math.log(0.8), math.log(0.2)]])
    out = processed_scores(chain(t=1.0, delta=1.0, exponent=2.0), logits)
    h = -(0.8 * math.log(0.8) + 0.2 * math.log(0.2))
    temp = 0.0 + 2.0 * (h / math.log(2)) ** 2
    assert abs(temp - 1.0423604) < 1e-6
    assert torch.allclose(out, logits / temp, atol=1e-6)


# --------------------------------------------------------------------------- llama.cpp port, random logits
@pytest.mark.parametrize("vocab", (4, 50, 1000))
@pytest.mark.parametrize("seed", (0, 1))
@pytest.mark.parametrize(
    ("t", "delta", "exponent"),
    [(1.0, 0.5, 1.0), (0.8, 0.5, 2.0), (0.3, 1.0, 0.5), (1.5, 0.2, 1.0), (0.0, 1.0, 1.0), (1.0, 1.0, 0.0)],
)
def test_dynamic_matches_llama_cpp_port(seed, vocab, t, delta, exponent):
    logits = logits_for(seed, vocab, scale=2.0)
    logits[0, ::3] = float("-inf")  # removed candidates are not part of cur_p
    logits[1, 1] = logits[1, 0]  # a tie
    got = probs_of(processed_scores(chain(t=t, delta=delta, exponent=exponent), logits))
    for b in range(B):
        want = torch.from_numpy(llama_temp_ext_probs(logits[b], t, delta, exponent))
        assert torch.allclose(got[b], want, atol=1e-5), f"row {b}"


@pytest.mark.parametrize("formula", ["llama.cpp", "webui"])
def test_wide_rows_compute_the_entropy_in_float32(formula, monkeypatch):
    """Rows of >= 16384 candidates take a float32 entropy (llama.cpp's precision): the same temperatures as the
    float64 path to float32 accuracy, with -inf entries, a single live candidate and per-row parameters."""
    logits = logits_for(3, 20000, scale=2.0)
    logits[0, ::3] = float("-inf")
    logits[2, 1:] = float("-inf")
    c = chain(t=0.9, delta=0.5, exponent=1.5, formula=formula)
    per_row = [{}, {"dynatemp_range": 0.3}, {}, {"temperature": 1.4, "dynatemp_exponent": 0.5}]
    fast = processed_scores(c, logits, per_row[:B] + [{}] * (B - len(per_row)))
    monkeypatch.setattr("samplechain.filters.WIDE", 10**9)
    ref = processed_scores(c, logits, per_row[:B] + [{}] * (B - len(per_row)))
    assert torch.equal(torch.isfinite(fast), torch.isfinite(ref))
    live = torch.isfinite(ref)
    assert torch.allclose(fast[live], ref[live], rtol=1e-5, atol=1e-5)
    assert not torch.equal(fast, logits)  # the dynamic temperature did change the rows


def test_single_live_candidate_row_is_unchanged_llama_cpp():
    logits = torch.full((1, 6), float("-inf"))
    logits[0, 2] = 3.0
    assert_bitwise_no_op(chain(t=1.0, delta=0.5), logits)


def test_dyn_temp_zero_keeps_only_the_argmax():
    """t = delta: lo = 0, and a one-hot-like distribution (H ~ 0) gives T = 0 with exponent large."""
    logits = torch.tensor([[50.0, 0.0, -10.0, -20.0]])
    out = processed_scores(chain(t=0.5, delta=0.5, exponent=8.0), logits)
    assert torch.isfinite(out).tolist() == [[True, False, False, False]]
    assert out[0, 0] == 50.0


# --------------------------------------------------------------------------- webui formula
@pytest.mark.parametrize("vocab", (4, 50, 1000))
@pytest.mark.parametrize("seed", (0, 1, 2))
@pytest.mark.parametrize(("t", "delta", "exponent"), [(1.0, 0.5, 1.0), (1.25, 0.75, 2.0), (0.75, 0.25, 0.5)])
def test_webui_formula_matches_webui(seed, vocab, t, delta, exponent):
    logits = logits_for(seed, vocab, scale=2.0)
    logits[0, ::3] = float("-inf")
    logits[2, 1:] = float("-inf")  # a single live token: webui uses T = high there
    out = processed_scores(chain(t=t, delta=delta, exponent=exponent, formula="webui"), logits)
    for b in range(B):
        want = webui_dynatemp(logits[b], t - delta, t + delta, exponent)
        assert torch.allclose(probs_of(out[b]), probs_of(want), atol=1e-5), f"row {b}"
        fin = torch.isfinite(want)
        assert torch.equal(torch.isfinite(out[b]), fin)
        assert torch.allclose(out[b][fin], want[fin], rtol=1e-5, atol=1e-5)


def test_formulas_differ_where_the_references_do():
    """Same row, t - delta < 0: llama.cpp clamps lo to 0, webui would divide by a negative T (refused)."""
    logits = logits_for(3, 50)
    a = processed_scores(chain(t=1.0, delta=0.5), logits)
    b = processed_scores(chain(t=1.0, delta=0.5, formula="webui"), logits)
    assert torch.allclose(probs_of(a), probs_of(b), atol=1e-5)  # same range, same H: same result
    single = torch.full((1, 5), float("-inf"))
    single[0, 0] = 4.0
    assert torch.equal(processed_scores(chain(t=1.0, delta=0.5), single), single)  # llama.cpp: n <= 1 untouched
    assert processed_scores(chain(t=1.0, delta=0.5, formula="webui"), single)[0, 0] == pytest.approx(4.0 / 1.5)


# --------------------------------------------------------------------------- plain temperature, no-op, per row
@pytest.mark.parametrize("t", (0.0, 0.5, 0.7, 1.0, 2.0))
@pytest.mark.parametrize("delta", (0.0, -1.0))
def test_delta_not_positive_is_the_temperature_plugin_bitwise(t, delta):
    logits = logits_for(5, 1000)
    want = (
        Chain.load({"samplers": [{"use": "temperature", "t": t}, {"use": "greedy"}]})
        .sample(logits, return_scores=True)
        .scores
    )
    assert torch.equal(processed_scores(chain(t=t, delta=delta), logits), want)


@pytest.mark.parametrize("formula", ("llama.cpp", "webui"))
def test_t_one_delta_zero_is_a_bitwise_no_op(formula):
    logits = logits_for(7, 1000)
    logits[0, :5] = float("-inf")
    assert_bitwise_no_op(chain(t=1.0, delta=0.0, formula=formula), logits)


@pytest.mark.parametrize("formula", ("llama.cpp", "webui"))
def test_per_row_equals_rows_alone(formula):
    rows = [
        {"temperature": 1.0, "dynatemp_range": 0.0},
        {"temperature": 1.0, "dynatemp_range": 0.5, "dynatemp_exponent": 1.0},
        {"temperature": 0.0 if formula == "llama.cpp" else 0.5},
        {"temperature": 0.8, "dynatemp_range": 0.5, "dynatemp_exponent": 2.0},
        {"temperature": 1.5, "dynatemp_range": 0.25},
        {"temperature": 0.7},
        {"temperature": 1.0, "dynatemp_range": 0.75, "dynatemp_exponent": 0.5},
        {"temperature": 2.0, "dynatemp_range": 1.0},
    ]
    logits = logits_for(11, 500)
    c = chain(formula=formula)
    batch = assert_rows_equal_alone(c, logits, rows)
    assert torch.equal(batch[0], logits[0])


def test_argmax_invariant():
    logits = logits_for(2, 1000)
    out = chain(t=0.8, delta=0.6, exponent=1.0).sample(logits)
    assert torch.equal(out.token_ids, logits.argmax(dim=-1))


def test_half_precision_input():
    logits = logits_for(4, 300).to(torch.bfloat16)
    out = processed_scores(chain(t=1.0, delta=0.5), logits)
    assert out.dtype == torch.float32
    want = processed_scores(chain(t=1.0, delta=0.5), logits.float())
    assert torch.equal(out, want)


@pytest.mark.parametrize(
    ("params", "key"),
    [
        ({"t": -0.5}, "t"),
        ({"t": float("nan")}, "t"),
        ({"delta": float("inf")}, "delta"),
        ({"exponent": -1.0}, "exponent"),
        ({"formula": "kobold"}, "formula"),
        ({"t": 0.5, "delta": 0.5, "formula": "webui"}, "delta"),
    ],
)
def test_bad_values_are_refused_naming_the_key(params, key):
    with pytest.raises(ConfigError, match=key):
        chain(**params)


def test_bad_request_value_is_refused():
    c = chain()
    with pytest.raises(Exception, match="exponent"):
        c.new_store().add("r", {"dynatemp_exponent": -2.0})


def test_entropy_of_a_peaked_row_keeps_its_digits_and_its_width():
    """A row whose maximum holds all but ~1e-14 of the mass: its entropy (~1e-12) against 50-digit arithmetic, and
    the same padded with -inf to another width (a compacted row in a batch). log(S) with S = 1 + 1e-14 rounded with
    the width of the sum, and so did the dynamic temperature (which scales every logit by ~1e11 on such rows)."""
    import mpmath

    from samplechain_temp_ext import _row_entropy

    row = torch.tensor([0.0, -33.0, -34.5, -36.0, -35.25, -40.0])
    mpmath.mp.dps = 50
    e = [mpmath.e ** mpmath.mpf(float(v)) for v in row]
    s = mpmath.fsum(e)
    want = float(-mpmath.fsum(p * mpmath.log(p) for p in (v / s for v in e)))
    got, _ = _row_entropy(row[None, :])
    padded, _ = _row_entropy(torch.cat([row, torch.full((58,), -math.inf)])[None, :])
    assert abs(float(got[0]) - want) <= 1e-6 * want
    assert float(padded[0]) == float(got[0]) or abs(float(padded[0]) - float(got[0])) <= 1e-9 * want
