"""The cpu backend's compiled selections over whole rows (numba): Backend.at_least (a count, then the survivors
gathered and radix-sorted), Backend.ranked_topk (a min-heap of the k best ranked keys) and filters.bucket_mass's
histogram (BUCKET_MASS), each the same result as its torch path, bit for bit, with no (B, V) temporary.

The dispatch module (samplechain_cpu) imports this module only when a call needs it, numba installed and
SAMPLECHAIN_CPU_NUMBA not "0"; it imports only samplechain_cpu_jit, the shared compiled helpers."""

from __future__ import annotations

import numba
import numpy as np
import torch

from samplechain_cpu_jit import BUCKET_SHIFT, descending_key, jit, stable_radix_sort, threads

__all__ = ["at_least", "ranked_topk", "bucket_mass", "offer", "drain"]

_NO_IDS = np.zeros((1, 1), dtype=np.int64)  # the ids argument when there are none


# ----------------------------------------------------------------------------- Backend.at_least
@jit(parallel=True, nogil=True)
def _count_at_least(x, threshold, counts):
    for row in numba.prange(x.shape[0]):
        xr = x[row]
        edge = threshold[row]
        n = 0
        for j in range(xr.shape[0]):  # vectorised
            n += np.float64(xr[j]) >= edge
        counts[row] = n


@jit(parallel=True, nogil=True)
def _sorted_at_least(x, threshold, counts, values, positions):
    """Each row's entries >= its threshold, sorted by (value descending, position ascending), then (-inf, the
    columns not kept, ascending) in the spare slots: contracts.compact_kept and a stable descending sort. The
    entries are gathered in position order and radix-sorted stably by value alone."""
    width = values.shape[1]
    for row in numba.prange(x.shape[0]):
        xr = x[row]
        edge = threshold[row]
        n = counts[row]
        keys = np.empty(n, dtype=np.uint32)
        where = np.empty(n, dtype=np.int64)
        i = 0
        for j in range(xr.shape[0]):
            if np.float64(xr[j]) >= edge:
                keys[i] = descending_key(xr[j])
                where[i] = j
                i += 1
        _, where = stable_radix_sort(keys, where, n, np.empty(n, dtype=np.uint32), np.empty(n, dtype=np.int64))
        for slot in range(n):
            positions[row, slot] = where[slot]
            values[row, slot] = xr[where[slot]]
        slot, j = n, 0
        while slot < width:
            if not np.float64(xr[j]) >= edge:
                positions[row, slot] = j
                values[row, slot] = -np.inf
                slot += 1
            j += 1


def at_least(
    logits: torch.Tensor, threshold: torch.Tensor, k: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """samplechain_cpu_torch.compacted_at_least in two compiled passes: count each row's entries >= its threshold, then
    gather and sort only those (int64 keys: value, then lowest position), with no (B, V) temporary. The same
    values, positions and counts; None where that returns None (k more than a row holds above its threshold, or
    nothing above any) or in a forked child. logits (B, V) float32, threshold (B,)."""
    if not threads(logits.numel()):
        return None
    x = logits.detach().contiguous().numpy()
    edge = threshold.detach().to(torch.float64).contiguous().numpy()
    counts = np.empty(x.shape[0], dtype=np.int64)
    _count_at_least(x, edge, counts)
    if x.shape[0] == 0 or k > counts.min() or counts.max() == 0:
        return None
    width = int(counts.max())
    values = np.empty((x.shape[0], width), dtype=x.dtype)
    positions = np.empty((x.shape[0], width), dtype=np.int64)
    _sorted_at_least(x, edge, counts, values, positions)
    return torch.from_numpy(values), torch.from_numpy(positions), torch.from_numpy(counts)


# ----------------------------------------------------------------------------- Backend.ranked_topk
@jit(inline="always")
def _rank_key(v, ident):
    """contracts.ranked_keys of one entry: the float32's bits made monotone (-0.0 as +0.0) in the high 32 bits,
    2**32 - 1 - id in the low ones."""
    bits = np.int64(np.float32(v + np.float32(0.0)).view(np.int32))
    return ((bits ^ ((bits >> 31) & 0x7FFFFFFF)) << 32) | (np.int64(0xFFFFFFFF) - ident)


@jit(inline="always")
def _sift_down(heap, where, n, i):
    """Restore the min-heap heap[:n] (where[] carried along) below slot i."""
    key = heap[i]
    at = where[i]
    while True:
        child = 2 * i + 1
        if child >= n:
            break
        if child + 1 < n and heap[child + 1] < heap[child]:
            child += 1
        if heap[child] >= key:
            break
        heap[i] = heap[child]
        where[i] = where[child]
        i = child
    heap[i] = key
    where[i] = at


@jit(inline="always")
def offer(xr, heap, where, n, j, key, low):
    """Entry j of row xr, its ranked key, offered to the min-heap of the k = heap.shape[0] best (heap[:n] filled so
    far; at least k entries reach the caller's floor, so it fills): (n, low) after it, low the smallest logit of a
    full heap (an entry below it cannot enter)."""
    k = heap.shape[0]
    if n < k:
        heap[n] = key
        where[n] = j
        n += 1
        if n == k:
            for i in range(k // 2 - 1, -1, -1):
                _sift_down(heap, where, k, i)
            low = xr[where[0]]
    elif key > heap[0]:
        heap[0] = key
        where[0] = j
        _sift_down(heap, where, k, 0)
        low = xr[where[0]]
    return n, low


@jit(inline="always")
def drain(heap, where):
    """Heap-sort a full min-heap in place: descending keys (the filters' order), where[] carried along."""
    for end in range(heap.shape[0] - 1, 0, -1):  # the smallest to the back
        heap[0], heap[end] = heap[end], heap[0]
        where[0], where[end] = where[end], where[0]
        _sift_down(heap, where, end, 0)


@jit(inline="always")
def _group_floor(xr, k):
    """The least of the maxima of k disjoint runs of the row (NaN passed over; vectorised): each run's maximum is
    an entry, so at least k entries are >= it and no entry below it is among the k best. -inf where a run holds
    nothing above -inf."""
    n = xr.shape[0]
    size = n // k
    low = np.float32(np.inf)
    for g in range(k):
        start = g * size
        end = n if g == k - 1 else start + size
        top = np.float32(-np.inf)
        for j in range(start, end):
            v = xr[j]
            top = v if v > top else top
        low = top if top < low else low
    return low


@jit(parallel=True, nogil=True)
def _ranked_topk(x, ids, has_ids, values, positions):
    """Per row the k = values.shape[1] largest ranked keys (contracts.ranked_keys: logit, then lowest id) through a
    min-heap of k, then heap-sorted: descending keys, the filters' order. An entry whose logit is below the least
    of k runs' maxima (_group_floor), or once the heap is full below its smallest logit, cannot enter, and is
    passed over on one float comparison (NaN compares false: it takes the key)."""
    k = values.shape[1]
    for row in numba.prange(x.shape[0]):
        xr = x[row]
        heap = np.empty(k, dtype=np.int64)
        where = np.empty(k, dtype=np.int64)
        low = _group_floor(xr, k)
        n = 0
        for j in range(xr.shape[0]):
            v = xr[j]
            if v < low:
                continue
            n, low = offer(xr, heap, where, n, j, _rank_key(v, ids[row, j] if has_ids else j), low)
        drain(heap, where)
        for i in range(k):
            positions[row, i] = where[i]
            values[row, i] = xr[where[i]]


def ranked_topk(
    logits: torch.Tensor, k: int, ids: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """contracts.ranked_topk in one compiled pass per row, with no (B, K) keys: the same values and positions, in
    the filters' order (descending logit, equal logits lowest id first), ties or not. logits (B, K) float32, 0 < k
    <= K; ids (B, K) integer or None (id = position). None in a forked child."""
    if not threads(logits.numel()):
        return None
    x = logits.detach().contiguous().numpy()
    idn = _NO_IDS if ids is None else ids.detach().to(torch.int64).contiguous().numpy()
    values = np.empty((x.shape[0], k), dtype=x.dtype)
    positions = np.empty((x.shape[0], k), dtype=np.int64)
    _ranked_topk(x, idn, ids is not None, values, positions)
    return torch.from_numpy(values), torch.from_numpy(positions)


# ----------------------------------------------------------------------------- filters.bucket_mass
@jit(parallel=True, nogil=True)
def _bucket_mass(x, out):
    for row in numba.prange(x.shape[0]):
        xr = x[row]
        into = out[row]
        into[:] = 0
        for j in range(xr.shape[0]):  # in row order, in float32: scatter_add's sums to the bit
            v = xr[j]
            into[(np.float32(v).view(np.int32) >> BUCKET_SHIFT) & np.int32(into.shape[0] - 1)] += v


def bucket_mass(values: torch.Tensor, buckets: int) -> torch.Tensor | None:
    """filters.bucket_sums(filters.bucket_keys(values), values) in one compiled pass per row (no (B, K) int64
    keys): (B, buckets) float32. values (B, K) float32, >= 0. None in a forked child."""
    if not threads(values.numel()):
        return None
    out = np.empty((values.shape[0], buckets), dtype=np.float32)
    _bucket_mass(values.detach().contiguous().numpy(), out)
    return torch.from_numpy(out)
