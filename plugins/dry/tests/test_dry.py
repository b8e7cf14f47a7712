"""dry.v1 against llama.cpp's DRY sampler.

1. Expected probabilities of tests/test-sampling.cpp `test_dry` (commit 07e4038f): logits = logf(p), the sampler
   accepts `last_tokens`, then dist's softmax; |p - expected| < 1e-5 in token-id order (DRY does not sort).
2. A plain-Python transcription of `llama_sampler_dry_apply` (src/llama-sampling.cpp: breaker scan, Z-algorithm,
   max repeat per token, capped exponent), on random repetitive histories with single- and multi-token breakers:
   the same logits (allclose 1e-6) and the same set of penalised tokens.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import samplechain
from samplechain import Chain, ChainWarning, ConfigError, SamplingError, strings
from samplechain.tools.testing import (
    assert_bitwise_no_op,
    assert_rows_equal_alone,
    processed_scores,
    sampler_chain,
    top_k_only,
)

TOL = 1e-5


def chain(**params):
    """A DRY chain; without string breakers unless given (the default, llama.cpp's four, warns without a tokenizer)."""
    params.setdefault("breakers", [])
    return sampler_chain({"use": "dry", **params})


def run(c, logits, history, per_row=None):
    return processed_scores(c, logits, per_row, history=history)


# (probs, last_tokens, expected, multiplier, base, allowed_length, penalty_last_n, breakers) -- verbatim
LLAMA_CPP = [
    ([0.25] * 4, [0, 1], [0.25, 0.25, 0.25, 0.25], 1.0, 1.1, 2, 4, []),
    ([0.25] * 4, [0, 1, 2, 0, 1], [0.296923, 0.296923, 0.109232, 0.296923], 1.0, 1.1, 2, 5, []),
    ([0.2] * 5, [0, 1, 3, 4, 0, 1], [0.2] * 5, 1.0, 1.1, 2, 6, [[3]]),
    ([0.2] * 5, [0, 1, 2, 0, 1], [0.241818, 0.241818, 0.032727, 0.241818, 0.241818], 2.0, 1.1, 2, 5, []),
    ([0.2] * 5, [0, 1, 2, 3, 4, 0, 1], [0.2] * 5, 1.0, 1.1, 4, 7, []),
]


@pytest.mark.parametrize(("probs", "last", "expected", "mult", "base", "allowed", "last_n", "brk"), LLAMA_CPP)
def test_llama_cpp_expected_probabilities(probs, last, expected, mult, base, allowed, last_n, brk):
    logits = torch.log(torch.tensor([probs], dtype=torch.float32))
    c = chain(multiplier=mult, base=base, allowed_length=allowed, penalty_last_n=last_n, breaker_ids=brk)
    got = torch.softmax(run(c, logits, torch.tensor([last]))[0], dim=-1)
    assert (got - torch.tensor(expected)).abs().max() < TOL


def llama_cpp_dry(logits, tokens, mult, base, allowed, last_n, breakers):
    """llama_sampler_dry_apply for one row, transcribed (tokens: the accepted tokens, oldest first)."""
    out = logits.clone()
    if mult == 0.0 or base < 1.0 or last_n == 0:
        return out
    n_last = len(tokens) if last_n < 0 else min(len(tokens), last_n)
    if n_last <= allowed:
        return out
    rat = lambda i: tokens[len(tokens) - 1 - i]  # noqa: E731 - ring_buffer::rat
    processed = {}
    for seq in breakers:
        processed.setdefault(seq[0], []).append(list(seq[1:]))
    rep_limit = n_last
    for i in range(n_last):
        longest = -1
        for tail in processed.get(rat(i), []):
            if len(tail) > longest and len(tail) <= i and all(tail[o] == rat(i - o - 1) for o in range(len(tail))):
                longest = len(tail)
        if longest >= 0:
            rep_limit = i - longest
            break
    if rep_limit < allowed:
        return out
    count = [0] * n_last
    last, rt, lt = n_last - 1, 0, 0
    for k in range(1, n_last):  # the Z-algorithm, as llama.cpp writes it
        if k > rt:
            n = 0
            while n + k < n_last and rat(n) == rat(n + k):
                n += 1
            count[last - k] = min(n, rep_limit)
            if n > 0:
                lt, rt = k, k + n - 1
        else:
            p = k - lt
            right = rt - k + 1
            if count[last - p] < right:
                count[last - k] = min(count[last - p], rep_limit)
            else:
                i = rt + 1
                while i < n_last and rat(i) == rat(i - k):
                    i += 1
                count[last - k] = min(i - k, rep_limit)
                lt, rt = k, i - 1
    best = {}
    for i in range(n_last - 1):
        if count[i] >= allowed:
            tok = rat(n_last - 2 - i)
            best[tok] = max(best.get(tok, -1), count[i])
    max_exp = int(np.float32(88.7228391) / np.float32(math.log(np.float32(base)))) if base > 1.000001 else 0
    for tok, length in best.items():
        if tok in processed and any(len(t) == 0 for t in processed[tok]):
            continue
        e = length - allowed
        if max_exp > 0 and e > max_exp:
            e = max_exp
        out[tok] = out[tok] - np.float32(mult * math.pow(base, e))
    return out


def random_history(g, L, span):
    base = torch.randint(0, span, (L // 3,), generator=g).tolist()
    seq = []
    while len(seq) < L:  # copies of random chunks: long repeats as well as short ones
        a = int(torch.randint(0, len(base), (1,), generator=g))
        b = int(torch.randint(a, len(base) + 1, (1,), generator=g))
        seq += base[a:b] + [int(torch.randint(0, span, (1,), generator=g))]
    return seq[:L]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(
    ("mult", "base", "allowed", "last_n"), [(0.8, 1.75, 2, -1), (1.0, 1.1, 3, 40), (2.0, 3.0, 1, 25), (0.5, 1.0, 2, -1)]
)
@pytest.mark.parametrize("breakers", ([], [[5]], [[5], [7, 8], [2, 3, 4]], [[7, 8], [8]]))
def test_matches_llama_cpp_transcription(seed, mult, base, allowed, last_n, breakers):
    g = torch.Generator().manual_seed(seed)
    B, V, L = 4, 30, 60
    logits = torch.randn(B, V, generator=g) * 2
    history = torch.tensor([random_history(g, L, 10) for _ in range(B)])
    history[1, :13] = -1  # left padding
    c = chain(multiplier=mult, base=base, allowed_length=allowed, penalty_last_n=last_n, breaker_ids=breakers)
    ours = run(c, logits, history)
    for b in range(B):
        toks = [t for t in history[b].tolist() if t >= 0]
        ref = llama_cpp_dry(logits[b], toks, mult, base, allowed, last_n, [tuple(x) for x in breakers])
        assert torch.equal(ours[b] != logits[b], ref != logits[b]), f"row {b}: penalised tokens differ"
        torch.testing.assert_close(ours[b], ref, rtol=1e-6, atol=1e-6)


def test_exponent_is_capped_against_overflow():
    history = torch.tensor([[1, 2] * 200])
    logits = torch.zeros(1, 4)
    ours = run(chain(multiplier=1.0, base=3.0, allowed_length=1, penalty_last_n=-1), logits, history)
    ref = llama_cpp_dry(logits[0], history[0].tolist(), 1.0, 3.0, 1, -1, [])
    assert bool(torch.isfinite(ours).all())
    torch.testing.assert_close(ours[0], ref)


def test_per_row_parameters_equal_rows_alone_and_disabled_rows_pass_unchanged():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(5, 30, generator=g)
    history = torch.tensor([random_history(g, 50, 8) for _ in range(5)])
    rows = [
        {"dry_multiplier": 0.0},
        {"dry_multiplier": 0.8},
        {"dry_multiplier": 1.0, "dry_penalty_last_n": 10},
        {"dry_multiplier": 1.5, "dry_allowed_length": 4, "dry_base": 1.3},
        {"dry_multiplier": 1.0, "dry_penalty_last_n": 0},
    ]
    c = chain(breaker_ids=[[3]])
    batch = assert_rows_equal_alone(c, logits, rows, history=history)
    assert torch.equal(batch[0], logits[0]) and torch.equal(batch[4], logits[4])
    assert_bitwise_no_op(chain(), logits, history=history)  # multiplier defaults to 0


def test_after_top_k_penalises_the_same_candidates():
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(3, 30, generator=g)
    history = torch.tensor([random_history(g, 50, 8) for _ in range(3)])
    full = run(chain(multiplier=1.0), logits, history)
    c = Chain.load(
        {"samplers": [{"use": "top_k", "k": 12}, {"use": "dry", "multiplier": 1.0, "breakers": []}, {"use": "greedy"}]}
    )
    want = top_k_only(full, 12, by=logits)
    assert torch.equal(run(c, logits, history), want)


TOKENIZER = Path(samplechain.__file__).parent / "models" / "docs-gpt2"


def test_string_breakers_resolve_through_the_tokenizer_as_llama_cpp():
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(TOKENIZER)
    c = chain(multiplier=1.0, breakers=["\n", "a:b"])
    with pytest.raises(SamplingError, match="need a tokenizer"):
        run(c, torch.zeros(1, len(tok)), torch.zeros(1, 5, dtype=torch.long))
    dry = c.samplers[0]
    c.prepare(tokenizer=tok)
    newline = {i for i in range(len(tok)) if "\n" in tok.decode([i])}
    assert newline and newline <= set(dry._single.tolist())
    for seq in (s for n, v in dry._multi.items() for s in v.tolist()):  # "a:b" split across tokens: head + tail
        head = tok.decode([seq[0]])
        assert any(("a:b".startswith(head[j:]) and head[j:]) for j in range(len(head)))
        assert tok.decode(seq).endswith("a:b") or "a:b" in tok.decode(seq)
    # a newline inside the repeated part cuts it: without breakers " d" would be penalised (it follows the
    # earlier " a b\n c"); with "\n" a breaker, only " c" lies after the newline, shorter than allowed_length 2
    history = torch.tensor([tok.encode(" a b\n c d a b\n c")])
    logits = torch.zeros(1, len(tok))
    d = tok.encode(" d")[0]
    plain = run(chain(multiplier=1.0), logits, history)
    assert plain[0, d] < 0
    assert torch.equal(run(c, logits, history), logits)


def test_default_breakers_are_llama_cpp_s_and_resolve_in_prepare():
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(TOKENIZER)
    c = sampler_chain({"use": "dry", "multiplier": 0.8})
    assert c.samplers[0].params.breakers == ("\n", ":", '"', "*")
    c.prepare(tokenizer=tok)
    single = set(c.samplers[0]._single.tolist())
    for text in ("\n", ":", '"', "*"):
        assert {i for i in range(len(tok)) if text in tok.decode([i])} <= single
    # the quotes break the repeat: only 'a' follows the last '"', shorter than allowed_length 2
    history = torch.tensor([tok.encode('x "a" b "a" b "a')])
    logits = torch.zeros(1, len(tok))
    assert torch.equal(run(c, logits, history), logits)
    assert (run(chain(multiplier=0.8), logits, history) < 0).any()


def test_default_breakers_without_a_tokenizer_are_off_with_a_warning():
    """The defaults cannot be resolved without a tokenizer: DRY runs without them and says so once; `breakers =
    []` runs the same silently. The presets restate the defaults and behave the same."""
    history = torch.tensor([[1, 2, 3, 1, 2, 3, 1, 2]])
    logits = torch.zeros(1, 8)
    c = sampler_chain({"use": "dry", "multiplier": 0.8})
    with pytest.warns(ChainWarning, match="default sequence breakers are off"):
        out = run(c, logits, history)
    assert torch.equal(out, run(chain(multiplier=0.8), logits, history))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run(c, logits, history)  # once per sampler
        explicit = sampler_chain({"use": "dry", "multiplier": 0.8, "breakers": ["\n", ":", '"', "*"]})
    with pytest.warns(ChainWarning):
        assert torch.equal(run(explicit, logits, history), out)


def test_other_string_breakers_without_a_tokenizer_are_an_error():
    c = chain(multiplier=0.8, breakers=["\n"])
    with pytest.raises(SamplingError, match=r"breakers \['\\n'\] need a tokenizer.*breaker_ids"):
        run(c, torch.zeros(1, 8), torch.tensor([[1, 2, 1, 2]]))
    assert torch.equal(
        run(chain(multiplier=0.0, breakers=["\n"]), torch.zeros(1, 8), torch.tensor([[1, 2]])), torch.zeros(1, 8)
    )  # a DRY that is off never needs them


def test_string_breakers_are_the_string_services_overlapping_sequences():
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(TOKENIZER)
    c = chain(multiplier=1.0, breakers=["\n", "a:b"])
    c.prepare(tokenizer=tok)
    dry = c.samplers[0]
    want = {s for text in ("\n", "a:b") for s in strings.overlapping_sequences(tok, text, max_tail=20)}
    got = {(i,) for i in dry._single.tolist()} | {tuple(s) for v in dry._multi.values() for s in v.tolist()}
    assert got == want


def test_bad_values_are_configuration_errors():
    with pytest.raises(ConfigError, match="base"):
        chain(base=0.5)
    with pytest.raises(ConfigError, match="breaker_ids"):
        chain(breaker_ids=[[]])
