"""infill.v1 against llama.cpp's llama_sampler_infill_apply (src/llama-sampling.cpp).

llama.cpp has no test vectors for the infill sampler (tests/test-sampling.cpp does not exercise it), so:
- hand-computed vectors on a tiny real byte-level BPE vocabulary (samplechain.tools.testing.byte_bpe_tokenizer) cover
  each branch: EOG only, prefix merging, the 0.2 cut, the 1 / (n_non_eog + 1) cut, the EOT fallback;
- `llama_infill_reference` below replicates the C++ step by step (an array of {id, logit, p} structs, float32
  arithmetic, the double loop with its break / continue, memcmp on token pieces) and is compared on random rows.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from transformers.convert_slow_tokenizer import bytes_to_unicode

from samplechain import Chain, ConfigError, SamplingError
from samplechain.tools.testing import byte_bpe_tokenizer, processed_scores, sampler_chain

F32 = np.float32
INF = float("inf")


@pytest.fixture(scope="module")
def tok():
    return byte_bpe_tokenizer(300)


@pytest.fixture(scope="module")
def pieces(tok):
    """token_to_piece(id, special=false): raw bytes of each token; special tokens have none."""
    inverse = {c: b for b, c in bytes_to_unicode().items()}
    out = []
    for i, t in enumerate(tok.convert_ids_to_tokens(list(range(len(tok))))):
        out.append(b"" if i in tok.all_special_ids else bytes(inverse[c] for c in t))
    return out


def chain(tok, **params) -> Chain:
    c = sampler_chain({"use": "infill", **params})
    c.prepare(tokenizer=tok)
    return c


def row_with(tok, probs: dict[str, float], vocab: int = 300) -> torch.Tensor:
    """A logits row where only the given tokens (by their token string) are live, with logits log p."""
    row = torch.full((vocab,), -INF)
    for t, p in probs.items():
        row[tok.convert_tokens_to_ids(t)] = math.log(p)
    return row


# --------------------------------------------------------------------------- the C++, step by step
def llama_infill_reference(logits: np.ndarray, pieces: list[bytes], eog: set[int], eot: int, probs_out: bool):
    """Returns {token id: value} of the surviving candidates: their logit (or log p with probs_out)."""
    cur = [{"id": i, "logit": F32(v), "p": F32(0)} for i, v in enumerate(logits) if np.isfinite(v)]
    cur.sort(key=lambda d: -d["logit"])  # llama_sampler_softmax_impl(cur_p, true)
    max_l = cur[0]["logit"]
    cum = F32(0)
    for d in cur:
        d["p"] = F32(np.exp(F32(d["logit"] - max_l)))
        cum = F32(cum + d["p"])
    for d in cur:
        d["p"] = F32(d["p"] / cum)

    p_txt = F32(0)
    p_eog = F32(0)
    for d in cur:
        if d["id"] in eog:
            p_eog = F32(p_eog + d["p"])
        else:
            p_txt = F32(p_txt + d["p"])
    if F32(F32(3) * p_eog) * F32(len(cur)) > p_txt:
        kept = [d for d in cur if d["id"] in eog]
        s = F32(0)
        for d in kept:
            s = F32(s + d["p"])
        return {d["id"]: (math.log(F32(d["p"] / s)) if probs_out else float(d["logit"])) for d in kept}

    for i0 in range(len(cur)):
        for i1 in range(len(cur)):
            if cur[i0]["logit"] == -INF:
                break
            if i0 == i1 or cur[i1]["logit"] == -INF:
                continue
            b0, b1 = pieces[cur[i0]["id"]], pieces[cur[i1]["id"]]
            if len(b0) > 0 and len(b0) <= len(b1) and b1[: len(b0)] == b0:
                dst, src = i0, i1
                if cur[i1]["p"] > cur[i0]["p"]:
                    dst, src = src, dst
                cur[dst]["p"] = F32(cur[dst]["p"] + cur[src]["p"])
                cur[src]["logit"] = -INF
                cur[src]["p"] = F32(0)

    n_non_eog = 0
    p_sum = F32(0)
    kept = []
    for d in cur:
        is_eog = d["id"] in eog
        if d["p"] < F32(0.2) and not is_eog:
            continue
        if not is_eog:
            n_non_eog += 1
        p_sum = F32(p_sum + d["p"])
        kept.append(d)
    if n_non_eog == 0:
        return {eot: 0.0 if probs_out else 1.0}
    for d in kept:
        d["p"] = F32(d["p"] / p_sum)
    thold = 1.0 / (n_non_eog + 1)
    p_sum = F32(0)
    second = []
    for d in kept:
        if float(d["p"]) < thold and d["id"] not in eog:
            continue
        p_sum = F32(p_sum + d["p"])
        second.append(d)
    out = {}
    for d in second:
        d["p"] = F32(d["p"] / p_sum)
        value = math.log(d["p"]) if d["p"] > 0 else -INF
        out[d["id"]] = value if probs_out else float(d["logit"])
    return {k: v for k, v in out.items() if v != -INF}


def survivors(row: torch.Tensor) -> dict[int, float]:
    fin = torch.isfinite(row)
    return {int(i): float(row[i]) for i in fin.nonzero().flatten()}


# --------------------------------------------------------------------------- hand-computed vectors
def test_prefix_merge_then_cuts(tok):
    """' the' .4, ' t' .29, 'he' .2, 'h' .1, eos .01 (n = 5: 3 * .01 * 5 = .15 <= .99: no EOG shortcut).
    ' t' is a prefix of ' the' (less likely): ' the' = .69; 'h' of 'he': 'he' = .3. Cut .2 keeps ' the', 'he',
    eos; n_non_eog = 2, cut 1/3 drops 'he' (.3). Left: ' the' .69/.70 and eos .01/.70."""
    row = row_with(tok, {"Ġthe": 0.4, "Ġt": 0.29, "he": 0.2, "h": 0.1, "<|endoftext|>": 0.01})
    out = processed_scores(chain(tok), row[None])[0]
    the = tok.convert_tokens_to_ids("Ġthe")
    assert survivors(out) == {the: pytest.approx(math.log(0.4)), 0: pytest.approx(math.log(0.01))}
    assert out[the] == row[the] and out[0] == row[0]  # llama.cpp keeps the logits: dist re-softmaxes them
    probs = processed_scores(chain(tok, output="probs"), row[None])[0]
    assert probs[the].exp().item() == pytest.approx(0.69 / 0.70, abs=1e-6)
    assert probs[0].exp().item() == pytest.approx(0.01 / 0.70, abs=1e-6)


def test_merge_goes_into_the_more_likely_token(tok):
    """' t' .6 is more likely than ' the' .4: ' the' merges into ' t' (p = 1), which alone survives."""
    row = row_with(tok, {"Ġthe": 0.4, "Ġt": 0.6})
    t = tok.convert_tokens_to_ids("Ġt")
    assert list(survivors(processed_scores(chain(tok), row[None])[0])) == [t]


def test_eog_only_when_eog_is_likely_enough(tok):
    """eos .1 and four text tokens .225 (n = 5): 3 * .1 * 5 = 1.5 > .9: only the EOG token is kept."""
    row = row_with(tok, {"<|endoftext|>": 0.1, "a": 0.225, "b": 0.225, "c": 0.225, "s": 0.225})
    out = processed_scores(chain(tok), row[None])[0]
    assert survivors(out) == {0: pytest.approx(math.log(0.1))}


def test_eot_fallback_when_no_text_token_reaches_the_cut(tok):
    """Seven unrelated tokens near 1/7 < .2, eos at 1e-4 (3 * 1e-4 * 8 < 1): none survives the .2 cut, so the row
    becomes the single EOT token with logit 1 (llama.cpp sets it so)."""
    names = ["a", "b", "c", "d", "f", "g", "k"]
    row = row_with(tok, {**{n: (1 - 1e-4) / 7 for n in names}, "<|endoftext|>": 1e-4})
    out = processed_scores(chain(tok), row[None])[0]
    assert survivors(out) == {0: 1.0}
    assert survivors(processed_scores(chain(tok, eot_id=5), row[None])[0]) == {5: 1.0}


def test_eot_fallback_after_top_k_when_eot_is_not_a_candidate(tok):
    names = ["a", "b", "c", "d", "f", "g", "k"]
    row = row_with(tok, {n: 1 / 7 for n in names})
    c = sampler_chain({"use": "infill"}, before=[{"use": "top_k", "k": 7}])
    c.prepare(tokenizer=tok)
    out = c.sample(row[None], return_scores=True)
    assert survivors(out.scores[0]) == {0: 1.0}
    assert out.token_ids.tolist() == [0]


# --------------------------------------------------------------------------- the step-by-step port
def random_rows(seed: int, vocab: int = 300) -> torch.Tensor:
    """Rows of (live candidates, logit scale, eos): peaked and flat rows, with eos unlikely, absent or on top."""
    shapes = [
        (4, 1.0, "low"),
        (8, 2.0, "low"),
        (12, 1.0, "top"),
        (20, 0.05, "low"),
        (40, 0.05, None),
        (80, 3.0, "low"),
        (300, 0.01, "low"),
        (300, 5.0, "top"),
    ]
    g = torch.Generator().manual_seed(seed)
    rows = []
    for live_n, scale, eos in shapes:
        x = torch.randn(vocab, generator=g) * scale
        live = torch.randperm(vocab - 1, generator=g)[:live_n] + 1
        row = torch.full((vocab,), -INF)
        row[live] = x[live]
        if eos == "low":
            row[0] = row[live].max() - 9.0
        elif eos == "top":
            row[0] = row[live].max() + 0.5
        rows.append(row)
    return torch.stack(rows)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("output", ("logits", "probs"))
def test_matches_the_cpp_step_by_step(tok, pieces, seed, output):
    logits = random_rows(seed)
    out = processed_scores(chain(tok, output=output), logits)
    for b in range(logits.shape[0]):
        want = llama_infill_reference(logits[b].numpy(), pieces, {0}, 0, output == "probs")
        got = survivors(out[b])
        assert set(got) == set(want), f"row {b}"
        for k, v in want.items():
            assert got[k] == pytest.approx(v, abs=1e-5), f"row {b} token {k}"


def test_the_random_rows_exercise_every_branch(tok, pieces):
    """The rows above reach the EOG shortcut, merges, the fallback and the plain path (else the test is weak)."""
    seen = set()
    for seed in range(6):
        logits = random_rows(seed)
        for b in range(logits.shape[0]):
            want = llama_infill_reference(logits[b].numpy(), pieces, {0}, 0, False)
            if list(want) == [0] and want[0] == 1.0:
                seen.add("fallback")
            elif set(want) == {0}:
                seen.add("eog")
            else:
                seen.add("text")
    assert seen == {"fallback", "eog", "text"}


def test_token_pieces_are_the_token_bytes(tok, pieces):
    from samplechain_infill import token_pieces

    assert token_pieces(tok) == pieces
    for i in range(len(tok)):
        text = tok.decode([i], skip_special_tokens=True)
        if "\ufffd" not in text:
            assert pieces[i] == text.encode("utf-8")


def test_sentencepiece_style_pieces():
    """SentencePiece vocabularies: '▁' is a space, <0xNN> is that byte, special tokens have no text."""
    from samplechain_infill import token_pieces

    class SpTok:
        all_special_ids = [0, 1]
        vocab = ["<s>", "</s>", "▁the", "▁t", "<0x0A>", "ab", "▁"]

        def __len__(self):
            return len(self.vocab)

        def convert_ids_to_tokens(self, ids):
            return [self.vocab[i] for i in ids]

    assert token_pieces(SpTok(), 9) == [b"", b"", b" the", b" t", b"\n", b"ab", b" ", b"", b""]


def test_after_top_k_equals_full_vocabulary(tok):
    logits = random_rows(3)
    full = processed_scores(chain(tok), logits)
    c = sampler_chain({"use": "infill"}, before=[{"use": "top_k", "k": 300}])
    c.prepare(tokenizer=tok)
    assert torch.equal(c.sample(logits, return_scores=True).scores, full)


# --------------------------------------------------------------------------- per row, disabled, errors
def test_per_row_equals_rows_alone_and_disabled_rows_pass_through(tok):
    logits = random_rows(4)
    rows = [{"infill": bool(i % 3)} for i in range(8)]
    c = chain(tok)
    batch = processed_scores(c, logits, rows)
    for i, params in enumerate(rows):
        assert torch.equal(batch[i], processed_scores(c, logits[i : i + 1], [params])[0]), f"row {i}"
        if not params["infill"]:
            assert torch.equal(batch[i], logits[i])


def test_disabled_is_a_bitwise_no_op_even_without_prepare():
    logits = torch.randn(3, 50)
    c = sampler_chain({"use": "infill", "enabled": False})
    assert torch.equal(c.sample(logits, return_scores=True).scores, logits)


def test_without_prepare_the_error_says_what_to_do():
    c = sampler_chain({"use": "infill"})
    with pytest.raises(SamplingError, match=r"chain\.prepare\(tokenizer=\.\.\.\)"):
        c.sample(torch.randn(2, 50))


def test_extra_eog_ids(tok):
    """eog_ids adds end-of-generation tokens: 'a' counted as EOG turns the row into the EOG-only branch."""
    row = row_with(tok, {"a": 0.1, "b": 0.3, "c": 0.3, "d": 0.3})
    a = tok.convert_tokens_to_ids("a")
    assert set(survivors(processed_scores(chain(tok, eog_ids=[a]), row[None])[0])) == {a}
    assert a not in survivors(processed_scores(chain(tok), row[None])[0])


@pytest.mark.parametrize(
    ("params", "key"),
    [
        ({"eot_id": -2}, "eot_id"),
        ({"output": "p"}, "output"),
        ({"eog_ids": [-1]}, "eog_ids"),
        ({"enabled": "yes"}, "enabled"),
    ],
)
def test_bad_values_are_refused_naming_the_key(params, key):
    with pytest.raises(ConfigError, match=key):
        Chain.load({"samplers": [{"use": "infill", **params}, {"use": "greedy"}]})
