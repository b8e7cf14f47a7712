"""`logit_bias`: add a fixed bias to chosen tokens' logits, as llama.cpp's `llama_sampler_init_logit_bias`,
OpenAI's / vLLM's `logit_bias`, and transformers' SequenceBiasLogitsProcessor with one-token sequences.

`bias` is a table `{ "50256" = -100.0 }` (TOML keys are strings) or an array of `[token_id, bias]` pairs. A bias
may be -inf (bans the token); +inf and NaN are refused. The same id given twice adds both biases (llama.cpp).
Chain-level (one table for every row); an empty table is a no-op.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import torch

from samplechain import Candidates, Sampler, SamplingError, Stage, StepContext, hookimpl


def bias_pairs(value: Any) -> tuple[tuple[int, float], ...]:
    """The bias as (token id, bias) pairs, from a table or an array of pairs."""
    items = value.items() if isinstance(value, Mapping) else value
    out = []
    for item in items:
        if isinstance(item, (str, bytes)) or len(item) != 2:
            raise ValueError(f"expected [token_id, bias] pairs or a table {{token_id = bias}}, got {item!r}")
        tok, b = item
        if isinstance(tok, str) and tok.strip().lstrip("-").isdigit():
            tok = int(tok)
        if isinstance(tok, bool) or not isinstance(tok, int) or tok < 0:
            raise ValueError(f"token id {tok!r} must be a non-negative integer")
        if isinstance(b, bool) or not isinstance(b, (int, float)) or b != b or b == float("inf"):
            raise ValueError(f"bias {b!r} for token {tok} must be a number (or -inf)")
        out.append((tok, float(b)))
    return tuple(out)


def _check(_inst: Any, _attr: attrs.Attribute, value: Any) -> None:
    if not isinstance(value, (Mapping, list, tuple)):
        raise ValueError("expected a table {token_id = bias} or an array of [token_id, bias] pairs")
    bias_pairs(value)


@attrs.frozen
class LogitBiasParams:
    bias: Any = attrs.field(factory=dict, validator=_check)


class LogitBias(Sampler):
    name = "logit_bias"
    sync_free = True  # no host read in a sync-free step (plugins/cuda/tests/test_sync_free.py)
    stage = Stage.TRANSFORM
    role = "bias"
    Params = LogitBiasParams
    summary = "add a fixed bias to the logits of chosen token ids"

    def __init__(self, params: LogitBiasParams) -> None:
        super().__init__(params)
        pairs = bias_pairs(params.bias)
        self._ids = torch.tensor([p[0] for p in pairs], dtype=torch.int64)
        self._bias = torch.tensor([p[1] for p in pairs], dtype=torch.float32)
        self._dense: dict[tuple[int, str], torch.Tensor] = {}

    def dense(self, vocab: int, device: torch.device) -> torch.Tensor:
        """(V,) float32 bias per token id (0 for unbiased ids), cached per vocabulary size and device."""
        key = (vocab, str(device))
        if key not in self._dense:
            if int(self._ids.max()) >= vocab:
                bad = sorted({int(i) for i in self._ids[self._ids >= vocab]})
                raise SamplingError(f"logit_bias.v1: token ids {bad[:5]} are outside the vocabulary (size {vocab})")
            self._dense[key] = torch.zeros(vocab).index_add_(0, self._ids, self._bias).to(device)
        return self._dense[key]

    def apply(self, cand: Candidates, ctx: StepContext) -> Candidates:
        if self._ids.numel() == 0:
            return cand
        bias = self.dense(cand.vocab_size, cand.logits.device)
        if cand.ids is None:
            return cand.replace_logits(cand.logits + bias)
        return cand.replace_logits(cand.logits + bias[cand.ids])


@hookimpl
def register_samplers(register):
    register(LogitBias)
