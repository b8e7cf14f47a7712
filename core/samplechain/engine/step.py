"""What one step of a chain holds (`Step`) and what it returns (`SampleOutput`; `DeferredSample` for a step whose
acceptance waits, `Chain.sample_deferred`). The executor that fills them is `chain.Chain`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import attrs
import torch

from ..contracts import Backend, Candidates, FusedPart, StepContext
from .store import BatchView, RequestStore

__all__ = ["DeferredSample", "FusionPlan", "SampleOutput", "Step"]


@attrs.frozen
class SampleOutput:
    """token_ids (B,) int64; logprobs (B,) float32 of each chosen token under the processed distribution (or the
    stage and kind `logprobs_at` asked for: a logit where it asked for logits); scores (B, V) float32 processed
    logits when asked for (return_scores=True), else None; top_logprobs, when asked for (top_logprobs=n > 0), a pair
    (values (B, n) float32, token ids (B, n) int64) of the n most likely tokens under the same stage and kind, best
    first (-inf, with the id of some removed token, where a stage has fewer than n candidates left); ranks, when a
    stage other than the default was asked for or top_logprobs > 0, (B,) int64 rank of each chosen token under
    that distribution (1 for the most likely; tokens tied with it count, as vLLM's selected_token_ranks).

    On a backend whose step never waits for the host (`Backend.sync_free`: cuda) the step's check of its tokens
    is deferred to a device flag: call `check()` where the tokens are read anyway (generate() does); it raises
    the error the step would have raised, and a failed step changed no request's state."""

    token_ids: torch.Tensor
    logprobs: torch.Tensor
    scores: torch.Tensor | None = None
    deferred: tuple[torch.Tensor, Callable[[], Exception]] | None = attrs.field(default=None, repr=False, eq=False)
    top_logprobs: tuple[torch.Tensor, torch.Tensor] | None = attrs.field(default=None, eq=False)
    ranks: torch.Tensor | None = attrs.field(default=None, eq=False)

    def check(self) -> SampleOutput:
        """Raise the step's deferred error, if any (one host read of a device flag); returns self."""
        if self.deferred is not None:
            failed, error = self.deferred
            if bool(failed):
                raise error()
        return self


@attrs.frozen
class DeferredSample:
    """A step whose acceptance waits (`Chain.sample_deferred`): `output` is what `Chain.sample` returns; the
    stateful samplers' new state rows are computed (so nothing can fail later) but written, with every row's RNG
    position moved, only by `commit()`. MixedChains computes every group's before it commits any."""

    output: SampleOutput
    store: RequestStore | None = None  # None: an empty batch, nothing to commit
    view: BatchView | None = attrs.field(default=None, repr=False)
    updates: Mapping[tuple[int, str], torch.Tensor] = attrs.field(factory=dict, repr=False)
    failed: torch.Tensor | None = attrs.field(default=None, repr=False)  # the step's deferred failure flag

    def commit(self, also: torch.Tensor | None = None) -> None:
        """Write the updates and move the RNG positions; also: another step's failure flag (a device flag set where
        any of them failed: then nothing is written, decided on the device)."""
        if self.store is None or self.view is None:
            return
        failed = self.failed if also is None else also if self.failed is None else self.failed | also
        self.store.advance(self.view, self.updates, failed)


class FusionPlan(NamedTuple):
    """The chain's tail a backend runs in one truncate-and-draw kernel (`contracts.FUSED_SAMPLE`)."""

    start: int  # the index of the tail's first sampler
    kernel: Callable[..., Any]
    parts: list[FusedPart]  # the tail's samplers before the selector, in chain order (perhaps none)
    select: FusedPart  # the selector's


@attrs.define(slots=True, eq=False)
class Step:
    """Everything one step of a chain reads and what its stages leave for the next, built once per step: the
    executor's stages (`Chain._filter`, `_fusion`, `_select`, ...) take it instead of a dozen arguments.

    store / view / positions / backend: the requests of the batch, their parameters (`store.batch`), RNG positions
    and the backend running the step. history: (tokens so far (B, L), prompt lengths (B,)) as checked, or None;
    unconditional: the checked unconditional logits, or None. given / given_unconditional: the caller's tensors
    (a failing step names the NaN / +inf it finds there). logits / writable: the checked logits and whether the
    chain may write into them. modes: each row's logprobs_at stage (None: the processed logprobs, no top-n).
    contexts: each sampler's StepContext, built once. kept: the stages logprobs_at asked for. cand / chosen / lse:
    what the selector saw, chose and its normaliser (None after a fused draw). failed: the device flag of a
    deferred check (sync-free backends). given_tokens: the tokens of sample(accept=token_ids), checked, or None."""

    store: RequestStore
    view: BatchView
    positions: torch.Tensor
    backend: Backend
    history: tuple[torch.Tensor, torch.Tensor] | None = None
    unconditional: torch.Tensor | None = None
    given: Any = None
    given_unconditional: torch.Tensor | None = None
    logits: Any = None
    writable: bool = False
    modes: list[tuple[int, bool]] | None = None
    contexts: dict[int, StepContext] = attrs.field(factory=dict)
    kept: dict[int, Candidates] | None = None
    cand: Candidates | None = None
    chosen: torch.Tensor | None = None
    lse: torch.Tensor | None = None
    failed: torch.Tensor | None = None
    given_tokens: torch.Tensor | None = None

    @property
    def batch(self) -> int:
        return len(self.view.request_ids)
