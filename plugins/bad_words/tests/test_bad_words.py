"""bad_words.v1 against transformers' NoBadWordsLogitsProcessor: the same -inf mask exactly and the other logits
bitwise, on random logits and histories that end in the banned prefixes; eos-only sequences dropped."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import NoBadWordsLogitsProcessor

from samplechain import Chain, ConfigError
from samplechain.tools.testing import top_k_only

BAD = [[7], [3, 9], [1, 2, 9], [4, 4, 4, 11], [5, 12], [6, 12], [8, 13], [0]]


def run(logits, history, before=(), **params):
    c = Chain.load({"samplers": [*before, {"use": "bad_words", **params}, {"use": "greedy"}]})
    return c.sample(logits, history=history, return_scores=True).scores


def case(seed, B=8, V=200, L=12):
    g = torch.Generator().manual_seed(seed)
    logits, history = torch.randn(B, V, generator=g), torch.randint(0, 16, (B, L), generator=g)
    for b, t in enumerate([[3], [1, 2], [4, 4, 4], [5], [6], [8], [2, 3], [4, 4]][:B]):
        history[b, L - len(t) :] = torch.tensor(t)
    return logits, history


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("eos", (None, 0))
def test_matches_transformers(seed, eos):
    logits, history = case(seed)
    ref = NoBadWordsLogitsProcessor(BAD, eos_token_id=eos)(history, logits.clone())
    ours = run(logits, history, ids=BAD, eos_ids=[] if eos is None else [eos])
    assert torch.equal(ours, ref)


def test_after_top_k():
    logits, history = case(1)
    logits[:, [7, 9, 11, 12, 13]] += 10.0
    ref = NoBadWordsLogitsProcessor(BAD)(history, logits.clone())
    want = top_k_only(ref, 30, by=logits)
    assert torch.equal(run(logits, history, before=[{"use": "top_k", "k": 30}], ids=BAD), want)


def test_empty_is_a_no_op():
    logits, history = case(2)
    assert torch.equal(run(logits, history), logits)


@pytest.mark.parametrize("bad", ([[]], [[1, -1]], [1, 2], "abc"))
def test_malformed_ids_are_configuration_errors(bad):
    with pytest.raises(ConfigError, match="ids"):
        Chain.load({"samplers": [{"use": "bad_words", "ids": bad}, {"use": "greedy"}]})


def test_words_are_tokenised_as_vllm_does_and_banned():
    from pathlib import Path

    from transformers import AutoTokenizer
    from transformers.generation.logits_process import NoBadWordsLogitsProcessor

    import samplechain
    from samplechain import SamplingError

    tok = AutoTokenizer.from_pretrained(Path(samplechain.__file__).parent / "models" / "docs-gpt2")
    words = ["list", " dictionary", "foo bar"]
    c = Chain.load({"samplers": [{"use": "bad_words", "words": words}, {"use": "greedy"}]})
    with pytest.raises(SamplingError, match="chain.prepare"):
        c.sample(torch.zeros(1, len(tok)), history=torch.zeros(1, 2, dtype=torch.long))
    c.prepare(tokenizer=tok)
    # vLLM's rule, written out: the bare word, plus the spaced form when it is a distinct word-start of equal length
    expected = []
    for w in words:
        bare = tok.encode(w.lstrip(), add_special_tokens=False)
        spaced = tok.encode(" " + w.lstrip(), add_special_tokens=False)
        expected.append(bare)
        if spaced[0] != bare[0] and len(spaced) == len(bare):
            expected.append(spaced)
    assert any(len(e) == 1 for e in expected) and any(len(e) > 1 for e in expected)
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, len(tok), generator=g)
    history = torch.tensor([tok.encode("x foo"), tok.encode("a b"), tok.encode("foo x")])
    ours = c.sample(logits.clone(), history=history, return_scores=True).scores
    ref = NoBadWordsLogitsProcessor(expected, eos_token_id=None)(history, logits.clone())
    assert torch.equal(torch.isinf(ours), torch.isinf(ref))
