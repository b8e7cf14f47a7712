"""`eta`: eta sampling (Hewitt et al. 2022, "Truncation Sampling as Language Model Desmoothing").

Over the current candidates, with p = softmax and H = -sum p log p (the entropy), the cutoff is
eta = min(epsilon, sqrt(epsilon) * exp(-H)); candidates with p >= eta are kept, and the min_keep most likely
always survive (with every candidate tied with the min_keep-th in logit), as transformers' EtaLogitsWarper.
epsilon = 0 is a no-op. min_keep 0 counts as 1 (a row never ends up empty). Probabilities and entropy are float64
at every width (transformers: float32), so the kept set does not depend on the row's width.
"""

from __future__ import annotations

import attrs
import torch

from samplechain import Candidates, Sampler, Stage, StepContext, finite, hookimpl, in_range
from samplechain.filters import with_min_keep


@attrs.frozen
class EtaParams:
    epsilon: float = attrs.field(validator=[finite, in_range(0.0, 1.0, high_open=True, hint="0 disables")])
    min_keep: int = attrs.field(default=1, validator=in_range(0, None))


class Eta(Sampler):
    name = "eta"
    stage = Stage.FILTER
    Params = EtaParams
    request_aliases = {"eta_cutoff": "epsilon", "min_keep": "min_keep"}
    summary = "keep tokens with probability >= min(epsilon, sqrt(epsilon) * exp(-entropy))"

    def is_noop(self, ctx: StepContext) -> bool:
        shared = ctx.scalar("epsilon")
        return shared is not None and shared <= 0.0

    def apply(self, cand: Candidates, ctx: StepContext) -> Candidates:
        if self.is_noop(ctx):
            return cand
        eps = ctx.param("epsilon").double()
        off = eps <= 0.0
        # float64 at every width: the kept set does not depend on the row's width (float32 sums round with it)
        x = cand.logits.double()
        logp = torch.log_softmax(x, dim=-1)
        prob = torch.exp(logp)
        entropy = -torch.where(prob > 0, prob * logp, 0.0).sum(dim=-1).double()
        eta = torch.minimum(eps, torch.sqrt(eps) * torch.exp(-entropy))
        keep = with_min_keep(cand, ctx.backend, prob >= eta[:, None], ctx.param("min_keep"))
        keep |= off[:, None]
        return cand.masked(keep)


@hookimpl
def register_samplers(register):
    register(Eta)
