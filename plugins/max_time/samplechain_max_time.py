"""`max_time`: stop every row once the generation has run for `seconds` (transformers' MaxTimeCriteria).

The clock starts when the generation starts (`StopSetup.start_time`, time.monotonic()).
"""

from __future__ import annotations

import time

import attrs

from samplechain import StopContext, StoppingCriterion, finite, hookimpl, in_range


@attrs.frozen
class MaxTimeParams:
    seconds: float = attrs.field(validator=[finite, in_range(0.0, None, low_open=True)])


class MaxTime(StoppingCriterion):
    name = "max_time"
    Params = MaxTimeParams
    summary = "stop every row after a wall-clock budget"

    def check(self, ctx: StopContext) -> bool:
        return time.monotonic() - ctx.setup.start_time > self.params.seconds  # the same answer for every row


@hookimpl
def register_stopping_criteria(register):
    register(MaxTime)
