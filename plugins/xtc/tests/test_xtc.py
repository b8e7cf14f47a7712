"""xtc.v1 against llama.cpp's `llama_sampler_xtc` and text-generation-webui's `XTCLogitsWarper`.

- Vectors: llama.cpp's `test_xtc` (tests/test-sampling.cpp), verbatim: probability 0.99 (with a seed whose draw is
  below 0.99, checked) and 1.0; the kept tokens' probabilities are the original ones (XTC does not renormalise).
- Oracle: webui's XTCLogitsWarper re-implemented below in plain torch with its draw forced to "act", on random
  logits (-inf entries included), one row at a time (its newline / eos check is batch-wide): the same scores,
  with and without `keep_special`.
- Randomness: the draw is counter-based: per-row parameters and seeds equal each row alone, over several steps;
  the fraction of acting rows matches `probability`.
- llama.cpp's min_keep (all or nothing), sorted candidates (after top_k), ties, no-ops, bad values.
"""

from __future__ import annotations

import pytest
import torch

from samplechain import Chain, ConfigError, RequestError, rng
from samplechain.tools.testing import assert_bitwise_no_op, processed_scores, sampler_chain

NEG_INF = float("-inf")


# ----------------------------------------------------------------- the webui reference, written out
def webui_xtc(scores: torch.Tensor, threshold: float, special_token_ids: list[int]) -> torch.Tensor:
    """XTCLogitsWarper.__call__ after its `random.random() >= probability` check passed."""
    sorted_logits, sorted_indices = torch.sort(scores, descending=True)
    probs = sorted_logits.softmax(dim=-1)
    sorted_remove = torch.full_like(probs, False, dtype=torch.bool)
    sorted_remove[..., :-1] = probs[..., 1:] >= threshold
    remove = sorted_remove.scatter(1, sorted_indices, sorted_remove)
    if special_token_ids and remove[:, special_token_ids].any():
        return scores
    return scores.masked_fill(remove, NEG_INF)


class FakeTokenizer:
    """Encodes "\\n" as two tokens, the last being the newline (as sentencepiece's "▁", "<0x0A>")."""

    eos_token_id = None

    def encode(self, text, add_special_tokens=True):
        assert text == "\n"
        return [1, 13] if add_special_tokens else [29871, 13]


# ----------------------------------------------------------------- helpers
def chain(probability: float = 0.0, threshold: float = 0.1, before: list | None = None, **extra) -> Chain:
    return sampler_chain({"use": "xtc", "probability": probability, "threshold": threshold, **extra}, before=before)


def logits_for(seed: int, B: int = 8, V: int = 200) -> torch.Tensor:
    """Peaked rows, so several tokens meet thresholds like 0.05 - 0.2."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, V, generator=g)
    x[:, :6] += torch.rand(B, 6, generator=g) * 4.0 + 2.0
    x[0, 50:120] = NEG_INF
    return x


def first_seed_below(p: float) -> int:
    zero = torch.zeros(1, dtype=torch.int64)
    for seed in range(100):
        if float(rng.uniform(torch.tensor([seed]), zero, zero[:, None], 0)[0, 0]) < p:
            return seed
    raise AssertionError("no seed found")


# ----------------------------------------------------------------- llama.cpp's vectors, verbatim
LLAMA_CASES = [
    ([0.4, 0.3, 0.2, 0.1], [0.1], 0.99, 0.09),
    ([0.4, 0.3, 0.2, 0.1], [0.2, 0.1], 0.99, 0.19),
    ([0.4, 0.3, 0.2, 0.1], [0.3, 0.2, 0.1], 0.99, 0.29),
    ([0.4, 0.3, 0.2, 0.1], [0.4, 0.3, 0.2, 0.1], 0.99, 0.39),  # "XTC should not"
]


@pytest.mark.parametrize(("probs", "expected", "p", "t"), LLAMA_CASES)
@pytest.mark.parametrize("force", (False, True))
def test_llama_cpp_vectors(probs, expected, p, t, force):
    p = 1.0 if force else p  # 1.0: always acts, whatever the draw
    seed = first_seed_below(0.99)
    logits = torch.tensor(probs, dtype=torch.float32).log()[None, :]
    out = processed_scores(chain(p, t, min_keep=0, seed=seed), logits)[0]
    kept = torch.isfinite(out)
    got = torch.softmax(logits[0], dim=-1)[kept].sort(descending=True).values  # not renormalised
    assert got.shape[0] == len(expected)
    assert torch.allclose(got, torch.tensor(expected), atol=1e-5, rtol=0), got.tolist()
    assert torch.equal(out[kept], logits[0][kept])


def test_probability_zero_and_threshold_above_half_are_bitwise_no_ops():
    logits = logits_for(0)
    assert_bitwise_no_op(chain(0.0, 0.05), logits)
    assert_bitwise_no_op(chain(1.0, 0.51), logits)
    assert_bitwise_no_op(chain(1.0, 1.0, keep_special=True), logits)


# ----------------------------------------------------------------- webui as oracle
@pytest.mark.parametrize("seed", (0, 1, 2))
@pytest.mark.parametrize("threshold", (0.0, 0.02, 0.05, 0.1, 0.2, 0.5))
def test_matches_webui_when_acting(seed, threshold):
    logits = logits_for(seed)
    ours = processed_scores(chain(1.0, threshold), logits)
    for b in range(logits.shape[0]):
        if threshold == 0.0 and not bool(torch.isfinite(logits[b]).all()):
            # webui's threshold 0 keeps only the last sorted token, a -inf one here (an empty row); ours treats
            # -inf candidates as removed (llama.cpp's compacted array) and keeps the least likely finite token
            assert int(torch.isfinite(ours[b]).sum()) == 1
            assert float(ours[b][torch.isfinite(ours[b])]) == float(logits[b][torch.isfinite(logits[b])].min())
            continue
        ref = webui_xtc(logits[b : b + 1].double(), threshold, [])
        assert torch.equal(torch.isfinite(ours[b]), torch.isfinite(ref[0])), f"row {b}"
    kept = torch.isfinite(ours)
    assert torch.equal(ours[kept], logits[kept])


@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16))
def test_half_precision_input(dtype):
    logits = (logits_for(3) * 2).to(dtype)
    x = logits.float()
    ours = processed_scores(chain(1.0, 0.1), logits)
    for b in range(x.shape[0]):
        ref = webui_xtc(x[b : b + 1].double(), 0.1, [])
        # rounding to 8 bits makes ties: which of equal logits is kept is each sort's choice, so compare multisets
        got = ours[b][torch.isfinite(ours[b])].sort().values
        want = ref[0][torch.isfinite(ref[0])].float().sort().values
        assert torch.equal(got, want), f"row {b}"


@pytest.mark.parametrize("use_tokenizer", (True, False))
def test_keep_special_matches_webui(use_tokenizer):
    logits = logits_for(4)
    newline, eos = 13, 2
    logits[1, newline] = logits[1].max() + 1.0  # the newline is the top choice: webui skips the row
    logits[2, eos] = logits[2, :6].min()  # eos meets the threshold (among the top choices)
    logits[3, newline] = logits[3, :6].max() - 0.1
    c = chain(1.0, 0.05, keep_special=True)
    c.prepare(tokenizer=FakeTokenizer() if use_tokenizer else None, eos_token_ids=[eos])
    assert c.samplers[0].protected_ids() == ((eos, newline) if use_tokenizer else (eos,))
    special = [newline, eos] if use_tokenizer else [eos]
    ours = processed_scores(c, logits)
    plain = processed_scores(chain(1.0, 0.05), logits)
    changed = 0
    for b in range(logits.shape[0]):
        ref = webui_xtc(logits[b : b + 1].double(), 0.05, special)
        assert torch.equal(torch.isfinite(ours[b]), torch.isfinite(ref[0])), f"row {b}"
        changed += int(not torch.equal(ours[b], plain[b]))
    assert changed == (3 if use_tokenizer else 1)  # rows 1, 2, 3 protected (only row 2 by eos)


def test_keep_special_false_removes_special_tokens():
    logits = logits_for(4)
    logits[1, 13] = logits[1].max() + 1.0
    c = chain(1.0, 0.05)
    c.prepare(tokenizer=FakeTokenizer(), eos_token_ids=[2])
    ours = processed_scores(c, logits)
    assert not bool(torch.isfinite(ours[1, 13]))


# ----------------------------------------------------------------- llama.cpp details
def test_min_keep_is_all_or_nothing():
    probs = torch.tensor([[0.4, 0.3, 0.2, 0.1]])
    logits = probs.log()
    # threshold 0.19: 3 qualify, 2 removed, 2 remain
    assert int(torch.isfinite(processed_scores(chain(1.0, 0.19, min_keep=2), logits)).sum()) == 2
    assert_bitwise_no_op(chain(1.0, 0.19, min_keep=3), logits)


def test_ties_keep_the_highest_position_and_sorted_path_agrees():
    logits = torch.tensor([[1.0, 2.0, 2.0, 0.0, 2.0, -1.0]])
    out = processed_scores(chain(1.0, 0.2), logits)[0]
    assert torch.isfinite(out).tolist() == [True, False, False, True, True, True]
    sorted_out = processed_scores(chain(1.0, 0.2, before=[{"use": "top_k", "k": 6}]), logits)[0]
    assert torch.equal(torch.isfinite(sorted_out).sum(), torch.isfinite(out).sum())
    assert torch.equal(sorted_out.sort().values, out.sort().values)


@pytest.mark.parametrize("k", (5, 40))
def test_after_top_k_matches_webui(k):
    logits = logits_for(5)
    ours = processed_scores(chain(1.0, 0.08, before=[{"use": "top_k", "k": k}]), logits)
    after_k = torch.full_like(logits, NEG_INF)
    idx = logits.topk(k, dim=-1).indices
    after_k.scatter_(1, idx, logits.gather(1, idx))
    for b in range(logits.shape[0]):
        ref = webui_xtc(after_k[b : b + 1].double(), 0.08, [])
        assert torch.equal(torch.isfinite(ours[b]), torch.isfinite(ref[0])), f"row {b}"
    kept = torch.isfinite(ours)
    assert torch.equal(ours[kept], logits[kept])


def test_wide_rows_remove_what_the_float64_path_removes(monkeypatch):
    """Rows of >= 16384 unsorted candidates: only the acting rows, only the qualifying candidates read (at the
    lower edge of a bound on the float64 cut); the same removals as the float64 mask (per-row thresholds, min_keep,
    -inf entries, ties at the lowest level, keep_special, rows that do not act)."""
    logits = logits_for(21, B=7, V=40000)
    logits[:, :6] += 3.0  # several tokens above the thresholds on a wide row
    logits[2, 1] = logits[2, 2] = logits[2, 4] = 30.0  # a three-way tie at the least likely qualifying level
    logits[3, 2:] = NEG_INF  # two finite candidates
    logits[5, ::2] = NEG_INF
    rows = [
        {"xtc_probability": 1.0, "xtc_threshold": 0.001, "seed": 1},
        {"xtc_probability": 1.0, "xtc_threshold": 0.05, "seed": 2, "min_keep": 39996},
        {"xtc_probability": 1.0, "xtc_threshold": 0.1, "seed": 3},
        {"xtc_probability": 1.0, "xtc_threshold": 0.1, "seed": 4},
        {"xtc_probability": 0.0, "xtc_threshold": 0.1, "seed": 5},
        {"xtc_probability": 1.0, "xtc_threshold": 0.0005, "seed": 6},
        {"xtc_probability": 1.0, "xtc_threshold": 0.1, "seed": 7, "xtc.keep_special": True},
    ]
    c = chain(0.5, 0.1, keep_special=False)
    c.samplers[0]._protected = (int(logits[6].argmax()),)  # as prepare() sets them from a tokenizer
    fast = processed_scores(c, logits, rows)
    assert not torch.equal(torch.isfinite(fast), torch.isfinite(logits))  # it did remove tokens
    assert torch.equal(fast[6], logits[6]) and torch.equal(fast[4], logits[4])
    assert torch.isfinite(fast[2]).sum() == torch.isfinite(logits[2]).sum() - 2  # of the tie, position 4 stays
    assert torch.isfinite(fast[2, 4])
    monkeypatch.setattr("samplechain.filters.WIDE", 10**9)
    assert torch.equal(fast, processed_scores(c, logits, rows))


# ----------------------------------------------------------------- the draw
def test_acting_fraction_matches_probability():
    B = 3000
    logits = torch.log(torch.tensor([0.4, 0.3, 0.2, 0.1])).expand(B, -1).contiguous()
    c = chain()
    out = processed_scores(c, logits, [{"xtc_probability": 0.3, "xtc_threshold": 0.15, "seed": s} for s in range(B)])
    acted = (~torch.isfinite(out)).any(dim=-1).float().mean().item()
    assert abs(acted - 0.3) < 0.035, acted


def test_per_row_parameters_equal_rows_alone_over_steps():
    rows = [
        {"xtc_probability": 0.5, "xtc_threshold": 0.05, "seed": 1},
        {"xtc_probability": 0.0, "xtc_threshold": 0.05, "seed": 2},
        {"xtc_probability": 1.0, "xtc_threshold": 0.6, "seed": 3},
        {"xtc_probability": 0.7, "xtc_threshold": 0.1, "seed": 4, "min_keep": 150},
        {"xtc_probability": 0.9, "xtc_threshold": 0.02, "seed": 5},
        {"xtc_probability": 1.0, "xtc_threshold": 0.1, "seed": 6},
        {"xtc_probability": 0.3, "xtc_threshold": 0.08, "seed": 7},
        {"xtc_probability": 0.6, "xtc_threshold": 0.0, "seed": 8},
    ]
    c = Chain.load({"samplers": [{"use": "xtc", "probability": 0.0}, {"use": "dist"}]})
    batch_store = c.new_store()
    ids = [f"r{i}" for i in range(len(rows))]
    alone_stores = []
    for rid, params in zip(ids, rows):
        batch_store.add(rid, params)
        s = c.new_store()
        s.add(rid, params)
        alone_stores.append(s)
    for step in range(4):
        logits = logits_for(10 + step)
        batch = c.sample(logits, batch_store, ids, return_scores=True)
        for i, rid in enumerate(ids):
            alone = c.sample(logits[i : i + 1], alone_stores[i], [rid], return_scores=True)
            assert torch.equal(batch.scores[i], alone.scores[0]), f"step {step} row {i}"
            assert int(batch.token_ids[i]) == int(alone.token_ids[0])
        assert torch.equal(batch.scores[1], logits[1]) and torch.equal(batch.scores[2], logits[2])


# ----------------------------------------------------------------- validation
@pytest.mark.parametrize(
    ("entry", "key"),
    [
        ({"probability": 1.5}, "probability"),
        ({"probability": -0.1}, "probability"),
        ({"probability": 0.5, "threshold": -0.1}, "threshold"),
        ({"probability": 0.5, "threshold": float("nan")}, "threshold"),
        ({"probability": 0.5, "min_keep": -1}, "min_keep"),
        ({"probability": 0.5, "seed": -1}, "seed"),
        ({"probability": 0.5, "keep_special": "yes"}, "keep_special"),
    ],
)
def test_bad_values_are_refused(entry, key):
    with pytest.raises(ConfigError, match=rf"\.{key} ="):
        Chain.load({"samplers": [{"use": "xtc", **entry}, {"use": "greedy"}]})


def test_bad_request_value_is_refused():
    store = chain(0.5).new_store()
    with pytest.raises(RequestError, match="xtc.threshold"):
        store.add("r", {"xtc_threshold": 1.5})


def test_the_example_chain_loads_and_samples():
    c = Chain.load({"samplers": [{"use": "xtc", "probability": 0.5, "threshold": 0.1}, {"use": "dist"}]})
    out = c.sample(logits_for(0))
    assert out.token_ids.shape == (8,)
