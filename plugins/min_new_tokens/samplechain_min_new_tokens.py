"""`min_new_tokens`: transformers' MinNewTokensLengthLogitsProcessor (vLLM's `min_tokens`).

While a row has generated fewer than `n` tokens, the ids in `eos_ids` (eos and any stop token ids) are masked
(-inf). `n` may differ per row (`min_new_tokens`, `min_tokens`); 0 disables. `eos_ids` is chain-level and must
be given: samplers have no tokenizer / model-config hook to read the eos id from (see docs/semantics.md).
"""

from __future__ import annotations

import attrs
import torch

from samplechain import Candidates, Sampler, Stage, StepContext, hookimpl, in_range


def _eos_ok(_inst, _attr, value) -> None:
    if not value:
        raise ValueError("give the end-of-sequence / stop token ids to hold back, e.g. eos_ids = [2]")
    if any(t < 0 for t in value):
        raise ValueError(f"token ids must be non-negative, got {list(value)}")


@attrs.frozen
class MinNewTokensParams:
    eos_ids: tuple[int, ...] = attrs.field(validator=_eos_ok)
    n: int = attrs.field(default=0, validator=in_range(0, None, hint="0 disables"))


class MinNewTokens(Sampler):
    name = "min_new_tokens"
    stage = Stage.TRANSFORM
    Params = MinNewTokensParams
    request_aliases = {"min_new_tokens": "n", "min_tokens": "n"}
    summary = "mask eos / stop ids until a row has generated n tokens"

    def __init__(self, params: MinNewTokensParams) -> None:
        super().__init__(params)
        self._ids = torch.tensor(params.eos_ids, dtype=torch.int64)

    def needs_history(self) -> bool:
        return True

    def apply(self, cand: Candidates, ctx: StepContext) -> Candidates:
        if ctx.scalar("n") == 0:
            return cand
        generated = (ctx.history >= 0).sum(dim=1) - ctx.prompt_lengths
        early = generated < ctx.param("n")  # (B,)
        if not bool(early.any()):
            return cand
        if cand.ids is None:
            ids = self._ids[self._ids < cand.vocab_size].to(cand.logits.device)
            hit = torch.zeros(1, cand.vocab_size, dtype=torch.bool, device=cand.logits.device).index_fill_(1, ids, True)
        else:
            hit = torch.isin(cand.ids, self._ids.to(cand.ids.device))
        return cand.masked(~(hit & early[:, None]))


@hookimpl
def register_samplers(register):
    register(MinNewTokens)
