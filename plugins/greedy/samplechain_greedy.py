"""`greedy`: pick the most likely candidate; of equal maxima the lowest token id (llama.cpp's greedy sampler takes
the first in its vocabulary-ordered array: the same token). By id, not by candidate position, so the pick never
depends on the order an earlier filter left the candidates in (which may change with the batch)."""

from __future__ import annotations

import torch

from samplechain import Candidates, FusedPart, Sampler, Stage, StepContext, hookimpl


class Greedy(Sampler):
    name = "greedy"
    sync_free = True  # no host read in a sync-free step (plugins/cuda/tests/test_sync_free.py)
    stage = Stage.SELECT
    summary = "argmax of the processed logits"
    has_fused_part = True  # a backend's FUSED_SAMPLE kernel may take the argmax with the samplers before it

    def fused(self, ctx: StepContext) -> FusedPart:
        return FusedPart("greedy", None)

    def is_argmax_invariant(self) -> bool:
        return True

    def select(self, cand: Candidates, ctx: StepContext) -> torch.Tensor:
        return cand.best()  # (B,) of equal maxima the lowest token id


@hookimpl
def register_samplers(register):
    register(Greedy)
