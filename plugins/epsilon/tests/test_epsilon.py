"""epsilon.v1 against transformers' EpsilonLogitsWarper.

Equivalence level: probabilities within 1e-5 (kept sets equal except tokens whose probability is within float
rounding of epsilon: the oracle runs on float64 logits, we compute float64 probabilities of the float32 logits).
Kept logits are bitwise the input logits, removed ones -inf.
"""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import EpsilonLogitsWarper, TopKLogitsWarper

from samplechain import Chain, ConfigError, RequestError

B = 6
ATOL = 1e-5
NAME, FIELD, ALIAS, WARPER = "epsilon", "epsilon", "epsilon_cutoff", EpsilonLogitsWarper
VALUES = (1e-5, 3e-4, 1e-3, 0.01, 0.1)


def logits_for(seed: int, vocab: int, scale: float = 2.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, vocab, generator=g) * scale


def chain(value: float = 0.0, min_keep: int = 1, before: list | None = None) -> Chain:
    entry = {"use": NAME, FIELD: value, "min_keep": min_keep}
    return Chain.load({"samplers": [*(before or []), entry, {"use": "greedy"}]})


def process(c: Chain, logits: torch.Tensor, per_row: list[dict] | None = None) -> torch.Tensor:
    if per_row is None:
        return c.process(logits)
    store = c.new_store()
    ids = [f"r{i}" for i in range(len(per_row))]
    for rid, params in zip(ids, per_row):
        store.add(rid, params)
    return c.process(logits, store, ids)


def reference(logits: torch.Tensor, value: float, min_keep: int = 1) -> torch.Tensor:
    return WARPER(value, min_tokens_to_keep=max(min_keep, 1))(None, logits.double())


def assert_close_to(ours: torch.Tensor, logits: torch.Tensor, ref: torch.Tensor) -> None:
    kept = torch.isfinite(ours)
    assert torch.equal(ours[kept], logits.float()[kept]), "kept logits must be the input logits, bitwise"
    got = torch.softmax(ours.double(), dim=-1)
    want = torch.softmax(ref.double(), dim=-1)
    assert torch.allclose(got, want, atol=ATOL, rtol=0), f"max diff {(got - want).abs().max().item():.3g}"
    differ = kept != torch.isfinite(ref)
    assert int(differ.sum()) <= 2, f"kept sets differ at {differ.nonzero()[:8].tolist()}"


@pytest.mark.parametrize("vocab", (50, 1000, 32000))
@pytest.mark.parametrize("seed", (0, 1))
@pytest.mark.parametrize("value", VALUES)
def test_matches_transformers_on_random_logits(vocab, seed, value):
    logits = logits_for(seed, vocab)
    assert_close_to(process(chain(value), logits), logits, reference(logits, value))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("value", (3e-4, 0.01))
def test_half_precision_input_with_ties_matches_transformers(dtype, value):
    logits = logits_for(5, 4000, 3.0).to(dtype)
    up = logits.double()
    assert int((up[0][:, None] == up[0][None, :]).sum()) > 4000 + 100, "the test needs ties"
    assert_close_to(process(chain(value), logits), up, reference(up, value))


def test_ties_at_the_min_keep_boundary_are_all_kept():
    """transformers keeps every token whose logit is >= the min_keep-th largest: ties there all survive."""
    logits = torch.full((1, 20), -5.0)
    logits[0, :6] = torch.tensor([3.0, 2.0, 1.0, 1.0, 1.0, 0.5])
    ours = process(chain(0.9, 3), logits)
    ref = reference(logits, 0.9, 3)
    assert torch.equal(torch.isfinite(ours), torch.isfinite(ref))
    assert int(torch.isfinite(ours).sum()) == 5


def test_minus_inf_entries_are_never_kept():
    logits = logits_for(6, 1000)
    logits[:, 1::3] = float("-inf")
    ours = process(chain(1e-3), logits)
    assert not bool(torch.isfinite(ours[:, 1::3]).any())
    assert_close_to(ours, logits, reference(logits, 1e-3))


@pytest.mark.parametrize(("value", "min_keep"), [(0.5, 5), (0.9, 20), (0.01, 3)])
def test_min_keep_matches_transformers(value, min_keep):
    logits = logits_for(3, 1000)
    ours = process(chain(value, min_keep), logits)
    assert_close_to(ours, logits, reference(logits, value, min_keep))
    assert bool((torch.isfinite(ours).sum(dim=-1) >= min_keep).all())


def test_min_keep_zero_still_keeps_the_top_token():
    logits = logits_for(3, 1000, 0.1)  # flat: no probability reaches 0.5
    ours = process(chain(0.5, 0), logits)
    counts = torch.isfinite(ours).sum(dim=-1)
    assert bool((counts >= 1).all())
    assert torch.equal(ours.argmax(dim=-1), logits.argmax(dim=-1))
    if NAME == "epsilon":
        assert torch.equal(counts, torch.ones(B, dtype=torch.int64))


def test_after_top_k_matches_transformers_pipeline():
    logits = logits_for(12, 5000)
    ours = process(chain(0.02, before=[{"use": "top_k", "k": 40}]), logits)
    after_k = TopKLogitsWarper(40)(None, logits.clone())
    assert_close_to(ours, after_k, reference(after_k, 0.02))


def test_per_row_params_equal_rows_alone():
    rows = [
        {ALIAS: 0.0},
        {ALIAS: 1e-4},
        {ALIAS: 0.05, "min_keep": 7},
        {ALIAS: 1e-3},
        {ALIAS: 0.0, "min_keep": 9},
        {ALIAS: 0.2, "min_keep": 2},
    ]
    logits = logits_for(7, 3000)
    c = chain()
    batch = process(c, logits, rows)
    for i, params in enumerate(rows):
        alone = process(c, logits[i : i + 1], [params])[0]
        assert torch.equal(batch[i], alone), f"row {i} {params}"
        if params[ALIAS] <= 0.0:
            assert torch.equal(batch[i], logits[i])
        else:
            ref = reference(logits[i : i + 1], params[ALIAS], params.get("min_keep", 1))
            assert_close_to(batch[i : i + 1], logits[i : i + 1], ref)


@pytest.mark.parametrize("vocab", (50, 32000))
def test_zero_is_a_bitwise_no_op(vocab):
    logits = logits_for(9, vocab)
    assert torch.equal(process(chain(0.0, 5), logits), logits)
    out = chain(0.0).sample(logits, return_scores=True)
    assert torch.equal(out.scores, logits)


@pytest.mark.parametrize(
    ("key", "value"), [(FIELD, 1.0), (FIELD, -0.1), (FIELD, float("nan")), (FIELD, float("inf")), ("min_keep", -1)]
)
def test_bad_values_are_refused(key, value):
    entry = {"use": NAME, FIELD: 1e-3, key: value}
    with pytest.raises(ConfigError, match=key):
        Chain.load({"samplers": [entry, {"use": "dist"}]})


def test_bad_request_value_is_refused():
    store = chain(1e-3).new_store()
    with pytest.raises(RequestError, match=FIELD):
        store.add("r", {ALIAS: 1.5})


def test_chain_with_dist_samples_a_kept_token():
    c = Chain.load({"samplers": [{"use": NAME, FIELD: 0.01}, {"use": "dist"}]})
    out = c.sample(logits_for(0, 100), return_scores=True)
    assert bool(torch.isfinite(out.scores.gather(1, out.token_ids[:, None])).all())
