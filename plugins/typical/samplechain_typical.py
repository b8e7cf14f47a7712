"""`typical`: locally typical sampling (Meister et al. 2022, arXiv:2202.00666).

Over the current candidates: probabilities p_i = softmax, entropy H = -sum p_i log p_i, and each candidate's
distance from typicality |-log p_i - H|. Candidates are ranked by that distance (most typical first) and the
most typical ones are kept until their mass passes p. p >= 1 is a no-op; at least min_keep survive.

Two references, which differ at the cut (`semantics`):
- "llama.cpp" (llama_sampler_typical_apply, src/llama-sampler.cpp): walking the ranking, the first token where
  the running mass is strictly greater than p is the last one kept; the cut is by position, so of candidates
  tied in distance exactly as many are kept as the count says (ties ranked by candidate position here; llama.cpp
  leaves the order of ties to std::sort).
- "transformers" (TypicalLogitsWarper): the cut token is the first where the running mass is >= p, and every
  candidate whose distance is <= the cut token's is kept (a whole tie group survives).
Masked (-inf) candidates have p = 0, add nothing to H and are never kept (llama.cpp would compute NaN for them).
Probabilities, entropy and the running mass are float64.
"""

from __future__ import annotations

import attrs
import torch

from samplechain import Candidates, Sampler, Stage, StepContext, finite, hookimpl, in_range, one_of

SEMANTICS = ("llama.cpp", "transformers")


@attrs.frozen
class TypicalParams:
    p: float = attrs.field(validator=[finite, in_range(0.0, 1.0, hint="1 disables")])
    min_keep: int = attrs.field(default=1, validator=in_range(0, None))
    semantics: str = attrs.field(default="llama.cpp", validator=one_of(*SEMANTICS))


def typical_keep(
    logits: torch.Tensor, p: torch.Tensor, min_keep: torch.Tensor, semantics: str
) -> torch.Tensor:
    """(B, K) bool: the candidates typical sampling keeps, for per-row p (B,) and min_keep (B,)."""
    x = logits.double()
    valid = torch.isfinite(x)
    logp = torch.log_softmax(x, dim=-1)
    prob = torch.exp(logp)
    entropy = -torch.where(valid, prob * logp, 0.0).sum(dim=-1, keepdim=True)
    distance = torch.where(valid, (-logp - entropy).abs(), float("inf"))
    ranked, order = torch.sort(distance, dim=-1, stable=True)
    mass = torch.cumsum(prob.gather(1, order), dim=-1)
    width = x.shape[1]
    rank = torch.arange(width, device=x.device)[None, :]
    pp = p.double()[:, None]
    if semantics == "llama.cpp":
        # the first rank where the running mass exceeds p is the last kept (all kept when it never does)
        counts = (mass <= pp).sum(dim=-1) + 1
        counts = torch.clamp(torch.maximum(counts, min_keep), max=width)
        kept_ranked = rank < counts[:, None]
    else:
        cut = (mass < pp).sum(dim=-1).clamp(max=width - 1)
        kept_ranked = (ranked <= ranked.gather(1, cut[:, None])) | (rank < min_keep[:, None])
    kept_ranked &= torch.isfinite(ranked)
    return torch.zeros_like(kept_ranked).scatter_(1, order, kept_ranked)


class Typical(Sampler):
    name = "typical"
    stage = Stage.FILTER
    Params = TypicalParams
    request_aliases = {"typical_p": "p", "min_keep": "min_keep"}
    summary = "keep the most typical tokens (surprisal closest to the entropy) up to mass p"

    def apply(self, cand: Candidates, ctx: StepContext) -> Candidates:
        shared = ctx.scalar("p")
        if shared is not None and shared >= 1.0:
            return cand
        p, min_keep = ctx.param("p"), ctx.param("min_keep")
        off = p >= 1.0
        if bool(off.all()):
            return cand
        keep = typical_keep(cand.logits, p, min_keep, self.params.semantics)
        keep |= off[:, None]
        return cand.masked(keep)


@hookimpl
def register_samplers(register):
    register(Typical)
