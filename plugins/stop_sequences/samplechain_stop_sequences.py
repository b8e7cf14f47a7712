"""`stop_sequences`: a row stops when its generated tokens end with one of the given token-id sequences.

Only generated tokens count: a sequence that straddles the prompt and the first new tokens does not fire
(vLLM's stop_token_ids are the one-token case).
"""

from __future__ import annotations

import attrs
import torch

from samplechain import StopContext, StoppingCriterion, hookimpl


def _valid(_inst, _attr, value) -> None:
    if not value:
        raise ValueError("give at least one sequence, e.g. [[13, 13]]")
    for i, seq in enumerate(value):
        if not seq:
            raise ValueError(f"sequence {i} is empty; every sequence needs at least one token id")
        if any(t < 0 for t in seq):
            raise ValueError(f"sequence {i} has a negative token id")


@attrs.frozen
class StopSequencesParams:
    sequences: tuple[tuple[int, ...], ...] = attrs.field(validator=_valid)


class StopSequences(StoppingCriterion):
    name = "stop_sequences"
    Params = StopSequencesParams
    summary = "stop a row whose new tokens end with a token-id sequence"

    def check(self, ctx: StopContext) -> torch.Tensor:
        new = ctx.new_tokens
        hit = torch.zeros(new.shape[0], dtype=torch.bool, device=new.device)
        for seq in self.params.sequences:
            if len(seq) > new.shape[1]:
                continue
            target = torch.tensor(seq, dtype=new.dtype, device=new.device)
            hit |= (new[:, -len(seq):] == target).all(dim=1)
        return hit


@hookimpl
def register_stopping_criteria(register):
    register(StopSequences)
