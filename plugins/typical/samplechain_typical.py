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

On a wide full-vocabulary row a backend may find the candidates (its TYPICAL_BAND kernel; the cpu backend's is
compiled with numba): since -log p_i - H = c - x_i with c = sum p_i x_i the mean logit, the distance is |c - x_i|,
the kept tokens lie in a band of logits around c, and only that band is ranked, with c and log Z from the kernel's
float64 sums (which round differently from torch's log_softmax only in the last bits).
"""

from __future__ import annotations

import attrs
import torch

from samplechain import Candidates, Sampler, Stage, StepContext, filters, finite, hookimpl, in_range, one_of
from samplechain.contracts import TYPICAL_BAND, Backend, compact_kept, in_sync_free_step
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


def _wide_keep(
    distance: torch.Tensor, prob: torch.Tensor, p: torch.Tensor, min_keep: torch.Tensor, semantics: str
) -> torch.Tensor | None:
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


def _ranked_keep(
    distance: torch.Tensor,
    prob: torch.Tensor,
    p: torch.Tensor,
    min_keep: torch.Tensor,
    semantics: str,
    size: torch.Tensor | None = None,
    *,
    per_row: bool = False,
):
    """Rank by distance (stable) and cut at mass p. With `size` (B,), the rows hold only their first size[b]
    candidates of the ranking: None when a row's cut is not certainly among them, or with per_row, the keep mask
    and which rows' cuts are (B,) bool."""
    ranked, order = torch.sort(distance, dim=-1, stable=True)
    mass = torch.cumsum(prob.gather(1, order), dim=-1)
    width = distance.shape[1]
    rank = torch.arange(width, device=distance.device)[None, :]
    pp = p.double()[:, None]
    if semantics == "llama.cpp":
        # the first rank where the running mass exceeds p is the last kept (all kept when it never does)
        counts = (mass <= pp).sum(dim=-1) + 1
        uncertain = torch.maximum(counts, min_keep) > size if size is not None else None
        if uncertain is not None and not per_row and bool(uncertain.any()):
            return None
        counts = torch.clamp(torch.maximum(counts, min_keep), max=width)
        kept_ranked = rank < counts[:, None]
    else:
        cut = (mass < pp).sum(dim=-1)
        uncertain = (cut >= size) | (min_keep > size) if size is not None else None
        if uncertain is not None and not per_row and bool(uncertain.any()):
            return None
        cut = cut.clamp(max=width - 1)
        kept_ranked = (ranked <= ranked.gather(1, cut[:, None])) | (rank < min_keep[:, None])
    kept_ranked &= torch.isfinite(ranked)
    kept = torch.zeros_like(kept_ranked).scatter_(1, order, kept_ranked)
    if not per_row:
        return kept
    assert uncertain is not None  # per_row comes with size (its one caller passes both)
    return kept, ~uncertain


def _band_keep(
    band: tuple[torch.Tensor, ...], p: torch.Tensor, min_keep: torch.Tensor, semantics: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """From a TYPICAL_BAND kernel's band: (keep (B, W) over its slots, done (B,) bool). The band is ranked by
    |c - x| (float64, spare slots at inf) and cut by the running mass of e**(x - log Z); rows the kernel left out
    (count -1), or whose cut the band does not surely hold, are not done (the caller ranks them whole)."""
    values, _, counts, center, lse = band
    done = counts >= 0
    x = values.double()
    distance = (center[:, None] - x).abs()  # a spare slot (-inf) is at inf
    prob = torch.exp(x - lse[:, None])
    keep, certain = _ranked_keep(distance, prob, p, min_keep, semantics, counts.clamp(min=0), per_row=True)
    done &= certain
    return keep & done[:, None], done


def _band_path(
    cand: Candidates, p: torch.Tensor, min_keep: torch.Tensor, semantics: str, backend: Backend
) -> Candidates | None:
    """typical on the full vocabulary of wide rows through the backend's TYPICAL_BAND kernel; None where it has
    none (or declines). Rows it leaves out are ranked whole by typical_keep."""
    kernel = backend.kernel(TYPICAL_BAND)
    band = kernel(cand.logits, p, min_keep) if kernel is not None else None
    if band is None:
        return None
    values, positions = band[:2]
    keep_band, done = _band_keep(band, p, min_keep, semantics)
    counts = keep_band.sum(dim=1)
    width = int(counts.max())
    if bool(done.all()) and width * 8 <= cand.width:  # compacted, as Candidates.masked would compact the mask
        order = torch.argsort((~keep_band).to(torch.uint8), dim=1, stable=True)[:, :width]  # kept first, in order
        spare = torch.arange(width, device=order.device)[None, :] >= counts[:, None]  # the band's other tokens
        return Candidates(
            values.gather(1, order).masked_fill_(spare, float("-inf")),
            positions.gather(1, order),
            cand.vocab_size,
            False,
            True,
        )
    keep = torch.zeros_like(cand.logits, dtype=torch.bool).scatter_(1, positions, keep_band)
    if not bool(done.all()):
        rest = (~done).nonzero()[:, 0]
        keep[rest] = typical_keep(cand.logits[rest], p[rest], min_keep[rest], semantics)
    return cand.masked(keep)


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
        if cand.ids is None and not sync_free and cand.width >= filters.WIDE and not bool(off.any()):
            found = _band_path(cand, p, min_keep, self.params.semantics, ctx.backend)
            if found is not None:
                return found
        if cand.ids is None:  # candidate order is token-id order: equal distances rank by id
            keep = typical_keep(cand.logits, p, min_keep, self.params.semantics, wide=not sync_free)
        else:  # rank equal distances by token id, not by the order earlier filters left (batch invariance)
            by_id = cand.ids.argsort(dim=-1)
            keep_by_id = typical_keep(
                cand.logits.gather(1, by_id), p, min_keep, self.params.semantics, wide=not sync_free
            )
            keep = torch.zeros_like(keep_by_id).scatter_(1, by_id, keep_by_id)
        keep |= off[:, None]
        return cand.masked(keep)


@hookimpl
def register_samplers(register):
    register(Typical)
