"""`allowed_tokens`: keep only the token ids in `ids` (vLLM's `allowed_token_ids`; transformers has no processor,
the same mask is SuppressTokensLogitsProcessor over the complement). On the full vocabulary the candidate set is
compacted to the allowed ids (K = len(ids)), so later samplers never touch the rest. Ids outside the vocabulary
are ignored; duplicates count once. Chain-level; empty `ids` is a no-op.
"""

from __future__ import annotations

import attrs
import torch

from samplechain import Candidates, Sampler, Stage, StepContext, hookimpl


def _non_negative(_inst, _attr, value) -> None:
    if any(t < 0 for t in value):
        raise ValueError(f"token ids must be non-negative, got {list(value)}")


@attrs.frozen
class AllowedTokensParams:
    ids: tuple[int, ...] = attrs.field(default=(), validator=_non_negative)


class AllowedTokens(Sampler):
    name = "allowed_tokens"
    sync_free = True  # no host read in a sync-free step (plugins/cuda/tests/test_sync_free.py)
    stage = Stage.FILTER
    role = "mask"
    Params = AllowedTokensParams
    summary = "keep only the given token ids"

    def __init__(self, params: AllowedTokensParams) -> None:
        super().__init__(params)
        self._ids = torch.tensor(sorted(set(params.ids)), dtype=torch.int64)

    def apply(self, cand: Candidates, ctx: StepContext) -> Candidates:
        if self._ids.numel() == 0:
            return cand
        ids = self._ids[self._ids < cand.vocab_size].to(cand.logits.device)
        if cand.ids is None:  # compact to the allowed columns
            index = ids[None, :].expand(cand.batch_size, -1)
            return cand.take(cand.logits.index_select(1, ids), index, is_sorted=False)
        return cand.masked(torch.isin(cand.ids, ids))


@hookimpl
def register_samplers(register):
    register(AllowedTokens)
