"""`quadratic`: quadratic sampling ("smoothing"), as text-generation-webui's QuadraticSamplingLogitsWarper.

Per row, with m the row's top logit and d = logit - m (<= 0):

    k = (3 - curve) / 2,  s = (curve - 1) / 2
    logit' = -(k * factor * d**2) + (s * factor * d**3) + m          (-inf stays -inf)

curve = 1 is the pure quadratic; larger curves add the cubic term. factor = 0 disables (a bitwise no-op: webui
does not add the warper then; the formula itself would flatten every logit to m). webui takes m over the whole
batch tensor (it runs batch 1); here m is each row's own maximum, so rows are independent.
"""

from __future__ import annotations

import attrs
import torch

from samplechain import Candidates, Sampler, Stage, StepContext, finite, hookimpl, in_range


@attrs.frozen
class QuadraticParams:
    factor: float = attrs.field(default=0.0, validator=[finite, in_range(0.0, None, hint="0 disables")])
    curve: float = attrs.field(default=1.0, validator=[finite, in_range(1.0, None, hint="1 = pure quadratic")])


def coefficients(factor: torch.Tensor, curve: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(k * factor, s * factor) per row, formed in float64 as webui forms them from Python floats, then float32
    (the dtype torch gives a Python scalar multiplying a float32 tensor)."""
    f, c = factor.double(), curve.double()
    return ((3.0 - c) / 2.0 * f).float(), ((c - 1.0) / 2.0 * f).float()


def smooth(x: torch.Tensor, kf: torch.Tensor, sf: torch.Tensor) -> torch.Tensor:
    """The webui transform of rows x (B, K) with per-row coefficients kf, sf (B,): same operations, same order."""
    top = x.amax(dim=-1, keepdim=True)
    d = x - top
    out = -(kf[:, None] * d**2) + (sf[:, None] * d**3) + top
    return torch.where(x != float("-inf"), out, x)


class Quadratic(Sampler):
    name = "quadratic"
    stage = Stage.TRANSFORM
    Params = QuadraticParams
    request_aliases = {"smoothing_factor": "factor", "smoothing_curve": "curve"}
    summary = "quadratic / cubic smoothing of the logits around the top one (webui smoothing_factor)"

    def apply(self, cand: Candidates, ctx: StepContext) -> Candidates:
        shared = ctx.scalar("factor")
        if shared is not None and shared == 0.0:
            return cand
        factor, curve = ctx.param("factor"), ctx.param("curve")
        off = factor == 0.0
        kf, sf = coefficients(factor, curve)
        out = smooth(cand.logits, kf, sf)
        if bool(off.any()):
            out = torch.where(off[:, None], cand.logits, out)
        return cand.replace_logits(out)


@hookimpl
def register_samplers(register):
    register(Quadratic)
