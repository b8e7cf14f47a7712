"""`top_k`: keep the k most likely candidates (k <= 0 disables; at least min_keep survive).

llama.cpp semantics: k <= 0 is a no-op and k is clipped to the candidate count. transformers'
TopKLogitsWarper keeps max(top_k, min_tokens_to_keep) tokens and rejects k <= 0. Equal logits at the k-th
place: the lowest token ids among them survive (`settle_ties`), so the kept set is a function of the row alone,
never of the batch around it (torch.topk's own choice among ties changes with its width).
"""

from __future__ import annotations

import attrs
import torch

from samplechain import Candidates, FusedPart, Sampler, Stage, StepContext, hookimpl, in_range
from samplechain.contracts import in_sync_free_step


@attrs.frozen
class TopKParams:
    k: int  # <= 0 disables
    min_keep: int = attrs.field(default=1, validator=in_range(0, None))


class TopK(Sampler):
    name = "top_k"
    sync_free = True  # no host read in a sync-free step (plugins/cuda/tests/test_sync_free.py)
    stage = Stage.FILTER
    Params = TopKParams
    request_aliases = {"top_k": "k", "min_keep": "min_keep"}
    summary = "keep the k most likely tokens"
    has_fused_part = True

    def is_rank_only(self) -> bool:
        return True

    def is_noop(self, ctx: StepContext) -> bool:
        shared = ctx.scalar("k")
        return shared is not None and shared <= 0

    def fused(self, ctx: StepContext) -> FusedPart:
        return FusedPart("top_k", ctx.value("k"), ctx.value("min_keep"))

    def rank_counts(self, cand: Candidates, ctx: StepContext) -> torch.Tensor | None:
        k = ctx.param("k")
        if bool((k <= 0).any()):
            return None
        return torch.clamp(torch.maximum(k, ctx.param("min_keep")), max=cand.width)

    def apply(self, cand: Candidates, ctx: StepContext) -> Candidates:
        width = cand.width
        k, min_keep = ctx.scalar("k"), ctx.scalar("min_keep")
        if k is not None and min_keep is not None:  # one k for the whole batch: a single partial top-k
            if k <= 0:
                return cand
            k = min(max(k, min_keep), width)
            if k >= width:
                return cand
            counts = torch.full((cand.batch_size,), k, device=cand.logits.device)
            if cand.is_sorted:
                return cand.keep_first_settled(counts)
            values, index = ctx.backend.ranked_topk(cand.logits, k, cand.ids)  # equal logits at the cut: lowest ids
            return cand.take(values, index, is_sorted=True)
        k = ctx.param("k")
        off = k <= 0
        counts = torch.clamp(torch.maximum(k, ctx.param("min_keep")), max=width)  # (B,)
        counts = torch.where(off, width, counts)
        if in_sync_free_step():  # widths from the batch's bounds, known on the host: no read of the device
            kmax = max(ctx.bound("k")[1], ctx.bound("min_keep")[1])
            if cand.is_sorted or ctx.bound("k")[0] <= 0 or kmax >= width:  # some row may keep all: one sort
                return cand.sorted(ctx.backend).keep_first_settled(counts)
            values, index = ctx.backend.ranked_topk(cand.logits, kmax, cand.ids)  # ranked: no ties to settle
            return cand.take(values, index, is_sorted=True).keep_first(counts)
        if bool((counts >= width).all()):
            return cand
        if cand.is_sorted:
            return cand.keep_first_settled(counts)
        kmax = int(torch.where(off, 0, counts).max())
        values, index = ctx.backend.topk(cand.logits, min(kmax + 1, width))  # one more: restrict settles ties
        return cand.restrict(values, index, counts, off | (counts >= width))


@hookimpl
def register_samplers(register):
    register(TopK)
