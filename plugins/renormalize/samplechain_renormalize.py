"""`renormalize`: transformers' LogitNormalization: logits become log_softmax over the remaining candidates.

Removed candidates stay -inf; the result is the log-probability of each candidate. The argmax is unchanged.
transformers runs it last (`renormalize_logits=True`), after the warpers, so reported scores are normalised.
No parameters.
"""

from __future__ import annotations

import torch

from samplechain import Candidates, Sampler, Stage, StepContext, hookimpl


class Renormalize(Sampler):
    name = "renormalize"
    stage = Stage.TRANSFORM
    summary = "log-softmax over the remaining candidates"

    def is_argmax_invariant(self) -> bool:
        return True

    def apply(self, cand: Candidates, ctx: StepContext) -> Candidates:
        return cand.replace_logits(torch.log_softmax(cand.logits, dim=-1))


@hookimpl
def register_samplers(register):
    register(Renormalize)
