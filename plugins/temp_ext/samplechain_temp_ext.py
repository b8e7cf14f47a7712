"""`temp_ext`: dynamic temperature chosen per row from the entropy of the candidates' distribution.

With delta <= 0 it is plain temperature t (t = 0 keeps only the argmax, t = 1 is a bitwise no-op), as llama.cpp's
`llama_sampler_temp_ext` falls back to `temp`. With delta > 0, per row:

    H = entropy of softmax(logits) over the live (finite) candidates, n = their count
    T = lo + (hi - lo) * (H / log n) ** exponent;  logits / T   (T <= 0 keeps only the argmax)

`formula` picks the reference:
- "llama.cpp" (src/llama-sampling.cpp llama_sampler_temp_ext_apply): lo = max(0, t - delta), hi = t + delta;
  a row with n <= 1 is left unchanged.
- "webui" (text-generation-webui modules/sampler_hijack.py DynamicTemperatureLogitsWarper, with
  dynatemp_low = t - delta, dynatemp_high = t + delta): H is clamped to >= 1e-10 and log n to >= 1e-10 (so a
  single live candidate gets T = hi); lo must be > 0 (webui divides by T).
"""

from __future__ import annotations

import math

import attrs
import torch

from samplechain import Candidates, FusedPart, Sampler, Stage, StepContext, filters, finite, hookimpl, in_range, one_of
from samplechain.contracts import in_sync_free_step

FORMULAS = ("llama.cpp", "webui")


def _delta_ok(inst: TempExtParams, _attr: attrs.Attribute, value: float) -> None:
    finite(inst, _attr, value)
    if inst.formula == "webui" and value > 0 and not inst.t - value > 0:
        raise ValueError(
            f'with formula = "webui" the low temperature t - delta must be > 0 (t = {inst.t:g}); '
            "webui divides the logits by it"
        )


@attrs.frozen
class TempExtParams:
    t: float = attrs.field(default=1.0, validator=[finite, in_range(0.0, None, hint="0 keeps only the argmax")])
    delta: float = attrs.field(default=0.0, validator=_delta_ok)
    exponent: float = attrs.field(default=1.0, validator=[finite, in_range(0.0, None)])
    formula: str = attrs.field(default="llama.cpp", validator=one_of(*FORMULAS))


def _row_entropy(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: entropy (nats, float64) of softmax over the finite logits, and the count of finite logits.

    H = log S - sum(e * z) / S with z = x - max, e = exp(z), S = sum(e): float32 passes (llama.cpp's precision),
    the sums accumulated in float64, at every width, log S through log1p of what lies below the maximum. The temperature divides every logit, so its float32 value must
    not depend on the batch: float32 sums round differently when torch splits a lone row's reduction across threads,
    and a width-dependent choice of formula changed it when compaction padded the row to another row's width."""
    live = torch.isfinite(x)
    n = live.sum(dim=-1)
    top = x.amax(dim=-1, keepdim=True)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    z = (x - top).clamp_(min=torch.finfo(x.dtype).min)  # -inf -> the lowest float: e = 0 and e * z = -0
    e = torch.exp(z)
    total = e.sum(dim=-1, dtype=torch.float64)
    # log S as log k + log1p(rest / k), k the tokens at the maximum (e = 1): on a peaked row S = k + rest with rest
    # ~1e-14, whose digits log(S) would lose (the entropy, ~rest, then rounding with the width of the sum)
    at_top = z == 0
    k = at_top.sum(dim=-1).clamp(min=1).double()
    rest = torch.where(at_top, torch.zeros_like(e), e).sum(dim=-1, dtype=torch.float64)
    return torch.log(k) + torch.log1p(rest / k) - z.mul_(e).sum(dim=-1, dtype=torch.float64) / total, n


def dynamic_temperature(
    x: torch.Tensor, t: torch.Tensor, delta: torch.Tensor, exponent: torch.Tensor, formula: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """(B,) float32 temperature per row and (B,) bool rows left unchanged (llama.cpp: n <= 1 live candidates)."""
    ent, n = _row_entropy(x)
    t64, d64, e64 = t.double(), delta.double(), exponent.double()
    lo, hi = t64 - d64, t64 + d64
    nd = n.double()
    if formula == "llama.cpp":
        lo = lo.clamp(min=0.0)
        max_ent = torch.log(nd.clamp(min=2.0))  # rows with n <= 1 are passed through below
        norm = ent / max_ent
        untouched = n <= 1
    else:  # webui
        ent = ent.clamp(min=1e-10)
        max_ent = torch.log(nd.clamp(min=1.0))
        max_ent = torch.where(max_ent > 0, max_ent, torch.full_like(max_ent, 1e-10))
        norm = ent / max_ent
        untouched = n == 0
    temp = lo + (hi - lo) * norm.pow(e64)
    return temp.float(), untouched


class TempExt(Sampler):
    name = "temp_ext"
    stage = Stage.TRANSFORM
    Params = TempExtParams
    request_aliases = {
        "temperature": "t",
        "dynatemp_range": "delta",
        "dynatemp_exponent": "exponent",
    }
    summary = "dynamic temperature in [t - delta, t + delta] from the normalised entropy (llama.cpp temp_ext)"
    has_fused_part = True

    def is_argmax_invariant(self) -> bool:
        return True  # a positive temperature keeps the order; T <= 0 keeps the (first) argmax itself

    @staticmethod
    def _plain(ctx: StepContext) -> bool:
        """delta <= 0 for every row of the batch: plain temperature t (its T <= 0 rule included)."""
        delta = ctx.scalar("delta")
        return delta is not None and delta <= 0.0

    def is_noop(self, ctx: StepContext) -> bool:
        return self._plain(ctx) and ctx.scalar("t") == 1.0

    def syncs_on(self, ctx: StepContext) -> bool:
        return not self._plain(ctx)  # plain: the sync-free path of a per-row temperature

    def fused(self, ctx: StepContext) -> FusedPart | None:
        return FusedPart("temperature", ctx.value("t")) if self._plain(ctx) else None

    def apply(self, cand: Candidates, ctx: StepContext) -> Candidates:
        s = ctx.scalar
        if self._plain(ctx):
            shared_t = s("t")
            if shared_t == 1.0:
                return cand
            if shared_t is not None and shared_t > 0:  # plain temperature for the whole batch
                if cand.writable:
                    cand.logits.div_(shared_t)
                    return cand
                return cand.replace_logits(cand.logits / shared_t, is_sorted=cand.is_sorted)
            if in_sync_free_step():  # plain temperature per row, as the temperature sampler: no host read
                t = ctx.param("t")
                return filters.divided(cand, t, ctx.bound("t")[0] <= 0)
        x = cand.logits
        t, delta = ctx.param("t"), ctx.param("delta")
        dyn = delta > 0
        temp = t.to(torch.float32)
        keep_rows = torch.zeros_like(dyn)
        if bool(dyn.any()):
            dyn_t, untouched = dynamic_temperature(x, t, delta, ctx.param("exponent"), self.params.formula)
            temp = torch.where(dyn, dyn_t, temp)
            keep_rows = dyn & untouched
        temp = temp[:, None]
        hot = temp > 0
        divisor = torch.where(hot, temp, torch.ones_like(temp))
        out = x.div_(divisor) if cand.writable and bool(hot.all()) and not bool(keep_rows.any()) else x / divisor
        if not bool(hot.all()):  # T <= 0: only the first maximum survives, its logit unchanged (llama.cpp)
            cand, top = cand.best_first()  # of equal maxima the lowest id (sorted rows: moved to the front)
            only_top = torch.zeros_like(x, dtype=torch.bool).scatter_(1, top, True)
            out = torch.where(hot, out, x.masked_fill(~only_top, -math.inf))
        if bool(keep_rows.any()):
            out = torch.where(keep_rows[:, None], x, out)
        return cand.replace_logits(out, is_sorted=cand.is_sorted)  # T > 0 never reorders; T <= 0 keeps the front


@hookimpl
def register_samplers(register):
    register(TempExt)
