"""The passes over one row of the cuda backend's truncation kernel (samplechain_cuda_truncate), in blocks: the row's
ranges, the kept set's sums, the keep mask, and the pivot searches (the largest order key at which a count or a
probability mass still reaches a bound, and the n-th token equal to a key). `@triton.jit` helpers, each called a few
times per row.
"""

from __future__ import annotations

from samplechain_cuda_triton import triton

__all__ = ["kept_set_pass", "mask_pass", "nth_equal", "pivot_pass", "row_ranges", "search"]

if triton is not None:
    from samplechain_cuda_triton import load_row, tl

    @triton.jit
    def pivot_pass(
        x_row,
        V,
        t,
        piv,
        tk,
        ck,
        top64,
        total,
        HAS_T: tl.constexpr,
        SWAP: tl.constexpr,
        ON_X: tl.constexpr,
        RESTRICT: tl.constexpr,
        MASS: tl.constexpr,
        BLOCK: tl.constexpr,
        NP: tl.constexpr,
    ):
        """For NP pivots (int64 keys): how many tokens (of S when RESTRICT) have a key >= each, and (MASS) their
        probability mass exp(y - top) / total in float64."""
        cnt = tl.zeros((NP,), tl.int32)
        mass = tl.zeros((NP,), tl.float64)
        for start in range(0, V, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            valid = offs < V
            y, kx, ky = load_row(x_row, offs, valid, t, HAS_T, SWAP)
            inset = valid
            if RESTRICT:
                inset = inset & ((kx > tk) | ((kx == tk) & (offs <= ck)))
            if ON_X:
                key = kx
            else:
                key = ky
            ge = (key[None, :] >= piv[:, None]) & inset[None, :]
            cnt += tl.sum(ge.to(tl.int32), axis=1)
            if MASS:
                prob = tl.exp(y.to(tl.float64) - top64) / total
                mass += tl.sum(tl.where(ge, prob[None, :], 0.0), axis=1)
        return cnt, mass

    @triton.jit
    def search(
        x_row,
        V,
        t,
        lo,
        hi,
        lo_cnt,
        need,
        p,
        tk,
        ck,
        top64,
        total,
        HAS_T: tl.constexpr,
        SWAP: tl.constexpr,
        ON_X: tl.constexpr,
        RESTRICT: tl.constexpr,
        MASS: tl.constexpr,
        BLOCK: tl.constexpr,
        NP: tl.constexpr,
    ):
        """The largest key v in [lo, hi) with count(key >= v) >= need (MASS: mass(key >= v) >= p), given that lo
        satisfies it and hi does not: NP pivots per pass over the row (the range shrinks NP + 1 times a pass). Returns
        v, the count at v, the count and the mass at v's successor (the tokens strictly above v)."""
        hi_cnt = tl.full((), 0, tl.int32)
        hi_mass = tl.full((), 0.0, tl.float64)
        j = (tl.arange(0, NP) + 1).to(tl.int64)
        while hi - lo > 1:
            piv = lo + ((hi - lo) * j) // (NP + 1)
            cnt, mass = pivot_pass(x_row, V, t, piv, tk, ck, top64, total, HAS_T, SWAP, ON_X, RESTRICT, MASS, BLOCK, NP)
            if MASS:
                ok = mass >= p
            else:
                ok = cnt >= need
            # counts and masses fall as the pivot rises: the largest passing pivot has the smallest passing count
            lo_cnt = tl.minimum(lo_cnt, tl.min(tl.where(ok, cnt, 2147483647), axis=0))
            hi_cnt = tl.maximum(hi_cnt, tl.max(tl.where(ok, 0, cnt), axis=0))
            hi_mass = tl.maximum(hi_mass, tl.max(tl.where(ok, 0.0, mass), axis=0))
            new_lo = tl.max(tl.where(ok, piv, lo), axis=0)
            hi = tl.min(tl.where(ok, hi, piv), axis=0)
            lo = new_lo
        return lo, lo_cnt, hi_cnt, hi_mass

    @triton.jit
    def nth_equal(
        x_row,
        V,
        t,
        tau,
        n,
        tk,
        ck,
        HAS_T: tl.constexpr,
        SWAP: tl.constexpr,
        RESTRICT: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        """The position of the n-th (1-based, in row order = token id order) token (of S when RESTRICT) whose
        key (ky, or kx when not RESTRICT) equals tau; -1 if there are fewer."""
        run = tl.full((), 0, tl.int32)
        found = tl.full((), -1, tl.int64)
        for start in range(0, V, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            valid = offs < V
            y, kx, ky = load_row(x_row, offs, valid, t, HAS_T, SWAP)
            if RESTRICT:
                eq = valid & ((kx > tk) | ((kx == tk) & (offs <= ck))) & (ky == tau)
            else:
                eq = valid & (kx == tau)
            rank = tl.cumsum(eq.to(tl.int32), axis=0) + run
            found = tl.maximum(found, tl.max(tl.where(eq & (rank == n), offs, -1), axis=0).to(tl.int64))
            run += tl.sum(eq.to(tl.int32), axis=0)
        return found

    @triton.jit
    def row_ranges(x_row, V, t, HAS_T: tl.constexpr, SWAP: tl.constexpr, BLOCK: tl.constexpr):
        """Pass 1: the row's largest y and the ranges of its rank keys (kx) and cut keys (ky)."""
        top = tl.full((), float("-inf"), tl.float32)
        kx_lo = tl.full((), 2147483647, tl.int64)
        kx_hi = tl.full((), -2147483648, tl.int64)
        ky_lo = tl.full((), 2147483647, tl.int64)
        ky_hi = tl.full((), -2147483648, tl.int64)
        for start in range(0, V, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            valid = offs < V
            y, kx, ky = load_row(x_row, offs, valid, t, HAS_T, SWAP)
            top = tl.maximum(top, tl.max(y, axis=0))
            kx_lo = tl.minimum(kx_lo, tl.min(tl.where(valid, kx, 2147483647), axis=0))
            kx_hi = tl.maximum(kx_hi, tl.max(tl.where(valid, kx, -2147483648), axis=0))
            ky_lo = tl.minimum(ky_lo, tl.min(tl.where(valid, ky, 2147483647), axis=0))
            ky_hi = tl.maximum(ky_hi, tl.max(tl.where(valid, ky, -2147483648), axis=0))
        return top, kx_lo, kx_hi, ky_lo, ky_hi

    @triton.jit
    def kept_set_pass(
        x_row,
        V,
        t,
        tk,
        ck,
        take,
        vv,
        top64,
        thr_m,
        HAS_T: tl.constexpr,
        SWAP: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        """One pass over S: its last id at tk (ck), its normaliser (float64, as top_p's row_mass), its size, and min_p's
        count: the tokens of S at or above thr_m and the smallest key among them."""
        total = tl.full((), 0.0, tl.float64)
        n_in = tl.full((), 0, tl.int32)
        n_m = tl.full((), 0, tl.int32)
        key_m = tl.full((), 2147483647, tl.int64)  # the smallest key of S at or above min_p's threshold
        run = tl.full((), 0, tl.int32)
        for start in range(0, V, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            valid = offs < V
            y, kx, ky = load_row(x_row, offs, valid, t, HAS_T, SWAP)
            eq = valid & (kx == tk)
            rank = tl.cumsum(eq.to(tl.int32), axis=0) + run
            run += tl.sum(eq.to(tl.int32), axis=0)
            inset = valid & ((kx > tk) | (eq & ((rank <= take) | (ck == vv))))
            ck = tl.maximum(ck, tl.max(tl.where(eq & (rank == take), offs, -1), axis=0).to(tl.int64))
            total += tl.sum(tl.where(inset, tl.exp(y.to(tl.float64) - top64), 0.0), axis=0)
            n_in += tl.sum(inset.to(tl.int32), axis=0)
            above_m = inset & (y >= thr_m)
            n_m += tl.sum(above_m.to(tl.int32), axis=0)
            key_m = tl.minimum(key_m, tl.min(tl.where(above_m, ky, 2147483647), axis=0))
        total = tl.where(total > 0, total, 1.0)
        return ck, total, n_in, n_m, key_m

    @triton.jit
    def mask_pass(x_row, V, t, tk, ck, ty, cy, mask_row, HAS_T: tl.constexpr, SWAP: tl.constexpr, BLOCK: tl.constexpr):
        """The (V,) keep mask of the row: in S and in the final prefix."""
        for start in range(0, V, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            valid = offs < V
            y, kx, ky = load_row(x_row, offs, valid, t, HAS_T, SWAP)
            keep = ((kx > tk) | ((kx == tk) & (offs <= ck))) & ((ky > ty) | ((ky == ty) & (offs <= cy)))
            tl.store(mask_row + offs, keep.to(tl.int8), mask=valid)
