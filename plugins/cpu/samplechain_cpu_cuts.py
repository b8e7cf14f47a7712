"""Truncation cuts over whole rows, compiled with numba: the cpu backend's TYPICAL_BAND and TOP_P_CANDIDATES kernels.

TOP_P_CANDIDATES (top_p on unsorted wide rows): per row the maximum, then one pass summing e**(x - max) in float64
(the vectorised float64 e** of samplechain_cpu_jit) by depth below the maximum (buckets of 1/16 logit, the
adds branch-free), the normaliser as the buckets' sum, a logit at or below the last token top-p keeps (the bucket
where the mass from the top passes p), the tokens at or above it radix-sorted by (logit descending, position) (as
Backend.at_least ranks them) and top-p's cut on their float64 running mass (the plugin's rule, kept_counts).
The cpu backend's FUSED_SAMPLE runs `[temperature ->] top_p -> dist` through the same pass and then draws among
the tokens kept (top_p_draw): the candidates are never copied out.

TYPICAL_BAND:

Typical sampling (plugins/typical) keeps the tokens whose surprisal -log p_i is closest to the entropy H, most
typical first, until their mass passes p. With log p_i = x_i - log Z and H = log Z - c, where c = sum p_i x_i is
the mean logit, the distance |-log p_i - H| is |c - x_i|: the kept tokens are a band of logits around c. Per row,
all while the row stays in the core's cache:

1. the maximum m, then Z' = sum e**(x - m), T = sum e**(x - m) (x - m) and U = sum e**(x - m) (x - m)**2 in
   float64, with a vectorised float64 e** (Cody-Waite reduction, degree-13 Taylor polynomial: within 1 ulp of
   libm's): log Z = m + log Z', c = m + T / Z' and the surprisal's variance U / Z' - (T / Z')**2;
2. the mass p_i of the tokens within reach of c bucketed by their distance (the float32 bit pattern of a distance
   >= 0 is monotone in it, filters.bucket_keys), the reach from Chebyshev's bound: the tokens within it hold more
   than p (a few percent of an LLM's row; if rounding or min_keep says otherwise, every token is bucketed), and
   from the buckets' running mass the least distance D whose band {|c - x_i| <= D} surely holds more than p and at
   least min_keep tokens;
3. the band's positions, in position order.

The plugin then ranks the band alone (|c - x_i| and p_i in torch's float64, the band being a prefix of the
stable ranking by that distance) and cuts it by its semantics. Both sums differ from torch's log_softmax in the
last bits (~1e-16): the kept set is torch's path's but where a running mass lies within ~1e-15 of p, or two
distances within ~1e-15 of each other. A row is its own: the same band alone and in any batch.
"""

from __future__ import annotations

import threading

import numba
import numpy as np
import torch

from samplechain.contracts import TopPCandidates, TypicalBand
from samplechain_cpu_jit import (
    BLOCK,
    BUCKET_SHIFT,
    EXP64_FLOOR,
    HUGE,
    descending_key,
    exp64,
    jit,
    largest,
    noise,
    noise_bound,
    per_row,
    row_keys,
    salt,
    stable_radix_sort,
    threads,
    token_bits,
)

__all__ = ["typical_band", "top_p_candidates", "top_p_draw"]

_PER_DEPTH = 16.0  # top_p's buckets: 1/16 of a logit below the top each
_DEEPEST = 1023  # the last bucket (64 logits down) takes every deeper token
_MARGIN = 1e-6  # the buckets' float64 mass aims past p by this much: far beyond the rounding of their sums
_LARGEST_TOP = 2.0**16  # typical leaves rows whose largest |logit| is beyond it to the torch path: c and log Z are
# kept relative to 0, so their rounding grows with the top (here at most ~1e-11 of a probability)


_buffers = threading.local()  # per thread: the kernels' (B, W) scratch, kept from call to call


def _scratch(name: str, rows: int, cols: int, dtype: type) -> np.ndarray:
    """A (rows, cols) array of dtype, its contents undefined, reused by the next call in this thread: a fresh
    (B, V / 4) array every step costs its page faults (at B = 128 more than the kernel's own work)."""
    pool = _buffers.__dict__
    buf = pool.get(name)
    if buf is None or buf.size < rows * cols:
        buf = pool[name] = np.empty(max(rows * cols, 1), dtype=dtype)
    return buf[: rows * cols].reshape(rows, cols)


@jit(nogil=True, fastmath={"contract"})
def _exps(xr, m, e, low):
    """e[j] = e**(x[j] - m) and low[j] = max(x[j] - m, -708): vectorised, and not under `reassoc`, which would
    undo exp64's rounding to an integer ((y + C) - C -> y)."""
    for j in range(xr.shape[0]):
        r = np.float64(xr[j]) - m  # <= 0, -inf for a masked token (e 0, low finite: no 0 * -inf)
        e[j] = exp64(r)
        low[j] = r if r > EXP64_FLOOR else EXP64_FLOOR  # a select, not max: the loop vectorises


@jit(nogil=True, fastmath={"reassoc", "nsz", "contract"})
def _sums(e, low, n):
    """sum e, sum e low, sum e low**2 over the first n: vectorised (the order is the compiled loop's)."""
    s = 0.0
    t = 0.0
    u = 0.0
    for j in range(n):
        s += e[j]
        t += e[j] * low[j]
        u += e[j] * low[j] * low[j]
    return s, t, u


@jit(nogil=True)
def _moments(xr, m):
    """sum e**r, sum e**r r and sum e**r r**2 over a row in float64, r = x - m, m its finite maximum: block by
    block of BLOCK, the blocks' sums added in order."""
    e = np.empty(BLOCK)
    low = np.empty(BLOCK)
    s = 0.0
    t = 0.0
    u = 0.0
    for start in range(0, xr.shape[0], BLOCK):
        n = min(BLOCK, xr.shape[0] - start)
        _exps(xr[start : start + n], m, e, low)
        bs, bt, bu = _sums(e, low, n)
        s += bs
        t += bt
        u += bu
    return s, t, u


@jit(nogil=True, fastmath={"contract"})
def _near(xr, c, reach, lse, gap, w):
    """gap[j] = |c - x[j]| and w[j] = e**(x[j] - lse) for a block, vectorised; how many gaps are <= reach."""
    n = 0
    for j in range(xr.shape[0]):
        v = np.float64(xr[j])
        g = abs(c - v)
        gap[j] = g
        w[j] = exp64(v - lse)
        n += g <= reach
    return n


@jit(nogil=True)
def _close(xr, c, reach, hit):
    """hit[j] = |c - x[j]| <= reach, one byte each (vectorised): how many, and how many x[j] are NaN."""
    n = 0
    nan = 0
    for j in range(xr.shape[0]):
        near = abs(c - np.float64(xr[j])) <= reach
        hit[j] = near
        n += near
        nan += xr[j] != xr[j]
    return n, nan


@jit(nogil=True)
def _bucket_bound(xr, c, lse, reach, goal, least, mass, many):
    """The bucket (of filters.bucket_keys of the distance |c - x|) where the running mass of the tokens within
    `reach` of c passes goal with at least `least` of them; -1 if it never does. A block with few such tokens
    (LLM rows: a few percent of the vocabulary) marks them in one vectorised loop and takes their e** one by one,
    its marks read 8 at a time (a word of 8 misses costs one test: _gather's way); a block with many, all at
    once."""
    mass[:] = 0.0
    many[:] = 0
    gap = np.empty(BLOCK)
    w = np.empty(BLOCK)
    hit = np.zeros(BLOCK, dtype=np.uint8)
    words = hit.view(np.uint64)
    dense = False
    for start in range(0, xr.shape[0], BLOCK):
        n = min(BLOCK, xr.shape[0] - start)
        block = xr[start : start + n]
        if dense:  # the last block was dense: this one likely too
            dense = _near(block, c, reach, lse, gap, w) * 8 > n
            for j in range(n):
                if gap[j] <= reach:
                    key = (np.float32(gap[j]).view(np.int32) >> BUCKET_SHIFT) & np.int32(mass.shape[0] - 1)
                    mass[key] += w[j]
                    many[key] += 1
            continue
        if n < BLOCK:
            hit[:] = 0
        hits, _ = _close(block, c, reach, hit)
        for g in range(BLOCK // 8 if hits else 0):
            if words[g] != 0:
                for j in range(8 * g, 8 * g + 8):
                    if hit[j]:
                        v = np.float64(block[j])
                        key = (np.float32(abs(c - v)).view(np.int32) >> BUCKET_SHIFT) & np.int32(mass.shape[0] - 1)
                        mass[key] += exp64(v - lse)
                        many[key] += 1
        dense = hits * 8 > n
    run = 0.0
    seen = 0
    for b in range(mass.shape[0]):
        run += mass[b]
        seen += many[b]
        if run > goal and seen >= least:
            return b
    return -1


@jit(parallel=True, nogil=True)
def _bands(x, p, min_keep, limit, c_out, lse_out, counts, positions):
    """Per row: c and log Z (c_out, lse_out), the band's size (counts; -1: this row is not done here: NaN or +inf
    in it, no finite entry, or a band of `limit` tokens or more) and its positions (positions[row, :count])."""
    buckets = 1 << (31 - BUCKET_SHIFT)
    for row in numba.prange(x.shape[0]):
        xr = x[row]
        counts[row] = -1
        top = np.float64(largest(xr, xr.shape[0]))
        if not (top > -np.inf and top < np.inf) or abs(top) > _LARGEST_TOP:  # NaN, +inf, nothing finite or huge
            continue  # logits: the torch path (log Z = top + log s would lose log s's digits to a huge top)
        s, t, u = _moments(xr, top)
        if not (s >= 1.0 and t == t and u == u):
            continue
        lse = top + np.log(s)
        c = top + t / s
        c_out[row] = c
        lse_out[row] = lse
        # the surprisal's variance: by Chebyshev's inequality the tokens within `reach` of c hold more than the
        # goal; only they are bucketed (on LLM rows a few percent of the vocabulary), then, if they do not do
        # (rounding, min_keep), every token
        goal = p[row] + _MARGIN
        spread = max(u / s - (t / s) ** 2, 0.0)
        rest = 1.0 - goal - _MARGIN
        reach = np.sqrt(spread / rest) * 1.01 + 1e-9 * (abs(c) + 1.0) if rest > 0.0 else np.inf
        mass = np.empty(buckets)
        many = np.empty(buckets, dtype=np.int64)
        key = _bucket_bound(xr, c, lse, reach, goal, min_keep[row], mass, many)
        if key < 0 and reach < np.inf:
            key = _bucket_bound(xr, c, lse, np.inf, goal, min_keep[row], mass, many)
        if key < 0:
            key = buckets - 1
        # the band: every distance <= the next bucket's least value (a float32 below it rounds down into the
        # buckets up to key, as a float64 distance whose float32 is below it is below it too)
        upper = np.float64(np.int32(min((key + 1) << BUCKET_SHIFT, 0x7F7FFFFF)).view(np.float32))
        n = 0
        nan = 0
        hit = np.zeros(BLOCK, dtype=np.uint8)
        words = hit.view(np.uint64)
        for start in range(0, xr.shape[0], BLOCK):  # marked in a vectorised loop, the marks read 8 at a time
            m = min(BLOCK, xr.shape[0] - start)
            if m < BLOCK:
                hit[:] = 0
            hits, bad = _close(xr[start : start + m], c, upper, hit)  # -inf: an infinite distance, never in
            nan += bad
            if n + hits >= limit:  # the band is too wide for this path
                n = limit
                break
            for g in range(BLOCK // 8 if hits else 0):
                if words[g] != 0:
                    for j in range(8 * g, 8 * g + 8):
                        positions[row, n] = start + j
                        n += hit[j]
        if n < limit and nan == 0:
            counts[row] = n


@jit(nogil=True)
def _spares(x, counts, positions, values):
    """values = x at the band's positions; past a row's count, -inf at the least columns not in its band."""
    width = positions.shape[1]
    for row in numba.prange(x.shape[0]):
        n = counts[row]
        for slot in range(n):
            values[row, slot] = x[row, positions[row, slot]]
        slot, j, i = n, 0, 0
        while slot < width:
            if i < n and positions[row, i] == j:
                i += 1
            else:
                positions[row, slot] = j
                values[row, slot] = -np.inf
                slot += 1
            j += 1


def typical_band(logits: torch.Tensor, p: torch.Tensor, min_keep: torch.Tensor) -> TypicalBand | None:
    """The TYPICAL_BAND kernel: for logits (B, V) float32 and per-row p (B,) < 1 and min_keep (B,), the band of
    each row (see the module): (values (B, W) float32, positions (B, W) int64, counts (B,) int64, c (B,) float64,
    log Z (B,) float64). A row's band is values[b, :counts[b]] in position order; its spare slots hold -inf at
    columns outside the band. counts[b] = -1: that row is left to the caller (NaN or +inf logits, nothing
    finite, a largest logit beyond +-2**16, or a band of more than a quarter of the row: ranking the row costs
    less there). None in a forked child."""
    if not threads(logits.numel()):
        return None
    x = logits.detach().contiguous().numpy()
    batch, width = x.shape
    limit = width // 4
    c = np.zeros(batch)
    lse = np.zeros(batch)
    counts = np.empty(batch, dtype=np.int64)
    scratch = _scratch("band", batch, limit, np.int64)
    _bands(
        x,
        p.detach().double().contiguous().numpy(),
        min_keep.detach().to(torch.int64).contiguous().numpy(),
        limit,
        c,
        lse,
        counts,
        scratch,
    )
    kept = max(int(counts.max()) if batch else 0, 1)
    positions = np.ascontiguousarray(scratch[:, :kept])
    values = np.empty((batch, kept), dtype=np.float32)
    _spares(x, np.maximum(counts, 0), positions, values)
    return TypicalBand(
        torch.from_numpy(values),
        torch.from_numpy(positions),
        torch.from_numpy(counts),
        torch.from_numpy(c),
        torch.from_numpy(lse),
    )


# ----------------------------------------------------------------------------- TOP_P_CANDIDATES
@jit(nogil=True, fastmath={"contract"})
def _depth_keys(xr, top, e, keys):
    """For a block: e[j] = e**(x[j] - top) and keys[j] = the bucket of top - x[j] (1 / _PER_DEPTH wide buckets, the last
    holding everything deeper, -inf included); vectorised, so that the loop that adds them has no branch."""
    for j in range(xr.shape[0]):
        r = np.float64(xr[j]) - top  # <= 0
        e[j] = exp64(r)
        d = -(r if r > EXP64_FLOOR else EXP64_FLOOR) * _PER_DEPTH  # -inf: the last bucket
        keys[j] = np.int32(d) if d < _DEEPEST else np.int32(_DEEPEST)


@jit(nogil=True)
def _hits(xr, cut, hit):
    """hit[j] = xr[j] >= cut, one byte each (vectorised)."""
    for j in range(xr.shape[0]):
        hit[j] = xr[j] >= cut


@jit(nogil=True)
def _gather(xr, cut, where, hit):
    """The positions j of xr[j] >= cut in where[:n], in order, and n; -1 where they would not fit in where. A block's
    comparisons are bytes read 8 at a time: a word of 8 misses (most of a row) costs one test, and the positions of
    a word with a hit are written branch-free (each written, the count advanced by the hit)."""
    cap = where.shape[0]
    words = hit.view(np.uint64)
    n = 0
    for start in range(0, xr.shape[0], BLOCK):
        m = min(BLOCK, xr.shape[0] - start)
        if n > cap - BLOCK:
            return -1
        if m < BLOCK:
            hit[:] = 0
        _hits(xr[start : start + m], cut, hit)
        for g in range(BLOCK // 8):
            if words[g] != 0:
                for i in range(8):
                    where[n] = start + 8 * g + i
                    n += hit[8 * g + i]
    return n


@jit(nogil=True, fastmath={"contract"})
def _ranked_mass(ranked, n, top):
    """e**(x - top) (float64) of the values whose descending_key are ranked[:n]: the keys decoded back to their
    float32 bits and the e** taken in one vectorised loop (no gather)."""
    out = np.empty(n)
    for i in range(n):
        up = ~ranked[i]  # ascending in the value: the sign bit set for values >= +0
        bits = up & np.uint32(0x7FFFFFFF) if up >> np.uint32(31) else ~up
        out[i] = exp64(np.float64(np.uint32(bits).view(np.float32)) - top)
    return out


@jit(nogil=True)
def _row_nucleus(xr, p, min_keep, least, where, keys, spare_keys, spare_where):
    """One row of _nucleus: (n, top, total, threshold, kept, mass). n: how many tokens lie at or above the threshold,
    their positions sorted by (logit descending, position) in spare_where[:n] and their e**(x - top) in that order in
    mass[:n]; -1: NaN, +inf or nothing finite (nothing else set); -2: more than where's width, or fewer than least
    (the threshold lowered, twice as deep each time, while more fit), or the mass there short of p (top, total and
    threshold set). kept: how many of them top-p keeps."""
    nothing = np.empty(0)
    top = np.float64(largest(xr, xr.shape[0]))
    if not (top > -np.inf and top < np.inf):
        return -1, top, 0.0, np.float32(0.0), 0, nothing
    e = np.empty(BLOCK)
    keys_b = np.empty(BLOCK, dtype=np.int32)
    hit = np.zeros(BLOCK, dtype=np.uint8)
    depths = np.zeros(_DEEPEST + 1)
    nan = 0
    for start in range(0, xr.shape[0], BLOCK):  # one pass: the mass by depth below the top
        n = min(BLOCK, xr.shape[0] - start)
        block = xr[start : start + n]
        _depth_keys(block, top, e, keys_b)
        for j in range(n):
            depths[np.uint32(keys_b[j])] += e[j]  # unsigned: no negative-index wraparound test
        for j in range(n):
            nan += block[j] != block[j]
    if nan:
        return -1, top, 0.0, np.float32(0.0), 0, nothing
    total = 0.0
    for b in range(_DEEPEST + 1):  # the normaliser: the buckets' sums, in depth order
        total += depths[b]
    goal = (p + _MARGIN) * total
    run = 0.0
    depth = _DEEPEST + 1
    for b in range(_DEEPEST):
        run += depths[b]
        if run >= goal:
            depth = b + 1
            break
    # every token shallower than `depth` buckets holds more than p: a logit at or below the last one kept
    cut = np.float32(top - depth / _PER_DEPTH - 1e-3) if depth <= _DEEPEST else np.float32(-np.inf)
    n = _gather(xr, cut, where, hit)
    while 0 <= n < least and cut > -np.inf:  # min_keep reaches below: twice as deep, while they fit in where
        depth *= 2
        cut = np.float32(top - depth / _PER_DEPTH - 1e-3) if depth <= _DEEPEST else np.float32(-np.inf)
        n = _gather(xr, cut, where, hit)
    if n < least:
        return -2, top, total, cut, 0, nothing
    for i in range(n):
        keys[i] = descending_key(xr[where[i]])
    ranked, order = stable_radix_sort(keys, where, n, spare_keys, spare_where)
    for i in range(n):  # the sorted positions may be in either buffer
        spare_where[i] = order[i]
    mass = _ranked_mass(ranked, n, top)  # e**(x - top) in rank order, vectorised
    above = 0.0  # top-p's cut: a token is kept while the mass strictly above it is < p
    keep = 0
    for i in range(n):
        keep += above < p
        above += mass[i] / total
    if not above >= p:  # the token where the mass reaches p must be among them (the threshold sees to it)
        return -2, top, total, cut, 0, nothing
    return n, top, total, cut, min(max(keep, min_keep, 1), n), mass


@jit(parallel=True, nogil=True)
def _nucleus(x, p, min_keep, least, top_out, total_out, threshold, counts, kept, keys, where, spare_keys, spare_where):
    """Per row (_row_nucleus): the maximum, the normaliser sum e**(x - max) (float64, in depth order), a float32
    logit at or below the last token whose mass above is < p, and the tokens at or above it sorted by (logit
    descending, position): their count, their positions in spare_where[row, :count] (counts[row] -1: NaN, +inf or
    nothing finite; -2: more than where's width, or fewer than `least`), and how many of them top-p keeps
    (kept[row]: the float64 running mass, at least min_keep[row] and 1)."""
    for row in numba.prange(x.shape[0]):
        n, top, total, cut, keep, _ = _row_nucleus(
            x[row], p[row], min_keep[row], least, where[row], keys[row], spare_keys[row], spare_where[row]
        )
        counts[row] = n
        if n != -1:
            top_out[row], total_out[row], threshold[row], kept[row] = top, total, cut, keep


@jit(parallel=True, nogil=True)
def _ranked_spares(x, threshold, counts, ranked, values, positions):
    """values / positions (B, W): each row's ranked tokens (ranked[row, :count]) then, in the spare slots, -inf at
    the columns below its threshold, ascending (Backend.at_least's layout)."""
    width = positions.shape[1]
    for row in numba.prange(x.shape[0]):
        n = counts[row]
        for slot in range(n):
            positions[row, slot] = ranked[row, slot]
            values[row, slot] = x[row, ranked[row, slot]]
        slot, j = n, 0
        while slot < width:
            if not x[row, j] >= threshold[row]:
                positions[row, slot] = j
                values[row, slot] = -np.inf
                slot += 1
            j += 1


def top_p_candidates(logits: torch.Tensor, p: torch.Tensor, min_keep: torch.Tensor) -> TopPCandidates | None:
    """The TOP_P_CANDIDATES kernel (see contracts): for logits (B, V) float32, per-row p (B,) and min_keep (B,):
    (top (B, 1) and total (B,) float64, threshold (B,) float32, then values (B, W), positions (B, W) and counts (B,)
    of the tokens at or above the threshold, ranked as Backend.at_least ranks them, and kept (B,): how many of them
    top-p keeps; the last four None where a row holds more than a quarter of its tokens there or fewer than its
    min_keep). None where a row has NaN or +inf or nothing finite (the plugin's torch path fails such a step with
    its name), or in a forked child."""
    if not threads(logits.numel()):
        return None
    x = logits.detach().contiguous().numpy()
    batch, width = x.shape
    cap = max(width // 4, 1)
    top, total = np.zeros(batch), np.zeros(batch)
    threshold = np.empty(batch, dtype=np.float32)
    counts, kept = np.empty(batch, dtype=np.int64), np.empty(batch, dtype=np.int64)
    keys, spare_keys = _scratch("keys", batch, cap, np.uint32), _scratch("spare_keys", batch, cap, np.uint32)
    where, spare_where = _scratch("where", batch, cap, np.int64), _scratch("spare_where", batch, cap, np.int64)
    least = min_keep.detach().to(torch.int64).contiguous().numpy()
    _nucleus(
        x,
        p.detach().double().contiguous().numpy(),
        least,
        int(least.max(initial=0)),
        top,
        total,
        threshold,
        counts,
        kept,
        keys,
        where,
        spare_keys,
        spare_where,
    )
    if batch == 0 or (counts == -1).any():
        return None
    found = (torch.from_numpy(top)[:, None], torch.from_numpy(total), torch.from_numpy(threshold))
    if (counts < 0).any():
        return TopPCandidates(*found, None, None, None, None)
    width = max(int(counts.max()), 1)
    values = np.empty((batch, width), dtype=np.float32)
    positions = np.empty((batch, width), dtype=np.int64)
    threads(batch * width)  # a copy of the survivors: threads only where they outweigh their wake-up
    _ranked_spares(x, threshold, counts, spare_where, values, positions)
    return TopPCandidates(
        *found,
        torch.from_numpy(values),
        torch.from_numpy(positions),
        torch.from_numpy(counts),
        torch.from_numpy(kept),
    )


# ----------------------------------------------------------------------------- top_p -> dist fused (FUSED_SAMPLE)
@jit(nogil=True)
def _ranked_draw(xr, order, kept, k1, k2):
    """The index i < kept of rng.gumbel_argmax over the tokens order[:kept] of the row xr (their ids their
    positions, in that order: the first of equal values wins): samplechain_cpu_draw._scan's draw, the bound of
    each token formed in a first, vectorised loop, the logs taken only where the bound does not rule it out."""
    values = np.empty(kept)
    low = np.empty(kept)
    for i in range(kept):
        xs = np.float64(xr[order[i]])
        values[i] = xs
        low[i] = noise_bound(token_bits(np.uint64(order[i]), k1, k2)) - xs
    best_v = np.inf
    best = 0
    for i in range(kept):
        if low[i] > best_v:
            continue
        val = noise(token_bits(np.uint64(order[i]), k1, k2)) - values[i]
        if val < best_v:  # strictly: an equal value later never replaces the first
            best_v = val
            best = i
    return best


@jit(parallel=True, nogil=True)
def _nucleus_draw(x, t, p, min_keep, seed, position, salt, tokens, lse, status, keys, where, spare_keys, spare_where):
    """Per row: top_p's kept tokens of x / t (_row_nucleus, on the float32 quotient where t != 1), the seeded draw
    among them under the row keys of seed, position and salt (row_keys) (tokens[row]) and the float64 log of their
    normaliser around the row's top (lse[row]); status[row] _row_nucleus's n, or -3 where the row's top is beyond
    rng.HUGE (the draw would shift the row)."""
    k1 = np.empty(x.shape[0], dtype=np.uint32)
    k2 = np.empty(x.shape[0], dtype=np.uint32)
    row_keys(seed, position, salt, k1, k2)
    for row in numba.prange(x.shape[0]):
        xr = x[row]
        if t[row] != 1.0:
            q = np.empty_like(xr)
            for j in range(xr.shape[0]):
                q[j] = xr[j] / t[row]
            xr = q
        n, top, _, _, keep, mass = _row_nucleus(
            xr, p[row], min_keep[row], min_keep[row], where[row], keys[row], spare_keys[row], spare_where[row]
        )
        status[row] = n
        if n < 0:
            continue
        if abs(top) > HUGE:
            status[row] = -3
            continue
        kept_mass = 0.0
        for i in range(keep):
            kept_mass += mass[i]
        lse[row] = top + np.log(kept_mass)
        tokens[row] = spare_where[row, _ranked_draw(xr, spare_where[row], keep, k1[row], k2[row])]


def top_p_draw(
    logits: torch.Tensor,
    t: torch.Tensor | float,
    p: torch.Tensor,
    min_keep: torch.Tensor,
    seed: torch.Tensor,
    position: torch.Tensor,
    stream: int,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """`[temperature t ->] top_p -> dist` over wide rows in one compiled pass per row (the cpu backend's
    FUSED_SAMPLE): the tokens the samplers draw when top_p takes the TOP_P_CANDIDATES kernel's path (the same kept
    set: that path's cut on the same float64 normaliser; the same draw over it), and their logprobs under the kept
    distribution (float32; the kept mass summed in rank order where the executor sums in torch's order: the same
    to float rounding). logits (B, V) float32, t > 0 a number or (B,) (1: no temperature), p (B,) < 1, min_keep
    (B,). None (the samplers run) where a row has NaN, +inf or nothing finite, holds more than a quarter of its
    tokens above the kernel's threshold or fewer than its min_keep, or has logits beyond rng.HUGE; or in a forked
    child."""
    if not threads(logits.numel()):
        return None
    x = logits.detach().contiguous().numpy()
    batch, width = x.shape
    if batch == 0:
        return None
    cap = max(width // 4, 1)
    scale = per_row(t, batch, np.dtype(np.float32))
    least = per_row(min_keep, batch, np.dtype(np.int64))
    tokens, lse = np.zeros(batch, dtype=np.int64), np.zeros(batch)
    status = np.empty(batch, dtype=np.int64)
    keys, spare_keys = _scratch("keys", batch, cap, np.uint32), _scratch("spare_keys", batch, cap, np.uint32)
    where, spare_where = _scratch("where", batch, cap, np.int64), _scratch("spare_where", batch, cap, np.int64)
    _nucleus_draw(
        x,
        scale,
        per_row(p, batch, np.dtype(np.float64)),
        least,
        per_row(seed, batch, np.dtype(np.int64)),
        per_row(position, batch, np.dtype(np.int64)),
        salt(stream),
        tokens,
        lse,
        status,
        keys,
        where,
        spare_keys,
        spare_where,
    )
    if (status < 0).any():
        return None
    chosen = torch.from_numpy(tokens)
    picked = logits.gather(1, chosen[:, None])[:, 0]
    if not (isinstance(t, (int, float)) and t == 1):
        picked = picked / (t if not isinstance(t, torch.Tensor) else t.to(picked.dtype))
    return chosen, picked - torch.from_numpy(lse).float()
