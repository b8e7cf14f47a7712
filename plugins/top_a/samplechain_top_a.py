"""`top_a`: remove the candidates whose probability is below a * (top probability)^2.

text-generation-webui's `TopALogitsWarper` (modules/sampler_hijack.py) and koboldcpp's `sample_top_a`: probabilities
are the softmax over the current candidates; a token is removed iff `p < a * p_max^2`; at least `min_keep` (the
most likely) survive; `a = 0` is a no-op (webui adds the warper only for 0 < a <= 1, koboldcpp returns on a <= 0).

Computed in logit space without a softmax over the vocabulary: `p < a * p_max^2` is
`logit < log(a) + 2 * max_logit - logsumexp(logits)`, in float64 from the float32 logits; the kept set can differ
from a float32 softmax comparison only for a token within rounding of the threshold. It does not depend on the
row's width: rows of at least `filters.WIDE` candidates sum float32 exponentials in float64 (no float64 copy of the
row), which bounds the threshold within ~1e-6; only a row with a logit inside the bound takes the float64
threshold itself.
"""

from __future__ import annotations

import functools
import math

import attrs
import torch

from samplechain import Candidates, Sampler, Stage, StepContext, filters, finite, hookimpl, in_range
from samplechain.contracts import in_sync_free_step


@attrs.frozen
class TopAParams:
    a: float = attrs.field(validator=[finite, in_range(0.0, 1.0, hint="0 disables")])
    min_keep: int = attrs.field(default=1, validator=in_range(0, None))


def top_a_threshold(logits: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """(B,) float64 logit threshold log(a) + 2 * max - logsumexp: keep logit >= threshold."""
    x = logits.double()
    top = x.amax(dim=-1)
    lse = top + torch.log(torch.exp(x - top[:, None]).sum(dim=-1))
    return torch.log(a.double()) + 2.0 * top.double() - lse.double()  # a = 0 gives -inf: everything kept


def rounded(t: torch.Tensor, up: bool) -> torch.Tensor:
    """(B,) float32: the smallest float32 >= t (up) or the largest <= t, so `logit >= it` is `logit >= t` exactly."""
    r = t.float()
    if up:
        return torch.where(r.double() < t, torch.nextafter(r, torch.full_like(r, math.inf)), r)
    return torch.where(r.double() > t, torch.nextafter(r, torch.full_like(r, -math.inf)), r)


def wide_kept(logits: torch.Tensor, a: torch.Tensor) -> torch.Tensor | None:
    """(B,) how many logits are >= top_a_threshold, without a float64 copy of the rows; None when a row's maximum
    is not finite (NaN, +inf). e**(x - top) in float32 is within (4 + |x - top|) units of float32 roundoff u of
    its value (one rounding of x - top, an exp within 1 ulp, 2 on CUDA), so the float64 sum S is within
    u * (4 + E_p[top - x]) <= u * (4 + log n) relative (E_p[top - x] is at most the entropy): the threshold lies
    within twice that of the float64 one, and a row with no logit inside that bound keeps the same count."""
    top = logits.amax(dim=-1)
    if not bool(torch.isfinite(top).all()):
        return None
    total = torch.exp(logits - top[:, None]).sum(dim=-1, dtype=torch.float64)
    scale = torch.log(a.double())
    threshold = scale + top.double() - torch.log(total)
    margin = 2.0**-24 * (8.0 + 2.0 * math.log(logits.shape[1])) + 2.0**-40 * (2.0 * top.double().abs() + scale.abs())
    count = functools.partial(torch.sum, dim=-1, dtype=torch.int32)  # a third of an int64 count's time
    kept = count(logits >= rounded(threshold - margin, up=False)[:, None])
    unsure = kept != count(logits >= rounded(threshold + margin, up=True)[:, None])
    if bool(unsure.any()):  # a logit inside the bound: the float64 threshold decides those rows
        rows = unsure.nonzero().flatten()
        exact = rounded(top_a_threshold(logits[rows], a[rows]), up=True)
        kept[rows] = count(logits[rows] >= exact[:, None])
    return kept.long()


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
        a = torch.where(off, torch.ones_like(a), a)
        wide = width >= filters.WIDE and not in_sync_free_step()  # (wide_kept reads the host)
        kept = wide_kept(cand.logits, a) if wide else None
        if kept is None:  # a prefix of the descending order, ties included
            kept = (cand.logits >= rounded(top_a_threshold(cand.logits, a), up=True)[:, None]).sum(dim=-1)
        counts = torch.clamp(torch.maximum(kept, min_keep), min=1, max=width)
        return cand.keep_best(counts, off, ctx.backend)


@hookimpl
def register_samplers(register):
    register(TopA)
