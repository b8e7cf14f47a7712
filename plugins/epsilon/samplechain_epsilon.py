"""`epsilon`: epsilon sampling (Hewitt et al. 2022, "Truncation Sampling as Language Model Desmoothing").

Keep the candidates whose probability (softmax over the current candidates) is at least epsilon; the min_keep
most likely candidates always survive (with every candidate tied with the min_keep-th in logit), as transformers'
EpsilonLogitsWarper. epsilon = 0 is a no-op. min_keep 0 counts as 1: the top candidate always survives, so a row
never ends up empty. Probabilities are float64 at every width (transformers: the input dtype), so the kept set
does not depend on the row's width.
"""

from __future__ import annotations

import attrs
import torch

from samplechain import Candidates, Sampler, Stage, StepContext, finite, hookimpl, in_range
from samplechain.filters import with_min_keep


@attrs.frozen
class EpsilonParams:
    epsilon: float = attrs.field(validator=[finite, in_range(0.0, 1.0, high_open=True, hint="0 disables")])
    min_keep: int = attrs.field(default=1, validator=in_range(0, None))


class Epsilon(Sampler):
    name = "epsilon"
    stage = Stage.FILTER
    Params = EpsilonParams
    request_aliases = {"epsilon_cutoff": "epsilon", "min_keep": "min_keep"}
    summary = "keep tokens with probability >= epsilon"

    def is_noop(self, ctx: StepContext) -> bool:
        shared = ctx.scalar("epsilon")
        return shared is not None and shared <= 0.0

    def apply(self, cand: Candidates, ctx: StepContext) -> Candidates:
        if self.is_noop(ctx):
            return cand
        eps = ctx.param("epsilon")
        off = eps <= 0.0
        # float64 at every width: the kept set does not depend on the row's width (a float32 softmax's sum rounds
        # with it)
        prob = torch.softmax(cand.logits.double(), dim=-1)
        keep = with_min_keep(cand, ctx.backend, prob >= eps.double()[:, None], ctx.param("min_keep"))
        keep |= off[:, None]
        return cand.masked(keep)


@hookimpl
def register_samplers(register):
    register(Epsilon)
