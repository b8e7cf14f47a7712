"""`max_new_tokens`: a row stops once it has generated n tokens (transformers' max_new_tokens).

A length limit (`is_length_limit`): every generation has one. Warns once in `prepare` when the padded prompt
plus n tokens would run past the model's position embeddings (generate() then ends the rows at the last one).
"""

from __future__ import annotations

import warnings

import attrs

from samplechain import StopContext, StoppingCriterion, StopSetup, hookimpl, in_range


@attrs.frozen
class MaxNewTokensParams:
    n: int = attrs.field(validator=in_range(1, None, hint="the most tokens a row may generate"))


class MaxNewTokens(StoppingCriterion):
    name = "max_new_tokens"
    Params = MaxNewTokensParams
    summary = "stop a row after n new tokens"
    is_length_limit = True

    def prepare(self, setup: StopSetup) -> None:
        limit = setup.max_positions
        if limit is not None and setup.prompt_length + self.params.n > limit:
            warnings.warn(
                f"max_new_tokens = {self.params.n} after a {setup.prompt_length}-token prompt runs past the model's "
                f"{limit} positions: samplechain's generate() ends the rows at the last one (finish reason "
                f"max_length), other loops fail or degrade there; lower max_new_tokens to "
                f"{max(limit - setup.prompt_length, 1)}",
                UserWarning,
                stacklevel=2,
            )

    def max_new_tokens(self, setup: StopSetup) -> int:
        return self.params.n

    def check(self, ctx: StopContext) -> bool:
        return ctx.step >= self.params.n  # the same answer for every row


@hookimpl
def register_stopping_criteria(register):
    register(MaxNewTokens)
