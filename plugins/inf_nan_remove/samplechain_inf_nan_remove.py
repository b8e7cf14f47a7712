"""`inf_nan_remove`: transformers' InfNanRemoveLogitsProcessor.

NaN becomes 0 and +inf the largest float32, as transformers does. -inf stays -inf: in a candidate set -inf is a
removed token (an earlier filter's mask, or the model's own -inf), and a token an earlier filter compacted away
cannot come back, so bringing back the masked ones would make a row's candidates depend on whether its batch was
compacted or masked. transformers writes the smallest float32 there instead, which has probability 0 after a
softmax whenever the row holds a finite logit: the same distribution and the same argmax. Only a row of nothing
but -inf differs (transformers then draws uniformly; here it is the every-token-masked error). No parameters.
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
        return cand.replace_logits(torch.nan_to_num(x, nan=0.0, posinf=F32.max, neginf=float("-inf")))


@hookimpl
def register_samplers(register):
    register(InfNanRemove)
