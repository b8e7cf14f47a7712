"""`mirostat_v2`: llama.cpp's `llama_sampler_mirostat_v2`, per request, seeded and batch-invariant.

Per row, over the candidates the chain passes in (earlier filters included), as llama.cpp:
    p        = softmax(logits)                                  float64 (llama.cpp: float32, whose rounding here
                                                                would follow the row's width, so the batch)
    keep     = candidates whose surprise -log2(p) <= mu         (at least the most probable one, of equal
                                                                maxima the lowest id)
    p'       = softmax(logits of the kept candidates)
    token    ~ p'                                               Gumbel-max keyed by (seed, position, token id)
    mu      <- mu - eta * (-log2 p'(token) - tau)                mu starts at 2 * tau
llama.cpp updates mu inside apply(); here select() (samplechain.filters.SurpriseSteering, shared with mirostat)
computes the new mu and the chain commits it when it accepts the step, so a step sampled with accept=False (or one
that fails) leaves mu as it was. Tokens accepted without a preceding select() of the same step (forced tokens)
leave mu unchanged, as llama.cpp (its mirostat has no accept). A token other than the draw accepted for the step
select() saw (teacher forcing: chain.sample(accept=token_ids)) moves mu by its own surprise under p', as though
select() had drawn it; one outside the kept set leaves mu unchanged.
"""

from __future__ import annotations

import attrs
import torch

from samplechain import Candidates, StepContext, finite, hookimpl, in_range, seed_field
from samplechain.filters import SurpriseSteering


@attrs.frozen
class MirostatV2Params:
    tau: float = attrs.field(default=5.0, validator=[finite, in_range(0.0, None, hint="target surprise in bits")])
    eta: float = attrs.field(default=0.1, validator=[finite, in_range(0.0, None, hint="learning rate of mu")])
    seed: int | None = seed_field()


class MirostatV2(SurpriseSteering):
    name = "mirostat_v2"
    Params = MirostatV2Params
    request_aliases = {"mirostat_tau": "tau", "mirostat_eta": "eta", "seed": "seed"}
    summary = "llama.cpp's mirostat v2: keep tokens with surprise <= mu, sample, steer mu toward tau"

    def kept(self, cand: Candidates, ctx: StepContext, mu: torch.Tensor) -> torch.Tensor:
        # float64: a float32 softmax rounds differently with the row's width, which follows the batch
        p = torch.softmax(cand.logits.double(), dim=-1)
        keep = -torch.log2(p) <= mu.double()[:, None]  # masked candidates: p = 0, surprise inf, never kept
        keep.scatter_(1, cand.best()[:, None], True)  # llama.cpp keeps at least one: of equal maxima the lowest id
        return keep


@hookimpl
def register_samplers(register):
    register(MirostatV2)
