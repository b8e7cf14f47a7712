"""The cpu backend's torch fast paths and reference helpers: chunked top-k through chunk maxima, the threshold and
compacted paths of ranked top-k and at-least, the tie checks that let a plain top-k stand for a ranked one, the
ranked keys in numpy for small inputs, and min_p's floor as the plugin forms it.

Plain torch and numpy: no numba. The dispatch module (samplechain_cpu) chooses among these and the compiled kernels,
and the kernel modules take min_p_floor from here; this module imports neither."""

from __future__ import annotations

import math

import numpy as np
import torch

from samplechain.contracts import compact_kept

__all__ = [
    "CHUNK",
    "MAX_SHARE",
    "MIN_VOCAB",
    "NP_KEYS",
    "chunk_width",
    "chunk_maxima",
    "gather_chunks",
    "chunked_topk",
    "threshold_ranked_topk",
    "looks_coarse",
    "distinct_topk",
    "np_ranked_topk",
    "compacted_at_least",
    "min_p_floor",
]

# chunked top-k pays when the k best chunks are a small part of the row (their gather and second top-k stay cheap)
CHUNK = 64
_MIN_CHUNK = 16
MAX_SHARE = 4  # gather at most 1/4 of a row
MIN_VOCAB = 16384  # narrower rows: torch.topk is as fast as the extra calls
NP_KEYS = 1 << 13  # up to this many entries the keys are made and ranked in numpy (~1 us an operation, not ~5;
# numpy's one thread loses beyond)


def chunk_width(vocab: int, k: int) -> int:
    """The chunk width chunked_topk uses for a row of `vocab` entries and `k` wanted, or 0 for a plain topk."""
    if vocab < MIN_VOCAB:
        return 0
    width = CHUNK
    while width > _MIN_CHUNK and k * width * MAX_SHARE > vocab:
        width //= 2
    return width if k * width * MAX_SHARE <= vocab else 0


def chunk_maxima(logits: torch.Tensor, width: int) -> torch.Tensor:
    """(B, V // width): the maximum of each whole chunk of `width` entries along the rows of logits (B, V); the
    tail that fills no whole chunk is left out (gather_chunks adds it back)."""
    batch, vocab = logits.shape
    chunks = vocab // width
    return logits[:, : chunks * width].reshape(batch, chunks, width).amax(dim=-1)


def gather_chunks(logits: torch.Tensor, best: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The entries of the chunks `best` (B, n) (chunk numbers, as chunk_maxima counts them) and of the tail that
    fills no whole chunk: (positions (B, n * width + tail) int64, chunk by chunk then the tail, and logits at them)."""
    batch, vocab = logits.shape
    body = vocab // width * width
    offsets = torch.arange(width, device=logits.device)
    positions = (best[:, :, None] * width + offsets).reshape(batch, best.shape[1] * width)
    if body < vocab:
        positions = torch.cat([positions, torch.arange(body, vocab, device=logits.device).expand(batch, -1)], dim=1)
    return positions, logits.gather(1, positions)


def chunked_topk(logits: torch.Tensor, k: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """torch.topk(logits, k) through chunk maxima: the same values, in descending order, and their positions.

    The k largest entries of a row lie in the k chunks with the largest maxima: were one of them in another
    chunk, the k chunks chosen would each hold an entry at least as large, k entries in all. So one vectorised
    `amax` over (B, V / w, w) chunks, a top-k of the chunk maxima, a gather of those k * w entries (plus the tail
    that fills no whole chunk) and a top-k of them. Equal logits at the k-th place may resolve to other positions
    than torch.topk's (whose choice is unspecified too); the values are identical.
    """
    best = torch.topk(chunk_maxima(logits, width), k, dim=-1, sorted=False).indices  # (B, k) chunk numbers
    positions, gathered = gather_chunks(logits, best, width)
    values, where = torch.topk(gathered, k, dim=-1, sorted=True)
    return values, positions.gather(1, where)


def threshold_ranked_topk(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Backend.ranked_topk on whole rows (k too large for chunks to pay): the k-th largest logit v from one
    top-k, every entry above it and, of those equal to it, the first along the row (a running count), compacted
    and sorted by value."""
    kth = torch.topk(logits, k, dim=-1, sorted=False).values.amin(dim=-1, keepdim=True)  # (B, 1)
    above = logits > kth
    equal = logits == kth
    room = k - above.sum(dim=-1, keepdim=True)
    keep = above | (equal & (torch.cumsum(equal, dim=-1, dtype=torch.int32) <= room))
    values, positions, _ = compact_kept(logits, keep)  # k per row, in row order
    values, order = torch.sort(values, dim=-1, descending=True, stable=True)
    return values, positions.gather(1, order)


def looks_coarse(logits: torch.Tensor) -> bool:
    """Whether a row looks rounded to bfloat16 / float16 (the low 13 mantissa bits of its first 256 values all
    zero): such rows tie at a k-th place so often that trying a plain top-k first costs more than it saves. Only a
    choice of path: both give the same result."""
    sample = logits[:1, :256].contiguous()
    return sample.dtype == torch.float32 and not bool((sample.view(torch.int32) & 0x1FFF).any())


def distinct_topk(
    x: torch.Tensor, j: int, *, masked_ties: bool = False, whole: bool = True
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """torch.topk(x, j) when no tie needs the filters' order: no entry left out equals the j-th value (the set is
    the ranked one) and, whole=True, no two of the j are equal (so is the order; nearly always on float32 logits);
    masked_ties: equal -inf values allowed, for callers that never keep those. None otherwise (bfloat16 logits):
    the caller ranks by keys. A top-k of j, not j + 1: torch's faster path needs j * 64 <= the row's width."""
    if j >= x.shape[1] or x.requires_grad:
        return None
    values, where = torch.topk(x, j, dim=-1, sorted=True)
    last = values[:, j - 1 : j]
    tied = (x >= last).sum(dim=-1) > j  # an entry left out equals the j-th value
    if masked_ties:
        tied &= last[:, 0] > float("-inf")
    if bool(tied.any()):
        return None
    if whole and j > 1:
        if values.shape[0] <= 256:  # numpy: one call instead of a handful of torch ones
            v = values.numpy()
            same = v[:, 1:] == v[:, :-1]
            if same.any() and (not masked_ties or (same & (v[:, 1:] > -np.inf)).any()):
                return None
        elif bool(
            (
                (values[:, 1:] == values[:, :-1]) & (values[:, 1:] > float("-inf"))
                if masked_ties
                else values[:, 1:] == values[:, :-1]
            ).any()
        ):
            return None
    return values, where


def np_ranked_topk(x: torch.Tensor, k: int, ids: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """contracts.ranked_topk in numpy, for inputs of up to NP_KEYS entries: candidates.ranked_keys' keys (the float's
    monotone bits, then 2**32 - 1 - id) formed in numpy, an argpartition for the k largest and a sort of those."""
    bits = (x.float().numpy() + np.float32(0.0)).view(np.int32)  # + 0.0: -0.0 becomes +0.0
    order = (bits ^ ((bits >> 31) & 0x7FFFFFFF)).astype(np.int64)
    idn = np.arange(x.shape[1], dtype=np.int64)[None, :] if ids is None else ids.numpy()
    keys = (order << 32) | (0xFFFFFFFF - idn)
    width = keys.shape[1]
    part = (
        np.argpartition(keys, width - k, axis=-1)[:, width - k :]
        if k < width
        else np.broadcast_to(np.arange(width), keys.shape).copy()
    )
    top = np.take_along_axis(keys, part, axis=-1)
    where = torch.from_numpy(np.take_along_axis(part, np.argsort(-top, axis=-1, kind="stable"), axis=-1))
    return x.gather(1, where), where


def compacted_at_least(
    logits: torch.Tensor, threshold: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """Backend.at_least for many entries per row (thousands: flat rows): the entries >= threshold compacted
    with one nonzero into (B, max count) (in column order) and sorted there, stably (equal logits: lowest
    position first), about half the cost of a top-k of that many from the whole row. None when k asks for more
    than a row holds above its threshold (the caller takes the top-k)."""
    keep = logits >= threshold[:, None]
    counts = keep.sum(dim=-1)
    width = int(counts.max())
    if k > int(counts.min()) or width == 0:
        return None
    values, positions, _ = compact_kept(logits, keep, counts)
    values, order = torch.sort(values, dim=-1, descending=True, stable=True)
    return values, positions.gather(1, order), counts


def min_p_floor(top: torch.Tensor, p: torch.Tensor | float) -> torch.Tensor:
    """(B,) float32: min_p's threshold as the plugin computes it from the rows' largest logits top (B,) (of logits
    / t when the temperature comes first): top + log p in float32, -inf where p <= 0 (the row keeps everything)."""
    if not isinstance(p, torch.Tensor):
        return top + math.log(p)
    off = p <= 0.0
    return torch.where(off, float("-inf"), top + torch.log(torch.where(off, torch.ones_like(p), p)))
