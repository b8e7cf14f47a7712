"""`inf_nan_remove`: transformers' InfNanRemoveLogitsProcessor.

NaN becomes 0, +inf the largest float32, -inf the smallest float32 (so masked candidates become finite, with
probability 0 after a softmax, exactly as transformers does). Put it first in a chain; a later filter masks with
-inf again. No parameters.
"""

from __future__ import annotations

import torch

from samplechain import Candidates, Sampler, Stage, StepContext, hookimpl

F32 = torch.finfo(torch.float32)


class InfNanRemove(Sampler):
    name = "inf_nan_remove"
    stage = Stage.TRANSFORM
    summary = "replace NaN by 0 and +-inf by the largest / smallest float32"

    def apply(self, cand: Candidates, ctx: StepContext) -> Candidates:
        x = cand.logits
        if bool(torch.isfinite(x).all()):
            return cand
        return cand.replace_logits(torch.nan_to_num(x, nan=0.0, posinf=F32.max, neginf=F32.min))


@hookimpl
def register_samplers(register):
    register(InfNanRemove)
