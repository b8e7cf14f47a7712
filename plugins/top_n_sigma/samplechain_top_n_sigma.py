"""`top_n_sigma`: keep the candidates whose logit is within n standard deviations of the top logit.

llama.cpp's `llama_sampler_top_n_sigma` (src/llama-sampler.cpp), per row: over the finite candidates (-inf ones
are skipped, as llama.cpp skips them), mean and population standard deviation of the logits; every candidate
with `logit < max - n * std` is removed. `n <= 0` is a no-op (llama.cpp since PR #13345; its default is -1), and
so is a row with fewer than two candidates. llama.cpp has no min_keep; here at least `min_keep` (default 1, which
changes nothing: the top logit always survives) candidates are kept.

Mean, std and the threshold are computed in float64 from the float32 logits (llama.cpp accumulates in float32),
so the two can differ only for a logit within float32 rounding of the threshold. The kept set does not depend on
the row's width: rows of `filters.WIDE` candidates or more take one float64 pass of sums (of x and x * x) instead of
sigma_threshold's float64 copies of the row, which places the threshold within a bound of sigma_threshold's; the
survivors are read with one `at_least` call at the bound's lower edge, and only a row with a logit inside the bound
(a threshold landing on a logit: two candidates and n = 2 put it exactly on the lower one) is settled by
sigma_threshold itself.
"""

from __future__ import annotations

import attrs
import torch

from samplechain import Candidates, Sampler, Stage, StepContext, filters, finite, hookimpl, in_range
from samplechain.contracts import in_sync_free_step


@attrs.frozen
class TopNSigmaParams:
    n: float = attrs.field(validator=finite)  # <= 0 disables (llama.cpp's default is -1)
    min_keep: int = attrs.field(default=1, validator=in_range(0, None))


def sigma_threshold(logits: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """(B,) float64 `max - n * std` over each row's finite logits (population std, as llama.cpp)."""
    x = logits.double()
    valid = torch.isfinite(x)
    count = valid.sum(dim=-1).clamp(min=1).double()
    zero = torch.zeros((), dtype=torch.float64, device=x.device)
    mean = torch.where(valid, x, zero).sum(dim=-1) / count
    dev = torch.where(valid, x - mean[:, None], zero)
    std = torch.sqrt((dev * dev).sum(dim=-1) / count)
    top = torch.where(valid, x, torch.full_like(x, float("-inf"))).amax(dim=-1)
    return top - n.double() * std


# How far apart two float64 variances of one row's float32 logits can lie, relative to the row's mean square: this
# module's from sums of x and x * x (each x * x exact in float64) and sigma_threshold's from two passes, summed in
# any order (a sum's rounding is at most ~c ulps of the sum of magnitudes; 2**-40 allows c up to ~2000)
_VARIANCE_SLACK = 2.0**-40
_ROUNDING = 2.0**-48  # the few roundings of `top - n * std`, relative to |top| + |n| * std, in either computation


def wide_bounds(
    logits: torch.Tensor, n: torch.Tensor, off: torch.Tensor, finite_count: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """(low, high, top) per row: low <= sigma_threshold(logits, n) <= high (float64, (B,); ~1e-12 relative apart)
    from one float64 pass of sums over the finite logits (finite_count (B,) of them), and the rows' maxima
    (float32). None when a row that is not off has a maximum that is not finite (NaN, +inf). The bound: the
    variances differ by at most slack = _VARIANCE_SLACK * mean square, so the standard deviations by at most
    min(slack / std, sqrt(slack)) <= 2 slack / (std + sqrt(slack))."""
    top = logits.amax(dim=-1)
    if not bool((torch.isfinite(top) | off).all()):
        return None
    x = torch.nan_to_num(logits, neginf=0.0).double()  # -inf entries add nothing; count skips them
    count = finite_count.clamp(min=1).double()
    mean = x.sum(dim=-1) / count
    square = torch.linalg.vecdot(x, x) / count
    std = torch.sqrt(torch.clamp(square - mean * mean, min=0.0))
    slack = square * _VARIANCE_SLACK
    spread = torch.where(slack > 0.0, 2.0 * slack / (std + torch.sqrt(slack)), 0.0)
    scale = torch.broadcast_to(n, off.shape).double()
    threshold = top.double() - scale * std
    margin = scale.abs() * spread + _ROUNDING * (top.double().abs() + scale.abs() * std)
    return threshold - margin, threshold + margin, top


class TopNSigma(Sampler):
    name = "top_n_sigma"
    sync_free = True  # no host read in a sync-free step (plugins/cuda/tests/test_sync_free.py)
    stage = Stage.FILTER
    Params = TopNSigmaParams
    request_aliases = {"top_n_sigma": "n", "min_keep": "min_keep"}
    summary = "keep tokens with logit >= max - n * std of the logits (llama.cpp's top-n-sigma)"

    def is_noop(self, ctx: StepContext) -> bool:
        shared = ctx.scalar("n")
        return shared is not None and shared <= 0.0

    def apply(self, cand: Candidates, ctx: StepContext) -> Candidates:
        if self.is_noop(ctx):
            return cand
        n, min_keep = ctx.param("n"), ctx.param("min_keep")
        width = cand.width
        finite_count = torch.isfinite(cand.logits).sum(dim=-1)
        off = (n <= 0.0) | (finite_count <= 1)
        sync_free = in_sync_free_step()
        if not sync_free and bool(off.all()):
            return cand
        if width >= filters.WIDE and not cand.is_sorted and not sync_free:  # float64 sums, an at_least read
            wide = self._wide(cand, ctx, n, min_keep, off, finite_count)
            if wide is not None:
                return wide
        threshold = sigma_threshold(cand.logits, n)
        keep = cand.logits.double() >= threshold[:, None]  # a prefix of the descending order, ties included
        shared_keep = ctx.scalar("min_keep")
        if sync_free and not cand.is_sorted and shared_keep is not None and shared_keep <= 1:
            return cand.masked(keep | off[:, None])  # the largest logit is always kept: the mask is the answer
        counts = torch.clamp(torch.maximum(keep.sum(dim=-1), min_keep), max=width)
        return cand.keep_best(counts, off, ctx.backend)

    @staticmethod
    def _wide(
        cand: Candidates,
        ctx: StepContext,
        n: torch.Tensor,
        min_keep: torch.Tensor,
        off: torch.Tensor,
        finite_count: torch.Tensor,
    ) -> Candidates | None:
        """Wide rows: the survivors of sigma_threshold's comparison, found and compacted by one at_least call at the
        lower edge of wide_bounds, sigma_threshold computed only for the rows with a logit between the edges. None
        when a row's maximum is not finite (a NaN or +inf logit): the float64 path then takes the batch."""
        x = cand.logits
        bounds = wide_bounds(x, n, off, finite_count)
        if bounds is None:
            return None
        low, high, top = bounds
        down = low.float()  # the largest float32 <= low: `logit >= it` is `logit >= low` exactly
        down = torch.where(down.double() > low, torch.nextafter(down, torch.full_like(down, float("-inf"))), down)
        down = torch.where(off, top, down)  # off rows must not widen the read
        need = int(torch.where(off, 0, min_keep).max())
        compacted = cand.ids is not None  # columns not in token-id order: ties settled by id in restrict
        values, index, above = ctx.backend.at_least(
            x, down, min(need + compacted, cand.width) if need > 1 else 0, ordered=need > 1
        )  # min_keep <= 1: the cut is the count
        inside = torch.arange(values.shape[1], device=x.device)[None, :] < above[:, None]
        unsure = ((values.double() <= high[:, None]) & inside).any(dim=-1) & ~off
        if bool(unsure.any()):  # a logit between the edges: sigma_threshold's own value decides those rows
            rows = unsure.nonzero().flatten()
            exact = sigma_threshold(x[rows], torch.broadcast_to(n, off.shape)[rows])
            above = above.clone()
            above[rows] = ((values[rows].double() >= exact[:, None]) & inside[rows]).sum(dim=-1)
        counts = torch.clamp(torch.maximum(above, min_keep), max=cand.width)
        return cand.restrict(values, index, torch.where(off, cand.width, counts), off, ranked=not compacted)


@hookimpl
def register_samplers(register):
    register(TopNSigma)
