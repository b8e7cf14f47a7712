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

from samplechain import Candidates, Sampler, Stage, StepContext, filters, finite, hookimpl, in_range, one_of
from samplechain.contracts import compact_kept, in_sync_free_step
from samplechain.filters import BUCKETS, MASS_MARGIN, bucket_edge, bucket_keys, bucket_sums

SEMANTICS = ("llama.cpp", "transformers")


@attrs.frozen
class TypicalParams:
    p: float = attrs.field(validator=[finite, in_range(0.0, 1.0, hint="1 disables")])
    min_keep: int = attrs.field(default=1, validator=in_range(0, None))
    semantics: str = attrs.field(default="llama.cpp", validator=one_of(*SEMANTICS))


def typical_keep(
    logits: torch.Tensor, p: torch.Tensor, min_keep: torch.Tensor, semantics: str, *, wide: bool = True
) -> torch.Tensor:
    """(B, K) bool: the candidates typical sampling keeps, for per-row p (B,) and min_keep (B,). wide=False: rank
    the whole row even when it is wide (no host read: the wide path sizes its buckets on the host)."""
    x = logits.double()
    valid = torch.isfinite(x)
    logp = torch.log_softmax(x, dim=-1)
    prob = torch.exp(logp)
    entropy = -torch.where(valid, prob * logp, 0.0).sum(dim=-1, keepdim=True)
    distance = torch.where(valid, (-logp - entropy).abs(), float("inf"))
    if wide and x.shape[1] >= filters.WIDE:  # only the candidates that can be kept are ranked
        keep = _wide_keep(distance, prob, p, min_keep, semantics)
        if keep is not None:
            return keep
    return _ranked_keep(distance, prob, p, min_keep, semantics)




def _wide_keep(distance: torch.Tensor, prob: torch.Tensor, p: torch.Tensor, min_keep: torch.Tensor,
               semantics: str) -> torch.Tensor | None:
    """typical's keep mask without ranking the whole row: the mass of the probabilities bucketed by distance (the
    float32 bit pattern of a distance >= 0 is monotone in it) gives a distance D whose set {distance <= D} holds
    more than p (plus a margin) and at least min_keep candidates; the stable ranking restricted to that set (kept
    in candidate order) is the ranking's prefix, so the cut found there is the cut of the row. None when a row's
    set would be most of the row, or when the cut is not found inside it (then the whole row is ranked)."""
    batch, width = distance.shape
    finite = torch.isfinite(distance)
    keys = bucket_keys(distance.float().clamp(max=3e38))
    mass_upto = bucket_sums(keys, torch.where(finite, prob, 0.0).float()).cumsum(dim=1, dtype=torch.float64)
    count_upto = bucket_sums(keys, finite.long()).cumsum(dim=1)
    enough = (mass_upto > (p.double() + MASS_MARGIN)[:, None]) & (count_upto >= min_keep[:, None])
    # rows that never get there (p near 1, few finite candidates) take every finite candidate
    key = torch.where(enough.any(dim=1), enough.int().argmax(dim=1), BUCKETS - 1)
    upper = bucket_edge(key + 1)
    inside = distance <= upper[:, None]  # every candidate of a bucket <= key (and a little more)
    size = inside.sum(dim=1)
    if int(size.max()) * 4 > width:
        return None
    dist_s, pos, size = compact_kept(distance, inside, size)  # candidate order kept: a stable rank restricted
    spare = torch.arange(dist_s.shape[1], device=dist_s.device)[None, :] >= size[:, None]
    dist_s = dist_s.masked_fill(spare, float("inf"))  # spare slots rank last and weigh nothing
    prob_s = prob.gather(1, pos).masked_fill(spare, 0.0)
    keep_s = _ranked_keep(dist_s, prob_s, p, min_keep, semantics, size)
    if keep_s is None:
        return None
    return torch.zeros_like(finite).scatter_(1, pos, keep_s) & finite


def _ranked_keep(distance: torch.Tensor, prob: torch.Tensor, p: torch.Tensor, min_keep: torch.Tensor,
                 semantics: str, size: torch.Tensor | None = None) -> torch.Tensor | None:
    """Rank by distance (stable) and cut at mass p. With `size` (B,), the rows hold only their first size[b]
    candidates of the ranking: None when a row's cut is not certainly among them."""
    ranked, order = torch.sort(distance, dim=-1, stable=True)
    mass = torch.cumsum(prob.gather(1, order), dim=-1)
    width = distance.shape[1]
    rank = torch.arange(width, device=distance.device)[None, :]
    pp = p.double()[:, None]
    if semantics == "llama.cpp":
        # the first rank where the running mass exceeds p is the last kept (all kept when it never does)
        counts = (mass <= pp).sum(dim=-1) + 1
        if size is not None and bool((torch.maximum(counts, min_keep) > size).any()):
            return None
        counts = torch.clamp(torch.maximum(counts, min_keep), max=width)
        kept_ranked = rank < counts[:, None]
    else:
        cut = (mass < pp).sum(dim=-1)
        if size is not None and bool(((cut >= size) | (min_keep > size)).any()):
            return None
        cut = cut.clamp(max=width - 1)
        kept_ranked = (ranked <= ranked.gather(1, cut[:, None])) | (rank < min_keep[:, None])
    kept_ranked &= torch.isfinite(ranked)
    return torch.zeros_like(kept_ranked).scatter_(1, order, kept_ranked)


class Typical(Sampler):
    name = "typical"
    sync_free = True  # no host read in a sync-free step (plugins/cuda/tests/test_sync_free.py)
    stage = Stage.FILTER
    Params = TypicalParams
    request_aliases = {"typical_p": "p", "min_keep": "min_keep"}
    summary = "keep the most typical tokens (surprisal closest to the entropy) up to mass p"

    def is_noop(self, ctx: StepContext) -> bool:
        shared = ctx.scalar("p")
        return shared is not None and shared >= 1.0

    def apply(self, cand: Candidates, ctx: StepContext) -> Candidates:
        if self.is_noop(ctx):
            return cand
        p, min_keep = ctx.param("p"), ctx.param("min_keep")
        off = p >= 1.0
        sync_free = in_sync_free_step()
        if not sync_free and bool(off.all()):
            return cand
        if cand.ids is None:  # candidate order is token-id order: equal distances rank by id
            keep = typical_keep(cand.logits, p, min_keep, self.params.semantics, wide=not sync_free)
        else:  # rank equal distances by token id, not by the order earlier filters left (batch invariance)
            by_id = cand.ids.argsort(dim=-1)
            keep_by_id = typical_keep(cand.logits.gather(1, by_id), p, min_keep, self.params.semantics,
                                      wide=not sync_free)
            keep = torch.zeros_like(keep_by_id).scatter_(1, by_id, keep_by_id)
        keep |= off[:, None]
        return cand.masked(keep)


@hookimpl
def register_samplers(register):
    register(Typical)
