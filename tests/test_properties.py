"""Property-based invariants of the samplers (hypothesis) on adversarial logits.

Logits are float32 batches (1-6 rows, 1-64 tokens) mixing ordinary values, exact ties (values drawn from a small
set), -inf (masked) entries, huge (+-1e30) and tiny (+-1e-30) magnitudes, with at least one finite entry per
row; every row is its own request with its own parameters (`store.add(rid, {...})`). `wide` draws also lower
`samplechain.filters.WIDE` so that the small rows take the wide-vocabulary paths (chunked / histogram cuts).
The rules checked come from docs/semantics.md and docs/samplers/*.md; each test's docstring quotes the one it
checks. Runs derandomised (the same examples on every machine) without a deadline.
"""

from __future__ import annotations

import contextlib
import functools
import math
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from samplechain import Chain, ChainWarning
from samplechain import filters as sc_filters
from samplechain.errors import SamplingError
from samplechain.tools.testing import assert_kept_logits_bitwise, hard_logits, request_store

NEG_INF = float("-inf")
HUGE = float(np.float32(1e30))
TINY = float(np.float32(1e-30))

FAST = settings(
    max_examples=100,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
SLOWER = settings(FAST, max_examples=60)
FEW = settings(FAST, max_examples=6)

# ----------------------------------------------------------------- logits
FINITE = st.one_of(
    st.floats(-20.0, 20.0, width=32),  # ordinary logits
    st.sampled_from([-1.5, 0.0, 0.25, 2.0, 7.0]),  # exact ties, within and across rows
    st.sampled_from([HUGE, -HUGE]),  # huge but finite
    st.sampled_from([TINY, -TINY]),  # tiny
)
ENTRY = st.one_of(FINITE, st.just(NEG_INF))  # -inf: a masked token


@st.composite
def logits_batches(draw: st.DrawFn, max_rows: int = 6, max_vocab: int = 64) -> torch.Tensor:
    """(B, V) float32 logits with at least one finite entry per row."""
    rows = draw(st.integers(1, max_rows))
    vocab = draw(st.integers(1, max_vocab))
    x = draw(arrays(np.float32, (rows, vocab), elements=ENTRY))
    for r in range(rows):
        if not np.isfinite(x[r]).any():
            x[r, draw(st.integers(0, vocab - 1))] = draw(FINITE)
    return torch.from_numpy(x.copy())


@contextlib.contextmanager
def wide_paths(on: bool) -> Iterator[None]:
    """Route rows of >= 16 tokens through the wide-vocabulary code paths (WIDE is read at call time)."""
    saved = sc_filters.WIDE
    sc_filters.WIDE = 16 if on else saved
    try:
        yield
    finally:
        sc_filters.WIDE = saved


# ----------------------------------------------------------------- samplers, chains, per-request parameters
def _floats(low: float, high: float) -> st.SearchStrategy[float]:
    """Parameters are float32 and refuse subnormal magnitudes ("too small for float32")."""
    return st.floats(float(np.float32(low)), float(np.float32(high)), width=32, allow_subnormal=False)


def _unit(*special: float) -> st.SearchStrategy[float]:
    return st.one_of(st.sampled_from(special), _floats(0.0, 1.0))


# per-request alias -> values (both enabling and disabling ones)
ALIASES: dict[str, st.SearchStrategy[Any]] = {
    "temperature": st.one_of(st.sampled_from([0.0, 1.0]), _floats(0.05, 4.0)),
    "top_k": st.integers(-1, 70),
    "top_p": _unit(0.0, 0.25, 0.5, 0.7, 0.9, 1.0),
    "min_p": _unit(0.0, 0.05, 0.5, 1.0),
    "typical_p": _unit(0.0, 0.5, 0.9, 1.0),
    "top_n_sigma": st.one_of(st.sampled_from([-1.0, 0.0, 1.0]), _floats(0.0, 4.0)),
    "epsilon_cutoff": st.one_of(st.just(0.0), _floats(1e-6, 0.5)),
    "eta_cutoff": st.one_of(st.just(0.0), _floats(1e-6, 0.5)),
    "tfs": _unit(0.5, 0.95, 1.0),
    "top_a": _unit(0.0, 0.2, 1.0),
    "xtc_probability": st.sampled_from([0.0, 0.5, 1.0]),
    "xtc_threshold": _floats(0.0, 0.6),
    "smoothing_factor": st.one_of(st.just(0.0), _floats(0.0, 3.0)),
    "min_keep": st.integers(0, 8),
    "seed": st.integers(0, 2**32 - 1),
}

# chain entries at their disabled values: a request switches them on through its aliases
ENTRIES: dict[str, dict[str, Any]] = {
    "temperature": {"use": "temperature", "t": 1.0},
    "top_k": {"use": "top_k", "k": 0},
    "top_p": {"use": "top_p", "p": 1.0},
    "min_p": {"use": "min_p", "p": 0.0},
    "typical": {"use": "typical", "p": 1.0},
    "top_n_sigma": {"use": "top_n_sigma", "n": -1.0},
    "epsilon": {"use": "epsilon", "epsilon": 0.0},
    "eta": {"use": "eta", "epsilon": 0.0},
    "tfs": {"use": "tfs", "z": 1.0},
    "top_a": {"use": "top_a", "a": 0.0},
    "xtc": {"use": "xtc", "probability": 0.0},
    "quadratic": {"use": "quadratic", "factor": 0.0},
}
# the per-request alias that switches each filter on
SWITCH = {
    "top_k": "top_k",
    "top_p": "top_p",
    "min_p": "min_p",
    "typical": "typical_p",
    "top_n_sigma": "top_n_sigma",
    "epsilon": "epsilon_cutoff",
    "eta": "eta_cutoff",
    "tfs": "tfs",
    "top_a": "top_a",
    "xtc": "xtc_probability",
}
# filters whose kept set is the most likely candidates (a prefix of the descending order, ties aside)
PREFIX_FILTERS = ("top_k", "top_p", "min_p", "top_n_sigma", "epsilon", "eta", "tfs", "top_a")
# transforms and filters that never remove the most likely candidate nor reorder candidates
ARGMAX_KEEPING = ("temperature", *PREFIX_FILTERS)
SELECTORS = ("dist", "greedy", "mirostat", "mirostat_v2")
SEEDED_SELECTORS = ("dist", "mirostat", "mirostat_v2")
PRESETS = ("llama.cpp", "transformers", "vllm", "text-generation-webui", "greedy")


@functools.cache
def chain_of(names: tuple[str, ...], selector: str) -> Chain:
    with warnings.catch_warnings():  # truncation before mirostat: warned (llama.cpp drops it), meant here
        warnings.simplefilter("ignore", ChainWarning)
        return Chain.load({"samplers": [*(ENTRIES[n] for n in names), {"use": selector}]})


@functools.cache
def preset(name: str) -> Chain:
    return Chain.load(f"preset:{name}")


def random_chains(
    pool: Sequence[str] = tuple(ENTRIES), selectors: Sequence[str] = SELECTORS
) -> st.SearchStrategy[Chain]:
    """A chain of distinct samplers from `pool` in a random order, then one of `selectors`."""
    return st.builds(
        chain_of, st.lists(st.sampled_from(pool), unique=True, max_size=5).map(tuple), st.sampled_from(selectors)
    )


def any_chains(selectors: Sequence[str] = SELECTORS) -> st.SearchStrategy[Chain]:
    return st.one_of(random_chains(selectors=selectors), st.sampled_from(PRESETS).map(preset))


def row_params(
    draw: st.DrawFn, chain: Chain, rows: int, *, force: Mapping[str, st.SearchStrategy[Any]] | None = None
) -> list[dict[str, Any]]:
    """Per-request parameters for `rows` rows: each of the chain's aliases we know is set or not, per row; the
    `force`d ones always; a seed whenever the chain takes one (so runs can be compared)."""
    known = [a for a in ALIASES if a in chain.layout.aliases]
    out = []
    for _ in range(rows):
        params = {a: draw(ALIASES[a]) for a in known if draw(st.booleans())}
        params.update({a: draw(s) for a, s in (force or {}).items()})
        if "seed" in chain.layout.aliases:
            params["seed"] = draw(ALIASES["seed"])
        out.append(params)
    return out


def step(chain: Chain, logits: torch.Tensor, per_row: Sequence[Mapping[str, Any]]):
    store, ids = request_store(chain, per_row)
    return chain.sample(logits.clone(), store, ids, return_scores=True)


def process(chain: Chain, logits: torch.Tensor, per_row: Sequence[Mapping[str, Any]]) -> torch.Tensor:
    store, ids = request_store(chain, per_row)
    return chain.process(logits.clone(), store, ids)


def finite_count(x: torch.Tensor) -> torch.Tensor:
    return torch.isfinite(x).sum(dim=-1)


def top_values(row: torch.Tensor, n: int) -> list[float]:
    """The n largest finite values of a row, descending (the multiset a prefix filter keeps)."""
    return sorted((v for v in row.tolist() if math.isfinite(v)), reverse=True)[:n]


def kept_values(row: torch.Tensor) -> list[float]:
    return sorted((v for v in row.tolist() if math.isfinite(v)), reverse=True)


def best_ids(row: torch.Tensor, n: int) -> list[int]:
    """The ids of the n best finite entries, ties to the lowest id, ascending."""
    finite = [(-v, i) for i, v in enumerate(row.tolist()) if math.isfinite(v)]
    return sorted(i for _, i in sorted(finite)[:n])


# ----------------------------------------------------------------- 1. masks
@FAST
@given(st.data(), logits_batches(), any_chains(), st.booleans())
def test_a_masked_token_is_never_selected_nor_revived(data, logits, chain, wide):
    """No transform, filter or selector turns a -inf candidate into a finite one or selects it: the chosen token's
    input logit is finite, its logprob finite and <= 0, and every -inf input is -inf in the processed scores."""
    per_row = row_params(data.draw, chain, logits.shape[0])
    with wide_paths(wide):
        out = step(chain, logits, per_row)
    chosen = logits.gather(1, out.token_ids[:, None]).squeeze(1)
    assert bool(torch.isfinite(chosen).all()), f"masked token chosen: rows {(~torch.isfinite(chosen)).nonzero()}"
    assert bool(torch.isfinite(out.logprobs).all()) and bool((out.logprobs <= 1e-6).all()), out.logprobs
    assert bool((out.scores[logits == NEG_INF] == NEG_INF).all()), "a masked token was revived"


@FAST
@given(st.data(), logits_batches(), any_chains())
def test_a_row_with_every_token_masked_is_an_error_naming_its_request(data, logits, chain):
    """semantics: "A row with no finite candidate ... is an error naming its request"; no request state moves."""
    bad = data.draw(st.integers(0, logits.shape[0] - 1))
    logits[bad] = NEG_INF
    store, ids = request_store(chain, row_params(data.draw, chain, logits.shape[0]))
    before = store.positions(store.batch(ids)).clone()
    with pytest.raises(SamplingError, match=rf"every token is masked.*'{ids[bad]}'"):
        chain.sample(logits, store, ids)
    assert torch.equal(store.positions(store.batch(ids)), before)


# ----------------------------------------------------------------- 2. top_k
@FAST
@given(st.data(), logits_batches())
def test_top_k_keeps_exactly_the_k_largest(data, logits):
    """semantics, top_k: "Keeps the max(k, min_keep) largest candidates, clipped to the candidate count; k <= 0 is a
    no-op". Masked candidates are never kept as finite, so a row keeps min(max(k, min_keep), #finite) finite
    tokens, and exactly which: "Equal logits at the k-th place: the lowest token ids among them survive"
    (plugins/top_k). Kept logits are the input, bitwise."""
    chain = chain_of(("top_k",), "greedy")
    per_row = row_params(data.draw, chain, logits.shape[0], force={"top_k": ALIASES["top_k"]})
    ours = process(chain, logits, per_row)
    assert_kept_logits_bitwise(ours, logits)
    for r, params in enumerate(per_row):
        k, min_keep = params["top_k"], params.get("min_keep", 1)
        n = int(finite_count(logits[r])) if k <= 0 else min(max(k, min_keep), int(finite_count(logits[r])))
        assert torch.isfinite(ours[r]).nonzero().flatten().tolist() == best_ids(logits[r], n), (r, params)
        if k <= 0:
            assert torch.equal(ours[r], logits[r]), "k <= 0 must pass the row through bitwise"


# ----------------------------------------------------------------- 3. top_p
def top_p_reference(row: torch.Tensor, p: float, min_keep: int, slack: float) -> tuple[int, int]:
    """(fewest, most) finite tokens top-p may keep: float64 softmax of the float32 logits (exact normaliser via
    fsum), candidates in descending order, a candidate kept iff the mass strictly above it is < p; at least
    max(min_keep, 1) survive. The bracket widens the cut by `slack` on either side of p (float rounding)."""
    values = sorted((v for v in row.double().tolist() if math.isfinite(v)), reverse=True)
    top = values[0]
    weights = [math.exp(v - top) for v in values]
    total = math.fsum(weights)
    above, masses = 0.0, []
    for w in weights:
        masses.append(above)
        above += w / total

    def count(cut: float) -> int:
        return min(max(sum(m < cut for m in masses), min_keep, 1), len(values))

    return count(p - slack), count(p + slack)


@FAST
@given(st.data(), logits_batches(), st.booleans())
def test_top_p_keeps_the_minimal_prefix_reaching_p(data, logits, wide):
    """semantics, top_p: "walking down in descending order, the token at which the cumulative mass first reaches p
    is the last one kept — a candidate is kept iff the mass strictly above it is < p — and at least min_keep
    survive. p >= 1 is a no-op; p = 0 keeps max(1, min_keep) tokens." Against a float64 reference; a cut within
    1e-12 of p may fall either way, on the wide path too (its normaliser is a float64 sum as well). The kept set is
    the largest values (ties: any of equal logits)."""
    chain = chain_of(("top_p",), "greedy")
    per_row = row_params(data.draw, chain, logits.shape[0], force={"top_p": ALIASES["top_p"]})
    with wide_paths(wide):
        ours = process(chain, logits, per_row)
    assert_kept_logits_bitwise(ours, logits)
    slack = 1e-12
    for r, params in enumerate(per_row):
        p, min_keep = params["top_p"], params.get("min_keep", 1)
        kept = kept_values(ours[r])
        if p >= 1.0:
            assert torch.equal(ours[r], logits[r]), "p >= 1 must pass the row through bitwise"
            continue
        fewest, most = top_p_reference(logits[r], float(np.float32(p)), min_keep, slack)  # p is stored as float32
        assert fewest <= len(kept) <= most, (r, params, len(kept), (fewest, most))
        assert kept == top_values(logits[r], len(kept)), (r, params)


# ----------------------------------------------------------------- 4. min_keep, prefixes
@FAST
@given(st.data(), logits_batches(), st.sampled_from(tuple(SWITCH)), st.booleans())
def test_every_truncation_filter_honours_min_keep(data, logits, name, wide):
    """Every truncation filter keeps at least min(max(min_keep, 1), #finite) finite candidates (docs/samplers:
    "at least min_keep survive"; a row never ends up empty; xtc: "unless fewer than min_keep would remain (then
    the row is unchanged)"). The filters that cut by probability keep the most likely ones: every kept finite
    logit is >= every removed finite one. Kept logits are the input, bitwise."""
    chain = chain_of((name,), "greedy")
    per_row = row_params(
        data.draw, chain, logits.shape[0], force={SWITCH[name]: ALIASES[SWITCH[name]], "min_keep": ALIASES["min_keep"]}
    )
    with wide_paths(wide):
        ours = process(chain, logits, per_row)
    assert_kept_logits_bitwise(ours, logits)
    kept = torch.isfinite(ours)
    for r, params in enumerate(per_row):
        need = min(max(params["min_keep"], 1), int(finite_count(logits[r])))
        assert int(kept[r].sum()) >= need, (name, r, params, int(kept[r].sum()), need)
        if name in PREFIX_FILTERS:
            removed = torch.isfinite(logits[r]) & ~kept[r]
            if bool(removed.any()):
                assert float(ours[r][kept[r]].min()) >= float(logits[r][removed].max()), (name, r, params)


# ----------------------------------------------------------------- 5. probabilities
@FAST
@given(st.data(), logits_batches(), any_chains(), st.booleans())
def test_kept_probabilities_sum_to_one_and_logprobs_match_the_scores(data, logits, chain, wide):
    """The processed distribution (the scores, -inf for removed tokens) is a distribution: softmax sums to 1 in
    float32, and the chosen token's logprob is log_softmax(scores) at that token (semantics, logprobs: "under the
    distribution the selector saw"), to float32 accuracy: the executor takes `logit - logsumexp` in float32, so
    near +-1e30 the error is a few ulps of the logits (log 2 vanishes next to 1e30)."""
    per_row = row_params(data.draw, chain, logits.shape[0])
    with wide_paths(wide):
        out = step(chain, logits, per_row)
    probs = torch.softmax(out.scores, dim=-1)
    assert not bool(probs.isnan().any())
    assert torch.allclose(probs.sum(dim=-1), torch.ones(logits.shape[0]), atol=1e-5, rtol=0)
    want = torch.log_softmax(out.scores.double(), dim=-1).gather(1, out.token_ids[:, None]).squeeze(1)
    scale = out.scores.masked_fill(~torch.isfinite(out.scores), 0.0).abs().amax(dim=-1).double()
    tolerance = 1e-5 + 4 * torch.finfo(torch.float32).eps * scale
    assert bool(((out.logprobs.double() - want).abs() <= tolerance).all()), (out.logprobs, want)


# ----------------------------------------------------------------- 6. greedy
@FAST
@given(logits_batches(), st.sampled_from([("greedy", ()), ("dist", ({"use": "temperature", "t": 0.0},))]))
def test_greedy_is_the_argmax_with_the_lowest_index_on_ties(logits, setup):
    """semantics, greedy: "equal maxima resolve to the first candidate (the lowest token id when the candidates
    are in vocabulary order)"; temperature: "t = 0 keeps only the most likely token (the first of equal maxima)",
    so dist after it is greedy too."""
    selector, before = setup
    chain = Chain.load({"samplers": [*before, {"use": selector}]})
    out = chain.sample(logits.clone())
    want = torch.tensor([int(np.flatnonzero(row == row.max())[0]) for row in logits.numpy()])
    assert torch.equal(out.token_ids, want)


@FAST
@given(st.data(), logits_batches(), random_chains(pool=ARGMAX_KEEPING, selectors=("greedy",)), st.booleans())
def test_greedy_after_argmax_keeping_samplers_picks_a_maximum(data, logits, chain, wide):
    """Temperature (order-preserving; t = 0 keeps the first maximum) and the probability-cut filters always keep
    the most likely token, so a greedy chain of them picks a token whose input logit is the row's maximum. Which
    of tied maxima: greedy takes "of equal maxima the lowest token id" (plugins/greedy) among those the filters
    kept, and top_p leaves the choice among tokens tied at its cut to the partial sort, so only the value is
    checked."""
    per_row = row_params(data.draw, chain, logits.shape[0])
    with wide_paths(wide):
        out = step(chain, logits, per_row)
    chosen = logits.gather(1, out.token_ids[:, None]).squeeze(1)
    assert torch.equal(chosen, logits.amax(dim=-1)), (per_row, out.token_ids)


# ----------------------------------------------------------------- 7. rows alone
@SLOWER
@given(st.data(), logits_batches(), any_chains(), st.booleans())
def test_every_row_gets_what_it_gets_alone(data, logits, chain, wide):
    """Heterogeneous rows equal rows alone (DESIGN, per-request parameters): token, logprob and processed scores of
    each row of the batch are bitwise those of the row run as a batch of one with the same request parameters."""
    per_row = row_params(data.draw, chain, logits.shape[0])
    with wide_paths(wide):
        batch = step(chain, logits, per_row)
        for r, params in enumerate(per_row):
            alone = step(chain, logits[r : r + 1], [params])
            assert torch.equal(alone.scores[0], batch.scores[r]), (r, params)
            assert torch.equal(alone.logprobs[0], batch.logprobs[r]), (r, params)
            assert int(alone.token_ids[0]) == int(batch.token_ids[r]), (r, params)


# ----------------------------------------------------------------- 8. seeded selection
def seeded_tokens(
    chain: Chain,
    logits: Sequence[torch.Tensor],
    per_row: Sequence[Mapping[str, Any]],
    order: Sequence[int],
    threads: int,
) -> dict[int, list[int]]:
    """Run the requests of `order` (row indices) as one batch in that order for len(logits) steps, on `threads`
    threads; each request's tokens by its row index."""
    store = chain.new_store()
    ids = [f"req{i}" for i in order]
    for i, rid in zip(order, ids):
        store.add(rid, per_row[i])
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got: dict[int, list[int]] = {i: [] for i in order}
        for x in logits:
            out = chain.sample(x[list(order)].clone(), store, ids)
            for i, t in zip(order, out.token_ids.tolist()):
                got[i].append(t)
        return got
    finally:
        torch.set_num_threads(saved)


@SLOWER
@given(st.data(), logits_batches(), any_chains(selectors=SEEDED_SELECTORS), st.booleans())
def test_seeded_selection_ignores_batch_composition_row_position_and_threads(data, logits, chain, wide):
    """semantics, dist: "a seeded request draws the same tokens alone, in any batch, at any row, with any thread
    count". Two steps (the RNG position moves, stateful selectors update): each request's tokens are the same in
    the batch as drawn, in a permuted batch on one thread, in a random sub-batch, and alone."""
    rows = logits.shape[0]
    per_row = row_params(data.draw, chain, rows)
    second = logits[data.draw(st.permutations(range(rows)))]  # a second step's logits: other rows' values
    steps = [logits, second]
    perm = data.draw(st.permutations(range(rows)))
    subset = data.draw(st.lists(st.integers(0, rows - 1), min_size=1, unique=True))
    with wide_paths(wide):
        base = seeded_tokens(chain, steps, per_row, range(rows), threads=2)
        assert seeded_tokens(chain, steps, per_row, perm, threads=1) == base, "permuted, 1 thread"
        sub = seeded_tokens(chain, steps, per_row, subset, threads=2)
        assert sub == {i: base[i] for i in subset}, "sub-batch"
        for r in range(rows):
            assert seeded_tokens(chain, steps, per_row, [r], threads=1)[r] == base[r], f"row {r} alone"


@FEW
@given(st.data(), st.integers(0, 2**16), any_chains(selectors=SEEDED_SELECTORS))
def test_seeded_selection_ignores_threads_on_wide_rows(data, seed, chain):
    """The thread count matters only where torch splits work, on rows far wider than the ones above: a 4 x 40000
    batch of testing.hard_logits (ties everywhere, 30% -inf, 3e38 entries, a row of 5 finite tokens) draws the same
    tokens on 1 and on 2 threads, over two steps."""
    logits = hard_logits(4, 40000, seed)
    per_row = row_params(data.draw, chain, 4)
    steps = [logits, logits.roll(1, dims=1)]

    def outcome(threads: int) -> Any:
        """The tokens, or the documented error when a temperature below 1 overflows the 3e38 entries to +inf
        (nonfinite = "error"): either way the same on 1 and 2 threads."""
        try:
            return seeded_tokens(chain, steps, per_row, range(4), threads=threads)
        except SamplingError as exc:
            assert "overflowed float32" in str(exc), exc
            return str(exc)

    assert outcome(2) == outcome(1)


# ----------------------------------------------------------------- minimal cases the properties above found
def test_tfs_passes_rows_of_fewer_than_three_candidates_through():
    """docs/samplers/tfs.md: "n <= 2 is a no-op": a candidate set narrower than 3 (a 2-token vocabulary, or what
    top_k 2 leaves) passes through (it raised IndexError from amin() on an empty second-difference axis)."""
    chain = chain_of(("tfs",), "greedy")
    store, ids = request_store(chain, [{"tfs": 0.5}])
    assert int(chain.sample(torch.tensor([[0.0, 1.0]]), store, ids).token_ids[0]) == 1


def test_greedy_picks_the_same_tied_token_in_a_batch_and_alone():
    """Rows equal rows alone: a row whose top_p keeps 3 of 4 tied tokens got token 0 in a batch where another row
    has top_p off (candidates stay in vocabulary order) and token 2 alone (compacted in torch.topk's order)."""
    chain = chain_of(("top_p",), "greedy")
    logits = torch.zeros(2, 4)
    per_row = [{}, {"top_p": 0.0, "min_keep": 3}]
    batch = step(chain, logits, per_row).token_ids[1]
    alone = step(chain, logits[1:], per_row[1:]).token_ids[0]
    assert int(batch) == int(alone)


def test_dist_draws_at_random_between_equal_huge_logits():
    """semantics, dist: a draw from softmax(logits), so of two equal logits of 1e30 each is drawn about half the
    time. argmax(x + G) on the raw logits in float64 absorbed G (ulp(1e30) ~ 1e14): every seed picked the first."""
    chain = chain_of((), "dist")
    drawn = {int(step(chain, torch.full((1, 2), HUGE), [{"seed": seed}]).token_ids[0]) for seed in range(20)}
    assert drawn == {0, 1}


def test_top_k_keeps_the_same_tied_token_in_a_batch_and_alone():
    """semantics, dist: "a seeded request draws the same tokens alone, in any batch, at any row". With 7 tied
    logits and top_k 1, the row kept token 3 next to a row with top_k 5 (one torch.topk of width 5 for the batch)
    and token 5 alone, so its seeded draw changed with its neighbour."""
    chain = chain_of(("top_k",), "dist")
    logits = torch.zeros(2, 7)
    per_row = [{"top_k": 5, "seed": 0}, {"top_k": 1, "seed": 0}]
    batch = step(chain, logits, per_row)
    alone = step(chain, logits[1:], per_row[1:])
    assert torch.equal(batch.scores[1], alone.scores[0])
    assert int(batch.token_ids[1]) == int(alone.token_ids[0])


def test_top_p_wide_path_keeps_the_same_tied_token_in_a_batch_and_alone():
    """The same on top_p's wide-row path (here on 18 tokens with WIDE lowered to 16): a row of 17 tied maxima with
    top_p 0 keeps one of them; next to a row with top_p off (whose count widens the batch's partial top-k in
    `Backend.at_least`) it kept token 10, alone token 9."""
    chain = chain_of(("top_p",), "dist")
    logits = torch.zeros(2, 18)
    logits[1, 0] = -1.0
    per_row = [{"seed": 0}, {"top_p": 0.0, "seed": 0}]
    with wide_paths(True):
        batch = step(chain, logits, per_row)
        alone = step(chain, logits[1:], per_row[1:])
    assert torch.equal(batch.scores[1], alone.scores[0])
    assert int(batch.token_ids[1]) == int(alone.token_ids[0])


def test_top_p_after_top_k_keeps_the_same_tied_token_in_a_batch_and_alone():
    """The same after top_k: 4 tied logits, top_k 2 then top_p 0 keep one token; alone top_k compacts and sorts
    (ids 0, 1, settled to the lowest) and top_p keeps the first, token 0; next to a row with top_k off the batch
    stays in vocabulary order with a mask, top_p's partial top-k picks among the two tied survivors: token 1."""
    chain = chain_of(("top_k", "top_p"), "greedy")
    logits = torch.zeros(2, 4)
    per_row = [{}, {"top_k": 2, "top_p": 0.0}]
    batch = step(chain, logits, per_row)
    alone = step(chain, logits[1:], per_row[1:])
    assert torch.equal(batch.scores[1], alone.scores[0])
    assert int(batch.token_ids[1]) == int(alone.token_ids[0])
