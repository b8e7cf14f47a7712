"""`top_n_sigma`: keep the candidates whose logit is within n standard deviations of the top logit.

llama.cpp's `llama_sampler_top_n_sigma` (src/llama-sampler.cpp), per row: over the finite candidates (-inf ones
are skipped, as llama.cpp skips them), mean and population standard deviation of the logits; every candidate
with `logit < max - n * std` is removed. `n <= 0` is a no-op (llama.cpp since PR #13345; its default is -1), and
so is a row with fewer than two candidates. llama.cpp has no min_keep; here at least `min_keep` (default 1, which
changes nothing: the top logit always survives) candidates are kept.

Mean, std and the threshold are computed in float64 from the float32 logits (llama.cpp accumulates in float32),
so the two can differ only for a logit within float32 rounding of the threshold. On rows of 16384 candidates or
more the statistics are float32 (torch's cascaded sums) and the survivors are read with one `at_least` call: the
threshold then agrees with the float64 one to ~1e-7 relative.
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
        if width >= filters.WIDE and not cand.is_sorted and not sync_free:  # float32 statistics, an at_least read
            wide = self._wide(cand, ctx, n, min_keep, off)
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
        cand: Candidates, ctx: StepContext, n: torch.Tensor, min_keep: torch.Tensor, off: torch.Tensor
    ) -> Candidates | None:
        """Wide rows: float32 statistics (torch's cascaded sums, ~1e-7 relative) instead of float64 copies of
        the row, the float64 threshold rounded up to the next float32 (so `logit >= it` is the float64
        comparison exactly), and the survivors found and compacted by one at_least call. None when a row's
        float32 variance overflowed (logits near the float32 limit): the float64 path then takes the batch."""
        x = cand.logits
        valid = torch.isfinite(x)
        count = valid.sum(dim=-1).clamp(min=1)
        zero = x.new_zeros(())
        mean = torch.where(valid, x, zero).sum(dim=-1) / count
        dev = torch.where(valid, x - mean[:, None], zero)
        std = torch.sqrt((dev * dev).sum(dim=-1) / count).double()
        if not bool((torch.isfinite(std) | off).all()):
            return None
        top = torch.where(valid, x, float("-inf")).amax(dim=-1).double()
        threshold = top - n.double() * std
        up = threshold.float()
        up = torch.where(up.double() < threshold, torch.nextafter(up, torch.full_like(up, float("inf"))), up)
        up = torch.where(off, top.float(), up)  # off rows must not widen the read
        need = int(torch.where(off, 0, min_keep).max())
        compacted = cand.ids is not None  # columns not in token-id order: ties settled by id in restrict
        values, index, above = ctx.backend.at_least(
            x, up, min(need + compacted, cand.width) if need > 1 else 0, ordered=need > 1
        )  # min_keep <= 1: the cut is the count
        counts = torch.clamp(torch.maximum(above, min_keep), max=cand.width)
        return cand.restrict(values, index, torch.where(off, cand.width, counts), off, ranked=not compacted)


@hookimpl
def register_samplers(register):
    register(TopNSigma)
