"""`softcap`: Gemma-2-style logit soft-capping, logits = cap * tanh(logits / cap).

Squashes every logit smoothly into [-cap, cap]: small logits pass almost unchanged (tanh(x) ~ x), large ones
saturate, so no single token can dominate by an outsized logit. Gemma 2 applies it to its final logits with
cap = 30 (`final_logit_softcapping`); models that need it expect it before any other sampler.

Masked candidates (-inf) stay masked: the formula alone would turn them into -cap and revive them. A +inf logit
is a value, not a mask, and follows the formula (it becomes cap), as in Gemma's modelling code.
"""

from __future__ import annotations

import attrs
import torch

from samplechain import Candidates, Sampler, Stage, StepContext, finite, hookimpl, in_range

__version__ = "0.1.0"

NEG_INF = float("-inf")


@attrs.frozen
class SoftcapParams:
    cap: float = attrs.field(validator=[finite, in_range(0.0, None, low_open=True, hint="Gemma 2 uses 30.0")])


class Softcap(Sampler):
    name = "softcap"
    version = 1
    stage = Stage.TRANSFORM
    Params = SoftcapParams
    request_aliases = {"softcap": "cap"}
    summary = "Gemma-2-style soft-capping: cap * tanh(logits / cap)"

    def is_argmax_invariant(self) -> bool:
        return True  # tanh is monotonic (exact ties only where float32 tanh saturates: |logit| > ~9 cap)

    def apply(self, cand: Candidates, ctx: StepContext) -> Candidates:
        shared = ctx.scalar("cap")  # one cap for the whole batch: a Python float, no (B, 1) broadcast
        cap = shared if shared is not None else ctx.param("cap")[:, None]  # float or (B, 1) float32
        logits = cand.logits  # (B, K) float32
        masked = torch.isneginf(logits)  # tanh(-inf) = -1 would turn a masked candidate into -cap
        if cand.writable:  # the chain owns the buffer: no allocation
            out = logits.div_(cap).tanh_().mul_(cap)
        else:  # never touch the caller's tensor: one new buffer, then in place on it
            out = torch.div(logits, cap).tanh_().mul_(cap)
        out.masked_fill_(masked, NEG_INF)
        return cand if out is logits else cand.replace_logits(out)


@hookimpl
def register_samplers(register):
    register(Softcap)
