"""`length_decay`: transformers' ExponentialDecayLengthPenalty.

Once a row has generated more than `start` tokens, each eos id's logit s gets `|s| * (factor ** (generated -
start) - 1)` added (non-finite logits unchanged), so eos grows more likely (factor > 1) with every step past
`start`. transformers counts from the (padded) prompt length; here from the row's own prompt length, which is
the same for unpadded rows. `start` and `factor` may differ per row; factor = 1 disables. `eos_ids` is
chain-level and required (samplers have no tokenizer / model-config hook).
"""

from __future__ import annotations

import attrs
import torch

from samplechain import Candidates, Sampler, Stage, StepContext, finite, hookimpl, in_range


def _eos_ok(_inst, _attr, value) -> None:
    if not value or any(t < 0 for t in value):
        raise ValueError("give the non-negative end-of-sequence token ids, e.g. eos_ids = [2]")


@attrs.frozen
class LengthDecayParams:
    eos_ids: tuple[int, ...] = attrs.field(validator=_eos_ok)
    start: int = attrs.field(default=0, validator=in_range(0, None))
    factor: float = attrs.field(default=1.0, validator=[finite, in_range(0.0, None, low_open=True, hint="1 disables")])


class LengthDecay(Sampler):
    name = "length_decay"
    stage = Stage.TRANSFORM
    Params = LengthDecayParams
    request_aliases = {"length_decay_start": "start", "length_decay_factor": "factor"}
    summary = "exponentially raise eos logits after `start` generated tokens"

    def __init__(self, params: LengthDecayParams) -> None:
        super().__init__(params)
        self._ids = torch.tensor(sorted(set(params.eos_ids)), dtype=torch.int64)

    def needs_history(self) -> bool:
        return True

    def apply(self, cand: Candidates, ctx: StepContext) -> Candidates:
        if ctx.scalar("factor") == 1.0:
            return cand
        generated = (ctx.history >= 0).sum(dim=1) - ctx.prompt_lengths
        steps = generated - ctx.param("start")
        on = (steps > 0) & (ctx.param("factor") != 1.0)
        if not bool(on.any()):
            return cand
        scale = (torch.pow(ctx.param("factor").double(), steps.clamp(min=0).double()) - 1.0).to(torch.float32)
        ids = self._ids[self._ids < cand.vocab_size].to(cand.logits.device)
        if cand.ids is None:
            is_eos = torch.zeros(1, cand.vocab_size, dtype=torch.bool, device=ids.device).index_fill_(1, ids, True)
        else:
            is_eos = torch.isin(cand.ids, ids)
        x = cand.logits
        hit = is_eos & on[:, None] & torch.isfinite(x)
        return cand.replace_logits(torch.where(hit, x + x.abs() * scale[:, None], x))


@hookimpl
def register_samplers(register):
    register(LengthDecay)
