"""`stop_sequences`: a row stops when its generated tokens end with one of the given token-id sequences.

Only generated tokens count: a sequence that straddles the prompt and the first new tokens does not fire (vLLM's
`stop_token_ids` are the one-token case; for text that may straddle, use `stop_strings`). Vectorised over rows
and sequences: the sequences are right-aligned once in an (S, M) table, and each step compares every row's last
M generated tokens with all of them in one tensor expression.
"""

from __future__ import annotations

import attrs
import torch
import torch.nn.functional as F

from samplechain import StopContext, StoppingCriterion, StopSetup, hookimpl


def _valid(_inst, _attr, value) -> None:
    if not value:
        raise ValueError("give at least one sequence, e.g. [[13, 13]]")
    for i, seq in enumerate(value):
        if not seq:
            raise ValueError(f"sequence {i} is empty; every sequence needs at least one token id")
        if any(t < 0 for t in seq):
            raise ValueError(f"sequence {i} has a negative token id ({min(seq)}); token ids are >= 0")


@attrs.frozen
class StopSequencesParams:
    sequences: tuple[tuple[int, ...], ...] = attrs.field(validator=_valid)


class StopSequences(StoppingCriterion):
    name = "stop_sequences"
    Params = StopSequencesParams
    summary = "stop a row whose new tokens end with a token-id sequence"

    def __init__(self, params: StopSequencesParams) -> None:
        super().__init__(params)
        self.longest = max(len(s) for s in params.sequences)
        targets = torch.zeros((len(params.sequences), self.longest), dtype=torch.int64)
        care = torch.zeros((len(params.sequences), self.longest), dtype=torch.bool)
        for i, seq in enumerate(params.sequences):  # right-aligned; `care` marks the sequence's own positions
            targets[i, self.longest - len(seq) :] = torch.tensor(seq)
            care[i, self.longest - len(seq) :] = True
        self._tables = {targets.device: (targets, care)}

    def _on(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if device not in self._tables:
            targets, care = next(iter(self._tables.values()))
            self._tables[device] = (targets.to(device), care.to(device))
        return self._tables[device]

    def prepare(self, setup: StopSetup) -> None:
        self._on(torch.device(setup.device))

    def check(self, ctx: StopContext) -> torch.Tensor:
        new = ctx.new_tokens
        tail = new[:, -self.longest :]
        if tail.shape[1] < self.longest:  # fewer new tokens than the longest sequence: -1 matches no id
            tail = F.pad(tail, (self.longest - tail.shape[1], 0), value=-1)
        targets, care = self._on(new.device)
        return ((tail[:, None, :] == targets) | ~care).all(dim=-1).any(dim=-1)


@hookimpl
def register_stopping_criteria(register):
    register(StopSequences)
