"""Every sampler with a transformers counterpart, side by side with it on the same inputs: random logits with
ties and -inf entries, given as float32, float16 and bfloat16, batched rows with their own histories. The
processed distributions must agree within 1e-5 (the removed sets exactly). transformers runs on the float32
values of the same (rounded) logits, as our chain does.

Documented differences kept out of the comparison: top_k keeps exactly k where transformers keeps every token tied
with the k-th (rows with such a tie are skipped for top_k); top_h keeps the lowest ids among logits tied at its
cut where transformers keeps the ones its torch.topk returns (there the kept logits are compared as multisets);
inf_nan_remove keeps -inf masked where transformers writes the smallest float32 (removed either way: probability
0). Per-sampler details are in docs/semantics.md and docs/samplers/."""

from __future__ import annotations

import pytest
import torch
from transformers.generation import logits_process as tp

from samplechain import Chain

B, V, PROMPT = 6, 300, 5
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def make_inputs(seed: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, V, generator=g) * 3
    logits[0, 10:20] = logits[0, 5]  # an explicit tie group
    logits[1, ::7] = float("-inf")  # masked entries
    logits[2, :3] = logits[2].max()  # a three-way tie at the top
    history = torch.randint(0, 40, (B, PROMPT + 4), generator=g)  # small ids: repeats for n-gram / penalty cases
    history[3, -3:] = history[3, 1:4]
    return logits.to(dtype), history


# (chain entry, transformers processor factory(ids_length) -> LogitsProcessor)
CASES = {
    "temperature": ({"use": "temperature", "t": 0.7}, lambda n: tp.TemperatureLogitsWarper(0.7)),
    "top_k": ({"use": "top_k", "k": 25}, lambda n: tp.TopKLogitsWarper(25)),
    "top_p": ({"use": "top_p", "p": 0.8}, lambda n: tp.TopPLogitsWarper(0.8)),
    "min_p": ({"use": "min_p", "p": 0.05}, lambda n: tp.MinPLogitsWarper(0.05)),
    "typical": ({"use": "typical", "p": 0.9, "semantics": "transformers"}, lambda n: tp.TypicalLogitsWarper(0.9)),
    "epsilon": ({"use": "epsilon", "epsilon": 3e-3}, lambda n: tp.EpsilonLogitsWarper(3e-3)),
    "eta": ({"use": "eta", "epsilon": 3e-3}, lambda n: tp.EtaLogitsWarper(3e-3, device="cpu")),
    "top_h": ({"use": "top_h", "top_h": 0.6}, lambda n: tp.TopHLogitsWarper(0.6)),
    "penalties": (
        {"use": "penalties", "repeat": 1.4, "scope": "transformers"},
        lambda n: tp.RepetitionPenaltyLogitsProcessor(1.4),
    ),
    "no_repeat_ngram": ({"use": "no_repeat_ngram", "n": 2}, lambda n: tp.NoRepeatNGramLogitsProcessor(2)),
    "bad_words": (
        {"use": "bad_words", "ids": [[3], [7, 8], [11, 12, 13]]},
        lambda n: tp.NoBadWordsLogitsProcessor([[3], [7, 8], [11, 12, 13]], eos_token_id=None),
    ),
    "sequence_bias": (
        {"use": "sequence_bias", "bias": [[[4], 2.5], [[9, 10], -3.0]]},
        lambda n: tp.SequenceBiasLogitsProcessor({(4,): 2.5, (9, 10): -3.0}),
    ),
    "suppress_tokens": (
        {"use": "suppress_tokens", "ids": [1, 2, 50]},
        lambda n: tp.SuppressTokensLogitsProcessor([1, 2, 50]),
    ),
    "begin_suppress_tokens": (
        {"use": "begin_suppress_tokens", "ids": [0, 6], "at": 4},
        lambda n: tp.SuppressTokensAtBeginLogitsProcessor([0, 6], PROMPT + 4),
    ),
    "min_new_tokens": (
        {"use": "min_new_tokens", "n": 6, "eos_ids": [2, 5]},
        lambda n: tp.MinNewTokensLengthLogitsProcessor(PROMPT, 6, [2, 5]),
    ),
    "length_decay": (
        {"use": "length_decay", "start": 2, "factor": 1.3, "eos_ids": [2, 5]},
        lambda n: tp.ExponentialDecayLengthPenalty((2, 1.3), [2, 5], PROMPT),
    ),
    "forced_eos": (
        {"use": "forced_eos", "eos_ids": [2], "max_length": PROMPT + 5},
        lambda n: tp.ForcedEOSTokenLogitsProcessor(PROMPT + 5, [2]),
    ),
    "inf_nan_remove": ({"use": "inf_nan_remove"}, lambda n: tp.InfNanRemoveLogitsProcessor()),
    "renormalize": ({"use": "renormalize"}, lambda n: tp.LogitNormalization()),
}


LOWEST = torch.finfo(torch.float32).min
TIE_ORDER = {"top_h"}  # which of the logits tied at the cut survive is transformers' torch.topk's choice


def tie_at_cut(row: torch.Tensor, k: int) -> bool:
    values = row.sort(descending=True).values
    return bool(values[k - 1] == values[k])


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[1])
@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_transformers_on_the_same_inputs(name, dtype):
    entry, make = CASES[name]
    chain = Chain.load({"samplers": [entry, {"use": "greedy"}]})
    for seed in range(3):
        logits, history = make_inputs(seed, dtype)
        x = logits.float()
        ours = chain.process(logits, history=history, prompt_lengths=torch.full((B,), PROMPT))
        ref = make(history.shape[1])(history, x.clone())
        rows = [b for b in range(B) if not (name == "top_k" and tie_at_cut(x[b], 25))]
        assert rows, "every row skipped: the case compares nothing"
        for b in rows:
            kept, kept_ref = ours[b] > LOWEST, ref[b].float() > LOWEST  # -inf, or transformers' finfo.min
            if name in TIE_ORDER and not torch.equal(kept, kept_ref):  # which of equal logits: see the docstring
                assert torch.equal(ours[b][kept].sort().values, ref[b].float()[kept_ref].sort().values), (name, b)
                continue
            assert torch.equal(kept, kept_ref), (name, seed, b)
            p, q = torch.softmax(ours[b], -1), torch.softmax(ref[b].float(), -1)
            assert torch.allclose(p, q, atol=1e-5, rtol=0), (name, seed, b, float((p - q).abs().max()))
