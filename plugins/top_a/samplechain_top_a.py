"""`top_a`: remove the candidates whose probability is below a * (top probability)^2.

text-generation-webui's `TopALogitsWarper` (modules/sampler_hijack.py) and koboldcpp's `sample_top_a`: probabilities
are the softmax over the current candidates; a token is removed iff `p < a * p_max^2`; at least `min_keep` (the
most likely) survive; `a = 0` is a no-op (webui adds the warper only for 0 < a <= 1, koboldcpp returns on a <= 0).

Computed in logit space without a softmax over the vocabulary: `p < a * p_max^2` is
`logit < log(a) + 2 * max_logit - logsumexp(logits)`, in float64 from the float32 logits (the log-sum-exp in
float32 on rows of at least `filters.WIDE`); the kept set can differ from a float32 softmax comparison only for a
token within rounding of the threshold.
"""

from __future__ import annotations

import attrs
import torch

from samplechain import Candidates, Sampler, Stage, StepContext, filters, finite, hookimpl, in_range


@attrs.frozen
class TopAParams:
    a: float = attrs.field(validator=[finite, in_range(0.0, 1.0, hint="0 disables")])
    min_keep: int = attrs.field(default=1, validator=in_range(0, None))


def top_a_threshold(logits: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """(B,) float64 logit threshold log(a) + 2 * max - logsumexp: keep logit >= threshold. Rows of at least
    `filters.WIDE` candidates take the log-sum-exp in float32 (a cascaded sum, ~1e-7 relative) instead of a float64
    copy of the row."""
    x = logits if logits.shape[1] >= filters.WIDE else logits.double()
    top = x.amax(dim=-1)
    lse = top + torch.log(torch.exp(x - top[:, None]).sum(dim=-1))
    return torch.log(a.double()) + 2.0 * top.double() - lse.double()  # a = 0 gives -inf: everything kept


class TopA(Sampler):
    name = "top_a"
    sync_free = True  # no host read in a sync-free step (plugins/cuda/tests/test_sync_free.py)
    stage = Stage.FILTER
    Params = TopAParams
    request_aliases = {"top_a": "a", "min_keep": "min_keep"}
    summary = "remove tokens with probability < a * max_prob^2"

    def is_noop(self, ctx: StepContext) -> bool:
        shared = ctx.scalar("a")
        return shared is not None and shared <= 0.0

    def apply(self, cand: Candidates, ctx: StepContext) -> Candidates:
        if self.is_noop(ctx):
            return cand
        a, min_keep = ctx.param("a"), ctx.param("min_keep")
        off = a <= 0.0
        width = cand.width
        threshold = top_a_threshold(cand.logits, torch.where(off, torch.ones_like(a), a))
        # x >= t for float32 x is x >= t rounded up to float32: an exact comparison without a float64 copy
        up = threshold.float()
        up = torch.where(up.double() < threshold, torch.nextafter(up, torch.full_like(up, float("inf"))), up)
        kept = (cand.logits >= up[:, None]).sum(dim=-1)  # a prefix of the descending order, ties included
        counts = torch.clamp(torch.maximum(kept, min_keep), min=1, max=width)
        return cand.keep_best(counts, off, ctx.backend)


@hookimpl
def register_samplers(register):
    register(TopA)
