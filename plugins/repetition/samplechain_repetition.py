"""`repetition`: stop a row whose generated tokens end in a pattern repeated `min_count` times in a row.

vLLM's `SamplingParams.repetition_detection` (vllm/v1/core/sched/utils.py, `check_sequence_repetition`): for each
pattern length L from `min_pattern_size` (0 means 1) to `max_pattern_size` (0 disables), the last L generated
tokens and the (min_count - 1) blocks of L before them are compared; any length whose blocks all match stops the
row. Only generated tokens count (the prompt never does), a row stops only once it has `min_count * L` of them for
some L, and not before `min_tokens` (vLLM checks `min_tokens` first). The finish reason is "repetition" (vLLM
reports "repetition_detected" as its stop reason). Vectorised: one comparison of (B, min_count, L) per length.
"""

from __future__ import annotations

import attrs
import torch

from samplechain import StopContext, StoppingCriterion, hookimpl, in_range


def _sizes(inst, _attr, _value) -> None:
    if inst.min_pattern_size > inst.max_pattern_size:
        raise ValueError(
            f"min_pattern_size {inst.min_pattern_size} > max_pattern_size {inst.max_pattern_size}; "
            f"give min_pattern_size <= max_pattern_size (0 means 1), or max_pattern_size 0 to disable"
        )
    if inst.max_pattern_size > 0 and inst.min_count < 2:
        raise ValueError(
            f"min_count {inst.min_count}: a pattern must repeat at least twice (min_count >= 2), "
            f"e.g. 3 for a phrase said three times; or set max_pattern_size 0 to disable"
        )


@attrs.frozen
class RepetitionParams:
    max_pattern_size: int = attrs.field(validator=[in_range(0, None, hint="0 disables"), _sizes])
    min_count: int = attrs.field(default=2, validator=in_range(0, None, hint=">= 2 where enabled"))
    min_pattern_size: int = attrs.field(default=0, validator=in_range(0, None, hint="0 means 1"))
    min_tokens: int = attrs.field(default=0, validator=in_range(0, None, hint="0: from the first token"))


class Repetition(StoppingCriterion):
    name = "repetition"
    Params = RepetitionParams
    summary = "stop a row whose new tokens end in a pattern repeated min_count times (vLLM's repetition_detection)"
    min_new_tokens_gate = "tokens"  # and the chain's min_new_tokens, as vLLM's check_stop

    def check(self, ctx: StopContext) -> torch.Tensor | bool:
        p = self.params
        new = ctx.new_tokens
        if p.max_pattern_size <= 0 or ctx.step < max(p.min_tokens, 1):
            return False
        found = torch.zeros(new.shape[0], dtype=torch.bool, device=new.device)
        for size in range(max(p.min_pattern_size, 1), p.max_pattern_size + 1):
            span = size * p.min_count
            if span > new.shape[1]:  # longer patterns do not fit either (vLLM stops looking here too)
                break
            blocks = new[:, -span:].reshape(new.shape[0], p.min_count, size)
            found |= (blocks == blocks[:, -1:, :]).all(dim=2).all(dim=1)
        return found


@hookimpl
def register_stopping_criteria(register):
    register(Repetition)
