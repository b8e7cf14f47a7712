"""`top_p` (nucleus): keep the smallest set of most likely candidates whose probability mass reaches p.

llama.cpp semantics: probabilities are the softmax over the current candidates; walking down the sorted
candidates, the token at which the cumulative mass first reaches p is the last one kept (so a candidate is kept
iff the mass strictly above it is < p); p >= 1 is a no-op; at least min_keep survive. transformers'
TopPLogitsWarper removes tokens whose ascending cumulative mass is <= 1 - p: the same set, rounded in float32
instead of our float64 cumulative sum.

Without a preceding top-k the candidates are unsorted and a full sort of the vocabulary would dominate the
step, so the cut is found on a partial top-k that grows (x8) until its mass reaches p in every row.
"""

from __future__ import annotations

import attrs
import torch

from samplechain import Candidates, Sampler, Stage, StepContext, finite, hookimpl, in_range

_FIRST_GUESS = 64  # partial top-k width tried first on unsorted candidates


@attrs.frozen
class TopPParams:
    p: float = attrs.field(validator=[finite, in_range(0.0, 1.0, hint="1 disables")])
    min_keep: int = attrs.field(default=1, validator=in_range(0, None))


def row_mass(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: the top logit and the normaliser sum(exp(logit - top)), both float64, (B, 1) and (B,).

    float64 throughout: a float32 log-sum-exp round trip moves the mass by ~1e-7, enough to flip a cut that
    lies exactly on p (llama.cpp's test: probabilities 0.1..0.4 with p = 0.7 keep two tokens, not three).
    """
    top = logits.amax(dim=-1, keepdim=True).double()
    return top, torch.exp(logits.double() - top).sum(dim=-1)


def kept_counts(
    values: torch.Tensor, top: torch.Tensor, total: torch.Tensor, p: torch.Tensor, min_keep: torch.Tensor
) -> torch.Tensor:
    """How many of the sorted candidates values (B, J) top-p keeps, given the row mass from row_mass()."""
    probs = torch.exp(values.double() - top) / total[:, None]  # (B, J)
    cum = torch.cumsum(probs, dim=-1)
    above = torch.cat([torch.zeros_like(cum[:, :1]), cum[:, :-1]], dim=-1)  # mass strictly above each candidate
    counts = (above < p.double()[:, None]).sum(dim=-1)  # `above` is non-decreasing: a prefix is kept
    # the token that reaches p is always kept, so at least one survives even with p = 0 and min_keep = 0
    return torch.clamp(torch.maximum(counts, min_keep), min=1, max=values.shape[1])


_WIDE = 16384  # from this many candidates on, the cut is located from a histogram of the probabilities
_BUCKET_SHIFT = 20  # float32 bits >> 20: sign, exponent and 3 mantissa bits, 2048 buckets ~9% wide, in order
_MASS_MARGIN = 1e-4  # the histogram is float32: aim past p by this much so the kept set is surely covered


def wide_row_mass(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For wide rows: float32 probabilities from one fused softmax, and the top logit and normaliser in float64.

    probs = exp(x - top) / S' with S' softmax's own float32 sum (which may be off by ~1e-5 on 10^5 terms), and
    p_top = 1 / S'; torch's sum of the probabilities is cascaded (~1e-7), so S = sum(probs) / p_top recovers the
    true normaliser to float32 accuracy without a float64 pass over the row."""
    probs = torch.softmax(logits, dim=-1)
    top, arg = logits.max(dim=-1, keepdim=True)
    total = probs.sum(dim=-1).double() / probs.gather(1, arg).squeeze(1).double()
    return probs, top.double(), total


def superset_threshold(probs: torch.Tensor, top: torch.Tensor, total: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """A logit per row (B,) at or below the last token top-p keeps, without a sort: the probabilities are
    bucketed by their float32 bit pattern (monotone in the value), the bucket mass accumulated from the top, and
    the lower edge of the bucket where it passes p (plus a margin) turned back into a logit (minus a margin)."""
    buckets = 1 << (31 - _BUCKET_SHIFT)
    keys = (probs.view(torch.int32) >> _BUCKET_SHIFT).long()
    hist = torch.zeros(probs.shape[0], buckets, dtype=probs.dtype, device=probs.device).scatter_add_(1, keys, probs)
    from_top = hist.flip(1).cumsum(dim=1, dtype=torch.float64)
    before = (from_top < (p.double() + _MASS_MARGIN)[:, None]).sum(dim=1)  # buckets entirely above the cut
    key = torch.clamp(buckets - 1 - before, min=0)
    edge = (key << _BUCKET_SHIFT).to(torch.int32).view(torch.float32).double()  # smallest prob in that bucket
    return (top.squeeze(1) + torch.log(edge * total) - 1e-3).float()


class TopP(Sampler):
    name = "top_p"
    stage = Stage.FILTER
    Params = TopPParams
    request_aliases = {"top_p": "p", "min_keep": "min_keep"}
    summary = "keep the smallest most-likely set with probability mass >= p"

    def apply(self, cand: Candidates, ctx: StepContext) -> Candidates:
        shared = ctx.scalar("p")
        if shared is not None and shared >= 1.0:
            return cand
        p, min_keep = ctx.param("p"), ctx.param("min_keep")
        off = p >= 1.0  # (B,)
        width = cand.width
        if cand.is_sorted or width < _WIDE:
            top, total = row_mass(cand.logits)  # over all current candidates, as llama.cpp's softmax
        if cand.is_sorted:
            counts = kept_counts(cand.logits, top, total, p, min_keep)
            return cand.keep_first(torch.where(off, width, counts))
        need = int(torch.where(off, 0, min_keep).max())
        if width >= _WIDE:
            # locate the cut first, then read only what lies above it: no growing top-k, no sort
            probs, top, total = wide_row_mass(cand.logits)
            threshold = superset_threshold(probs, top, total, p)
            threshold = torch.where(off, top.squeeze(1).float(), threshold)  # off rows must not widen the read
            values, index, _ = ctx.backend.at_least(cand.logits, threshold, need)
            counts = kept_counts(values, top, total, p, min_keep)
            j = values.shape[1]
        else:
            j = min(_FIRST_GUESS, width)
            values, index = ctx.backend.topk(cand.logits, j)
            counts = kept_counts(values, top, total, p, min_keep)
        # the cut is inside the top j unless every one of them was kept (the mass may continue below)
        while j < width and bool(((counts >= j) & ~off).any()):
            j = min(j * 8, width)
            values, index = ctx.backend.topk(cand.logits, j)
            counts = kept_counts(values, top, total, p, min_keep)
        counts = torch.where(off, width, counts)
        return cand.restrict(values, index, counts, off)


@hookimpl
def register_samplers(register):
    register(TopP)
