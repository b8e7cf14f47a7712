"""The cuda plugin's Triton kernels (samplechain_cuda_kernels) against the cpu backend, bit for bit: the counter
noise, the Gumbel-max token, the kept sets of temperature -> top_k -> top_p -> min_p and the token of that chain
ending in dist. Without a GPU the kernels run on CPU tensors under triton's interpreter (TRITON_INTERPRET=1, set by
conftest.py before triton is imported); the `gpu` tests run the compiled kernels on CUDA tensors, and a slow test
compiles them for an H100 target without one. Skipped, with the reason, where triton is not installed."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest
import torch

import samplechain_cuda_triton  # conftest.py set TRITON_INTERPRET before this module is imported
import samplechain_cuda_truncate
from samplechain import Chain, rng
from samplechain.tools.testing import cut_logits

PLUGIN = Path(__file__).resolve().parents[1]
MODULES = (
    "samplechain_cuda_triton",
    "samplechain_cuda_draw",
    "samplechain_cuda_passes",
    "samplechain_cuda_truncate",
    "samplechain_cuda_kernels",
)
HAS_TRITON = importlib.util.find_spec("triton") is not None
HAS_CUDA = torch.cuda.is_available()
needs_triton = pytest.mark.skipif(
    not HAS_TRITON, reason="triton is not installed: pip install 'samplechain-cuda[triton]' (scripts/setup.sh does)"
)
INF = float("inf")
STREAM = 4  # dist's index in CHAIN
CHAIN = {
    "samplers": [
        {"use": "temperature", "t": 1.0},
        {"use": "top_k", "k": 0},
        {"use": "top_p", "p": 1.0},
        {"use": "min_p", "p": 0.0},
        {"use": "dist", "seed": 1},
    ],
    "backend": "cpu",
}


@pytest.fixture(scope="module")
def interpreted() -> ModuleType:
    """The kernels on CPU tensors, under triton's interpreter (conftest.py sets TRITON_INTERPRET=1 without a GPU)."""
    import samplechain_cuda_kernels as kernels

    if not samplechain_cuda_triton.interpreted():
        pytest.skip(
            "triton compiles the kernels in this session (a CUDA device is present, or TRITON_INTERPRET is "
            "not 1): the gpu tests run the same comparisons"
        )
    return kernels


@pytest.fixture(scope="module")
def compiled() -> ModuleType:
    """The compiled kernels on CUDA tensors."""
    import samplechain_cuda_kernels as kernels

    if samplechain_cuda_triton.interpreted():
        pytest.skip("TRITON_INTERPRET=1: the kernels are interpreted in this session")
    return kernels


# ------------------------------------------------------------------------------------------------- inputs


def _noise_args(batch: int, width: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    seeds = torch.randint(0, 2**62, (batch,), generator=g)
    seeds[0] = 2**63 - 1
    positions = torch.randint(0, 2**40, (batch,), generator=g)
    positions[1] = 0
    ids = torch.randint(0, 151936, (batch, width), generator=g)
    return seeds, positions, ids


def _gumbel_inputs(vocab: int, seed: int) -> torch.Tensor:
    x = cut_logits(vocab, seed)
    g = torch.Generator().manual_seed(seed + 1)
    extra = torch.stack(
        [
            torch.randn(vocab, generator=g) * 1e30,  # shifted by its max (rng.shifted)
            torch.full((vocab,), -INF),  # nothing left: index 0, as argmin
            torch.round(torch.randn(vocab, generator=g)) - 3e7,
        ]
    )
    return torch.cat([x, extra])


# ------------------------------------------------------------------------------------------------- the chain


def _chain_run(logits: torch.Tensor, rows: list[dict], steps: int):
    """Kept sets (B, V) of the cpu chain and its tokens at positions 0 .. steps - 1."""
    chain = Chain.load(CHAIN)
    store = chain.new_store(device="cpu", capacity=len(rows))
    ids = [f"r{i}" for i in range(len(rows))]
    for rid, params in zip(ids, rows):
        store.add(rid, params)
    kept = chain.process(logits, store, ids) > -INF
    tokens = [chain.sample(logits, store, ids).token_ids for _ in range(steps)]
    return kept, tokens


def _kernel_args(rows: list[dict], shared: set[str]) -> dict:
    """The kernels' parameters for the chain's rows: a Python number where every row shares it (the chain's
    scalar path), else a (B,) tensor."""

    def value(key, default):
        values = [r.get(key, default) for r in rows]
        if key in shared:
            assert len(set(values)) == 1
            return values[0]
        return torch.tensor(values)

    keeps = tuple(value(f"{name}.min_keep", 1) for name in ("top_k", "top_p", "min_p"))
    return dict(
        temperature=value("temperature", 1.0),
        top_k=value("top_k", 0),
        top_p=value("top_p", 1.0),
        min_p=value("min_p", 0.0),
        min_keep=keeps,
    )


def _rows(**columns) -> list[dict]:
    """One request per row from columns of per-row values (chain aliases or "<entry>.<field>" keys)."""
    return [dict(zip(columns, values)) for values in zip(*columns.values())]


# name -> (rows' parameters, the ones every row shares: the chain's scalar paths, Python numbers for the kernels)
SCENARIOS = {
    "per-row": (
        _rows(
            temperature=(0.7, 1.0, 1.3, 0.5, 0.9, 1.0, 2.0, 0.8),
            top_k=(0, 40, 5, 1000, 50, 0, 20, 3),
            top_p=(0.9, 1.0, 0.5, 0.95, 0.8, 0.3, 0.99, 0.6),
            min_p=(0.05, 0.0, 0.1, 0.0, 0.02, 0.2, 0.0, 0.01),
        ),
        set(),
    ),
    "shared": (
        [dict(temperature=0.8, top_k=50, top_p=0.9, min_p=0.05)] * 8,
        {"temperature", "top_k", "top_p", "min_p"},
    ),
    "edges": (
        _rows(
            temperature=(0.0, 1.0, 0.6, 1.0, 3.0, 0.9, 1.0, 1.2),
            top_k=(7, -1, 100000, 30, 0, 12, 60, 1),
            top_p=(0.9, 0.0, 0.97, 1.0, 0.7, 0.99, 0.6, 0.4),
            min_p=(0.0, 0.3, 0.0, 0.9, 0.05, 0.0, 0.5, 0.2),
            **{
                "top_k.min_keep": (1, 0, 1, 45, 1, 1, 2, 3),
                "top_p.min_keep": (1, 5, 0, 1, 1, 30, 7, 1),
                "min_p.min_keep": (1, 1, 1, 3, 9, 1, 20, 2),
            },
        ),
        set(),
    ),
    "shared-t": (
        _rows(
            temperature=(1.5,) * 8,
            top_k=(40,) * 8,
            top_p=(0.9, 0.5, 0.95, 1.0, 0.8, 0.99, 0.7, 0.3),
            min_p=(0.0, 0.1, 0.02, 0.05, 0.0, 0.0, 0.3, 0.01),
        ),
        {"temperature", "top_k"},
    ),
}


def _seeded(rows: list[dict], base: int) -> list[dict]:
    return [{**r, "seed": base + 7919 * i} for i, r in enumerate(rows)]


# ------------------------------------------------------------------------------------------------- checks


def check_uniform(kernels: ModuleType, device: str) -> None:
    for stream, seed in ((0, 1), (3, 2), (17, 3)):
        seeds, positions, ids = _noise_args(6, 700, seed)
        got = kernels.uniform(seeds.to(device), positions.to(device), ids.to(device), stream)
        assert torch.equal(got.cpu(), rng.uniform(seeds, positions, ids, stream))


def check_gumbel_argmax(kernels: ModuleType, device: str, trials: int) -> None:
    for trial in range(trials):
        vocab = (1000, 2500, 4097)[trial % 3]
        x = _gumbel_inputs(vocab, trial)
        seeds, positions, ids = _noise_args(x.shape[0], vocab, 100 + trial)
        on = lambda t: t.to(device)  # noqa: E731
        stream = trial % 5
        want = rng.gumbel_argmax(x, seeds, positions, None, stream)
        assert torch.equal(kernels.gumbel_argmax(on(x), on(seeds), on(positions), stream).cpu(), want), trial
        assert want[-2] == 0  # the all -inf row
        # candidates with their own token ids (compacted rows), and logits of other float dtypes
        assert torch.equal(
            kernels.gumbel_argmax(on(x), on(seeds), on(positions), stream, ids=on(ids)).cpu(),
            rng.gumbel_argmax(x, seeds, positions, ids, stream),
        ), trial
        half = x.bfloat16()
        assert torch.equal(
            kernels.gumbel_argmax(on(half), on(seeds), on(positions), stream).cpu(),
            rng.gumbel_argmax(half, seeds, positions, None, stream),
        ), trial


def check_chain(
    kernels: ModuleType, device: str, scenario: str, vocab: int, seed: int, steps: int = 2, public: bool = True
) -> None:
    """The kernels' kept sets and tokens (positions 0 .. steps - 1) against the cpu chain's. public=False takes the
    kept set and the first token from one launch (what truncate and sample_top_k_top_p_min_p each run: half the
    interpreter's time)."""
    rows, shared = SCENARIOS[scenario]
    rows = _seeded(rows, 1000 + seed)
    x = cut_logits(vocab, seed)
    kept, tokens = _chain_run(x, rows, steps)
    args = _kernel_args(rows, shared)
    args = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in args.items()}
    args["min_keep"] = tuple(v.to(device) if isinstance(v, torch.Tensor) else v for v in args["min_keep"])
    seeds = torch.tensor([r["seed"] for r in rows], device=device)
    positions = [torch.full((len(rows),), step, dtype=torch.int64, device=device) for step in range(steps)]
    xd = x.to(device)
    first = None
    if public:
        trunc, mask = kernels.truncate(xd, mask=True, **args)
        count = trunc.count
    else:
        first_launch = samplechain_cuda_truncate.launch(
            xd,
            args["temperature"],
            args["top_k"],
            args["top_p"],
            args["min_p"],
            args["min_keep"],
            seeds,
            positions[0],
            STREAM,
            True,
            True,
        )
        first = first_launch.tokens
        mask, count = first_launch.keep.view(torch.bool), first_launch.truncation.count
    finite = mask.cpu() & torch.isfinite(x)  # the kernel's count may reach into -inf tokens, as the chain's
    bad = (finite != kept).any(dim=1).nonzero().flatten().tolist()
    assert not bad, (
        f"{scenario}: kept sets differ in rows {bad}: kernel {finite.sum(1).tolist()} chain {kept.sum(1).tolist()}"
    )
    assert bool((count.cpu() >= kept.sum(1)).all())
    for step in range(steps):
        got = (
            first
            if step == 0 and first is not None
            else kernels.sample_top_k_top_p_min_p(xd, seeds, positions[step], STREAM, **args)
        )
        assert torch.equal(got.cpu(), tokens[step]), (scenario, step, got.cpu(), tokens[step])


# ------------------------------------------------------------------------------------------------- without a GPU


def test_importable_without_triton(monkeypatch):
    for name in MODULES:  # imported afresh without triton below; the session's modules come back after the test
        importlib.import_module(name)
    for name in MODULES:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "triton", None)  # `import triton` raises ImportError
    monkeypatch.setitem(sys.modules, "triton.language", None)
    module = importlib.import_module("samplechain_cuda_kernels")
    assert "triton is not installed" in module.kernels_unavailable_reason("cuda")
    assert "samplechain-cuda[triton]" in module.kernels_unavailable_reason()
    with pytest.raises(RuntimeError, match="triton is not installed"):
        module.gumbel_argmax(torch.zeros(1, 4), torch.zeros(1, dtype=torch.int64), torch.zeros(1, dtype=torch.int64), 0)


@needs_triton
def test_the_interpreter_runs_them_on_cpu_tensors(interpreted, monkeypatch):
    assert interpreted.kernels_unavailable_reason("cpu") == ""
    monkeypatch.setattr(samplechain_cuda_triton, "interpreted", lambda: False)
    assert "TRITON_INTERPRET=1" in interpreted.kernels_unavailable_reason("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "finds no CUDA device" in interpreted.kernels_unavailable_reason("cuda")


@needs_triton
def test_uniform_is_rngs_bit_for_bit(interpreted):
    check_uniform(interpreted, "cpu")


@pytest.fixture
def small_blocks(interpreted, monkeypatch):
    """Rows read in several blocks, as on a GPU (the interpreter's default block holds these rows whole): the
    running counts, masses and argmin carried from block to block."""
    monkeypatch.setattr(samplechain_cuda_triton, "INTERPRETED_BLOCK", 512)


@needs_triton
def test_gumbel_argmax_draws_rngs_token(interpreted):
    check_gumbel_argmax(interpreted, "cpu", trials=3)


@needs_triton
def test_gumbel_argmax_across_blocks(interpreted, small_blocks):
    check_gumbel_argmax(interpreted, "cpu", trials=2)


@needs_triton
@pytest.mark.parametrize("scenario", ["per-row", "shared", "edges", "shared-t"])
def test_truncation_and_draw_equal_the_cpu_chain(interpreted, scenario):
    check_chain(
        interpreted,
        "cpu",
        scenario,
        vocab=1500 + 500 * list(SCENARIOS).index(scenario),
        seed=3,
        steps=1,
        public=scenario == "per-row",
    )


@needs_triton
@pytest.mark.parametrize("scenario", ["per-row", "edges"])
def test_truncation_and_draw_across_blocks(interpreted, small_blocks, scenario):
    check_chain(
        interpreted, "cpu", scenario, vocab=1100 + 400 * list(SCENARIOS).index(scenario), seed=5, steps=1, public=False
    )


@needs_triton
@pytest.mark.slow
@pytest.mark.parametrize("seed", range(3))
def test_more_draws_and_vocabularies(interpreted, monkeypatch, seed):
    # each of check_gumbel_argmax's three vocabularies once; the public truncate() in one scenario (the others take
    # the kept set and first token from one launch, which the public functions run in two)
    monkeypatch.setattr(samplechain_cuda_triton, "INTERPRETED_BLOCK", (8192, 2048, 1024)[seed])
    check_gumbel_argmax(interpreted, "cpu", trials=3)
    vocab = (1000, 5000, 4099)[seed]
    for i, scenario in enumerate(SCENARIOS):
        check_chain(interpreted, "cpu", scenario, vocab=vocab, seed=10 + seed, steps=2, public=i == seed)


@needs_triton
def test_llama_cpp_top_p_cut_on_p(interpreted):
    # probabilities 0.1 .. 0.4 and p = 0.7: the cut lies on p (top_p.row_mass's float64 example)
    x = torch.log(torch.tensor([[0.1, 0.2, 0.3, 0.4]]))
    kept, _ = _chain_run(x, [dict(top_p=0.7, seed=1)], 0)
    _, mask = interpreted.truncate(x, top_p=0.7, mask=True)
    assert torch.equal(mask, kept)


def _calls(fn) -> set[str]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    return {
        n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", "")
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
    }


@needs_triton
def test_no_host_reads_in_the_functions(interpreted):
    forbidden = {"item", "tolist", "bool", "nonzero", "cpu", "numpy", "synchronize", "any", "all"}
    for fn in (
        interpreted.gumbel_argmax,
        interpreted.uniform,
        interpreted.truncate,
        interpreted.sample_top_k_top_p_min_p,
        samplechain_cuda_truncate.launch,
        samplechain_cuda_triton.param_arg,
        samplechain_cuda_triton.counter,
    ):
        assert not _calls(fn) & forbidden, f"{fn.__name__} calls {_calls(fn) & forbidden}"


# every kernel variant the functions launch (the constexpr flags that change its code), compiled for an sm_90 target
_COMPILE = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
import samplechain_cuda_kernels as K
import samplechain_cuda_draw as D
import samplechain_cuda_truncate as T
from samplechain_cuda_triton import interpreted
assert not interpreted()
target = GPUTarget("cuda", 90, 32)
trunc = dict(x_ptr="*fp32", stride_x="i64", V="i32", t_ptr="*fp32", t_val="fp32", k_ptr="*i64", k_val="i64",
             kmin_ptr="*i64", kmin_val="i64", p_ptr="*fp32", p_val="fp32", pmin_ptr="*i64", pmin_val="i64",
             lm_ptr="*fp32", lm_val="fp32", mmin_ptr="*i64", mmin_val="i64", dt_ptr="*fp32", dt_val="fp32",
             seed_ptr="*i64", pos_ptr="*i64", salt="i64", k_key_ptr="*i64", k_last_ptr="*i64",
             cut_key_ptr="*i64", cut_last_ptr="*i64", count_ptr="*i64", top_ptr="*fp32", tok_ptr="*i64",
             lp_ptr="*fp32", mask_ptr="*i8", stride_mask="i64")
flags = ("HAS_T", "T_ROW", "K_ROW", "KMIN_ROW", "P_ROW", "PMIN_ROW", "LM_ROW", "MMIN_ROW", "SWAP", "DRAW_T",
         "DT_ROW", "DRAW", "MASK")
for on in ({"HAS_T", "T_ROW", "K_ROW", "KMIN_ROW", "P_ROW", "PMIN_ROW", "LM_ROW", "MMIN_ROW", "DRAW", "MASK"},
           {"HAS_T", "SWAP", "DRAW"}, {"DRAW_T", "DT_ROW", "DRAW"}, {"DRAW_T", "K_ROW", "DRAW"}):
    const = {f: f in on for f in flags} | {"BLOCK": 512, "NP": 16}
    triton.compile(ASTSource(T.truncate_kernel, {**trunc, **{c: "constexpr" for c in const}}, const), target=target)
draw = dict(x_ptr="*bf16", stride_x="i64", ids_ptr="*i64", stride_ids="i64", V="i32", seed_ptr="*i64",
            pos_ptr="*i64", salt="i64", out_ptr="*i64", HAS_IDS="constexpr", BLOCK="constexpr")
for has_ids in (True, False):
    triton.compile(ASTSource(D.gumbel_argmax_kernel, draw, {"HAS_IDS": has_ids, "BLOCK": 1024}), target=target)
uni = dict(ids_ptr="*i64", stride_ids="i64", K="i32", seed_ptr="*i64", pos_ptr="*i64", salt="i64", out_ptr="*fp64",
           stride_out="i64", BLOCK="constexpr")
triton.compile(ASTSource(D.uniform_kernel, uni, {"BLOCK": 1024}), target=target)
# the integer arguments compiled here as values must stay values at run time: triton would make a 1 a constant
for fn, sig in ((T.truncate_kernel, trunc), (D.gumbel_argmax_kernel, draw), (D.uniform_kernel, uni)):
    ints = {name for name, ty in sig.items() if ty in ("i32", "i64")}
    free = {p.name for p in fn.params if p.do_not_specialize}
    assert ints <= free, (fn, sorted(ints - free))
print("compiled")
"""


@needs_triton
@pytest.mark.slow
def test_the_kernels_compile_for_a_gpu_without_one():
    """What the interpreter lets through and the compiler does not (a loop-carried value changing type, a name
    bound in one branch only ...): the kernels compiled to a cubin for an H100 (sm_90), in a process where triton
    is not interpreted. No GPU is needed (triton ships ptxas); ~10 s cold, less from triton's cache."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PLUGIN), env.get("PYTHONPATH")]))
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # triton 3.9 warns when it is unset
    done = subprocess.run([sys.executable, "-c", _COMPILE], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "compiled" in done.stdout, done.stderr[-3000:]


# ------------------------------------------------------------------------------------------------- with a GPU


def gpu_test(fn):
    fn = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")(fn)
    return needs_triton(pytest.mark.gpu(fn))


@gpu_test
def test_gpu_kernels_equal_the_cpu_reference(compiled):
    assert compiled.kernels_unavailable_reason("cuda") == ""
    check_uniform(compiled, "cuda")
    check_gumbel_argmax(compiled, "cuda", trials=12)
    for seed in range(3):
        for scenario in SCENARIOS:
            check_chain(compiled, "cuda", scenario, vocab=(1000, 3000, 5000)[seed], seed=20 + seed, steps=3)
    for scenario in ("shared", "shared-t"):  # a real vocabulary, top_k on (the chain's float64 top_p path)
        check_chain(compiled, "cuda", scenario, vocab=128256, seed=7)


@gpu_test
def test_gpu_kernels_do_not_synchronise(compiled):
    x = cut_logits(32000, 1).cuda()
    seeds, positions, _ = (t.cuda() for t in _noise_args(8, 1, 5))
    args = dict(
        temperature=torch.full((8,), 0.7, device="cuda"),
        top_k=torch.full((8,), 50, device="cuda"),
        top_p=torch.full((8,), 0.9, device="cuda"),
        min_p=torch.full((8,), 0.05, device="cuda"),
    )
    compiled.sample_top_k_top_p_min_p(x, seeds, positions, 4, **args)  # compile first
    compiled.gumbel_argmax(x, seeds, positions, 4)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        compiled.sample_top_k_top_p_min_p(x, seeds, positions, 4, **args)
        compiled.truncate(x, mask=True, **args)
        compiled.gumbel_argmax(x, seeds, positions, 4)
    finally:
        torch.cuda.set_sync_debug_mode("default")
