"""`max_length`: stop when a sequence, prompt included, reaches n tokens (transformers' MaxLengthCriteria).

As transformers, the length is that of the (left-padded) batch, `input_ids.shape[-1] >= n`, so every row stops at
the same step (a shorter prompt does not buy a row more tokens). A length limit (`is_length_limit`). `prepare`
warns when n exceeds the model's position embeddings, and when the padded prompt already has n tokens (each row then
gets one new token; transformers' generate() refuses such a prompt).
"""

from __future__ import annotations

import warnings

import attrs

from samplechain import StopContext, StoppingCriterion, StopSetup, hookimpl, in_range


@attrs.frozen
class MaxLengthParams:
    n: int = attrs.field(validator=in_range(1, None, hint="the longest sequence, prompt included"))


class MaxLength(StoppingCriterion):
    name = "max_length"
    Params = MaxLengthParams
    summary = "stop when the sequence (prompt included) reaches n tokens"
    is_length_limit = True

    def prepare(self, setup: StopSetup) -> None:
        if setup.prompt_length >= self.params.n:
            warnings.warn(
                f"max_length = {self.params.n} but the (padded) prompt already has {setup.prompt_length} tokens: "
                f"each row gets one new token; raise max_length or use max_new_tokens",
                UserWarning,
                stacklevel=2,
            )
        limit = setup.max_positions
        if limit is not None and self.params.n > limit:
            warnings.warn(
                f"max_length = {self.params.n} is more than the model's {limit} positions: samplechain's generate() "
                f"ends the rows at the last one, other loops fail or degrade past them; use max_length <= {limit}",
                UserWarning,
                stacklevel=2,
            )

    def max_new_tokens(self, setup: StopSetup) -> int:
        return max(self.params.n - setup.prompt_length, 1)

    def check(self, ctx: StopContext) -> bool:
        return ctx.input_ids.shape[-1] >= self.params.n  # the same answer for every row


@hookimpl
def register_stopping_criteria(register):
    register(MaxLength)
