"""The cuda backend. Without a GPU (CI): its logic on the CPU, no host-synchronising op in its primitives (recorded
at dispatch and read in the source), the FlashInfer opt-in, and the clear error where CUDA is missing. With a GPU
(marked `gpu`): primitives equal to the cpu reference, a seeded chain drawing the cpu backend's tokens, no sync under
torch's sync debug mode, and the primitives captured and replayed in a CUDA graph."""

from __future__ import annotations

import ast
import inspect
import textwrap

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import samplechain_cpu
import samplechain_cuda as cuda
from samplechain import FUSED_SAMPLE, BackendError, Chain, PluginHost, rng
from samplechain.tools.testing import hard_logits

REF = samplechain_cpu.CpuBackend()
HAS_CUDA = torch.cuda.is_available()
PRIMITIVES = ("topk", "sort_desc", "gumbel", "uniform")
CHAIN = {
    "samplers": [
        {"use": "top_k", "k": 40},
        {"use": "top_p", "p": 0.9},
        {"use": "min_p", "p": 0.02},
        {"use": "temperature", "t": 0.7},
        {"use": "dist", "seed": 1234},
    ]
}


@pytest.fixture
def clean_env(monkeypatch):
    for var in ("SAMPLECHAIN_PLUGINS", "SAMPLECHAIN_BLOCK_PLUGINS", "SAMPLECHAIN_REGISTRY", cuda.ENV_TRITON):
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


_logits = hard_logits


def _noise_args(batch: int, width: int, seed: int = 3):
    g = torch.Generator().manual_seed(seed)
    seeds = torch.randint(0, 2**62, (batch,), generator=g)
    seeds[0] = 2**63 - 1
    positions = torch.randint(0, 2**40, (batch,), generator=g)
    ids = torch.randint(0, 151936, (batch, width), generator=g)
    return seeds, positions, ids


# ---------------------------------------------------------------- without a GPU


def test_primitives_on_cpu_equal_the_reference(clean_env):
    backend = cuda.CudaBackend(device="cpu")
    x = _logits()
    for k in (1, 17, 40, 1000):
        values, index = backend.topk(x, k)
        assert torch.equal(values, REF.topk(x, k)[0]) and torch.equal(x.gather(1, index), values)
    values, index = backend.sort_desc(x)
    ref_values, ref_index = REF.sort_desc(x)
    assert torch.equal(values, ref_values) and torch.equal(index, ref_index)
    args = _noise_args(4, 300)
    assert torch.equal(backend.gumbel(*args, 2), REF.gumbel(*args, 2))
    assert torch.equal(backend.uniform(*args, 2), REF.uniform(*args, 2))


def test_the_device_path_of_the_noise_equals_the_cpu_fast_path():
    # The GPU runs rng's torch path; on the CPU it only runs past 2**16 elements. Rows are independent, so the
    # same rows drawn in small batches (numpy path) must match bit for bit.
    seeds, positions, ids = _noise_args(70000, 1)
    whole = rng.uniform(seeds, positions, ids, 5)
    parts = torch.cat(
        [rng.uniform(seeds[i : i + 1000], positions[i : i + 1000], ids[i : i + 1000], 5) for i in range(0, 70000, 1000)]
    )
    assert torch.equal(whole, parts)


class _RecordOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


# aten ops that wait for the device: a value read on the host, or an output whose size depends on the data
_SYNCING = {
    "_local_scalar_dense",
    "nonzero",
    "nonzero_static",
    "masked_select",
    "_unique2",
    "unique_dim",
    "unique_consecutive",
    "repeat_interleave",
    "equal",
    "is_nonzero",
}


def test_primitives_dispatch_no_host_synchronising_op(clean_env):
    backend = cuda.CudaBackend(device="cpu")
    x = _logits(batch=3, vocab=32000)
    seeds, positions, ids = _noise_args(70000, 1)  # past rng's numpy fast path: the torch ops the GPU runs
    with _RecordOps() as rec:
        backend.topk(x, 50)
        backend.sort_desc(x)
        backend.gumbel(seeds, positions, ids, 1)
        backend.uniform(seeds, positions, ids, 1)
    assert {"topk", "sort", "log", "bitwise_xor"} <= rec.ops  # the recorder saw the primitives' work
    assert not rec.ops & _SYNCING, f"host-synchronising ops in the primitives: {rec.ops & _SYNCING}"


def _calls(fn) -> list[str]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            names.append(f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else "")
    return names


@pytest.mark.parametrize(
    "fn",
    [*(getattr(cuda.CudaBackend, p) for p in PRIMITIVES), rng.mix32, rng._mul32, rng._mix32_i32, rng._as_i32],
    ids=[*PRIMITIVES, "rng.mix32", "rng._mul32", "rng._mix32_i32", "rng._as_i32"],
)
def test_primitive_source_reads_nothing_on_the_host(fn):
    forbidden = {"item", "tolist", "bool", "int", "float", "nonzero", "cpu", "numpy", "synchronize"}
    assert not set(_calls(fn)) & forbidden, f"{fn.__qualname__} calls {set(_calls(fn)) & forbidden}"


def test_the_source_check_catches_a_sync():
    def bad(x):
        return x[bool((x > 0).any())].nonzero().item()

    assert {"bool", "nonzero", "item"} <= set(_calls(bad))


def test_the_fused_kernel_runs_where_triton_does(clean_env):
    """FUSED_SAMPLE (the chain's tail in one Triton launch) is offered on CUDA devices only, unless asked for on CPU
    tensors (the interpreter: tests); SAMPLECHAIN_CUDA_TRITON=0 or triton=False turns it off."""
    backend = cuda.CudaBackend(device="cpu")
    assert backend._triton is None and backend.kernel(FUSED_SAMPLE) is None  # CPU tensors: the torch ops
    assert cuda.CudaBackend(device="cpu", triton=False).kernel(FUSED_SAMPLE) is None
    clean_env.setenv(cuda.ENV_TRITON, "0")
    assert cuda.CudaBackend(device="cpu", triton=True).kernel(FUSED_SAMPLE) is None
    assert cuda._triton_kernels(torch.device("cuda"), None) is None
    clean_env.setenv(cuda.ENV_TRITON, "maybe")
    with pytest.raises(BackendError, match=r"SAMPLECHAIN_CUDA_TRITON='maybe': expected 1 .* or 0"):
        cuda.CudaBackend(device="cpu")


def test_asking_for_the_kernels_where_they_cannot_run_says_why(clean_env, monkeypatch):
    import samplechain_cuda_kernels as kernels

    monkeypatch.setattr(kernels, "kernels_unavailable_reason", lambda device=None: "triton is not installed (test)")
    with pytest.raises(BackendError, match=r"CudaBackend\(triton=True\) on cpu: triton is not installed"):
        cuda.CudaBackend(device="cpu", triton=True)


@pytest.mark.skipif(HAS_CUDA, reason="this machine has a CUDA device")
def test_is_unavailable_here_with_a_reason():
    assert cuda.CudaBackend.is_available() is False
    assert "CUDA" in cuda.CudaBackend.unavailable_reason()


def test_reason_names_the_cause(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", None)
    assert "built without CUDA" in cuda.cuda_unavailable_reason()
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    assert "finds no usable CUDA device" in cuda.cuda_unavailable_reason()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert cuda.cuda_unavailable_reason() == ""


@pytest.mark.skipif(HAS_CUDA, reason="this machine has a CUDA device")
def test_a_chain_that_names_cuda_fails_clearly_instead_of_falling_back(clean_env):
    host = PluginHost(use_env=False)
    assert host.get("backend", "cuda") is cuda.CudaBackend
    with pytest.raises(BackendError, match=r"backend 'cuda' is installed but cannot run here: .*built without CUDA"):
        Chain.load({**CHAIN, "backend": "cuda"}, host=host)


# ---------------------------------------------------------------- with a GPU


def gpu_test(fn):
    """Marked `gpu`, skipped without a CUDA device, and run without the caller's plugin / FlashInfer variables."""
    fn = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")(fn)
    return pytest.mark.usefixtures("clean_env")(pytest.mark.gpu(fn))


@pytest.mark.parametrize("k", [1, 16, 40, 1000])
@gpu_test
def test_gpu_topk_and_sort_equal_the_reference(k):
    backend = cuda.CudaBackend()
    x = _logits()
    values, index = backend.topk(x.cuda(), k)
    assert torch.equal(values.cpu(), REF.topk(x, k)[0])
    assert torch.equal(x.gather(1, index.cpu()), values.cpu())
    values, index = backend.sort_desc(x.cuda())
    ref_values, ref_index = REF.sort_desc(x)
    assert torch.equal(values.cpu(), ref_values) and torch.equal(index.cpu(), ref_index)


@gpu_test
def test_gpu_noise_equals_the_reference():
    backend = cuda.CudaBackend()
    seeds, positions, ids = _noise_args(64, 4096)
    on_gpu = [t.cuda() for t in (seeds, positions, ids)]
    for stream in (0, 7):
        assert torch.equal(backend.uniform(*on_gpu, stream).cpu(), REF.uniform(seeds, positions, ids, stream))
        # CUDA's float64 log and the CPU's may round to neighbouring doubles: allclose at a few ulp
        torch.testing.assert_close(
            backend.gumbel(*on_gpu, stream).cpu(), REF.gumbel(seeds, positions, ids, stream), rtol=0, atol=3e-14
        )


@gpu_test
def test_gpu_seeded_chain_draws_the_cpu_backends_tokens():
    logits = torch.randn(8, 32000, generator=torch.Generator().manual_seed(9)) * 4
    ids = [f"r{i}" for i in range(8)]
    chains, stores = [], []
    for name, device in (("cuda", "cuda"), ("cpu", "cpu")):
        chain = Chain.load({**CHAIN, "backend": name})
        store = chain.new_store(device=device)
        for i, rid in enumerate(ids):
            store.add(rid, {"seed": 100 + i, "top_k": 0 if i % 3 == 0 else 40})
        chains.append(chain)
        stores.append(store)
    for _ in range(4):  # consecutive positions of the same requests
        on_gpu = chains[0].sample(logits.cuda(), stores[0], ids).token_ids
        on_cpu = chains[1].sample(logits, stores[1], ids).token_ids
        assert torch.equal(on_gpu.cpu(), on_cpu)


@gpu_test
def test_gpu_primitives_do_not_synchronise():
    backend = cuda.CudaBackend()
    x = _logits().cuda()
    seeds, positions, ids = (t.cuda() for t in _noise_args(16, 2048))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any synchronising call raises
    try:
        backend.topk(x, 40)
        backend.sort_desc(x)
        backend.gumbel(seeds, positions, ids, 0)
        backend.uniform(seeds, positions, ids, 0)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@gpu_test
def test_gpu_primitives_replay_in_a_cuda_graph():
    backend = cuda.CudaBackend()
    logits = _logits(batch=8, vocab=32000).cuda()
    seeds, positions, ids = (t.cuda() for t in _noise_args(8, 64))

    def step():
        values, index = backend.topk(logits, 64)
        sorted_values, perm = backend.sort_desc(values)
        noise = backend.gumbel(seeds, positions, index, 0)
        u = backend.uniform(seeds, positions, index, 1)
        return index.gather(1, (sorted_values.double() + noise.gather(1, perm)).argmax(dim=-1, keepdim=True)), u

    side = torch.cuda.Stream()  # warm-up on a side stream, as torch.cuda.graph requires
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = step()
    for trial in range(3):  # new inputs in the captured buffers, then replay
        logits.copy_(_logits(batch=8, vocab=32000, seed=trial + 1).cuda())
        positions.add_(1)
        graph.replay()
        eager = step()
        assert torch.equal(static_out[0], eager[0]) and torch.equal(static_out[1], eager[1])
