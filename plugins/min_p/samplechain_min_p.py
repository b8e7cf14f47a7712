"""`min_p`: keep candidates whose probability is at least p times the top candidate's.

Compared in logit space, as llama.cpp does: keep logit >= max_logit + log(p), which needs no softmax. p <= 0
is a no-op; at least min_keep survive. transformers' MinPLogitsWarper compares probabilities
(prob < min_p * top_prob is removed): the same set up to float rounding at the boundary.
"""

from __future__ import annotations

import math

import attrs
import torch

from samplechain import Candidates, FusedPart, Sampler, Stage, StepContext, finite, hookimpl, in_range
from samplechain.contracts import in_sync_free_step


@attrs.frozen
class MinPParams:
    p: float = attrs.field(validator=[finite, in_range(0.0, 1.0, hint="0 disables")])
    min_keep: int = attrs.field(default=1, validator=in_range(0, None))


class MinP(Sampler):
    name = "min_p"
    sync_free = True  # no host read in a sync-free step (plugins/cuda/tests/test_sync_free.py)
    stage = Stage.FILTER
    Params = MinPParams
    request_aliases = {"min_p": "p", "min_keep": "min_keep"}
    summary = "keep tokens with probability >= p * the top probability"
    has_fused_part = True

    def is_noop(self, ctx: StepContext) -> bool:
        shared = ctx.scalar("p")
        return shared is not None and shared <= 0.0

    def fused(self, ctx: StepContext) -> FusedPart:
        return FusedPart("min_p", ctx.value("p"), ctx.value("min_keep"))

    def apply(self, cand: Candidates, ctx: StepContext) -> Candidates:
        shared = ctx.scalar("p")
        if shared is not None and shared <= 0.0:
            return cand
        p, min_keep = ctx.param("p"), ctx.param("min_keep")
        off = p <= 0.0
        width = cand.width
        top = cand.logits[:, 0] if cand.is_sorted else cand.logits.amax(dim=-1)  # (B,)
        if shared is not None:  # logf(p) in float32, as llama.cpp
            threshold = top + math.log(shared)
        else:
            threshold = top + torch.log(torch.where(off, torch.ones_like(p), p))
        if in_sync_free_step() and not cand.is_sorted:  # no host read: a mask, or a sort where min_keep may bind
            shared_keep = ctx.scalar("min_keep")
            if shared_keep is not None and shared_keep <= 1:  # the largest logit always passes: the mask suffices
                return cand.masked((cand.logits >= threshold[:, None]) | off[:, None])
            cand = cand.sorted(ctx.backend)  # the same largest logit, so the same threshold
        if cand.is_sorted:
            keep = cand.logits >= threshold[:, None]  # (B, K)
            counts = torch.clamp(torch.maximum(keep.sum(dim=-1), min_keep), max=width)
            return cand.keep_first_settled(torch.where(off, width, counts))  # min_keep inside ties: lowest ids
        if bool(off.all()):
            return cand
        # the survivors are the counts[b] largest logits: found and compacted in one backend call that reads
        # only the parts of the row that can hold them
        need = int(torch.where(off, 0, min_keep).max())
        # in the filters' order (ties settled), so min_keep needs its own count and no column more; compacted
        # candidates (columns not in token-id order after a sort) are settled by id in restrict: one column more
        compacted = cand.ids is not None
        values, index, above = ctx.backend.at_least(
            cand.logits, threshold, min(need + compacted, width) if need > 1 else 0, ordered=need > 1
        )  # min_keep <= 1: the cut is the count
        counts = torch.clamp(torch.maximum(above, min_keep), max=width)
        counts = torch.where(off, width, counts)
        if bool((counts >= width).all()):
            return cand
        return cand.restrict(values, index, counts, off | (counts >= width), ranked=not compacted)


@hookimpl
def register_samplers(register):
    register(MinP)
