"""logit_bias.v1 against transformers' SequenceBiasLogitsProcessor with one-token sequences (the same logits,
allclose 1e-6; -inf exactly), as a table or pairs; duplicate ids add (llama.cpp); empty = bitwise no-op.

The reference takes its documented list form `[[[token], bias], ...]` from transformers 5.18 on; 4.45-5.17 refuse
token id 0 in that form (`token_id > 0`), so there it gets the dict form `{(token,): bias}`, which every version
accepts with id 0 (docs/semantics.md, "transformers versions")."""

from __future__ import annotations

import pytest
import torch
import transformers
from packaging.version import Version
from transformers.generation.logits_process import SequenceBiasLogitsProcessor

from samplechain import Chain, ConfigError, SamplingError

NEG = float("-inf")
LIST_FORM_TAKES_ID_0 = Version(transformers.__version__).release >= (5, 18)


def run(bias, logits, before=()):
    c = Chain.load({"samplers": [*before, {"use": "logit_bias", "bias": bias}, {"use": "greedy"}]})
    return c.sample(logits, return_scores=True).scores


def logits_for(seed, B=4, V=1000):
    return torch.randn(B, V, generator=torch.Generator().manual_seed(seed)) * 2


@pytest.mark.parametrize("seed", range(3))
def test_matches_transformers_sequence_bias_of_single_tokens(seed):
    logits = logits_for(seed)
    pairs = [[5, 3.5], [17, -2.0], [999, NEG], [0, 100.0], [512, -100.0]]
    sequence_bias = [[[t], b] for t, b in pairs] if LIST_FORM_TAKES_ID_0 else {(t,): b for t, b in pairs}
    ref = SequenceBiasLogitsProcessor(sequence_bias)(torch.zeros(4, 3, dtype=torch.long), logits.clone())
    for form in (pairs, {str(t): b for t, b in pairs}):
        ours = run(form, logits)
        assert torch.equal(torch.isinf(ours), torch.isinf(ref))
        torch.testing.assert_close(ours, ref, rtol=1e-6, atol=1e-6)


def test_duplicate_ids_add_as_llama_cpp():
    logits = logits_for(1)
    ours = run([[7, 1.0], [7, 2.5]], logits)
    want = logits.clone()
    want[:, 7] += 3.5
    assert torch.equal(ours, want)


def test_on_compacted_candidates_after_top_k():
    logits = logits_for(2)
    top = logits.topk(20, dim=-1).indices
    tok = int(top[0, 3])
    ours = run([[tok, -50.0]], logits, before=[{"use": "top_k", "k": 20}])
    want = torch.full_like(logits, NEG).scatter_(1, top, logits.gather(1, top))
    want[0, tok] -= 50.0
    if bool((top[1:] == tok).any()):
        want[1:, tok] -= 50.0 * (top[1:] == tok).any(dim=1).float()
    assert torch.equal(ours, want)


def test_empty_bias_is_a_bitwise_no_op():
    logits = logits_for(3)
    assert torch.equal(run({}, logits), logits)
    assert torch.equal(run([], logits), logits)


@pytest.mark.parametrize("bad", ([[1, float("inf")]], [[-3, 1.0]], [[1]], {"x": 1.0}, "5=1.0"))
def test_malformed_bias_is_a_configuration_error(bad):
    with pytest.raises(ConfigError, match="bias"):
        run(bad, logits_for(0))


def test_id_outside_the_vocabulary_is_named():
    with pytest.raises(SamplingError, match=r"\[5000\].*size 1000"):
        run([[5000, 1.0]], logits_for(0))
