"""`epsilon`: epsilon sampling (Hewitt et al. 2022, "Truncation Sampling as Language Model Desmoothing").

Keep the candidates whose probability (softmax over the current candidates) is at least epsilon; the min_keep
most likely candidates always survive (with every candidate tied with the min_keep-th in logit), as transformers'
EpsilonLogitsWarper. epsilon = 0 is a no-op. min_keep 0 counts as 1: the top candidate always survives, so a row
never ends up empty. Probabilities are float64.
"""

from __future__ import annotations

import attrs
import torch

from samplechain import Candidates, Sampler, Stage, StepContext, finite, hookimpl, in_range


@attrs.frozen
class EpsilonParams:
    epsilon: float = attrs.field(validator=[finite, in_range(0.0, 1.0, high_open=True, hint="0 disables")])
    min_keep: int = attrs.field(default=1, validator=in_range(0, None))


def kth_largest(cand: Candidates, ctx: StepContext, k: torch.Tensor) -> torch.Tensor:
    """(B,) the k[b]-th largest logit of each row (k >= 1, clamped to the width)."""
    k = torch.clamp(k, 1, cand.width)
    if cand.is_sorted:
        return cand.logits.gather(1, (k - 1)[:, None]).squeeze(1)
    values, _ = ctx.backend.topk(cand.logits, int(k.max()))
    return values.gather(1, (k - 1)[:, None]).squeeze(1)


def cutoff_keep(cand: Candidates, ctx: StepContext, prob: torch.Tensor, cutoff: torch.Tensor) -> torch.Tensor:
    """(B, K) keep mask: prob >= cutoff[b], or a logit >= the min_keep-th largest."""
    keep = prob >= cutoff[:, None]
    floor = kth_largest(cand, ctx, ctx.param("min_keep"))
    return keep | (cand.logits >= floor[:, None])


class Epsilon(Sampler):
    name = "epsilon"
    stage = Stage.FILTER
    Params = EpsilonParams
    request_aliases = {"epsilon_cutoff": "epsilon", "min_keep": "min_keep"}
    summary = "keep tokens with probability >= epsilon"

    def apply(self, cand: Candidates, ctx: StepContext) -> Candidates:
        shared = ctx.scalar("epsilon")
        if shared is not None and shared <= 0.0:
            return cand
        eps = ctx.param("epsilon")
        off = eps <= 0.0
        prob = torch.softmax(cand.logits.double(), dim=-1)
        keep = cutoff_keep(cand, ctx, prob, eps.double()) | off[:, None]
        return cand.masked(keep)


@hookimpl
def register_samplers(register):
    register(Epsilon)
