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


def smooth(x: torch.Tensor, kf: torch.Tensor, sf: torch.Tensor, cubic: bool = True) -> torch.Tensor:
    """The webui transform of rows x (B, K) with per-row coefficients kf, sf (B,): the same float32 operations in
    the same order (d**2 is d * d and d**3 is d * d * d in torch), in place on two buffers. Rows whose sf is 0 get
    no s * d**3 term, which would only add zeros (webui's 0 * d**3 is NaN where d**3 overflows; there the quadratic
    alone gives -inf), also beside rows that have one; `cubic=False` (every sf is 0) skips the term altogether."""
    top = x.amax(dim=-1, keepdim=True)
    d = x - top
    out = torch.mul(d, d).mul_(kf[:, None]).neg_()  # -(k * factor * d**2)
    if cubic:
        cube = d.pow_(3).mul_(sf[:, None])  # + s * factor * d**3
        out.add_(cube.masked_fill_((sf == 0)[:, None], 0.0))
    out.add_(top)
    return out.masked_fill_(x == float("-inf"), float("-inf"))


class Quadratic(Sampler):
    name = "quadratic"
    stage = Stage.TRANSFORM
    Params = QuadraticParams
    request_aliases = {"smoothing_factor": "factor", "smoothing_curve": "curve"}
    summary = "quadratic / cubic smoothing of the logits around the top one (webui smoothing_factor)"

    def is_noop(self, ctx: StepContext) -> bool:
        shared = ctx.scalar("factor")
        return shared is not None and shared == 0.0

    def apply(self, cand: Candidates, ctx: StepContext) -> Candidates:
        if self.is_noop(ctx):
            return cand
        factor, curve = ctx.param("factor"), ctx.param("curve")
        off = factor == 0.0
        kf, sf = coefficients(factor, curve)
        out = smooth(cand.logits, kf, sf, cubic=ctx.scalar("curve") != 1.0)
        if bool(off.any()):
            out = torch.where(off[:, None], cand.logits, out)
        return cand.replace_logits(out)


@hookimpl
def register_samplers(register):
    register(Quadratic)
