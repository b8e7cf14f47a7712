"""`sequence_bias`: transformers' SequenceBiasLogitsProcessor.

`bias` is an array of `[[token ids...], bias]`. A one-token sequence biases its token always; a longer one
biases its last token when the row's history ends with the sequence's other tokens. Biases of sequences ending
in the same token add up. A bias may be -inf (bans); +inf and NaN are refused. Chain-level; empty = no-op.
Difference: transformers skips a sequence longer than the (padded) input; here a sequence applies as soon as the
row has as many real tokens as its prefix.
"""

from __future__ import annotations

from typing import Any

import attrs

from samplechain import Candidates, Sampler, Stage, StepContext, hookimpl
from samplechain.tokens import SequenceMatcher


def sequence_pairs(value: Any) -> tuple[tuple[tuple[int, ...], float], ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise ValueError("expected an array of [[token ids...], bias] pairs")
    out = []
    for item in value:
        if isinstance(item, (str, bytes)) or not isinstance(item, (list, tuple)) or len(item) != 2:
            raise ValueError(f"expected [[token ids...], bias], got {item!r}")
        seq, b = item
        if isinstance(seq, (str, bytes)) or not isinstance(seq, (list, tuple)) or not seq:
            raise ValueError(f"expected a non-empty array of token ids, got {seq!r}")
        if any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in seq):
            raise ValueError(f"token ids must be non-negative integers, got {list(seq)!r}")
        if isinstance(b, bool) or not isinstance(b, (int, float)) or b != b or b == float("inf"):
            raise ValueError(f"bias {b!r} of {list(seq)} must be a number (or -inf)")
        out.append((tuple(seq), float(b)))
    return tuple(out)


def _check(_inst: Any, _attr: attrs.Attribute, value: Any) -> None:
    sequence_pairs(value)


@attrs.frozen
class SequenceBiasParams:
    bias: Any = attrs.field(factory=tuple, validator=_check)


class SequenceBias(Sampler):
    name = "sequence_bias"
    sync_free = True  # no host read in a sync-free step (plugins/cuda/tests/test_sync_free.py)
    stage = Stage.TRANSFORM
    role = "bias"
    Params = SequenceBiasParams
    summary = "bias a token when it would complete a given token sequence"

    def __init__(self, params: SequenceBiasParams) -> None:
        super().__init__(params)
        self.matcher = SequenceMatcher(sequence_pairs(params.bias), self.qualified_name())

    def needs_history(self) -> bool:
        return any(p > 0 for p in self.matcher.groups)

    def apply(self, cand: Candidates, ctx: StepContext) -> Candidates:
        if not self.matcher.groups:
            return cand
        bias = self.matcher.bias(ctx.history, cand.vocab_size, cand.batch_size, cand.logits.device)
        if cand.ids is not None:
            bias = bias.gather(1, cand.ids)
        return cand.replace_logits(cand.logits + bias)


@hookimpl
def register_samplers(register):
    register(SequenceBias)
