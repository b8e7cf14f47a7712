"""The mps backend's logic, run on the CPU (no Mac in CI): its primitives equal the cpu reference's, the declared
CPU-fallback table warns once per op, and where MPS is missing the backend says why and a chain that names it fails
with a BackendError instead of falling back."""

from __future__ import annotations

import warnings

import pytest
import torch

import samplechain_cpu
import samplechain_mps as mps
from samplechain import BackendError, Chain, PluginHost
from samplechain.tools.testing import hard_logits, host_with

REF = samplechain_cpu.CpuBackend()
PRIMITIVES = ("topk", "sort_desc", "gumbel", "uniform")


@pytest.fixture
def clean_env(monkeypatch):
    """No plugin-selection variables leak in from the caller's shell."""
    for var in ("SAMPLECHAIN_PLUGINS", "SAMPLECHAIN_BLOCK_PLUGINS", "SAMPLECHAIN_REGISTRY"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def backend(monkeypatch):
    monkeypatch.setattr(mps, "_warned", set())  # each test sees the first call of the process
    return mps.MpsBackend(device="cpu")


_logits = hard_logits


def _noise_args(batch: int = 5, width: int = 300):
    seed = torch.tensor([0, 1, 42, 2**63 - 1, 2**40 + 7])[:batch]
    position = torch.tensor([0, 3, 2**33, 17, 1])[:batch]
    ids = torch.randint(0, 151936, (batch, width), generator=torch.Generator().manual_seed(3))
    return seed, position, ids


@pytest.mark.parametrize("k", [1, 16, 17, 40, 1000])
def test_topk_values_equal_the_reference(backend, k):
    x = _logits()
    values, index = backend.topk(x, k)
    ref_values, _ = REF.topk(x, k)
    assert torch.equal(values, ref_values)
    assert torch.equal(x.gather(1, index), values)
    assert (index.sort(dim=1).values.diff(dim=1) > 0).all(), "positions repeat"


def test_sort_desc_equals_the_reference_bitwise(backend):
    x = _logits(vocab=4096)
    values, index = backend.sort_desc(x)
    ref_values, ref_index = REF.sort_desc(x)
    assert torch.equal(values, ref_values) and torch.equal(index, ref_index)


def test_sort_desc_reads_strided_inputs_by_their_strides(backend):
    x = _logits(batch=64, vocab=512).t().contiguous().t()[:5]  # a non-contiguous view
    assert not x.is_contiguous()
    values, index = backend.sort_desc(x)
    ref_values, ref_index = REF.sort_desc(x.contiguous())
    assert torch.equal(values, ref_values) and torch.equal(index, ref_index)


@pytest.mark.filterwarnings("ignore::samplechain_mps.MpsFallbackWarning")
@pytest.mark.parametrize("stream", [0, 3])
def test_noise_equals_the_reference_bitwise(backend, stream):
    seed, position, ids = _noise_args()
    gumbel = backend.gumbel(seed, position, ids, stream)
    uniform = backend.uniform(seed, position, ids, stream)
    assert gumbel.dtype == uniform.dtype == torch.float64
    assert torch.equal(gumbel, REF.gumbel(seed, position, ids, stream))
    assert torch.equal(uniform, REF.uniform(seed, position, ids, stream))


def test_the_fallback_table_names_primitives_with_reasons():
    assert set(mps.CPU_FALLBACKS) == {"gumbel", "uniform"}
    for op, entry in mps.CPU_FALLBACKS.items():
        assert op in PRIMITIVES and "float64" in entry.reason
        assert entry.keep_on_cpu  # float64 cannot live on MPS


def test_each_fallback_op_warns_once_per_process_naming_op_and_reason(backend):
    seed, position, ids = _noise_args()
    with pytest.warns(mps.MpsFallbackWarning) as first:
        backend.gumbel(seed, position, ids, 0)
        backend.uniform(seed, position, ids, 0)
    messages = [str(w.message) for w in first]
    assert len(messages) == 2
    assert "'gumbel'" in messages[0] and "'uniform'" in messages[1]
    assert all("MPS has no float64" in m for m in messages)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        backend.gumbel(seed, position, ids, 1)  # a second call, another stream, another instance: silent
        mps.MpsBackend(device="cpu").uniform(seed, position, ids, 0)


def test_primitives_outside_the_table_never_warn(backend):
    x = _logits(vocab=2048)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        backend.topk(x, 40)
        backend.sort_desc(x)
        backend.isin(torch.arange(10), torch.tensor([3, 7]))


def test_an_undeclared_op_cannot_fall_back(backend):
    with pytest.raises(KeyError):
        backend._fallback("topk", torch.topk, torch.zeros(1, 3), 1)


def test_isin_equals_torch_isin(backend):
    g = torch.Generator().manual_seed(5)
    elements = torch.randint(0, 1000, (4, 300), generator=g)
    tests = torch.randint(0, 1000, (37,), generator=g)
    assert torch.equal(backend.isin(elements, tests), torch.isin(elements, tests))
    assert torch.equal(backend.isin(elements, tests.reshape(37, 1)), torch.isin(elements, tests))
    assert not backend.isin(elements, torch.tensor([], dtype=torch.int64)).any()


class MpsLogicOnCpu(mps.MpsBackend):
    """The mps backend's code registered for CPU logits, so a whole chain runs through it here."""

    name = "mps_logic_on_cpu"
    device_type = "cpu"

    def __init__(self) -> None:
        super().__init__(device="cpu")

    @classmethod
    def is_available(cls) -> bool:
        return True


CHAIN = {
    "samplers": [
        {"use": "top_k", "k": 40},
        {"use": "top_p", "p": 0.9},
        {"use": "min_p", "p": 0.02},
        {"use": "temperature", "t": 0.7},
        {"use": "dist", "seed": 1234},
    ]
}


def test_a_seeded_chain_draws_the_cpu_backends_tokens(monkeypatch):
    monkeypatch.setattr(mps, "_warned", {"gumbel", "uniform"})
    logits = torch.randn(8, 32000, generator=torch.Generator().manual_seed(9)) * 4
    host = host_with(backend=MpsLogicOnCpu)
    chains = [Chain.load({**CHAIN, "backend": name}, host=host) for name in ("mps_logic_on_cpu", "cpu")]
    stores = [c.new_store() for c in chains]
    ids = [f"r{i}" for i in range(8)]
    for store in stores:
        for i, rid in enumerate(ids):
            store.add(rid, {"seed": 100 + i, "top_k": 0 if i % 3 == 0 else 40})
    for _ in range(4):  # consecutive positions: the store advances each request's RNG counter
        ours, ref = (c.sample(logits, s, ids, return_scores=True) for c, s in zip(chains, stores))
        assert torch.equal(ours.token_ids, ref.token_ids)
        assert torch.equal(ours.scores, ref.scores)


def test_is_unavailable_here_with_a_reason():
    if torch.backends.mps.is_available():
        pytest.skip("this machine has an MPS device")
    assert mps.MpsBackend.is_available() is False
    reason = mps.MpsBackend.unavailable_reason()
    assert reason and ("macOS" in reason or "MPS" in reason)


def test_reason_names_the_cause(monkeypatch):
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    monkeypatch.setattr(mps.sys, "platform", "linux")
    assert "MPS needs macOS" in mps.mps_unavailable_reason()
    monkeypatch.setattr(mps.sys, "platform", "darwin")
    monkeypatch.setattr(torch.backends.mps, "is_built", lambda: False)
    assert "built without MPS" in mps.mps_unavailable_reason()
    monkeypatch.setattr(torch.backends.mps, "is_built", lambda: True)
    monkeypatch.setattr(mps.platform, "mac_ver", lambda: ("12.1", ("", "", ""), "arm64"))
    assert "macOS 12.1 is older than 12.3" in mps.mps_unavailable_reason()
    monkeypatch.setattr(mps.platform, "mac_ver", lambda: ("14.5", ("", "", ""), "arm64"))
    assert "no MPS device" in mps.mps_unavailable_reason()
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert mps.mps_unavailable_reason() == ""


def test_a_chain_that_names_mps_fails_clearly_instead_of_falling_back(clean_env):
    if torch.backends.mps.is_available():
        pytest.skip("this machine has an MPS device")
    host = PluginHost(use_env=False)
    assert host.get("backend", "mps") is mps.MpsBackend
    with pytest.raises(BackendError, match=r"backend 'mps' is installed but cannot run here: .*--backend"):
        Chain.load({**CHAIN, "backend": "mps"}, host=host)
    chain = Chain.load(CHAIN, host=host, backend="cpu")  # the override the message points to
    assert chain.sample(torch.randn(2, 100)).token_ids.shape == (2,)


def test_auto_never_picks_mps_for_cpu_logits(clean_env):
    host = PluginHost(use_env=False)
    chain = Chain.load(CHAIN, host=host)
    chain.sample(torch.randn(2, 100))
    assert type(chain._backends["cpu"]).__name__ == "CpuBackend"
