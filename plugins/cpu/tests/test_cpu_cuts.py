"""The cpu backend's TYPICAL_BAND kernel (samplechain_cpu_cuts, numba): its float64 statistics against an
independent computation, its band against the definition (a prefix of the ranking by |c - x| holding more than p),
and typical sampling through it against the plugin's torch path (the full ranking): the same kept sets on peaked,
flat, masked, tied and edge rows, per-row parameters, both semantics, alone and in any batch."""

from __future__ import annotations

import pytest
import torch

import samplechain_cpu as cpu
import samplechain_typical as typical
from samplechain import Candidates, Chain
from samplechain.contracts import TOP_P_CANDIDATES, TYPICAL_BAND
from samplechain.tools.bench import make_logits
from samplechain.tools.testing import assert_rows_equal_alone, processed_scores, sample_steps, sampler_chain
from samplechain_top_p import kept_counts

INF, NAN = float("inf"), float("nan")
V = 20000  # wide enough for the kernel (>= filters.WIDE), small enough to rank whole rows in the reference


@pytest.fixture(scope="module")
def band():
    if not cpu.numba_enabled():
        pytest.skip("numba is not installed (or SAMPLECHAIN_CPU_NUMBA=0)")
    return cpu.CpuBackend().kernel(TYPICAL_BAND)


def _rows(kind: str, batch: int, seed: int, width: int = V) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if kind == "peaked":
        return make_logits("peaked", batch, width, seed=seed)
    if kind == "flat":
        return torch.randn(batch, width, generator=g) * 3
    if kind == "tied":  # bf16-rounded: many equal logits, and equal distances among them
        return (make_logits("peaked", batch, width, seed=seed)).bfloat16().float()
    if kind == "masked":  # most of the vocabulary already removed (as after a grammar mask)
        x = torch.randn(batch, width, generator=g) * 4
        return x.masked_fill(torch.rand(batch, width, generator=g) < 0.9, -INF)
    if kind == "sharp":  # nearly one-hot
        x = torch.randn(batch, width, generator=g)
        x[:, 7] += 60
        return x
    raise ValueError(kind)


def _torch_path(x: torch.Tensor, p: torch.Tensor, min_keep: torch.Tensor, semantics: str) -> torch.Tensor:
    return typical.typical_keep(x, p, min_keep, semantics)


def _kernel_path(kernel, x: torch.Tensor, p: torch.Tensor, min_keep: torch.Tensor, semantics: str) -> torch.Tensor:
    """The full-width keep mask the plugin's band path gives (Candidates over the kept tokens)."""
    out = typical._band_path(
        Candidates(x.clone(), None, x.shape[1], False, True), p, min_keep, semantics, cpu.CpuBackend()
    )
    assert out is not None
    full = out.full()
    return torch.isfinite(full.logits)


@pytest.mark.parametrize("kind", ["peaked", "flat", "tied", "masked", "sharp"])
def test_statistics_and_band_follow_the_definition(band, kind):
    """c = sum p x and log Z agree with float64 torch to ~1e-13; the band is every token within its widest
    distance (a prefix of the ranking), in position order, holding more than p and at least min_keep tokens."""
    x = _rows(kind, 6, seed=3)
    p = torch.tensor([0.1, 0.5, 0.9, 0.95, 0.99, 0.3], dtype=torch.float64)
    min_keep = torch.tensor([1, 1, 3, 1, 20, 0])
    values, positions, counts, center, lse = band(x, p, min_keep)
    xd = x.double()
    want_lse = torch.logsumexp(xd, dim=1)
    prob = torch.exp(xd - want_lse[:, None])
    want_c = torch.where(prob > 0, prob * xd, 0.0).sum(dim=1)
    for row in range(x.shape[0]):
        n = int(counts[row])
        if n < 0:  # left to the caller: only a band wider than a quarter of the row
            assert kind == "flat" or float(p[row]) >= 0.95, (kind, row)
            continue
        assert abs(float(lse[row] - want_lse[row])) <= 1e-12 * max(1.0, abs(float(want_lse[row])))
        assert abs(float(center[row] - want_c[row])) <= 1e-12 * max(1.0, abs(float(want_c[row])))
        pos = positions[row, :n]
        assert torch.equal(pos, pos.sort().values) and torch.equal(values[row, :n], x[row, pos])
        assert torch.all(values[row, n:] == -INF)
        assert len(set(positions[row].tolist())) == positions.shape[1]  # spare slots: other columns
        distance = (center[row] - xd[row]).abs()
        inside = torch.zeros(x.shape[1], dtype=torch.bool)
        inside[pos] = True
        assert float(distance[inside].max()) < float(distance[~inside].min())  # a prefix of the ranking
        assert float(prob[row, pos].sum()) > float(p[row]) and n >= int(min_keep[row])


@pytest.mark.parametrize("semantics", typical.SEMANTICS)
@pytest.mark.parametrize("kind", ["peaked", "flat", "tied", "masked", "sharp"])
def test_kept_sets_equal_the_full_ranking(band, kind, semantics):
    """Through the kernel, typical keeps what ranking the whole row (the plugin's torch path) keeps, per-row p and
    min_keep included. (The kernel does most rows itself: one-hot rows with min_keep > 1 need a band of most of the
    row and are ranked whole.)"""
    done = 0
    for seed in range(4):
        x = _rows(kind, 5, seed=seed)
        g = torch.Generator().manual_seed(seed)
        p = torch.rand(5, generator=g, dtype=torch.float64) * 0.98 + 0.01
        min_keep = torch.randint(0, 30, (5,), generator=g)
        done += int((band(x, p, min_keep)[2] >= 0).sum())
        assert torch.equal(_kernel_path(band, x, p, min_keep, semantics), _torch_path(x, p, min_keep, semantics)), (
            kind,
            seed,
        )
    assert done >= (10 if kind == "sharp" else 20)


def test_edge_rows_are_left_to_the_torch_path(band):
    """NaN, +inf and all-masked rows get count -1 (the plugin ranks them whole); their batch mates do not."""
    x = _rows("peaked", 5, seed=1)
    x[1, 100] = NAN
    x[2, 5] = INF
    x[3] = -INF
    x[4, 9] = -NAN  # a NaN with its sign bit set
    p = torch.full((5,), 0.9, dtype=torch.float64)
    ones = torch.ones(5, dtype=torch.int64)
    counts = band(x, p, ones)[2]
    assert counts[0] > 0 and counts[1:].tolist() == [-1, -1, -1, -1]
    kept = _kernel_path(band, x, p, ones, "llama.cpp")
    assert torch.equal(kept, _torch_path(x, p, ones, "llama.cpp"))


def test_rows_of_huge_logits_are_left_to_the_torch_path(band):
    """A row whose largest logit is beyond +-2**16 (log Z = top + log s would lose log s: 400 tokens tied at 3e38
    each looked like mass 1, so typical kept one of them) is ranked whole; rows of ordinary logits are not."""
    x = _rows("peaked", 3, seed=2)
    x[1] = -INF
    x[1, 100:500] = 3e38  # 400 tokens tied: typical 0.5 keeps 200 of them
    x[2] = x[2] - 1e6
    p = torch.full((3,), 0.5, dtype=torch.float64)
    ones = torch.ones(3, dtype=torch.int64)
    assert band(x, p, ones)[2][1:].tolist() == [-1, -1] and band(x, p, ones)[2][0] > 0
    for semantics in typical.SEMANTICS:
        kept = _kernel_path(band, x, p, ones, semantics)
        assert torch.equal(kept, _torch_path(x, p, ones, semantics))
    assert int(_kernel_path(band, x, p, ones, "llama.cpp")[1].sum()) == 200  # transformers keeps every tie: 400


def test_a_row_keeps_the_same_tokens_alone_and_in_any_batch(band):
    x = torch.cat([_rows(kind, 2, seed=5) for kind in ("peaked", "flat", "tied", "sharp")])
    g = torch.Generator().manual_seed(0)
    p = torch.rand(x.shape[0], generator=g, dtype=torch.float64) * 0.9 + 0.05
    min_keep = torch.randint(1, 5, (x.shape[0],), generator=g)
    together = _kernel_path(band, x, p, min_keep, "llama.cpp")
    for row in range(x.shape[0]):
        alone = _kernel_path(band, x[row : row + 1], p[row : row + 1], min_keep[row : row + 1], "llama.cpp")
        assert torch.equal(alone[0], together[row]), row
    flipped = _kernel_path(band, x.flip(0), p.flip(0), min_keep.flip(0), "llama.cpp")
    assert torch.equal(flipped.flip(0), together)


def test_the_backend_declines_what_it_does_not_compile(band, monkeypatch):
    p, ones = torch.full((2,), 0.9, dtype=torch.float64), torch.ones(2, dtype=torch.int64)
    assert band(torch.randn(2, 100), p, ones) is None  # narrow
    assert band(torch.randn(2, V).double(), p, ones) is None  # float64
    monkeypatch.setenv("SAMPLECHAIN_CPU_NUMBA", "0")
    assert band(torch.randn(2, V), p, ones) is None


@pytest.mark.parametrize("numba", ["1", "0"])
def test_seeded_chains_draw_the_same_tokens_either_way(numba, monkeypatch):
    """typical -> dist and typical -> temperature -> dist on wide rows: with the kernel and with the torch path
    (SAMPLECHAIN_CPU_NUMBA=0), the same tokens, and logprobs within float rounding."""
    x = torch.cat([make_logits("peaked", 4, 40000, seed=2), torch.randn(2, 40000) * 3])

    def run() -> tuple[torch.Tensor, torch.Tensor]:
        chain = Chain.load(
            {
                "samplers": [{"use": "typical", "p": 0.8}, {"use": "temperature", "t": 0.7}, {"use": "dist"}],
                "backend": "cpu",
            }
        )
        store = chain.new_store(capacity=6)
        ids = [f"r{i}" for i in range(6)]
        for i, rid in enumerate(ids):
            store.add(rid, {"seed": 77 + i, "typical_p": 0.5 + 0.08 * i})
        out = chain.sample(x, store, ids)
        return out.token_ids, out.logprobs

    monkeypatch.setenv("SAMPLECHAIN_CPU_NUMBA", numba)
    tokens, logprobs = run()
    monkeypatch.setenv("SAMPLECHAIN_CPU_NUMBA", "0" if numba == "1" else "1")
    other_tokens, other_logprobs = run()
    assert torch.equal(tokens, other_tokens)
    torch.testing.assert_close(logprobs, other_logprobs, rtol=0, atol=1e-5)


# ----------------------------------------------------------------------------- TOP_P_CANDIDATES
@pytest.fixture(scope="module")
def nucleus():
    if not cpu.numba_enabled():
        pytest.skip("numba is not installed (or SAMPLECHAIN_CPU_NUMBA=0)")
    return cpu.CpuBackend().kernel(TOP_P_CANDIDATES)


def _top_p_reference(x: torch.Tensor, p: torch.Tensor, min_keep: torch.Tensor) -> torch.Tensor:
    """llama.cpp's top-p in float64 over the whole row, equal logits ranked by id: (B, V) keep mask."""
    xd = x.double()
    order = torch.sort(-xd, dim=1, stable=True).indices
    prob = torch.softmax(xd, dim=1).gather(1, order)
    above = torch.cumsum(prob, dim=1) - prob
    kept = (above < p[:, None]).sum(dim=1).clamp(min=1)
    kept = torch.maximum(kept, min_keep)
    ranked = torch.arange(x.shape[1])[None, :] < kept[:, None]
    return torch.zeros_like(ranked).scatter_(1, order, ranked) & torch.isfinite(xd)


def _top_p_kept(x: torch.Tensor, p: torch.Tensor, min_keep: torch.Tensor) -> torch.Tensor:
    """top_p's kept tokens through the plugin (the backend's kernel where it runs)."""
    per_row = [{"top_p": float(p[i]), "min_keep": int(min_keep[i])} for i in range(x.shape[0])]
    chain = sampler_chain({"use": "top_p", "p": 0.5})
    return torch.isfinite(processed_scores(chain, x, per_row, process=True))


@pytest.mark.parametrize("kind", ["peaked", "flat", "tied", "masked", "sharp"])
def test_top_p_candidates_are_at_leasts_above_a_sound_threshold(nucleus, kind):
    """The normaliser to ~1e-13; the tokens at or above the threshold hold more than p; the candidates are what
    Backend.at_least returns for that threshold, bit for bit (values, positions, spare slots, counts)."""
    x = _rows(kind, 6, seed=4)
    p = torch.tensor([0.1, 0.5, 0.9, 0.95, 0.99, 0.3], dtype=torch.float64)
    ones = torch.ones(6, dtype=torch.int64)
    found = nucleus(x, p, ones)
    assert found is not None
    top, total, threshold, values, positions, counts, kept = found
    xd = x.double()
    torch.testing.assert_close(top[:, 0] + torch.log(total), torch.logsumexp(xd, dim=1), rtol=1e-13, atol=0)
    prob = torch.softmax(xd, dim=1)
    assert torch.all(torch.where(x >= threshold[:, None], prob, 0.0).sum(dim=1) > p)
    assert values is not None or kind in ("flat", "tied")
    if values is not None:
        want = cpu.CpuBackend().at_least(x, threshold, 1)
        assert torch.equal(values, want[0]) and torch.equal(positions, want[1]) and torch.equal(counts, want[2])
        # the cut taken there is the plugin's rule (kept_counts) on the same normaliser
        assert torch.equal(kept, kept_counts(values, top, total, p, ones))


@pytest.mark.parametrize("kind", ["peaked", "flat", "tied", "masked", "sharp"])
def test_top_p_through_the_kernel_keeps_the_exact_nucleus(nucleus, kind):
    """top_p's kept set on wide rows equals llama.cpp's rule computed over the whole sorted row in float64 (ties
    by id), per-row p and min_keep included; rows whose crossing lies within 1e-12 of p are not compared."""
    for seed in range(3):
        x = _rows(kind, 5, seed=seed)
        g = torch.Generator().manual_seed(seed)
        p = torch.rand(5, generator=g, dtype=torch.float64) * 0.98 + 0.01
        min_keep = torch.randint(0, 30, (5,), generator=g)
        assert nucleus(x, p, min_keep) is not None
        ours, want = _top_p_kept(x, p, min_keep), _top_p_reference(x, p, min_keep)
        xd = x.double()
        prob = torch.softmax(xd, dim=1)
        for row in range(5):
            above = torch.sort(prob[row], descending=True).values.cumsum(0)
            if bool(((above - p[row]).abs() < 1e-12).any()):
                continue
            assert torch.equal(ours[row], want[row]), (kind, seed, row)


def test_top_p_rows_keep_the_same_tokens_alone_and_in_any_batch(nucleus):
    x = torch.cat([_rows(kind, 2, seed=6) for kind in ("peaked", "flat", "tied", "sharp")])
    per_row = [{"top_p": 0.3 + 0.08 * i, "min_keep": 1 + i % 3} for i in range(x.shape[0])]
    assert_rows_equal_alone(sampler_chain({"use": "top_p", "p": 0.5}), x, per_row, process=True)


def test_top_p_edge_rows_take_the_torch_path(nucleus):
    p = torch.full((3,), 0.9, dtype=torch.float64)
    for bad in (NAN, INF):
        x = _rows("peaked", 3, seed=2)
        x[1, 17] = bad
        assert nucleus(x, p, torch.ones(3, dtype=torch.int64)) is None
    x = _rows("peaked", 3, seed=2)
    x[2] = -INF
    assert nucleus(x, p, torch.ones(3, dtype=torch.int64)) is None
    fewer = nucleus(_rows("peaked", 3, seed=2), p, torch.full((3,), V))  # fewer than min_keep above: at_least
    assert fewer is not None and fewer[3] is None


# ----------------------------------------------------------------------------- random wide chains
@pytest.mark.parametrize("trial", range(24))
def test_random_wide_chains_draw_the_samplers_tokens_and_are_batch_invariant(band, nucleus, monkeypatch, trial):
    """Chains of 1-3 of temperature, top_p, min_p, typical and top_k in random order, then dist, on wide rows
    (peaked, flat, bf16-tied, masked) with per-request seeds: with the compiled kernels (TYPICAL_BAND,
    TOP_P_CANDIDATES, the fused draw) the tokens of the torch paths over two steps and their logprobs to 1e-5;
    and each row alone draws its token with its logprob to the bit."""
    import random

    rng = random.Random(trial)
    pool = [
        {"use": "temperature", "t": round(rng.uniform(0.3, 1.5), 2)},
        {"use": "top_p", "p": round(rng.uniform(0.05, 0.99), 2)},
        {"use": "min_p", "p": round(rng.uniform(0.0, 0.3), 3)},
        {"use": "typical", "p": round(rng.uniform(0.1, 0.99), 2)},
        {"use": "top_k", "k": rng.randint(1, 200)},
    ]
    chain = Chain.load({"samplers": [*rng.sample(pool, rng.randint(1, 3)), {"use": "dist"}], "backend": "cpu"})
    width = rng.choice([16384, 20000, 70000])
    x = torch.cat([_rows(kind, 1, seed=trial, width=width) for kind in ("peaked", "flat", "tied", "masked")])
    requests = [{"seed": rng.randrange(1000)} for _ in range(4)]

    def steps(logits: torch.Tensor, rows: list[dict]) -> tuple[torch.Tensor, torch.Tensor]:
        return sample_steps(chain, logits, rows, 2)

    tokens, logprobs = steps(x, requests)
    for row in range(4):
        alone = steps(x[row : row + 1], requests[row : row + 1])
        assert torch.equal(alone[0][:, 0], tokens[:, row]) and torch.equal(alone[1][:, 0], logprobs[:, row]), row
    monkeypatch.setenv("SAMPLECHAIN_CPU_NUMBA", "0")
    want_tokens, want_logprobs = steps(x, requests)
    assert torch.equal(tokens, want_tokens)
    torch.testing.assert_close(logprobs, want_logprobs, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- top_p -> dist fused
TOP_P_FUSED_CASES = {  # name -> (samplers before dist, fused?)
    "top_p alone": ([{"use": "top_p", "p": 0.9}], True),
    "temperature -> top_p": ([{"use": "temperature", "t": 0.7}, {"use": "top_p", "p": 0.8}], True),
    "per request": ([{"use": "temperature", "t": 0.7}, {"use": "top_p", "p": 0.8}], True),
    "min_keep": ([{"use": "top_p", "p": 0.05, "min_keep": 40}], True),
    "a row that keeps everything": ([{"use": "top_p", "p": 0.9}], False),
    "a greedy row": ([{"use": "temperature", "t": 0.7}, {"use": "top_p", "p": 0.8}], False),
    "top_p -> temperature": ([{"use": "top_p", "p": 0.8}, {"use": "temperature", "t": 0.7}], False),
}


@pytest.mark.parametrize("case", list(TOP_P_FUSED_CASES))
def test_the_cpu_backend_fuses_top_p(nucleus, monkeypatch, case):
    """`top_p -> dist` and `temperature -> top_p -> dist` on wide rows in one compiled call (FUSED_SAMPLE): over
    three steps the tokens and logprobs of the samplers on the kernel's path, bit for bit, and the tokens of the
    torch path (SAMPLECHAIN_CPU_NUMBA=0); peaked, flat, bf16-tied and masked rows, per-request p, temperature and
    min_keep. A row at p = 1 or t = 0, and top_p after the temperature, are left to the samplers."""
    samplers, fused = TOP_P_FUSED_CASES[case]
    g = torch.Generator().manual_seed(71)
    x = torch.cat([_rows(kind, 2, seed=9) for kind in ("peaked", "flat", "tied", "masked")])
    requests = [{"seed": 30 + i} for i in range(8)]
    if case == "per request":
        requests = [
            {
                "seed": 30 + i,
                "top_p": float(torch.rand(1, generator=g)) * 0.98 + 0.01,
                "temperature": 0.4 + i / 6,
                "min_keep": i % 3,
            }
            for i in range(8)
        ]
    elif case == "a row that keeps everything":
        requests[3]["top_p"] = 1.0
    elif case == "a greedy row":
        requests[5]["temperature"] = 0.0
    chain = Chain.load({"samplers": [*samplers, {"use": "dist"}], "backend": "cpu"})

    def steps() -> tuple[torch.Tensor, torch.Tensor]:
        return sample_steps(chain, x, requests, 3)

    ran = []
    draw = cpu._fused_top_p
    monkeypatch.setattr(cpu, "_fused_top_p", lambda *args: ran.append(out := draw(*args)) or out)
    tokens, logprobs = steps()
    assert len(ran) == (3 if case != "top_p -> temperature" else 0)
    assert [out is not None for out in ran] == [fused] * len(ran)
    monkeypatch.setattr(cpu, "_fused_top_p", lambda *args: None)  # the samplers, top_p on the kernel's path
    want_tokens, want_logprobs = steps()
    assert torch.equal(tokens, want_tokens)
    torch.testing.assert_close(logprobs, want_logprobs, rtol=1e-6, atol=1e-6)
    monkeypatch.setenv("SAMPLECHAIN_CPU_NUMBA", "0")  # the torch path: a float32 normaliser, the same tokens here
    assert torch.equal(steps()[0], tokens)


def test_fused_top_p_rows_draw_the_same_alone_and_in_any_batch(nucleus):
    chain = Chain.load(
        {"samplers": [{"use": "temperature", "t": 0.9}, {"use": "top_p", "p": 0.7}, {"use": "dist"}], "backend": "cpu"}
    )
    x = torch.cat([_rows(kind, 2, seed=12, width=70000) for kind in ("peaked", "flat", "tied")])
    requests = [{"seed": 5 + i, "top_p": 0.2 + 0.12 * i} for i in range(6)]

    def step(rows: slice) -> tuple[torch.Tensor, torch.Tensor]:
        store = chain.new_store(capacity=6)
        ids = [f"r{i}" for i in range(6)][rows]
        for rid, request in zip(ids, requests[rows]):
            store.add(rid, request)
        out = chain.sample(x[rows], store, ids)
        return out.token_ids, out.logprobs

    tokens, logprobs = step(slice(0, 6))
    for row in range(6):
        alone = step(slice(row, row + 1))
        assert torch.equal(alone[0], tokens[row : row + 1]) and torch.equal(alone[1], logprobs[row : row + 1]), row


@pytest.mark.parametrize("bad", ["nan", "huge"])
def test_a_fused_top_p_step_declines_rows_it_cannot_draw(nucleus, monkeypatch, bad):
    """A NaN logit: the samplers run and fail the step naming the request, its position unchanged. Logits beyond
    rng.HUGE (the draw shifts such a row): the samplers run and draw."""
    from samplechain import SamplingError

    chain = Chain.load({"samplers": [{"use": "top_p", "p": 0.9}, {"use": "dist"}], "backend": "cpu"})
    store = chain.new_store(capacity=2)
    store.add("a", {"seed": 1})
    store.add("b", {"seed": 2})
    x = _rows("flat", 2, seed=13)
    ran = []
    draw = cpu._fused_top_p
    monkeypatch.setattr(cpu, "_fused_top_p", lambda *args: ran.append(out := draw(*args)) or out)
    if bad == "nan":
        x[1, 99] = NAN
        with pytest.raises(SamplingError, match="'b'"):
            chain.sample(x, store, ["a", "b"])
        x[1, 99] = 0.0
        assert ran == [None] and chain.sample(x, store, ["a", "b"]).token_ids.shape == (2,)
        return
    x[1] += 1e8
    out = chain.sample(x, store, ["a", "b"])
    assert ran == [None] and bool(torch.isfinite(out.logprobs).all())
