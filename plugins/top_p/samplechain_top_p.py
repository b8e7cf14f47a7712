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
        top, total = row_mass(cand.logits)  # over all current candidates, as llama.cpp's softmax
        if cand.is_sorted:
            counts = kept_counts(cand.logits, top, total, p, min_keep)
            return cand.keep_first(torch.where(off, width, counts))
        j = min(_FIRST_GUESS, width)
        while True:
            values, index = ctx.backend.topk(cand.logits, j)
            counts = kept_counts(values, top, total, p, min_keep)
            # the cut is inside the top j unless every one of them was kept (the mass may continue below)
            if j == width or bool(((counts < j) | off).all()):
                break
            j = min(j * 8, width)
        counts = torch.where(off, width, counts)
        return cand.restrict(values, index, counts, off)


@hookimpl
def register_samplers(register):
    register(TopP)
