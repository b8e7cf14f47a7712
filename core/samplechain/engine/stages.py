"""The stages of one step of a chain, each on the step's `Step`: the transforms and filters in order with the
executor's fusions (`_filter`: an order-preserving transform after a rank-only filter, a sparse change into a
top-k; `_fusion`: the tail a backend's fused kernel runs), each sampler's StepContext, the stateful samplers' new
state, and the slow replay a failing step takes. `Chain` (chain.py) runs them as its pipeline."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import attrs
import torch

from ..contracts import FUSED_SAMPLE, Candidates, FusedPart, Sampler, StepContext
from ..errors import SamplechainError
from ..filters import patched_top
from .logprobs import kept_copy
from .step import FusionPlan, Step

__all__ = ["StepStages"]

_FUSE_MIN = 1 << 20  # logits elements from which skipping the (B, V) copy pays for the fusion's extra calls


class StepStages:
    """The stage methods of `Chain`, on its samplers and the flags it derives from their declarations."""

    samplers: tuple[Sampler, ...]
    _stateful: list[int]  # the samplers that keep per-request state
    _sparse: set[int]  # the samplers that declare `has_sparse_changes`
    _fusable: bool  # the selector declares a fused part and keeps no state
    _fusion_kept: tuple[Any, Any, FusionPlan | None] | None  # (batch view, backend, its plan): `_fusion`'s last
    _wrap: Callable[..., SamplechainError]
    _checked: Callable[[Any], tuple[torch.Tensor, bool]]

    def _filter_keeping(self, step: Step, cand: Candidates) -> Candidates:
        """`_filter`, stopping after each stage logprobs_at asks for to keep a copy of it in `step.kept` (-1 the
        logits as given, i after entry i): no swap or fusion crosses such a stage."""
        last = len(self.samplers) - 1
        step.kept = {}
        begin = 0
        for stage in sorted({stage for stage, _ in step.modes or () if stage < last}):
            if stage >= 0:
                cand = self._filter(step, cand, begin=begin, end=stage + 1)
                begin = stage + 1
            step.kept[stage] = kept_copy(cand)
        return self._filter(step, cand, begin=begin)

    def _updates(self, step: Step, token_ids: torch.Tensor) -> dict[tuple[int, str], torch.Tensor]:
        """Every stateful sampler's new state rows; nothing is written to the store here."""
        updates: dict[tuple[int, str], torch.Tensor] = {}
        last = len(self.samplers) - 1
        for i in self._stateful:  # compute everything first: a failure here commits nothing
            ctx = self._new_context(step, i, unconditional=False)
            if i == last and step.chosen is not None:  # the selector sees what it chose, in this very step
                ctx.selected_candidates, ctx.selected = step.cand, step.chosen
            try:
                for name, rows in self.samplers[i].accept(ctx, token_ids).items():
                    updates[(i, name)] = rows
            except Exception as exc:
                raise self._wrap(i, exc, phase="accept") from exc
        return updates

    def _filter(self, step: Step, cand: Candidates, *, begin: int = 0, end: int | None = None) -> Candidates:
        """Run the samplers begin .. end - 1 (default: every sampler but the selector). An order-preserving
        transform (temperature, t > 0) right before a rank-only filter (top_k) runs after it instead, on the k
        survivors rather than the whole vocabulary: the same values, one (B, V) pass fewer."""
        i, last = begin, len(self.samplers) - 1 if end is None else end
        while i < last:
            ctx = self._context(step, i)
            if i in self._sparse and cand.ids is None and not cand.writable and cand.logits.numel() >= _FUSE_MIN:
                fused = self._fuse_sparse_then_rank(step, cand, ctx, i, last)
                if fused is not None:
                    cand, i = fused
                    continue
            swap = i + 1 < last and self._swaps(i, ctx)
            steps = [(i + 1, self._context(step, i + 1)), (i, ctx)] if swap else [(i, ctx)]
            for j, ctx_j in steps:
                try:
                    cand = self.samplers[j].apply(cand, ctx_j)
                except Exception as exc:
                    raise self._wrap(j, exc) from exc
            i += len(steps)
        return cand

    def _swaps(self, i: int, ctx: StepContext) -> bool:
        """Sampler i is an order-preserving transform on this batch right before a rank-only filter, which the
        executor runs first."""
        return self.samplers[i + 1].is_rank_only() and self.samplers[i].preserves_order(ctx)

    def _fusion(self, step: Step) -> FusionPlan | None:
        """The chain's tail a backend may run in one truncate-and-draw kernel (`FUSED_SAMPLE`): the selector and the
        samplers before it, back to the first that is neither a no-op on this batch nor a `FusedPart`; None where
        there is no such kernel. Reads nothing on the device. The answer is kept while the batch's parameters stay
        (the store's cached BatchView): `is_noop` and `fused` read only those."""
        if not self._fusable:
            return None
        kept = self._fusion_kept
        if kept is not None and kept[0] is step.view and kept[1] is step.backend:
            return kept[2]
        plan = self._new_fusion(step)
        self._fusion_kept = (step.view, step.backend, plan)
        return plan

    def _new_fusion(self, step: Step) -> FusionPlan | None:
        kernel = step.backend.kernel(FUSED_SAMPLE)
        if kernel is None:
            return None
        last = len(self.samplers) - 1
        found: list[tuple[int, FusedPart]] = []
        start = last
        takes = getattr(kernel, "fused_kinds", None)  # the parts the kernel may run: stop the walk at another
        for i in range(last - 1, -1, -1):
            ctx = self._context(step, i)
            if not self._call(i, self.samplers[i].is_noop, ctx):
                part = self._call(i, self.samplers[i].fused, ctx) if self.samplers[i].has_fused_part else None
                if part is None:
                    break
                if takes is not None and part.kind not in takes:
                    return None
                found.append((i, part))
            start = i
        if start > 0 and self._swaps(start - 1, self._context(step, start - 1)):
            return None  # _filter would run the tail's first sampler (top_k) before the one in front of it
        select = self._call(last, self.samplers[last].fused, self._context(step, last))
        if select is None or select.kind not in ("dist", "greedy"):
            return None
        parts = []
        ranked = False  # a top_k among the parts after this one
        for i, part in found:  # back to front
            if (
                part.kind == "temperature"
                and ranked
                and not isinstance(part.value, torch.Tensor)
                and not self._swaps(i, self._context(step, i))
            ):
                # a shared temperature ranks a following top_k by the raw logits only where _filter swaps them
                positions = step.positions
                part = attrs.evolve(
                    part,
                    value=torch.full(positions.shape, float(part.value), dtype=torch.float32, device=positions.device),
                )
            ranked = ranked or part.kind == "top_k"
            parts.append(part)
        parts.reverse()
        return FusionPlan(start, kernel, parts, select)

    def _fuse_sparse_then_rank(
        self, step: Step, cand: Candidates, ctx: StepContext, i: int, last: int
    ) -> tuple[Candidates, int] | None:
        """Sampler i changes a few tokens of the full vocabulary (penalties) and the next sampler before `last` that
        is not disabled this step keeps the k best (top_k): take the k best of the changed rows from a partial
        top-k of the original ones (filters.patched_top) instead of copying (B, V) to write the change. The same
        candidates and logits as running the two in turn; None when the pattern does not apply."""
        j = i + 1
        while j < last:
            ctx_j = self._context(step, j)
            if not self._call(j, self.samplers[j].is_noop, ctx_j):
                break
            j += 1
        if j >= last or not self.samplers[j].is_rank_only():
            return None
        counts = self._call(j, self.samplers[j].rank_counts, cand, ctx_j)
        changes = None if counts is None else self._call(i, self.samplers[i].sparse_changes, cand, ctx)
        if changes is None:
            return None
        fused = self._call(j, patched_top, cand, changes, counts, step.backend)
        return None if fused is None else (fused, j + 1)

    def _call(self, i: int, fn, *args):
        """fn(*args) on behalf of sampler i: an exception names the sampler and the step."""
        try:
            return fn(*args)
        except Exception as exc:
            raise self._wrap(i, exc) from exc

    def _context(self, step: Step, i: int) -> StepContext:
        """Sampler i's StepContext for this step, built once per step (`step.contexts`)."""
        ctx = step.contexts.get(i)
        if ctx is None:
            ctx = step.contexts[i] = self._new_context(step, i)
        return ctx

    def _new_context(self, step: Step, i: int, *, unconditional: bool = True) -> StepContext:
        """A fresh StepContext of sampler i: its state read from the store now (unconditional=False: without the
        unconditional logits, as accept gets it)."""
        state = step.store.state_of(step.view, i) if i in self._stateful else {}
        history, lengths = step.history if step.history is not None else (None, None)
        missing = None
        if history is None and self.samplers[i].needs_history():
            missing = (
                f"{self.samplers[i].qualified_name()} reads the tokens so far: pass history= (B, L) token ids "
                "(prompt then generated, left padding as -1) to chain.sample; "
                "samplechain.generation.generate does this for you"
            )
        view = step.view
        return StepContext(
            step.backend,
            view.params[i],
            view.scalars[i],
            step.positions,
            i,
            view.request_ids,
            state,
            history,
            lengths,
            unconditional_logits=step.unconditional if unconditional else None,
            missing_history=missing,
            bounds=view.bounds[i] if view.bounds else {},
        )

    def _stages(self, step: Step) -> Iterator[Candidates]:
        """The candidates as given (checked again from the caller's tensor: the step may have written its own
        copy), then after each transform and filter in the declared order, without the executor's fusions: the
        slow path a failing step takes to find the stage that emptied a row. Nothing is accepted."""
        logits, writable = self._checked(step.given)
        cand = Candidates(logits, None, logits.shape[1], False, writable)
        yield cand
        for i in range(len(self.samplers) - 1):
            cand = self._call(i, self.samplers[i].apply, cand, self._new_context(step, i))
            yield cand
