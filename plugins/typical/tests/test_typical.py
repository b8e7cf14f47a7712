"""typical.v1 against llama.cpp's test_typical vectors and transformers' TypicalLogitsWarper.

Equivalence level: exact kept sets on the test data (float64 entropy and running mass, as the float64 oracle);
probabilities compared within 1e-5. Kept logits are bitwise the input logits, removed ones -inf.
"""

from __future__ import annotations

import math

import pytest
import torch
from transformers.generation.logits_process import TopKLogitsWarper, TypicalLogitsWarper

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


def chain(p: float = 1.0, min_keep: int = 1, semantics: str = "llama.cpp", before: list | None = None) -> Chain:
    return sampler_chain({"use": "typical", "p": p, "min_keep": min_keep, "semantics": semantics}, before=before)


def reference(logits: torch.Tensor, p: float, min_keep: int = 1) -> torch.Tensor:
    return TypicalLogitsWarper(p, min_tokens_to_keep=max(min_keep, 1))(None, logits.double())


def assert_close_to(ours: torch.Tensor, logits: torch.Tensor, ref: torch.Tensor) -> None:
    assert_kept_logits_bitwise(ours, logits)
    assert_probs_close(ours, ref, ATOL)


# ---------------------------------------------------------------- llama.cpp tests/test-sampling.cpp, verbatim
# test_typical(probs, probs_expected, p) applies llama_sampler_init_typical(p, 0) and checks cur_p's p values,
# i.e. the softmax before truncation, of the kept tokens in the order typical leaves them (most typical first).
LLAMA_CPP_TYPICAL = [
    ([0.97, 0.01, 0.01, 0.01], [0.97], 0.5),
    ([0.4, 0.2, 0.2, 0.2], [0.2, 0.2, 0.2], 0.5),
]


@pytest.mark.parametrize(("probs", "expected", "p"), LLAMA_CPP_TYPICAL)
def test_llama_cpp_vectors(probs, expected, p):
    logits = torch.tensor([[math.log(v) for v in probs]], dtype=torch.float32)
    ours = processed_scores(chain(p, 0), logits, process=True)[0]
    kept = torch.isfinite(ours)
    prob = torch.softmax(logits[0].double(), dim=-1)
    entropy = -(prob * prob.log()).sum()
    distance = (-prob.log() - entropy).abs()
    order = [i for i in torch.argsort(distance, stable=True).tolist() if kept[i]]
    got = [prob[i].item() for i in order]
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert abs(g - e) < 1e-5


# ---------------------------------------------------------------- transformers
@pytest.mark.parametrize("semantics", ["transformers", "llama.cpp"])
@pytest.mark.parametrize("vocab", (50, 1000, 8000))
@pytest.mark.parametrize("seed", (0, 1))
@pytest.mark.parametrize("p", (0.05, 0.2, 0.5, 0.9, 0.99))
def test_matches_transformers_on_random_logits(semantics, vocab, seed, p):
    """Continuous random logits have no ties and no running mass exactly equal to p, so both semantics give
    transformers' set."""
    logits = logits_for(seed, vocab)
    assert_close_to(processed_scores(chain(p, semantics=semantics), logits, process=True), logits, reference(logits, p))


@pytest.mark.parametrize("semantics", ["transformers", "llama.cpp"])
def test_matches_transformers_on_a_full_size_vocabulary(semantics):
    logits = logits_for(2, 32000)
    ours = processed_scores(chain(0.9, semantics=semantics), logits, process=True)
    assert_close_to(ours, logits, reference(logits, 0.9))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("p", (0.3, 0.9))
def test_half_precision_input_with_ties_matches_transformers(dtype, p):
    """fp16 / bf16 logits are rounded to few distinct values: many exact ties. transformers semantics keeps whole
    tie groups at the cut, as TypicalLogitsWarper (run on the same values, upcast)."""
    logits = logits_for(5, 2000).to(dtype)
    up = logits.double()
    assert int((up[0][:, None] == up[0][None, :]).sum()) > 2000 + 100, "the test needs ties"
    ours = processed_scores(chain(p, semantics="transformers"), logits, process=True)
    assert_close_to(ours, up, reference(up, p))


@pytest.mark.parametrize("semantics", ["transformers", "llama.cpp"])
def test_minus_inf_entries_are_never_kept(semantics):
    logits = logits_for(6, 1000)
    logits[:, 1::3] = float("-inf")
    ours = processed_scores(chain(0.9, semantics=semantics), logits, process=True)
    assert not bool(torch.isfinite(ours[:, 1::3]).any())
    assert_close_to(ours, logits, reference(logits, 0.9))


@pytest.mark.parametrize(("p", "min_keep"), [(0.05, 5), (0.01, 20), (0.5, 3)])
@pytest.mark.parametrize("semantics", ["transformers", "llama.cpp"])
def test_min_keep_matches_transformers(p, min_keep, semantics):
    logits = logits_for(3, 1000)
    ours = processed_scores(chain(p, min_keep, semantics), logits, process=True)
    assert_close_to(ours, logits, reference(logits, p, min_keep))
    assert bool((torch.isfinite(ours).sum(dim=-1) >= min_keep).all())


@pytest.mark.parametrize("semantics", ["transformers", "llama.cpp"])
def test_after_top_k_matches_transformers_pipeline(semantics):
    """On sorted, compacted candidates (after top_k) the softmax is over the survivors, as the HF pipeline."""
    logits = logits_for(12, 5000)
    ours = processed_scores(chain(0.6, semantics=semantics, before=[{"use": "top_k", "k": 40}]), logits, process=True)
    after_k = TopKLogitsWarper(40)(None, logits.clone())
    assert_close_to(ours, after_k, reference(after_k, 0.6))


def test_semantics_differ_on_ties_at_the_cut():
    """Uniform over 4: the running mass is 0.25, 0.5, 0.75. llama.cpp stops at the first mass > 0.5 and keeps 3
    (by position); transformers cuts at the first mass >= 0.5 and keeps every token as typical as it: all 4."""
    logits = torch.zeros(1, 4)
    assert int(torch.isfinite(processed_scores(chain(0.5, 0), logits, process=True)).sum()) == 3
    assert int(torch.isfinite(processed_scores(chain(0.5, 0, "transformers"), logits, process=True)).sum()) == 4
    assert int(torch.isfinite(reference(logits, 0.5)).sum()) == 4


# ---------------------------------------------------------------- batching, no-ops, validation
@pytest.mark.parametrize("semantics", ["transformers", "llama.cpp"])
def test_per_row_params_equal_rows_alone(semantics):
    rows = [
        {"typical_p": 1.0},
        {"typical_p": 0.2},
        {"typical_p": 0.9, "min_keep": 7},
        {"typical_p": 0.5},
        {"typical_p": 1.0, "min_keep": 9},
        {"typical_p": 0.0},
    ]
    logits = logits_for(7, 3000)
    c = chain(semantics=semantics)
    batch = assert_rows_equal_alone(c, logits, rows, process=True)
    for i, params in enumerate(rows):
        if params["typical_p"] >= 1.0:
            assert torch.equal(batch[i], logits[i])
        else:
            if params["typical_p"] > 0.0:
                ref = reference(logits[i : i + 1], params["typical_p"], params.get("min_keep", 1))
                assert_close_to(batch[i : i + 1], logits[i : i + 1], ref)
            else:
                assert int(torch.isfinite(batch[i]).sum()) == params.get("min_keep", 1)


@pytest.mark.parametrize("vocab", (50, 32000))
def test_p_one_is_a_bitwise_no_op(vocab):
    logits = logits_for(9, vocab)
    for semantics in ("llama.cpp", "transformers"):
        assert_bitwise_no_op(chain(1.0, 5, semantics), logits, process=True)
        out = chain(1.0, semantics=semantics).sample(logits, return_scores=True)
        assert torch.equal(out.scores, logits)
        assert torch.equal(out.token_ids, logits.argmax(dim=-1))


def test_p_zero_keeps_the_most_typical_token():
    logits = logits_for(4, 500)
    ours = processed_scores(chain(0.0, 0), logits, process=True)
    assert torch.equal(torch.isfinite(ours).sum(dim=-1), torch.ones(B, dtype=torch.int64))


@pytest.mark.parametrize(
    ("key", "value"), [("p", 1.5), ("p", -0.1), ("p", float("nan")), ("min_keep", -1), ("semantics", "vllm")]
)
def test_bad_values_are_refused(key, value):
    entry = {"use": "typical", "p": 0.9, key: value}
    with pytest.raises(ConfigError, match=key):
        Chain.load({"samplers": [entry, {"use": "dist"}]})


def test_bad_request_value_is_refused():
    c = chain(0.9)
    store = c.new_store()
    with pytest.raises(RequestError, match="p"):
        store.add("r", {"typical_p": 2.0})


def test_chain_with_dist_loads_and_samples():
    c = Chain.load({"samplers": [{"use": "typical", "p": 0.9}, {"use": "dist"}]})
    out = c.sample(logits_for(0, 100), return_scores=True)
    assert bool(torch.isfinite(out.scores.gather(1, out.token_ids[:, None])).all())


@pytest.mark.parametrize("semantics", ["llama.cpp", "transformers"])
@pytest.mark.parametrize("scale", [1.0, 3.0, 12.0])
def test_wide_rows_rank_only_what_can_be_kept(semantics, scale, monkeypatch):
    """On wide rows typical ranks only the candidates a histogram of the mass says can be kept: the same mask
    as ranking the whole row, for per-row p (p near 1 included), min_keep and masked entries."""
    import samplechain_typical as typical

    logits = random_logits(13, 6, 40000, scale)
    logits[2, ::2] = float("-inf")
    logits[4, 5:] = float("-inf")  # a row with 5 finite candidates
    p = torch.tensor([0.2, 0.9, 0.5, 0.999, 0.9, 0.7], dtype=torch.float32)
    min_keep = torch.tensor([1, 1, 3, 1, 1, 500])
    fast = typical.typical_keep(logits, p, min_keep, semantics)
    monkeypatch.setattr("samplechain.filters.WIDE", 10**9)
    assert torch.equal(fast, typical.typical_keep(logits, p, min_keep, semantics))
