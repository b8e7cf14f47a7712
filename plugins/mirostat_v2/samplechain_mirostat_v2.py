"""`mirostat_v2`: llama.cpp's `llama_sampler_mirostat_v2`, per request, seeded and batch-invariant.

Per row, over the candidates the chain passes in (earlier filters included), as llama.cpp:
    p        = softmax(logits)                                  float64 (llama.cpp: float32, whose rounding here
                                                                would follow the row's width, so the batch)
    keep     = candidates whose surprise -log2(p) <= mu         (at least the most probable one, of equal
                                                                maxima the lowest id)
    p'       = softmax(logits of the kept candidates)
    token    ~ p'                                               Gumbel-max keyed by (seed, position, token id)
    mu      <- mu - eta * (-log2 p'(token) - tau)                mu starts at 2 * tau
llama.cpp updates mu inside apply(); here select() computes the new mu and the chain commits it when it accepts
the step, so a step sampled with accept=False (or one that fails) leaves mu as it was. Tokens accepted without a
preceding select() of the same step (forced tokens) leave mu unchanged, as llama.cpp (its mirostat has no accept).
A token other than the draw accepted for the step select() saw (teacher forcing: chain.sample(accept=token_ids))
moves mu by its own surprise under p', as though select() had drawn it; one outside the kept set leaves mu unchanged.
"""

from __future__ import annotations

import attrs
import torch

from samplechain import Candidates, Sampler, Stage, StepContext, finite, hookimpl, in_range, seed_field
from samplechain.filters import at_tokens


@attrs.frozen
class MirostatV2Params:
    tau: float = attrs.field(default=5.0, validator=[finite, in_range(0.0, None, hint="target surprise in bits")])
    eta: float = attrs.field(default=0.1, validator=[finite, in_range(0.0, None, hint="learning rate of mu")])
    seed: int | None = seed_field()


class MirostatV2(Sampler):
    name = "mirostat_v2"
    stage = Stage.SELECT
    replaces_truncation = True
    Params = MirostatV2Params
    request_aliases = {"mirostat_tau": "tau", "mirostat_eta": "eta", "seed": "seed"}
    summary = "llama.cpp's mirostat v2: keep tokens with surprise <= mu, sample, steer mu toward tau"

    def __init__(self, params: MirostatV2Params) -> None:
        super().__init__(params)
        # (request ids, positions, mu, new mu, drawn ids, kept probabilities, candidate ids) from the last select()
        self._pending: tuple | None = None

    def is_stateful(self) -> bool:
        return True

    def state_spec(self):
        # mu's initial value 2 * tau depends on the request's tau: `started` says whether mu holds a value yet
        return {"mu": (torch.float32, (), 0.0), "started": (torch.bool, (), False)}

    def select(self, cand: Candidates, ctx: StepContext) -> torch.Tensor:
        logits = cand.logits
        tau, eta = ctx.param("tau"), ctx.param("eta")
        mu = torch.where(ctx.state["started"], ctx.state["mu"], 2.0 * tau)
        # float64: a float32 softmax rounds differently with the row's width, which follows the batch
        p = torch.softmax(logits.double(), dim=-1)
        keep = -torch.log2(p) <= mu.double()[:, None]  # masked candidates: p = 0, surprise inf, never kept
        keep.scatter_(1, cand.best()[:, None], True)  # llama.cpp keeps at least one: of equal maxima the lowest id
        kept = logits.masked_fill(~keep, float("-inf"))
        chosen = cand.draw(keep, ctx, ctx.param("seed"))  # the noise of the kept tokens only
        probs = torch.softmax(kept.double(), dim=-1)
        surprise = -torch.log2(probs.gather(1, chosen[:, None]).squeeze(1))
        moved = (mu - eta * (surprise - tau)).float()
        self._pending = (
            ctx.request_ids,
            ctx.positions.clone(),
            mu,
            moved,
            cand.ids_at(chosen[:, None])[:, 0],
            probs,
            cand.ids,
        )
        return chosen

    def accept(self, ctx: StepContext, token_ids: torch.Tensor):
        pending, self._pending = self._pending, None
        if pending is None or pending[0] != ctx.request_ids or not torch.equal(pending[1], ctx.positions):
            return {}  # not the step select() saw: mu unchanged (llama.cpp's mirostat has no accept)
        _, _, mu, moved, drawn, probs, ids = pending
        token_ids = token_ids.to(drawn.device)
        # another token than the draw (teacher forcing): mu moves by its surprise, as though select() had drawn it;
        # one outside the kept set (surprise inf) leaves mu as it was
        p = at_tokens(probs, ids, token_ids)
        given = torch.where(p > 0, (mu - ctx.param("eta") * (-torch.log2(p) - ctx.param("tau"))).float(), mu.float())
        return {"mu": torch.where(token_ids == drawn, moved, given), "started": torch.ones_like(ctx.state["started"])}


@hookimpl
def register_samplers(register):
    register(MirostatV2)
