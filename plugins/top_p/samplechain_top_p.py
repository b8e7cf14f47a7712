"""`top_p` (nucleus): keep the smallest set of most likely candidates whose probability mass reaches p.

llama.cpp semantics: probabilities are the softmax over the current candidates; walking down the sorted
candidates, the token at which the cumulative mass first reaches p is the last one kept (so a candidate is kept
iff the mass strictly above it is < p); p >= 1 is a no-op; at least min_keep survive. transformers'
TopPLogitsWarper removes tokens whose ascending cumulative mass is <= 1 - p: the same set, rounded in float32
instead of our float64 cumulative sum. Equal logits at the cut: the lowest token ids are kept (`settle_ties`),
so the kept set never depends on the batch.

Without a preceding top-k the candidates are unsorted and a full sort of the vocabulary would dominate the
step, so the cut is found on a partial top-k that grows (x8) until its mass reaches p in every row.
"""

from __future__ import annotations

import attrs
import torch

from samplechain import Backend, Candidates, FusedPart, Sampler, Stage, StepContext, filters, finite, hookimpl, in_range
from samplechain.contracts import TOP_P_CANDIDATES, in_sync_free_step
from samplechain.filters import BUCKETS, MASS_MARGIN, bucket_edge, bucket_mass

_FIRST_GUESS = 64  # partial top-k width tried first on unsorted candidates


@attrs.frozen
class TopPParams:
    p: float = attrs.field(validator=[finite, in_range(0.0, 1.0, hint="1 disables")])
    min_keep: int = attrs.field(default=1, validator=in_range(0, None))


def row_mass(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: the top logit and the normaliser sum(exp(logit - top)), both float64, (B, 1) and (B,).

    float64 throughout: a float32 log-sum-exp round trip moves the mass by ~1e-7, enough to flip a cut that
    lies exactly on p (llama.cpp's test: probabilities 0.1..0.4 with p = 0.7 keep two tokens, not three).
    """
    top = logits.amax(dim=-1, keepdim=True).double()
    return top, torch.exp(logits.double() - top).sum(dim=-1)


def kept_counts(
    values: torch.Tensor, top: torch.Tensor, total: torch.Tensor, p: torch.Tensor, min_keep: torch.Tensor
) -> torch.Tensor:
    """How many of the sorted candidates values (B, J) top-p keeps, given the row mass from row_mass()."""
    probs = torch.exp(values.double() - top) / total[:, None]  # (B, J)
    cum = torch.cumsum(probs, dim=-1)
    above = torch.cat([torch.zeros_like(cum[:, :1]), cum[:, :-1]], dim=-1)  # mass strictly above each candidate
    counts = (above < p.double()[:, None]).sum(dim=-1)  # `above` is non-decreasing: a prefix is kept
    # the token that reaches p is always kept, so at least one survives even with p = 0 and min_keep = 0
    return torch.clamp(torch.maximum(counts, min_keep), min=1, max=values.shape[1])


_CHUNK = 64
_FIRST_CHUNKS = 128  # ~8000 gathered tokens on a 128256 vocabulary: enough for peaked rows in one go


def wide_row_mass(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For wide rows: float32 probabilities from one fused softmax (for the histogram of superset_threshold, which
    allows for their rounding), and row_mass's float64 top logit and normaliser: the cut is the narrow rows' own
    at every width (a float32 normaliser is off by ~1e-7, enough to move a cut within rounding of p)."""
    top, total = row_mass(logits)
    return torch.softmax(logits, dim=-1), top, total


def chunked_cut(
    logits: torch.Tensor,
    top: torch.Tensor,
    total: torch.Tensor,
    p: torch.Tensor,
    min_keep: torch.Tensor,
    off: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """The top-p cut of wide rows from the chunks that hold the largest logits, or None (flat rows).

    The row is cut into chunks of 64; the n chunks with the largest maxima are gathered (plus the tail that fills
    no chunk). Every token outside them is <= U, the (n+1)-th largest chunk maximum, so the gathered tokens
    above U are exactly the row's largest, in order, and the mass above each of them is exact. When the cut lies
    among them in every row, it is the cut of the whole row; otherwise n grows (x4) while the gather stays small.
    Returns sorted values and positions (B, J) and the kept counts, as the top-k path does.
    """
    batch, vocab = logits.shape
    chunks = vocab // _CHUNK
    body = chunks * _CHUNK
    maxima = logits[:, :body].reshape(batch, chunks, _CHUNK).amax(dim=-1)  # (B, C)
    offsets = torch.arange(_CHUNK, device=logits.device)
    tail = torch.arange(body, vocab, device=logits.device).expand(batch, -1)
    need = int(torch.where(off, 0, min_keep).max())
    n = max(8, min(_FIRST_CHUNKS, vocab // (_CHUNK * 8)))
    while n < chunks and n * _CHUNK * 4 <= vocab:
        best_max, best = torch.topk(maxima, n + 1, dim=-1)  # sorted: column n is the largest maximum left out
        positions = torch.cat([(best[:, :n, None] * _CHUNK + offsets).reshape(batch, n * _CHUNK), tail], dim=1)
        gathered = logits.gather(1, positions)
        above = (gathered > best_max[:, n:]).sum(dim=-1)  # (B,) tokens ranked above everything not gathered
        j = min(max(int(above.max()) + 1, need, 1), gathered.shape[1])
        values, where = torch.topk(gathered, j, dim=-1)
        counts = kept_counts(values, top, total, p, min_keep)
        if bool((off | (counts <= above)).all()):
            return values, positions.gather(1, where), counts
        n *= 4
    return None


def superset_threshold(
    probs: torch.Tensor, top: torch.Tensor, total: torch.Tensor, p: torch.Tensor, backend: Backend | None = None
) -> torch.Tensor:
    """For flat rows: a logit per row (B,) at or below the last token top-p keeps, without a sort. The
    probabilities are bucketed by their float32 bit pattern (monotone in the value), the bucket masses summed
    from the top, and the lower edge of the bucket where the sum passes p (plus a margin) turned back into a
    logit (minus a margin). The caller checks the cut it then finds and widens if it must."""
    from_top = bucket_mass(probs, backend).flip(1).cumsum(dim=1, dtype=torch.float64)
    before = (from_top < (p.double() + MASS_MARGIN)[:, None]).sum(dim=1)  # buckets entirely above the cut
    edge = bucket_edge(torch.clamp(BUCKETS - 1 - before, min=0))  # smallest prob in the bucket of the cut
    return (top.squeeze(1) + torch.log(edge * total) - 1e-3).float()


class TopP(Sampler):
    name = "top_p"
    sync_free = True  # no host read in a sync-free step (plugins/cuda/tests/test_sync_free.py)
    stage = Stage.FILTER
    Params = TopPParams
    request_aliases = {"top_p": "p", "min_keep": "min_keep"}
    summary = "keep the smallest most-likely set with probability mass >= p"
    has_fused_part = True

    def is_noop(self, ctx: StepContext) -> bool:
        shared = ctx.scalar("p")
        return shared is not None and shared >= 1.0

    def fused(self, ctx: StepContext) -> FusedPart:
        return FusedPart("top_p", ctx.value("p"), ctx.value("min_keep"))

    def apply(self, cand: Candidates, ctx: StepContext) -> Candidates:
        shared = ctx.scalar("p")
        if shared is not None and shared >= 1.0:
            return cand
        p, min_keep = ctx.param("p"), ctx.param("min_keep")
        off = p >= 1.0  # (B,)
        width = cand.width
        if in_sync_free_step() and not cand.is_sorted:  # no host read: one sort, then the cut on sorted rows
            cand = cand.sorted(ctx.backend)
        if cand.is_sorted:
            top, total = row_mass(cand.logits)  # over all current candidates, as llama.cpp's softmax
            counts = kept_counts(cand.logits, top, total, p, min_keep)
            return cand.keep_first_settled(torch.where(off, width, counts))
        kernel = ctx.backend.kernel(TOP_P_CANDIDATES) if width >= filters.WIDE and cand.ids is None else None
        least = int(torch.where(off, 0, min_keep).max()) if width >= filters.WIDE else 0
        found = kernel(cand.logits, p, min_keep) if kernel is not None and not bool(off.any()) else None
        if found is not None:  # the backend's normaliser and candidates (the cpu backend's: compiled, one pass)
            top, total, threshold, values, index, trusted, counts = found  # a contracts.TopPCandidates
            if values is not None:  # and the cut: the rule below, on the same float64 mass
                return cand.restrict(values, index, counts, off, ranked=True)
            values, index, trusted = ctx.backend.at_least(cand.logits, threshold, least)
            ranked = True  # the full vocabulary: columns are token ids
        elif width >= filters.WIDE:  # the cut is searched in the chunks holding the largest logits
            # one normaliser per row whichever path finds the cut, so a row's cut never depends on its batch
            probs, top, total = wide_row_mass(cand.logits)
            found = chunked_cut(cand.logits, top, total, p, min_keep, off) if cand.logits.is_contiguous() else None
            if found is not None:
                values, index, counts = found
                return cand.restrict(values, index, torch.where(off, width, counts), off)
            # flat rows (thousands of tokens above the cut): read what lies above a threshold found from a
            # histogram of the probabilities, in one backend call
            threshold = torch.where(off, top.squeeze(1).float(), superset_threshold(probs, top, total, p, ctx.backend))
            values, index, trusted = ctx.backend.at_least(cand.logits, threshold, least)
            ranked = cand.ids is None  # in the filters' order where columns are token ids; else settled by id
        else:
            top, total = row_mass(cand.logits)  # float64: exact where a cut may sit right on p
            values, index = ctx.backend.topk(cand.logits, min(_FIRST_GUESS, width))
            trusted = torch.full_like(p, values.shape[1], dtype=torch.int64)
            ranked = False
        counts = kept_counts(values, top, total, p, min_keep)
        # a row's first `trusted` values are its largest in order; its cut is found unless it reached them all
        # (then the mass may continue below)
        while values.shape[1] < width and bool(((counts >= trusted) & ~off).any()):
            values, index = ctx.backend.topk(cand.logits, min(values.shape[1] * 8, width))
            trusted, ranked = torch.full_like(trusted, values.shape[1]), False
            counts = kept_counts(values, top, total, p, min_keep)
        counts = torch.where(off, width, counts)
        return cand.restrict(values, index, counts, off, ranked=ranked)


@hookimpl
def register_samplers(register):
    register(TopP)
