"""`max_time`: stop every row once the generation has run for `seconds` (transformers' MaxTimeCriteria).

The clock starts when the generation starts (`StopSetup.start_time`, time.monotonic(); a setup that leaves it
unset, 0.0, starts it at `prepare`). Every row stops at once; transformers compares time.time() against its
`initial_timestamp` the same way (strictly more than `seconds`).
"""

from __future__ import annotations

import time

import attrs

from samplechain import StopContext, StoppingCriterion, StopSetup, finite, hookimpl, in_range


@attrs.frozen
class MaxTimeParams:
    seconds: float = attrs.field(validator=[finite, in_range(0.0, None, low_open=True)])


class MaxTime(StoppingCriterion):
    name = "max_time"
    Params = MaxTimeParams
    summary = "stop every row after a wall-clock budget"

    def __init__(self, params: MaxTimeParams) -> None:
        super().__init__(params)
        self._started = 0.0

    def prepare(self, setup: StopSetup) -> None:
        self._started = time.monotonic()

    def check(self, ctx: StopContext) -> bool:
        if not (ctx.setup.start_time or self._started):  # neither the loop nor prepare started the clock
            self._started = time.monotonic()
        start = ctx.setup.start_time or self._started
        return time.monotonic() - start > self.params.seconds  # the same answer for every row


@hookimpl
def register_stopping_criteria(register):
    register(MaxTime)
