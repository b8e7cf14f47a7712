"""`dist`: draw from softmax(logits) with counter-based, batch-invariant noise.

Gumbel-max: argmax(logits + G) with G ~ Gumbel(0, 1) is a draw from softmax(logits). G is a pure function of
(seed, stream, position, token id), so a seeded request draws the same token alone or at any row of any batch,
and removing candidates (filters) never changes the noise of the tokens that remain. Never a sort and cumsum
over the vocabulary.
"""

from __future__ import annotations

import attrs
import torch

from samplechain import Candidates, FusedPart, Sampler, Stage, StepContext, hookimpl, seed_field


@attrs.frozen
class DistParams:
    seed: int | None = seed_field()  # None: each request draws a fresh seed when it joins


class Dist(Sampler):
    name = "dist"
    sync_free = True  # no host read in a sync-free step (plugins/cuda/tests/test_sync_free.py)
    stage = Stage.SELECT
    Params = DistParams
    request_aliases = {"seed": "seed"}
    summary = "seeded sampling from the processed distribution (Gumbel-max)"
    has_fused_part = True

    def fused(self, ctx: StepContext) -> FusedPart:
        return FusedPart("dist", ctx.param("seed"))

    def select(self, cand: Candidates, ctx: StepContext) -> torch.Tensor:
        # argmax(logits + G), G (B, K) float64 keyed by token id; -inf candidates can never win
        return ctx.backend.gumbel_argmax(cand.logits, ctx.param("seed"), ctx.positions, cand.ids, ctx.stream)


@hookimpl
def register_samplers(register):
    register(Dist)
