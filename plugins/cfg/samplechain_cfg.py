"""`cfg`: classifier-free guidance, as transformers' UnbatchedClassifierFreeGuidanceLogitsProcessor.

Each step the generation loop runs a second forward of the model on the unconditional context (the negative
prompt followed by the tokens generated so far, with its own KV cache) and passes its last-position logits as
`ctx.unconditional_logits`. With c = log_softmax(logits) and u = log_softmax(unconditional logits):

    guided = scale * (c - u) + u

`scale` (transformers' `guidance_scale`) may differ per row; 1 disables (the row passes unchanged: transformers
returns log_softmax(logits) there, the same distribution). scale > 1 pushes away from the negative prompt, 0 < scale
< 1 toward it. The negative prompt: `generate(negative_prompt=...)` (one string, or one per prompt) or
`negative_prompt_ids=`, else this chain's `negative_prompt`, else, as transformers does without
`negative_prompt_ids`, each row's last prompt token. Put cfg first in a chain, as transformers does: after a
truncation it guides only the survivors (renormalised among them).
"""

from __future__ import annotations

import attrs
import torch

from samplechain import Candidates, Sampler, Stage, StepContext, finite, hookimpl, in_range
from samplechain.filters import log_softmax64


@attrs.frozen
class CfgParams:
    scale: float = attrs.field(default=1.0, validator=[finite, in_range(0.0, None, hint="1 disables")])
    negative_prompt: str = ""  # chain-level; "" = generate()'s negative prompt, else the last prompt token


class Cfg(Sampler):
    name = "cfg"
    sync_free = True  # no host read in a sync-free step (plugins/cuda/tests/test_sync_free.py)
    stage = Stage.TRANSFORM
    role = "guidance"
    Params = CfgParams
    request_aliases = {"guidance_scale": "scale", "cfg_scale": "scale"}
    summary = "classifier-free guidance against a negative prompt (a second forward per step)"

    def needs_unconditional_logits(self) -> bool:
        return True

    def apply(self, cand: Candidates, ctx: StepContext) -> Candidates:
        if ctx.scalar("scale") == 1.0:
            return cand
        scale = ctx.param("scale")
        on = scale != 1.0  # (B,)
        assert ctx.unconditional_logits is not None  # needs_unconditional_logits() is declared: the chain passes them
        uncond = torch.log_softmax(ctx.unconditional_logits, dim=-1)  # over the whole vocabulary
        if cand.ids is not None:
            uncond = uncond.gather(1, cand.ids)
        cond = log_softmax64(cand.logits).float()  # over the candidates: the same values alone and in a batch
        guided = scale[:, None] * (cond - uncond) + uncond
        # scale 0 is the unconditional distribution, also where a logit far below the row's top overflowed cond to
        # -inf (0 * -inf would be NaN)
        guided = torch.where(scale[:, None] == 0.0, uncond, guided)
        guided = torch.where(torch.isfinite(cand.logits), guided, cand.logits)  # removed stays removed
        return cand.replace_logits(torch.where(on[:, None], guided, cand.logits), is_sorted=False)


@hookimpl
def register_samplers(register):
    register(Cfg)
