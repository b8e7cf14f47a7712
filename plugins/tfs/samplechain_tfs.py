"""`tfs`: tail-free sampling: cut the sorted distribution where its curvature has accumulated to z.

Per row, over the candidates in descending order, p = softmax, d2[i] = |p[i] - 2 p[i+1] + p[i+2]| normalised to
sum 1, cdf = cumsum(d2). `z >= 1` is a no-op. Two references, which differ by one token at the cut
(`variant`):

- "llama.cpp" (default): `llama_sampler_tail_free_apply` (src/llama-sampling.cpp, removed from llama.cpp in
  2024): over the n finite candidates (-inf ones count as already removed); n <= 2 is a no-op; when the d2 sum is
  <= 1e-6 every d2 weighs 1/(n-2); the kept count is the first i with cdf[i] > z and i >= min_keep (all n when
  none). At least one token survives (llama.cpp could keep none with min_keep = 0).
- "webui": text-generation-webui's `TailFreeLogitsWarper` (modules/sampler_hijack.py), over the whole vocabulary
  (removed tokens are probability 0): sorted token j >= 1 is removed iff cdf[j-1] > z, and the vocabulary's last
  sorted token always is; the first min_keep are kept. No guard for a zero d2 sum (the cdf is NaN: only the last
  token is removed).

Probabilities and the cdf are float64 from the float32 logits. The d2 normaliser runs over every candidate, so the
plain path sorts the whole row. Rows of at least `filters.WIDE` unsorted candidates first try the M best (M = 256,
then 4096, a partial top-k): in sorted order d2[i] <= (p[i] - p[i+1]) + (p[i+1] - p[i+2]), so the d2 of the unseen
tail telescope to at most p[M-2] + p[M-1], which brackets the normaliser. When the first cdf crossing is the same
for both ends of the bracket (with a 1e-9 relative margin for rounding), that crossing is the reference's own; any
row left undecided (the cut in the tail, a near-uniform row, a margin too close) sends the batch to the full sort.
"""

from __future__ import annotations

import attrs
import torch

from samplechain import Candidates, Sampler, Stage, StepContext, filters, finite, hookimpl, in_range, one_of

VARIANTS = ("llama.cpp", "webui")


@attrs.frozen
class TfsParams:
    z: float = attrs.field(validator=[finite, in_range(0.0, 1.0, hint="1 disables")])
    min_keep: int = attrs.field(default=1, validator=in_range(0, None))
    variant: str = attrs.field(default="llama.cpp", validator=one_of(*VARIANTS))


def second_derivatives(probs: torch.Tensor) -> torch.Tensor:
    """(B, J) sorted probabilities -> (B, J - 2) |second differences|."""
    return (probs[:, :-2] - 2.0 * probs[:, 1:-1] + probs[:, 2:]).abs()


def llama_counts(logits: torch.Tensor, z: torch.Tensor, min_keep: torch.Tensor) -> torch.Tensor:
    """(B,) kept count per row of sorted logits (B, K), llama.cpp's rule (n <= 2 rows keep n)."""
    x = logits.double()
    n = torch.isfinite(x).sum(dim=-1)  # the finite candidates come first in a sorted row
    if x.shape[1] <= 2:  # no second difference at all: n <= 2 rows are a no-op
        return n.clamp(min=1)
    probs = torch.softmax(x, dim=-1)
    d2 = second_derivatives(probs)  # (B, K - 2)
    i = torch.arange(d2.shape[1], device=x.device)[None, :]
    inside = i < (n - 2)[:, None]  # d2[i] uses candidates i..i+2, all finite
    d2 = torch.where(inside, d2, torch.zeros_like(d2))
    total = d2.sum(dim=-1, keepdim=True)
    uniform = inside.double() / (n - 2).clamp(min=1).double()[:, None]
    weights = torch.where(total > 1e-6, d2 / total.clamp(min=1e-300), uniform)
    cdf = torch.cumsum(weights, dim=-1)
    cut = inside & (cdf > z.double()[:, None]) & (i >= min_keep[:, None])
    first = torch.where(cut, i, torch.full_like(i, logits.shape[1])).amin(dim=-1)  # K where none
    counts = torch.where(cut.any(dim=-1), first, n)
    counts = torch.where(n <= 2, n, counts)
    return counts.clamp(min=1)


def webui_counts(logits: torch.Tensor, z: torch.Tensor, min_keep: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """(B,) kept count per row of sorted logits (B, K), text-generation-webui's rule on the full vocabulary."""
    x = logits.double()
    B, K = x.shape
    probs = torch.softmax(x, dim=-1)
    pad = min(2, vocab_size - K)  # tokens outside the candidates are probability-0 tokens of the vocabulary;
    if pad > 0:  # beyond two of them the second differences are all 0, so two stand for the whole tail
        probs = torch.cat([probs, torch.zeros(B, pad, dtype=probs.dtype, device=probs.device)], dim=-1)
    d2 = second_derivatives(probs)  # (B, K + pad - 2)
    cdf = torch.cumsum(d2 / d2.sum(dim=-1, keepdim=True), dim=-1)  # NaN when the sum is 0, as webui
    j = torch.arange(K, device=x.device)[None, :]
    removed = torch.zeros(B, K, dtype=torch.bool, device=x.device)
    m = min(K - 1, cdf.shape[1])  # sorted tokens 1..m have a cdf entry before them
    if m > 0:
        removed[:, 1 : 1 + m] = cdf[:, :m] > z.double()[:, None]
    if pad == 0:
        removed[:, K - 1] = True  # the last token of the vocabulary
    kept = ~removed | (j < min_keep[:, None])
    # `removed` is a suffix (the cdf is non-decreasing), so the kept tokens are a prefix
    return kept.sum(dim=-1).clamp(min=1)


_TRIES = (256, 4096)  # widths of the partial top-k the bracket is tried on
_MARGIN = 1e-9  # relative: far above float64 rounding of the sums, far below any real change in the cdf


def bracketed_counts(
    values: torch.Tensor,
    row_sum: torch.Tensor,
    z: torch.Tensor,
    min_keep: torch.Tensor,
    off: torch.Tensor,
    variant: str,
) -> torch.Tensor | None:
    """(B,) kept counts from the M best logits of each row (values (B, M), descending) when every row's cut is
    decided by the bracket on the d2 normaliser, else None. row_sum (B,): sum of exp(x - max) over the whole row,
    float32 (only for llama.cpp's 1e-6 uniform rule, which is decided with a 1e-4 margin). Rows where off[b] are
    not looked at (the caller keeps them whole)."""
    q = torch.exp(values.double() - values[:, :1].double())  # p up to the row's normaliser, which cancels in cdf
    M = values.shape[1]
    d2 = second_derivatives(q)  # (B, M - 2): d2[i] for i < M - 2, all inside the M best
    finite = torch.isfinite(values)
    n_top = finite.sum(dim=-1)  # == M: the row may go on past the M best
    complete = n_top < M  # llama.cpp: nothing past the M best counts; webui counts the zeros after them too
    if variant != "llama.cpp":
        complete = torch.zeros_like(complete)
    i = torch.arange(M - 2, device=values.device)[None, :]
    if variant == "llama.cpp":
        inside = i < (n_top - 2)[:, None]
        d2 = torch.where(inside, d2, torch.zeros_like(d2))
    else:
        inside = torch.ones_like(d2, dtype=torch.bool)
    head = d2.sum(dim=-1)
    tail = torch.where(complete, torch.zeros_like(head), q[:, M - 2] + q[:, M - 1])  # telescoped bound
    lo, hi = head * (1.0 - _MARGIN), (head + tail) * (1.0 + _MARGIN)
    if variant == "llama.cpp":  # the uniform rule must be decided: total / normaliser vs 1e-6, on both ends
        scale = row_sum.double()
        if not bool(((lo / (scale * (1 + 1e-4)) > 1e-6) | complete & (n_top <= 2) | off).all()):
            return None
    elif not bool(((lo > 0) & (min_keep < M - 2) | off).all()):
        return None
    cum = torch.cumsum(d2, dim=-1)
    zz = z.double()[:, None]
    allowed = inside & (i >= min_keep[:, None]) if variant == "llama.cpp" else inside
    possible = allowed & (cum > zz * lo[:, None])
    certain = allowed & (cum > zz * hi[:, None])
    far = torch.full_like(i, M)
    first_possible = torch.where(possible, i, far).amin(dim=-1)
    first_certain = torch.where(certain, i, far).amin(dim=-1)
    found = first_possible < M
    decided = found & (first_possible == first_certain) | ~found & complete
    if variant == "llama.cpp":
        decided |= n_top <= 2
    if not bool((decided | off).all()):
        return None
    if variant == "llama.cpp":
        counts = torch.where(found, first_possible, n_top)
        return torch.where(n_top <= 2, n_top, counts).clamp(min=1)
    return torch.maximum(first_possible + 1, min_keep).clamp(min=1)


class Tfs(Sampler):
    name = "tfs"
    stage = Stage.FILTER
    Params = TfsParams
    request_aliases = {"tfs": "z", "tfs_z": "z", "min_keep": "min_keep"}
    summary = "tail-free sampling: cut where the normalised |second derivative| of the sorted probs reaches z"

    def is_noop(self, ctx: StepContext) -> bool:
        shared = ctx.scalar("z")
        return shared is not None and shared >= 1.0

    def apply(self, cand: Candidates, ctx: StepContext) -> Candidates:
        if self.is_noop(ctx):
            return cand
        z, min_keep = ctx.param("z"), ctx.param("min_keep")
        off = z >= 1.0
        if bool(off.all()):
            return cand
        if (
            not cand.is_sorted
            and cand.width >= filters.WIDE
            and (self.params.variant == "llama.cpp" or cand.width == cand.vocab_size)
        ):
            x = cand.logits
            top = x.amax(dim=-1, keepdim=True)
            row_sum = torch.exp(x - top).sum(dim=-1)
            for width in _TRIES:
                values, index = ctx.backend.topk(x, min(width, cand.width))
                counts = bracketed_counts(values, row_sum, z, min_keep, off, self.params.variant)
                if counts is not None:
                    return cand.restrict(values, index, torch.where(off, values.shape[1], counts), off)
        ordered = cand.sorted(ctx.backend)
        if self.params.variant == "webui":
            counts = webui_counts(ordered.logits, z, min_keep, cand.vocab_size)
        else:
            counts = llama_counts(ordered.logits, z, min_keep)
        counts = torch.where(off, ordered.width, counts)
        if bool((counts >= ordered.width).all()):
            return cand
        return ordered.keep_first_settled(counts)


@hookimpl
def register_samplers(register):
    register(Tfs)
