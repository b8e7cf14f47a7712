"""`length_decay`: transformers' ExponentialDecayLengthPenalty.

Once a row has generated more than `start` tokens, each eos id's logit s gets `|s| * (factor ** (generated -
start) - 1)` added (non-finite logits unchanged), so eos grows more likely (factor > 1) with every step past
`start`. transformers counts from the (padded) prompt length; here from the row's own prompt length, which is
the same for unpadded rows. `start` and `factor` may differ per row; factor = 1 disables. `eos_ids` is
chain-level; empty (the default) means the generation's eos ids.
"""

from __future__ import annotations

import attrs
import torch

from samplechain import Candidates, EosIds, Sampler, Stage, StepContext, finite, hookimpl, in_range, token_ids_field


@attrs.frozen
class LengthDecayParams:
    eos_ids: tuple[int, ...] = token_ids_field()  # empty: the generation's eos ids
    start: int = attrs.field(default=0, validator=in_range(0, None))
    factor: float = attrs.field(default=1.0, validator=[finite, in_range(0.0, None, low_open=True, hint="1 disables")])


class LengthDecay(EosIds, Sampler):
    name = "length_decay"
    stage = Stage.TRANSFORM
    role = "bias"
    Params = LengthDecayParams
    request_aliases = {"length_decay_start": "start", "length_decay_factor": "factor"}
    summary = "exponentially raise eos logits after `start` generated tokens"

    def needs_history(self) -> bool:
        return True

    def is_noop(self, ctx: StepContext) -> bool:
        return ctx.scalar("factor") == 1.0

    def apply(self, cand: Candidates, ctx: StepContext) -> Candidates:
        if self.is_noop(ctx):
            return cand
        steps = ctx.generated() - ctx.param("start")
        on = (steps > 0) & (ctx.param("factor") != 1.0)
        if not bool(on.any()):
            return cand
        scale = (torch.pow(ctx.param("factor").double(), steps.clamp(min=0).double()) - 1.0).to(torch.float32)
        is_eos = cand.holding(self.eos_tensor(cand.logits.device))
        x = cand.logits
        hit = is_eos & on[:, None] & torch.isfinite(x)
        return cand.replace_logits(torch.where(hit, x + x.abs() * scale[:, None], x))


@hookimpl
def register_samplers(register):
    register(LengthDecay)
