"""`suppress_tokens` and `begin_suppress_tokens`: transformers' SuppressTokensLogitsProcessor and
SuppressTokensAtBeginLogitsProcessor.

`suppress_tokens` masks (-inf) the token ids in `ids` at every step. `begin_suppress_tokens` masks them only when
the row has generated exactly `at` tokens (default 0: the first generated token; transformers' `begin_index` is
the prompt length, plus one after a forced BOS). `ids` is chain-level; `at` may differ per row
(`begin_suppress_at`). Empty `ids` is a no-op; ids outside the vocabulary are ignored, as transformers ignores them.
"""

from __future__ import annotations

import attrs
import torch

from samplechain import Candidates, Sampler, Stage, StepContext, hookimpl, in_range


def _non_negative(_inst, _attr, value) -> None:
    if any(t < 0 for t in value):
        raise ValueError(f"token ids must be non-negative, got {list(value)}")


@attrs.frozen
class SuppressTokensParams:
    ids: tuple[int, ...] = attrs.field(default=(), validator=_non_negative)


@attrs.frozen
class BeginSuppressTokensParams:
    ids: tuple[int, ...] = attrs.field(default=(), validator=_non_negative)
    at: int = attrs.field(default=0, validator=in_range(0, None, hint="generated tokens before the masked step"))


class SuppressTokens(Sampler):
    name = "suppress_tokens"
    sync_free = True  # no host read in a sync-free step (plugins/cuda/tests/test_sync_free.py)
    stage = Stage.TRANSFORM
    role = "mask"
    Params = SuppressTokensParams
    summary = "mask chosen token ids at every step"

    def __init__(self, params: SuppressTokensParams) -> None:
        super().__init__(params)
        self._ids = torch.tensor(params.ids, dtype=torch.int64)

    def apply(self, cand: Candidates, ctx: StepContext) -> Candidates:
        if self._ids.numel() == 0:
            return cand
        return cand.masked(~cand.holding(self._ids).expand(cand.batch_size, -1))


class BeginSuppressTokens(Sampler):
    name = "begin_suppress_tokens"
    stage = Stage.TRANSFORM
    role = "mask"
    Params = BeginSuppressTokensParams
    request_aliases = {"begin_suppress_at": "at"}
    summary = "mask chosen token ids when a row has generated exactly `at` tokens"

    def __init__(self, params: BeginSuppressTokensParams) -> None:
        super().__init__(params)
        self._ids = torch.tensor(params.ids, dtype=torch.int64)

    def needs_history(self) -> bool:
        return True

    def apply(self, cand: Candidates, ctx: StepContext) -> Candidates:
        if self._ids.numel() == 0:
            return cand
        now = ctx.generated() == ctx.param("at")  # (B,)
        if not bool(now.any()):
            return cand
        return cand.masked(~(cand.holding(self._ids) & now[:, None]))


@hookimpl
def register_samplers(register):
    register(SuppressTokens)
    register(BeginSuppressTokens)
