"""`forced_eos`: transformers' ForcedEOSTokenLogitsProcessor.

When a row holds `max_length - 1` tokens (prompt + generated), every candidate becomes -inf except the ids in
`eos_ids`, which become 0, so the row's last token is an eos. transformers counts the padded width of the batch;
here each row counts its own real tokens (the same for unpadded rows). `max_length` may differ per row; 0
disables. `eos_ids` is chain-level; empty (the default) means the generation's eos ids. Put it first in a chain, as
transformers does; after a filter it still forces eos (a removed eos comes back, as in transformers).
"""

from __future__ import annotations

import attrs
import torch

from samplechain import Candidates, EosIds, Sampler, Stage, StepContext, hookimpl, in_range, token_ids_field


@attrs.frozen
class ForcedEosParams:
    eos_ids: tuple[int, ...] = token_ids_field()  # empty: the generation's eos ids
    max_length: int = attrs.field(default=0, validator=in_range(0, None, hint="0 disables"))


class ForcedEos(EosIds, Sampler):
    name = "forced_eos"
    stage = Stage.TRANSFORM
    role = "mask"
    Params = ForcedEosParams
    request_aliases = {"forced_eos_max_length": "max_length"}
    summary = "force an eos token as the last token a row may have"

    def needs_history(self) -> bool:
        return True

    def apply(self, cand: Candidates, ctx: StepContext) -> Candidates:
        if ctx.scalar("max_length") == 0:
            return cand
        limit = ctx.param("max_length")
        history = ctx.history
        assert history is not None  # needs_history() is declared, so the chain passes it
        last = ((history >= 0).sum(dim=1) == limit - 1) & (limit > 0)
        if not bool(last.any()):
            return cand
        cand = cand.full()  # a removed eos comes back, as transformers writes its column whatever it held
        tokens = cand.token_ids()
        chosen = torch.isin(tokens, self.eos_tensor(tokens.device))
        forced = torch.where(chosen, 0.0, float("-inf")).to(cand.logits.dtype)
        return cand.replace_logits(torch.where(last[:, None], forced, cand.logits), is_sorted=False)


@hookimpl
def register_samplers(register):
    register(ForcedEos)
