"""`top_h`: top-H sampling (Potraghloo et al., NeurIPS 2025, arXiv:2509.02510), as transformers' TopHLogitsWarper.

Take the top_n most likely candidates (transformers fixes top_n = 100) and renormalise them: q = softmax over
those n. With H(q) their entropy and tau = top_h * H(q), walk them from the most likely down, adding the entropy
terms -q_i log q_i; a candidate is kept while the running sum is <= tau. The top candidate always survives, and so
do the min_keep most likely (a parameter transformers lacks; the default 1 is its behaviour). Every candidate
outside the top_n is removed. top_h = 0 disables the sampler (a bitwise no-op); transformers refuses 0 and is
disabled by leaving top_h unset. Softmax, entropy and running sum are float64. Of logits tied at the cut, the
lowest token ids are kept (as every other filter here), so the kept set is the same on every backend and in any
batch; transformers keeps whichever tied tokens its torch.topk returns (the same values, so the same
distribution over logits, but which of equal tokens survive may differ).
"""

from __future__ import annotations

import attrs
import torch

from samplechain import Candidates, Sampler, Stage, StepContext, finite, hookimpl, in_range


@attrs.frozen
class TopHParams:
    top_h: float = attrs.field(validator=[finite, in_range(0.0, 1.0, hint="0 disables")])
    top_n: int = attrs.field(default=100, validator=in_range(1, None))
    min_keep: int = attrs.field(default=1, validator=in_range(0, None))


class TopH(Sampler):
    name = "top_h"
    stage = Stage.FILTER
    Params = TopHParams
    request_aliases = {"top_h": "top_h", "min_keep": "min_keep"}
    summary = "keep the most likely tokens while their entropy stays within top_h * the entropy of the top_n"

    def is_noop(self, ctx: StepContext) -> bool:
        shared = ctx.scalar("top_h")
        return shared is not None and shared <= 0.0

    def apply(self, cand: Candidates, ctx: StepContext) -> Candidates:
        if self.is_noop(ctx):
            return cand
        h = ctx.param("top_h").double()
        off = h <= 0.0
        width = cand.width
        n = torch.clamp(ctx.param("top_n"), 1, width)
        min_keep = torch.clamp(ctx.param("min_keep"), 1, width)
        j = int(torch.maximum(n, min_keep).max())
        values, index = ctx.backend.topk(cand.logits, min(j + 1, width))  # one column more: restrict sees ties
        rank = torch.arange(j, device=values.device)[None, :]
        inside = rank < n[:, None]
        logq = torch.log_softmax(torch.where(inside, values[:, :j].double(), float("-inf")), dim=-1)
        q = torch.exp(logq)
        terms = torch.where(q > 0, -q * logq, 0.0)
        running = torch.cumsum(terms, dim=-1)
        # the entropy as the running sum's last value (terms past top_n are 0): a plain sum's rounding would follow
        # the partial sort's width, which follows the batch; and top_h = 1 then keeps exactly the top_n
        tau = running[:, -1] * h
        counts = ((running <= tau[:, None]) & inside).sum(dim=-1)  # terms >= 0: the kept ones are a prefix
        counts = torch.where(off, j, torch.maximum(counts, min_keep))
        return cand.restrict(values, index, counts, off)  # equal logits at the cut: the lowest ids


@hookimpl
def register_samplers(register):
    register(TopH)
