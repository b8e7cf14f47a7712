"""`adaptive_p`: llama.cpp's adaptive-p selector (`llama_sampler_adaptive_p`, ggml-org/llama.cpp PR #17927),
per request, seeded and batch-invariant.

Per row, over the candidates the chain passes in, as llama.cpp, in float32 but for the softmax:
    p        = softmax(logits)                                  the original probabilities (summed in float64,
                                                                so its rounding does not follow the row's width)
    adapted  = clamp(2 * clamp(target, 0, 1) - weighted_sum / total_weight, 0, 1)
               (clamp(target, 0, 1) while total_weight == 0)
    d        = |p - adapted| / 0.3
    logit'   = 5 - 10 * d^2 / (1 + d)                            -inf candidates stay -inf
    token    ~ softmax(logit')                                   Gumbel-max keyed by (seed, position, token id)
on accept, when the accepted token is the one selected:
    weighted_sum <- p(token) + decay * weighted_sum,   total_weight <- 1 + decay * total_weight
The EMA starts as if the target had always been met: weighted_sum = target / (1 - decay), total_weight =
1 / (1 - decay). A negative target disables the transform: the row is drawn from softmax(logits), the EMA never
moves. llama.cpp clamps decay into [0, 0.99]; here a decay outside it (or a target above 1) is an error instead.
"""

from __future__ import annotations

import attrs
import torch

from samplechain import Candidates, Sampler, Stage, StepContext, finite, hookimpl, in_range, seed_field

# llama.cpp's constants, as float32
DISTRIBUTION_WIDTH = 0.3
PEAK_LOGIT_VALUE = 5.0
SHARPNESS = 10.0
INV_WIDTH = float(torch.tensor(1.0) / torch.tensor(DISTRIBUTION_WIDTH))  # 1.0f / 0.3f


@attrs.frozen
class AdaptivePParams:
    target: float = attrs.field(validator=[finite, in_range(None, 1.0, hint="a probability; negative disables")])
    decay: float = attrs.field(default=0.9, validator=[finite, in_range(0.0, 0.99, hint="EMA decay")])
    seed: int | None = seed_field()


class AdaptiveP(Sampler):
    name = "adaptive_p"
    stage = Stage.SELECT
    Params = AdaptivePParams
    request_aliases = {"adaptive_target": "target", "adaptive_decay": "decay", "seed": "seed"}
    summary = "llama.cpp's adaptive-p: prefer tokens near a target probability steered by an EMA"

    def __init__(self, params: AdaptivePParams) -> None:
        super().__init__(params)
        self._pending: tuple | None = None  # (request ids, positions, chosen ids, original probs) from select()

    def is_stateful(self) -> bool:
        return True

    def state_spec(self):
        # the EMA's initial values depend on the request's target and decay: `started` says whether it moved yet
        return {
            "weighted_sum": (torch.float32, (), 0.0),
            "total_weight": (torch.float32, (), 0.0),
            "started": (torch.bool, (), False),
        }

    @staticmethod
    def _ema(ctx: StepContext) -> tuple[torch.Tensor, torch.Tensor]:
        target, decay = ctx.param("target"), ctx.param("decay")
        started = ctx.state["started"]
        weighted_sum = torch.where(started, ctx.state["weighted_sum"], target / (1.0 - decay))
        total_weight = torch.where(started, ctx.state["total_weight"], 1.0 / (1.0 - decay))
        return weighted_sum, total_weight

    def select(self, cand: Candidates, ctx: StepContext) -> torch.Tensor:
        logits = cand.logits
        target = ctx.param("target")
        weighted_sum, total_weight = self._ema(ctx)
        p = torch.softmax(logits.double(), dim=-1).float()  # float64 sums: rounding independent of the row's width
        goal = target.clamp(0.0, 1.0)
        adapted = torch.where(total_weight == 0.0, goal, 2.0 * goal - weighted_sum / total_weight).clamp(0.0, 1.0)
        dist = ((p - adapted[:, None]) * INV_WIDTH).abs()
        transformed = PEAK_LOGIT_VALUE - SHARPNESS * dist * dist / (1.0 + dist)
        transformed = torch.where(logits == float("-inf"), logits, transformed)
        enabled = target >= 0.0
        transformed = torch.where(enabled[:, None], transformed, logits)  # negative target: plain draw
        chosen = cand.replace_logits(transformed).draw(None, ctx, ctx.param("seed"))
        token_ids = cand.ids_at(chosen[:, None]).squeeze(1)
        original = p.gather(1, chosen[:, None]).squeeze(1)
        self._pending = (ctx.request_ids, ctx.positions.clone(), torch.where(enabled, token_ids, -1), original)
        return chosen

    def accept(self, ctx: StepContext, token_ids: torch.Tensor):
        pending, self._pending = self._pending, None
        if pending is None or pending[0] != ctx.request_ids or not torch.equal(pending[1], ctx.positions):
            return {}  # no selection for this step: nothing pending, the EMA stays (as llama.cpp)
        _, _, selected, original = pending
        match = selected == token_ids.to(selected.device)  # the accepted token is the one adaptive-p chose
        decay = ctx.param("decay")
        weighted_sum, total_weight = self._ema(ctx)
        return {
            "weighted_sum": torch.where(match, original + decay * weighted_sum, ctx.state["weighted_sum"]),
            "total_weight": torch.where(match, 1.0 + decay * total_weight, ctx.state["total_weight"]),
            "started": ctx.state["started"] | match,
        }


@hookimpl
def register_samplers(register):
    register(AdaptiveP)
