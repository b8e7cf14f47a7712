"""`forced_bos`: transformers' ForcedBOSTokenLogitsProcessor.

At a row's first generated token every candidate becomes -inf except `bos_id`, which becomes 0, so every selector
picks it. transformers forces when the whole input is one token (an encoder-decoder's decoder start); here when
the row has generated nothing yet, whatever its prompt length (the same step for encoder-decoder decoding).
Put it first in a chain, as transformers does; after a filter it still forces `bos_id` (a removed token comes back,
as transformers' processor writes the column whatever it held). `bos_id` may differ per row
(`forced_bos_token_id`); -1 disables; an id outside the vocabulary leaves the row with nothing (an error naming
forced_bos and the request).
"""

from __future__ import annotations

import attrs
import torch

from samplechain import Candidates, Sampler, Stage, StepContext, hookimpl, in_range


@attrs.frozen
class ForcedBosParams:
    bos_id: int = attrs.field(default=-1, validator=in_range(-1, None, hint="-1 disables"))


def force(cand: Candidates, rows: torch.Tensor, ids: torch.Tensor) -> Candidates:
    """Rows (B,) bool: every candidate -inf except those whose token id is in ids (B, E) (-1 = none), set to 0. The
    forced ids get their 0 even when an earlier filter removed them (transformers' processors write the column
    whatever it held): compacted candidates are spread over the whole vocabulary again first, so the result is the
    same whether the batch around a row was compacted or masked."""
    cand = cand.full()
    tokens = cand.token_ids()
    chosen = (tokens[:, :, None] == ids[:, None, :]).any(dim=-1) & (ids >= 0).any(dim=-1, keepdim=True)
    forced = torch.where(chosen, 0.0, float("-inf")).to(cand.logits.dtype)
    return cand.replace_logits(torch.where(rows[:, None], forced, cand.logits), is_sorted=False)


class ForcedBos(Sampler):
    name = "forced_bos"
    stage = Stage.TRANSFORM
    role = "mask"
    Params = ForcedBosParams
    request_aliases = {"forced_bos_token_id": "bos_id"}
    summary = "force the bos token as a row's first generated token"

    def needs_history(self) -> bool:
        return True

    def apply(self, cand: Candidates, ctx: StepContext) -> Candidates:
        if ctx.scalar("bos_id") == -1:
            return cand
        ids = ctx.param("bos_id")
        first = (ctx.generated() == 0) & (ids >= 0)
        if not bool(first.any()):
            return cand
        return force(cand, first, ids[:, None])


@hookimpl
def register_samplers(register):
    register(ForcedBos)
