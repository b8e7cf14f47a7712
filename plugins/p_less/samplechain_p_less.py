"""`p_less`: p-less sampling (Tan, Wu and Howard, ICLR 2026, arXiv:2509.23234), hyperparameter-free truncation.

Over the current candidates, with p = softmax, the threshold is L = sum_i p_i^2 (the probability that two
independent draws agree; exp of minus the order-2 Renyi entropy). Candidates with p_i >= L - tolerance are kept.
The top candidate always survives (max p >= sum p^2, and kept explicitly against rounding), and so do the
min_keep most likely (min_keep 0 counts as 1).

Reference: llama.cpp pull request #26035 (llama_sampler_p_less_apply in src/llama-sampler.cpp, not merged at the
time of writing): CPU path keeps p >= L - 1e-5 in float32, the default tolerance here (without it a uniform row
can lose every token to rounding); its ggml backend path keeps p > L with no tolerance. vLLM has no merged p-less
sampler (pull requests #45288 and #48136). enabled = false is a bitwise no-op. Probabilities are float64.
"""

from __future__ import annotations

import attrs
import torch

from samplechain import Candidates, Sampler, Stage, StepContext, finite, hookimpl, in_range


@attrs.frozen
class PLessParams:
    enabled: bool = attrs.field(default=True, validator=attrs.validators.instance_of(bool))
    tolerance: float = attrs.field(default=1e-5, validator=[finite, in_range(0.0, 1.0)])
    min_keep: int = attrs.field(default=1, validator=in_range(0, None))


class PLess(Sampler):
    name = "p_less"
    stage = Stage.FILTER
    Params = PLessParams
    request_aliases = {"p_less": "enabled", "min_keep": "min_keep"}
    summary = "keep tokens with probability >= the sum of squared probabilities"

    def apply(self, cand: Candidates, ctx: StepContext) -> Candidates:
        if ctx.scalar("enabled") is False:
            return cand
        on = ctx.param("enabled")
        prob = torch.softmax(cand.logits.double(), dim=-1)  # float64 at every width: the same kept set at any width
        threshold = torch.linalg.vecdot(prob, prob) - ctx.param("tolerance").to(prob.dtype)
        keep = prob >= threshold[:, None]
        # the min_keep (at least 1: rounding can put L above a uniform row's 1/n) most likely always survive
        k = torch.clamp(ctx.param("min_keep"), 1, cand.width)
        if cand.is_sorted:
            floor = cand.logits.gather(1, (k - 1)[:, None])
        elif bool((k == 1).all()):
            floor = cand.logits.amax(dim=-1, keepdim=True)
        else:
            values, _ = ctx.backend.topk(cand.logits, int(k.max()))
            floor = values.gather(1, (k - 1)[:, None])
        keep |= cand.logits >= floor
        keep |= ~on[:, None]
        return cand.masked(keep)


@hookimpl
def register_samplers(register):
    register(PLess)
