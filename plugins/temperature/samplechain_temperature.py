"""`temperature`: logits / t. As llama.cpp: t = 0 keeps only the argmax (transformers rejects t = 0 and asks
for do_sample=False instead); t = 1 passes rows through unchanged."""

from __future__ import annotations

import attrs
import torch

from samplechain import Candidates, Sampler, Stage, StepContext, finite, hookimpl, in_range
from samplechain.contracts import in_sync_free_step


@attrs.frozen
class TemperatureParams:
    t: float = attrs.field(validator=[finite, in_range(0.0, None, hint="0 keeps only the most likely token")])


class Temperature(Sampler):
    name = "temperature"
    sync_free = True  # no host read in a sync-free step (plugins/cuda/tests/test_sync_free.py)
    stage = Stage.TRANSFORM
    Params = TemperatureParams
    request_aliases = {"temperature": "t"}
    summary = "divide logits by the temperature; 0 = keep only the argmax"

    def is_argmax_invariant(self) -> bool:
        return True

    def preserves_order(self, ctx: StepContext) -> bool:
        shared = ctx.scalar("t")  # x / t with t > 0 never reorders a row (rounding may tie, never invert)
        return shared is not None and shared > 0

    def apply(self, cand: Candidates, ctx: StepContext) -> Candidates:
        shared = ctx.scalar("t")
        if shared == 1.0:
            return cand
        if shared is not None and shared > 0:  # one scalar for the batch: bitwise what transformers computes
            if cand.writable:
                cand.logits.div_(shared)
                return cand
            out = ctx.backend.scratch("candidates", cand.logits)
            return cand.replace_logits(torch.div(cand.logits, shared, out=out), is_sorted=cand.is_sorted)
        t = ctx.param("t")[:, None]  # (B, 1)
        hot = t > 0
        logits = cand.logits / torch.where(hot, t, torch.ones_like(t))
        cold = ctx.bound("t")[0] <= 0 if in_sync_free_step() else not bool(hot.all())  # (bounds: no host read)
        if cold:  # t = 0 rows: only the first maximum survives
            cand, top = cand.best_first()  # of equal maxima the lowest id (sorted rows: moved to the front)
            cold_keep = torch.zeros_like(logits, dtype=torch.bool).scatter_(1, top, True)
            logits = logits.masked_fill(~hot & ~cold_keep, float("-inf"))
        return cand.replace_logits(logits, is_sorted=cand.is_sorted)  # t > 0 never reorders; t = 0 keeps the front


@hookimpl
def register_samplers(register):
    register(Temperature)
