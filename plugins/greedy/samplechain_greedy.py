"""`greedy`: pick the most likely candidate (the first of equal maxima, as llama.cpp's greedy sampler)."""

from __future__ import annotations

import torch

from samplechain import Candidates, Sampler, Stage, StepContext, hookimpl


class Greedy(Sampler):
    name = "greedy"
    stage = Stage.SELECT
    summary = "argmax of the processed logits"

    def is_argmax_invariant(self) -> bool:
        return True

    def select(self, cand: Candidates, ctx: StepContext) -> torch.Tensor:
        return cand.logits.argmax(dim=-1)  # (B,) first maximum in candidate order


@hookimpl
def register_samplers(register):
    register(Greedy)
