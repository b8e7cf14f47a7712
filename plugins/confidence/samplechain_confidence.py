"""`confidence`: a row stops when the probability of the token it just chose falls below `threshold`.

The probability is the chosen token's under the processed distribution the chain sampled from
(`exp(ctx.logprobs)`). transformers' ConfidenceCriteria (assisted generation) answers one bool for the whole
batch from row 0's probability (`scores[-1].softmax(-1)[0, input_ids[0, -1]]`); this criterion answers per row,
so a confident row keeps going while an unsure one stops. Without logprobs (a loop that does not provide them)
it falls back to softmax(ctx.scores), and to "never" when neither is given.
"""

from __future__ import annotations

import attrs
import torch

from samplechain import StopContext, StoppingCriterion, finite, hookimpl, in_range


@attrs.frozen
class ConfidenceParams:
    threshold: float = attrs.field(validator=[finite, in_range(0.0, 1.0, low_open=True, high_open=True)])


class Confidence(StoppingCriterion):
    name = "confidence"
    Params = ConfidenceParams
    summary = "stop a row when its chosen token's probability < threshold"

    def check(self, ctx: StopContext) -> torch.Tensor:
        if ctx.logprobs is not None:
            p = ctx.logprobs.exp()
        elif ctx.scores is not None:
            p = torch.softmax(ctx.scores.float(), dim=-1).gather(1, ctx.token_ids[:, None]).squeeze(1)
        else:
            return torch.zeros(ctx.input_ids.shape[0], dtype=torch.bool, device=ctx.input_ids.device)
        return p < self.params.threshold


@hookimpl
def register_stopping_criteria(register):
    register(Confidence)
