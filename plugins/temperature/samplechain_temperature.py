"""`temperature`: logits / t. As llama.cpp: t = 0 keeps only the argmax (transformers rejects t = 0 and asks
for do_sample=False instead); t = 1 passes rows through unchanged."""

from __future__ import annotations

import attrs
import torch

from samplechain import Candidates, FusedPart, Sampler, Stage, StepContext, filters, finite, hookimpl, in_range
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
    has_fused_part = True

    def is_argmax_invariant(self) -> bool:
        return True

    def is_noop(self, ctx: StepContext) -> bool:
        return ctx.scalar("t") == 1.0

    def fused(self, ctx: StepContext) -> FusedPart:
        return FusedPart("temperature", ctx.value("t"))

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
        t = ctx.param("t")
        cold = ctx.bound("t")[0] <= 0 if in_sync_free_step() else not bool((t > 0).all())  # (bounds: no host read)
        return filters.divided(cand, t, cold)


@hookimpl
def register_samplers(register):
    register(Temperature)
