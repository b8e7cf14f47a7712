"""softcap.v1: cap * tanh(logits / cap), per row, masked candidates kept masked, argmax unchanged.

These tests need only the core (`samplechain`) and this package: `samplechain.tools.testing` registers the sampler
in-process with a test backend and a test selector, so no other plugin has to be installed.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import samplechain
from samplechain import Chain, ConfigError, RequestError
from samplechain.tools.testing import host_with, run_chain
from samplechain_example_softcap import Softcap

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

PACKAGE_ROOT = Path(__file__).resolve().parents[1]
B = 8
VOCABS = (50, 1000, 32000)


def logits_for(seed: int, vocab: int, scale: float = 8.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, vocab, generator=g) * scale


def softcap(cap: float, logits: torch.Tensor, params=None):
    config = {"samplers": [{"use": "softcap", "cap": cap}, {"use": "test_argmax"}]}
    return run_chain([Softcap], config, logits, params)


def formula(logits: torch.Tensor, cap) -> torch.Tensor:
    return cap * torch.tanh(logits / cap)


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("cap", (0.5, 5.0, 30.0))
def test_scores_are_cap_times_tanh_of_logits_over_cap(cap, vocab):
    logits = logits_for(0, vocab)
    scores = softcap(cap, logits).scores
    assert torch.equal(scores, formula(logits, cap))  # bitwise: the same three float32 operations
    assert scores.abs().max() <= cap


def test_small_logits_pass_almost_unchanged_and_large_ones_saturate():
    logits = torch.tensor([[0.01, -0.02, 0.0, 1000.0, -1000.0]])
    scores = softcap(30.0, logits).scores[0]
    torch.testing.assert_close(scores[:3], logits[0, :3], rtol=1e-6, atol=0.0)
    assert scores[3:].tolist() == [30.0, -30.0]


def test_the_callers_logits_are_not_modified():
    logits = logits_for(1, 1000)
    original = logits.clone()
    softcap(5.0, logits)
    assert torch.equal(logits, original)


def test_half_precision_input_is_capped_in_float32():
    """The chain copies bf16 logits into a float32 buffer it owns: the in-place path gives the same numbers."""
    logits = logits_for(2, 1000).to(torch.bfloat16)
    scores = softcap(5.0, logits).scores
    assert scores.dtype == torch.float32
    assert torch.equal(scores, formula(logits.float(), 5.0))


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=("read-only", "writable"))
def test_masked_candidates_stay_masked(dtype):
    logits = logits_for(3, 100)
    logits[:, ::3] = float("-inf")
    logits = logits.to(dtype)
    scores = softcap(2.0, logits).scores
    masked = torch.isneginf(logits)
    assert torch.equal(torch.isneginf(scores), masked)
    assert torch.equal(scores[~masked], formula(logits.float(), 2.0)[~masked])


def test_plus_inf_follows_the_formula():
    logits = torch.tensor([[1.0, float("inf"), 2.0]])
    out = softcap(4.0, logits)
    assert out.scores[0, 1] == 4.0
    assert out.token_ids.tolist() == [1]


@pytest.mark.parametrize("cap", (0.5, 5.0, 30.0))
@pytest.mark.parametrize("seed", (4, 5, 6))
def test_argmax_is_unchanged(seed, cap):
    """tanh is strictly increasing. (Far beyond the cap, |logit| > ~9 cap, float32 tanh rounds to exactly +-1 and
    distinct logits tie at cap; logits here reach ~4 cap, as real ones do with Gemma 2's cap of 30.)"""
    logits = logits_for(seed, 32000, scale=cap)
    assert torch.equal(softcap(cap, logits).token_ids, logits.argmax(dim=-1))


def test_declares_itself_argmax_invariant_transform():
    chain = Chain.load(
        {"samplers": [{"use": "softcap", "cap": 5.0}, {"use": "test_argmax"}]},
        host=host_with(Softcap),
        backend="recording",
    )
    step = chain.describe()[0]
    assert step["name"] == "softcap.v1"
    assert step["stage"] == "transform"
    assert step["argmax_invariant"] is True
    assert step["stateful"] is False


@pytest.mark.parametrize("vocab", VOCABS)
def test_per_row_caps_equal_the_formula_and_each_row_alone(vocab):
    """A heterogeneous batch (each request its own `softcap`) takes the vectorised path; every row gets exactly
    what the formula gives it, and what it gets alone (the scalar path)."""
    caps = [0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 5.0, 100.0]
    logits = logits_for(5, vocab)
    batch = softcap(1.0, logits, params=[{"softcap": c} for c in caps]).scores
    for i, cap in enumerate(caps):
        assert torch.equal(batch[i], formula(logits[i], cap)), f"row {i} (cap={cap})"
        alone = softcap(1.0, logits[i : i + 1], params=[{"softcap": cap}]).scores[0]
        assert torch.equal(batch[i], alone), f"row {i} (cap={cap}) differs from the row alone"


def test_per_row_caps_keep_masked_candidates_masked():
    logits = logits_for(6, 200)
    logits[::2, :50] = float("-inf")
    scores = softcap(1.0, logits, params=[{"softcap": c} for c in (0.5, 1, 2, 4, 8, 16, 32, 64)]).scores
    assert torch.equal(torch.isneginf(scores), torch.isneginf(logits))


def test_the_chain_value_is_the_default_for_every_request():
    logits = logits_for(7, 300)
    out = softcap(3.0, logits, params=[{}] * (B - 1) + [{"softcap": 7.0}]).scores
    assert torch.equal(out[:-1], formula(logits[:-1], 3.0))
    assert torch.equal(out[-1], formula(logits[-1], 7.0))


@pytest.mark.parametrize(
    ("cap", "message"),
    [
        (0.0, "samplers[0].cap = 0.0: must be in (0, inf)"),
        (-1.0, "samplers[0].cap = -1.0: must be in (0, inf)"),
        (float("inf"), "samplers[0].cap = inf: must be a finite number"),
        ("30", "samplers[0].cap = '30': expected a number"),
    ],
)
def test_a_bad_cap_is_a_config_error_naming_the_key(cap, message):
    with pytest.raises(ConfigError) as info:
        Chain.load(
            {"samplers": [{"use": "softcap", "cap": cap}, {"use": "test_argmax"}]},
            host=host_with(Softcap),
            backend="recording",
        )
    assert message in str(info.value)


def test_cap_is_required():
    with pytest.raises(ConfigError, match=r"samplers\[0\]\.cap: required key missing"):
        Chain.load(
            {"samplers": [{"use": "softcap"}, {"use": "test_argmax"}]}, host=host_with(Softcap), backend="recording"
        )


def test_a_bad_per_request_cap_is_rejected_when_the_request_joins():
    chain = Chain.load(
        {"samplers": [{"use": "softcap", "cap": 5.0}, {"use": "test_argmax"}]},
        host=host_with(Softcap),
        backend="recording",
    )
    store = chain.new_store()
    with pytest.raises(RequestError, match=r"softcap\.cap = -2\.0: must be in \(0, inf\)"):
        store.add("r", {"softcap": -2.0})


def test_the_declared_entry_point_registers_softcap_v1():
    """pyproject.toml's entry point names this module, and registering it provides softcap.v1 (what
    `pip install` + `samplechain plugins` will show)."""
    project = tomllib.loads((PACKAGE_ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == "samplechain-example-softcap"
    module_name = project["entry-points"]["samplechain"]["example_softcap"]
    module = __import__(module_name)
    host = samplechain.PluginHost(entry_points=[], use_env=False)
    assert host.register_plugin(module, name="example_softcap") == ["softcap.v1"]
    assert host.get("sampler", "softcap") is Softcap
    assert host.get("sampler", "softcap.v1") is Softcap
