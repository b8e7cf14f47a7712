"""Composition hazards the fuzzer (tests/test_composition_fuzz.py) can run into, each pinned by its smallest case.

Three concern the chain as a whole (a valid chain must not empty a row, an error names its culprit, backends agree
on ties in top_h); the others are narrower: biases after a truncation leave candidates unsorted, a forced token
survives compaction, inf_nan_remove keeps what a filter removed, mirostat's ties and float32 sums, top_h's rounding
at top_h = 1, cfg's 0 x -inf, and an error that names the sampler after which a row had nothing.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from samplechain import Chain, SamplingError
from samplechain.tools.testing import RecordingBackend, hard_logits, host_with

NEG_INF = float("-inf")


def load(samplers: list[dict], **kwargs) -> Chain:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # order pitfalls are warned about: these chains are odd on purpose
        return Chain.load({"samplers": samplers}, **kwargs)


def staged(entries: list[dict], logits: torch.Tensor) -> torch.Tensor:
    """Each entry alone on the full vocabulary, in turn: the reference a chain's shortcuts must agree with."""
    for entry in entries:
        logits = load([entry, {"use": "greedy"}]).process(logits)
    return logits


# ----------------------------------------------------------------- a valid chain never empties a row
HOLE_MAKERS = [{"use": "top_n_sigma", "n": 1.0}, {"use": "typical", "p": 0.05}, {"use": "top_k", "k": 1}]


def test_a_later_cut_never_takes_a_masked_hole_for_a_candidate():
    """[top_n_sigma, typical, top_k 1, greedy]: typical masks survivors of the sorted candidates top_n_sigma left,
    and a "first k" read of them could take a -inf hole and empty the row. Masking sorted candidates moves the
    survivors to the front, so every row keeps the token the stages give one by one."""
    chain = load([*HOLE_MAKERS, {"use": "greedy"}])
    for seed in range(300):
        x = torch.randn(1, 64, generator=torch.Generator().manual_seed(seed))
        out = chain.sample(x, return_scores=True)
        assert torch.equal(out.scores, staged(HOLE_MAKERS, x)), seed
        assert int(out.token_ids[0]) == int(torch.isfinite(out.scores[0]).nonzero()[0]), seed


def test_a_bias_after_a_truncation_is_not_read_as_sorted():
    """top_k leaves sorted candidates; a bias that moves a token to the front must not leave them marked sorted,
    or top_p cuts the wrong prefix (kept [5, 4, 3, 12] instead of [12])."""
    x = torch.tensor([[5.0, 4.0, 3.0, 2.0, 1.0, 0.0]])
    entries = [{"use": "top_k", "k": 4}, {"use": "logit_bias", "bias": {"3": 10.0}}, {"use": "top_p", "p": 0.5}]
    out = load([*entries, {"use": "greedy"}]).process(x)
    assert torch.equal(out, torch.tensor([[NEG_INF, NEG_INF, NEG_INF, 12.0, NEG_INF, NEG_INF]]))
    assert torch.equal(out, staged(entries, x))


# ----------------------------------------------------------------- errors name the sampler and the request
def test_finite_huge_logprobs_are_not_taken_for_an_overflow():
    """adaptive_p over hard_logits: every chosen logprob is finite (about -3e38), though their float32 sum would
    overflow to -inf; the finiteness check looks at each row, so the step passes."""
    chain = load([{"use": "adaptive_p", "target": 0.5, "seed": 3}])
    for seed in range(3):
        out = chain.sample(hard_logits(4, 40000, seed))
        assert bool(torch.isfinite(out.logprobs).all())
        assert float(out.logprobs.double().sum()) < -1e38  # a float32 sum would overflow


def test_an_emptied_row_names_the_sampler_and_the_request():
    """A row left with nothing names the request and the sampler after which it had nothing."""
    chain = load([{"use": "top_k", "k": 1}, {"use": "suppress_tokens", "ids": [2]}, {"use": "greedy"}])
    x = torch.tensor([[0.0, 1.0, 2.0], [2.0, 1.0, 0.0]])
    store = chain.new_store()
    store.add_many(["a", "b"])
    with pytest.raises(SamplingError) as caught:
        chain.sample(x, store, ["a", "b"])
    text = str(caught.value)
    assert (
        "every token is masked (-inf) for request(s) ['a'] after sampler 'suppress_tokens' (suppress_tokens.v1 "
        "at samplers[1]" in text
    ), text
    assert "'b'" not in text and text.endswith("no request state was changed")
    assert store.positions(store.batch(["a", "b"])).tolist() == [0, 0]


def test_a_row_given_with_nothing_is_blamed_on_the_logits():
    chain = load([{"use": "top_k", "k": 2}, {"use": "greedy"}])
    x = torch.tensor([[NEG_INF, NEG_INF], [0.0, 1.0]])
    with pytest.raises(
        SamplingError,
        match=r"every token is masked \(-inf\) for request\(s\) \['row0'\] in the "
        r"logits as given",
    ):
        chain.sample(x)


def test_an_overflow_names_the_sampler_that_made_it():
    chain = load([{"use": "top_k", "k": 3}, {"use": "temperature", "t": 0.5}, {"use": "greedy"}])
    x = torch.tensor([[3e38, 1.0, 0.0, -1.0]])
    with pytest.raises(
        SamplingError,
        match=r"turned finite logits into NaN or \+inf for request\(s\) \['row0'\] "
        r"after sampler 'temperature' \(temperature.v1 at samplers\[1\]",
    ):
        chain.sample(x)


# ----------------------------------------------------------------- ties at a cut, whatever the backend's order
class ReversedTies(RecordingBackend):
    """A backend whose partial sort returns equal logits highest id first (the reference: lowest first), as
    another device's top-k may: a filter's kept set must not depend on it."""

    name = "reversed_ties"

    def topk(self, logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        flipped = logits.flip(-1)  # a stable sort of the flipped row puts the highest of equal ids first
        values, index = torch.sort(flipped, dim=-1, descending=True, stable=True)
        return values[:, :k], logits.shape[-1] - 1 - index[:, :k]


FILTERS = [
    {"use": "top_h", "top_h": 0.6},
    {"use": "top_h", "top_h": 1.0, "top_n": 7},
    {"use": "top_k", "k": 5},
    {"use": "top_p", "p": 0.6},
    {"use": "min_p", "p": 0.2},
    {"use": "top_n_sigma", "n": 0.5},
    {"use": "top_a", "a": 0.3},
    {"use": "tfs", "z": 0.7},
    {"use": "typical", "p": 0.5},
]


@pytest.mark.parametrize("entry", FILTERS, ids=lambda e: f"{e['use']}-{list(e.values())[1]}")
def test_ties_at_a_cut_keep_the_lowest_ids_whatever_order_the_backend_returns(entry):
    """Which of equal logits torch.topk returns differs between devices, so a filter that kept whichever it got
    would draw other tokens on cpu and cuda on tie-heavy rows. Every filter keeps the lowest ids among equal logits
    at its cut, on any backend."""
    x = (torch.randn(16, 200, generator=torch.Generator().manual_seed(4)) * 2).round()  # ties everywhere
    kept = []
    for backend in (RecordingBackend, ReversedTies):
        chain = Chain.load(
            {"backend": backend.name, "samplers": [entry, {"use": "dist", "seed": 5}]}, host=host_with(backend=backend)
        )
        out = chain.sample(x, return_scores=True)
        kept.append((torch.isfinite(out.scores), out.token_ids))
    assert torch.equal(kept[0][0], kept[1][0])
    assert torch.equal(kept[0][1], kept[1][1])


# ----------------------------------------------------------------- found by the fuzzer
def test_a_forced_token_comes_back_after_a_filter_in_any_batch():
    """forced_bos after a filter: transformers writes the bos column whatever it held, so bos comes back whether
    the filter compacted the row (alone, top_p) or masked it (in a batch)."""
    chain = load([{"use": "top_p", "p": 0.0}, {"use": "forced_bos", "bos_id": 1}, {"use": "greedy"}])
    x = torch.tensor([[4.0, -0.8], [2.8, 1.4]])
    store = chain.new_store()
    store.add("a", {})
    store.add("b", {"top_p": 1.0})
    hist = torch.full((2, 1), -1)
    batch = chain.sample(x, store, ["a", "b"], history=hist, accept=False)
    alone = chain.sample(x[:1], store, ["a"], history=hist[:1], accept=False)
    assert batch.token_ids.tolist() == [1, 1] and alone.token_ids.tolist() == [1]


def test_mirostat_v2_keeps_the_lowest_id_of_equal_maxima():
    """With mu below every surprise, mirostat v2 keeps one token: of equal maxima the lowest id, not the first
    in an order an earlier filter left."""
    x = torch.full((1, 4), 1.5)
    for head in ([], [{"use": "top_h", "top_h": 1.0}], [{"use": "top_k", "k": 3}]):
        chain = load([*head, {"use": "mirostat_v2", "tau": 0.0, "seed": 0}])
        assert chain.sample(x).token_ids.tolist() == [0], head


def test_cfg_at_scale_zero_is_the_unconditional_distribution_even_after_an_overflow():
    """log_softmax of a row spanning 6e38 is -inf for its lowest token, which scale 0 must not multiply into NaN."""
    chain = load([{"use": "cfg", "scale": 0.0}, {"use": "greedy"}])
    x = torch.tensor([[3e38, -3e38, 0.0]])
    uncond = torch.tensor([[0.0, 2.0, 1.0]])
    scores = chain.process(x, unconditional_logits=uncond)
    assert torch.allclose(scores, torch.log_softmax(uncond, -1))


def test_xtc_keeps_the_highest_id_of_equal_least_likely_qualifiers_in_any_batch():
    """Six tokens tied at the top, xtc with threshold 0: it keeps the highest token id, alone or beside another
    row, not the one at the highest candidate position (an earlier filter's order, so the batch, decides that)."""
    x = torch.tensor([[0.0, 5.0, 1.0, 5.0, 5.0, 2.0]])
    chain = load(
        [{"use": "top_k", "k": 0}, {"use": "xtc", "probability": 1.0, "threshold": 0.3, "seed": 0}, {"use": "greedy"}]
    )
    store = chain.new_store()
    store.add("a", {"top_k": 3})  # compacts: the tied tokens in the order the partial sort left
    store.add("b", {})
    alone = chain.process(x, store, ["a"])
    batch = chain.process(torch.cat([x, x]), store, ["a", "b"])
    assert torch.isfinite(alone[0]).nonzero().flatten().tolist() == [4]
    assert torch.equal(batch[0], alone[0])


def test_xtc_threshold_zero_on_a_wide_row_counts_only_finite_candidates():
    """A threshold of 0 qualifies the finite candidates only, not the -inf entries: on a wide row, as on a narrow
    one, xtc removes all but the least likely."""
    x = torch.full((1, 20000), NEG_INF)
    x[0, [5, 700, 19000]] = torch.tensor([3.0, 2.0, 1.0])
    entry = {"use": "xtc", "probability": 1.0, "threshold": 0.0, "seed": 0}
    wide = load([entry, {"use": "greedy"}]).process(x)
    narrow = load([{"use": "top_k", "k": 3}, entry, {"use": "greedy"}]).process(x)
    assert torch.isfinite(wide[0]).nonzero().flatten().tolist() == [19000]
    assert torch.equal(wide, narrow)


def test_renormalize_gives_a_row_the_same_values_alone_and_in_a_batch():
    """log_softmax in float32 rounds with the row's width (7 survivors of 64, compacted alone, masked in a batch),
    and even in float64 a dominant token's log-probability carries the sum's rounding: renormalize gives the same
    values either way."""
    chain = load([{"use": "top_k", "k": 0}, {"use": "renormalize"}, {"use": "greedy"}])
    store = chain.new_store()
    store.add("a", {"top_k": 7})
    store.add("b", {})
    for seed in range(20):
        x = torch.randn(2, 64, generator=torch.Generator().manual_seed(seed)) * 3
        x[:, seed] += 30.0 * (seed % 2)  # a dominant token in every other case
        batch = chain.process(x, store, ["a", "b"])
        assert torch.equal(chain.process(x[:1], store, ["a"])[0], batch[0]), seed


def test_quadratic_pure_rows_beside_cubic_ones_get_no_nan_from_an_overflowed_cube():
    """A row with curve 1 (no cubic term) beside a row with curve 5: where d**3 overflows (logits near the float32
    limit), a cubic term computed for every row would make 0 * (-inf) = NaN; the row gets -inf there, as alone."""
    chain = load([{"use": "quadratic", "factor": 1.0}, {"use": "greedy"}])
    x = torch.tensor([[3e38, -3e38, 0.0], [1.0, 0.5, 0.0]])
    store = chain.new_store()
    store.add("a", {})
    store.add("b", {"smoothing_curve": 5.0})
    batch = chain.process(x, store, ["a", "b"])
    assert torch.equal(batch[0], chain.process(x[:1], store, ["a"])[0])
    assert not bool(batch.isnan().any())


@pytest.mark.parametrize(
    "cut", [{"use": "min_p", "p": 0.5, "min_keep": 3}, {"use": "top_n_sigma", "n": 0.1, "min_keep": 3}]
)
def test_min_keep_inside_a_tie_keeps_the_lowest_ids_of_compacted_candidates(cut):
    """After top_k (compacted, columns in descending-logit order) and a bias that ties them, min_p's and
    top_n_sigma's min_keep keep the lowest ids of the tie, not the first tied columns (as the fuzzer's chains of
    top_a, cfg, top_h, quadratic, min_p, min_p on bfloat16 rows need): the chain keeps what the stages keep."""
    x = torch.arange(8.0)[None, :]
    entries = [
        {"use": "top_k", "k": 7},
        {"use": "logit_bias", "bias": {i: -float(i) for i in range(1, 7)} | {7: 3.0}},
        cut,
    ]
    kept = torch.isfinite(load([*entries, {"use": "greedy"}]).process(x))
    assert kept[0].nonzero().flatten().tolist() == [1, 2, 7]
    assert torch.equal(kept, torch.isfinite(staged(entries, x)))
