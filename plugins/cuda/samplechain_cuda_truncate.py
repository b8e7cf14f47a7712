"""The cuda backend's fused truncation and draw as one Triton kernel: per row, the candidates the chain
temperature -> top_k -> top_p -> min_p keeps on the cpu backend, found by pivot searches over the row (FlashInfer's
idea: no sort), then optionally a keep mask and the Gumbel-max draw over the kept tokens with its logprob. One program
per row, reading the row in blocks, with no (B, V) temporaries and no host synchronisation; each step of the chain is
a `@triton.jit` helper (a pass over the row or a pivot search), called once per row.

    truncate(logits, temperature=, top_k=, top_p=, min_p=, ..., mask=False) -> (Truncation, mask or None)
    sample_top_k_top_p_min_p(logits, seed, position, stream, ...) -> token ids
    sample(logits, seed, position, stream, ..., temperature_last=None) -> (token ids, logprobs)

The kept sets and their exactness are samplechain_cuda_kernels' docstring.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch

from samplechain_cuda_triton import (
    block_size,
    check,
    counter,
    f32,
    interpreted,
    param_arg,
    row_major,
    stream_salt,
    triton,
)

__all__ = ["Launch", "Truncation", "launch", "sample", "sample_top_k_top_p_min_p", "truncate", "truncate_kernel"]


class Truncation(NamedTuple):
    """Per row (B,): the truncation as thresholds. A token i of the row is kept iff it is in top_k's set S
    (rank_key(i) > k_key, or == k_key and i <= k_last) and in the final prefix (key(y_i) > cut_key, or == cut_key and
    i <= cut_last). Keys are the float32 values' bits made monotone (-0.0 as +0.0, as contracts.ranked_keys); rank_key
    is key(x) for a scalar temperature (top_k ran before it), else key(y). count: how many the chain keeps (may
    exceed the finite ones: the extra are -inf, never drawn); top: the row's largest y."""

    k_key: torch.Tensor
    k_last: torch.Tensor
    cut_key: torch.Tensor
    cut_last: torch.Tensor
    # the field shadows tuple.count (a method) on purpose: the kernel writes the count under this name
    count: torch.Tensor  # type: ignore[assignment]
    top: torch.Tensor


class Launch(NamedTuple):
    """What one launch of truncate_kernel gives: the truncation, the drawn tokens (B,) int64 and their logprobs (B,)
    float32 (unset without a draw), and the (B, V) int8 keep mask (None unless asked for)."""

    truncation: Truncation
    tokens: torch.Tensor
    logprobs: torch.Tensor
    keep: torch.Tensor | None


# ----------------------------------------------------------------------------------------------------- kernel
if triton is not None:
    from samplechain_cuda_passes import kept_set_pass, mask_pass, nth_equal, row_ranges, search
    from samplechain_cuda_triton import draw_pass, param, row_keys, tl, unkey

    @triton.jit
    def top_k_cut(
        x_row,
        V,
        t,
        k,
        kk,
        vv,
        row_ok,
        kx_lo,
        kx_hi,
        top64,
        HAS_T: tl.constexpr,
        SWAP: tl.constexpr,
        BLOCK: tl.constexpr,
        NP: tl.constexpr,
    ):
        """top_k's set S as (tk, ck, width, take): the kk-th largest rank key tk (below every key: top_k off) and,
        of the tokens equal to it, how many S keeps (take, the lowest ids: their last id ck is found by
        kept_set_pass, so ck is -1 here; V when every token equal to tk is in); width = |S|."""
        tk = tl.full((), -2147483649, tl.int64)  # no key: below every float32 order key
        ck = vv
        width = vv
        take = tl.full((), 0, tl.int32)
        if (k > 0) & (kk < vv) & row_ok:
            tk, _, above, _ = search(
                x_row,
                V,
                t,
                kx_lo,
                kx_hi + 1,
                V,
                kk,
                0.0,
                tk,
                ck,
                top64,
                1.0,
                HAS_T,
                SWAP,
                True,
                False,
                False,
                BLOCK,
                NP,
            )
            take = (kk - above).to(tl.int32)
            ck = tl.full((), -1, tl.int64)
            width = kk
        return tk, ck, width, take

    @triton.jit
    def top_p_cut(
        x_row,
        V,
        t,
        p,
        pmin,
        width,
        row_ok,
        ky_lo,
        ky_hi,
        n_in,
        tk,
        ck,
        top64,
        total,
        HAS_T: tl.constexpr,
        SWAP: tl.constexpr,
        BLOCK: tl.constexpr,
        NP: tl.constexpr,
    ):
        """top_p's count as (c_p, count_p, v_p, above_p): the largest value v_p whose mass at or above it reaches p;
        of the tokens equal to v_p, those whose mass above (G + r * q, r = 0, 1, ...) is still below p (count_p: -1
        when top_p is off, above_p: the tokens strictly above v_p); c_p: count_p within min_keep and |S|."""
        c_p = width
        count_p = tl.full((), -1, tl.int64)
        v_p = tl.full((), -2147483649, tl.int64)  # no key: below every float32 order key
        above_p = tl.full((), 0, tl.int64)
        if (p < 1.0) & row_ok:
            p64 = p.to(tl.float64)
            count_p = tl.full((), 0, tl.int64)
            if p64 > 0:
                v_p, at, above, g = search(
                    x_row,
                    V,
                    t,
                    ky_lo,
                    ky_hi + 1,
                    n_in,
                    0,
                    p64,
                    tk,
                    ck,
                    top64,
                    total,
                    HAS_T,
                    SWAP,
                    False,
                    True,
                    True,
                    BLOCK,
                    NP,
                )
                q = tl.exp(unkey(v_p).to(tl.float64) - top64) / total
                n = (at - above).to(tl.float64)
                r = tl.where(q > 0, tl.minimum(tl.math.ceil((p64 - g) / tl.where(q > 0, q, 1.0)), n), n)
                above_p = above.to(tl.int64)
                count_p = above_p + tl.maximum(r, 1.0).to(tl.int64)
            c_p = tl.minimum(tl.maximum(tl.maximum(count_p, pmin), 1), width)
        return c_p, count_p, v_p, above_p

    @triton.jit
    def final_cut(
        x_row,
        V,
        t,
        count,
        width,
        vv,
        row_ok,
        m_on,
        n_m,
        key_m,
        count_p,
        v_p,
        above_p,
        ky_lo,
        ky_hi,
        n_in,
        tk,
        ck,
        top64,
        total,
        HAS_T: tl.constexpr,
        SWAP: tl.constexpr,
        BLOCK: tl.constexpr,
        NP: tl.constexpr,
    ):
        """The count-th token of S in (y desc, id asc) order as (ty, cy): its key and id (below every key and V:
        no cut)."""
        ty = tl.full((), -2147483649, tl.int64)  # no key: below every float32 order key
        cy = vv
        if (count < width) & row_ok:
            if m_on & (count == n_m):  # min_p's own cut: all of S at or above its threshold, no search
                ty = key_m
            else:
                if count == count_p:  # top_p's own cut: the token lies among those equal to v_p
                    ty = v_p
                    nth = count - above_p
                else:  # a min_keep or temperature 0: search for it
                    ty, _, above, _ = search(
                        x_row,
                        V,
                        t,
                        ky_lo,
                        ky_hi + 1,
                        n_in,
                        count,
                        0.0,
                        tk,
                        ck,
                        top64,
                        total,
                        HAS_T,
                        SWAP,
                        False,
                        True,
                        False,
                        BLOCK,
                        NP,
                    )
                    nth = count - above.to(tl.int64)
                cy = nth_equal(x_row, V, t, ty, nth, tk, ck, HAS_T, SWAP, True, BLOCK)
        return ty, cy

    @triton.jit
    def draw_kept(
        x_row,
        V,
        t,
        tk,
        ck,
        ty,
        cy,
        top,
        row_ok,
        k1,
        k2,
        dt,
        HAS_T: tl.constexpr,
        SWAP: tl.constexpr,
        DRAW_T: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        """The Gumbel-max draw over the kept tokens and the drawn token's logprob under them, as (token, logprob):
        its drawn value - the float64 log-sum-exp of the kept ones. DRAW_T: the kept values are divided by dt (a
        temperature after the truncation) first, dt <= 0 keeping only the first maximum."""
        hot = dt > 0
        if DRAW_T:
            top = tl.where(hot, tl.math.div_rn(top, tl.where(hot, dt, 1.0)), top)
        ref = tl.where(row_ok, top.to(tl.float64), 0.0)  # the largest drawn value: kept, so the mass is >= 1
        big = (tl.abs(top) > 16777216.0) & row_ok  # rng.shifted, on the kept tokens (which hold the maximum)
        shift = tl.where(big, ref, 0.0)
        _, best, nan_i, _, mass = draw_pass(
            x_row,
            x_row,
            V,
            k1,
            k2,
            shift,
            t,
            tk,
            ck,
            ty,
            cy,
            dt,
            ref,
            False,
            True,
            HAS_T,
            SWAP,
            DRAW_T,
            True,
            BLOCK,
        )
        tok = tl.where(nan_i < V, nan_i, best)
        xb = tl.load(x_row + tok).to(tl.float32)
        if HAS_T:
            xb = tl.where(t > 0, tl.math.div_rn(xb, tl.where(t > 0, t, 1.0)), xb)
        if DRAW_T:
            xb = tl.where(hot, tl.math.div_rn(xb, tl.where(hot, dt, 1.0)), xb)
        lp = xb.to(tl.float64) - ref - tl.log(mass)
        if DRAW_T:  # temperature 0: the first maximum, alone (NaN where the row has no finite maximum: an error)
            lp = tl.where(hot, lp, tl.where(row_ok, 0.0, float("nan")))
        return tok, lp

    # kernel: its signature is most of its length: every parameter is a pointer or a scalar (the *_ROW flags choose
    # at compile time), as triton takes no structures; the body is one short call per step of the chain
    @triton.jit(do_not_specialize=["stride_x", "V", "k_val", "kmin_val", "pmin_val", "mmin_val", "salt", "stride_mask"])
    def truncate_kernel(
        x_ptr,
        stride_x,
        V,
        t_ptr,
        t_val,
        k_ptr,
        k_val,
        kmin_ptr,
        kmin_val,
        p_ptr,
        p_val,
        pmin_ptr,
        pmin_val,
        lm_ptr,
        lm_val,
        mmin_ptr,
        mmin_val,
        dt_ptr,
        dt_val,
        seed_ptr,
        pos_ptr,
        salt,
        k_key_ptr,
        k_last_ptr,
        cut_key_ptr,
        cut_last_ptr,
        count_ptr,
        top_ptr,
        tok_ptr,
        lp_ptr,
        mask_ptr,
        stride_mask,
        HAS_T: tl.constexpr,
        T_ROW: tl.constexpr,
        K_ROW: tl.constexpr,
        KMIN_ROW: tl.constexpr,
        P_ROW: tl.constexpr,
        PMIN_ROW: tl.constexpr,
        LM_ROW: tl.constexpr,
        MMIN_ROW: tl.constexpr,
        SWAP: tl.constexpr,
        DRAW_T: tl.constexpr,
        DT_ROW: tl.constexpr,
        DRAW: tl.constexpr,
        MASK: tl.constexpr,
        BLOCK: tl.constexpr,
        NP: tl.constexpr,
    ):
        # a parameter is read per row from its pointer (*_ROW) or is the scalar *_val; the results are written to
        # the Truncation's named outputs (k_key ... count, top) and, with DRAW, the token and its logprob
        row = tl.program_id(0).to(tl.int64)
        x_row = x_ptr + row * stride_x
        t = param(t_ptr, t_val, row, T_ROW, tl.float32)
        vv = tl.full((), 0, tl.int64) + V

        top, kx_lo, kx_hi, ky_lo, ky_hi = row_ranges(x_row, V, t, HAS_T, SWAP, BLOCK)
        row_ok = (top > float("-inf")) & (top < float("inf"))  # an all -inf (or NaN / +inf) row: no cut
        top64 = tl.where(row_ok, top.to(tl.float64), 0.0)

        k = param(k_ptr, k_val, row, K_ROW, tl.int64)
        kk = tl.minimum(tl.maximum(k, param(kmin_ptr, kmin_val, row, KMIN_ROW, tl.int64)), vv)
        tk, ck, width, take = top_k_cut(x_row, V, t, k, kk, vv, row_ok, kx_lo, kx_hi, top64, HAS_T, SWAP, BLOCK, NP)

        lm = param(lm_ptr, lm_val, row, LM_ROW, tl.float32)
        ck, total, n_in, n_m, key_m = kept_set_pass(x_row, V, t, tk, ck, take, vv, top64, top + lm, HAS_T, SWAP, BLOCK)

        p = param(p_ptr, p_val, row, P_ROW, tl.float32)
        pmin = param(pmin_ptr, pmin_val, row, PMIN_ROW, tl.int64)
        c_p, count_p, v_p, above_p = top_p_cut(
            x_row, V, t, p, pmin, width, row_ok, ky_lo, ky_hi, n_in, tk, ck, top64, total, HAS_T, SWAP, BLOCK, NP
        )

        # min_p: at least min_keep of the tokens >= max y + log(p), among top_p's
        count = c_p
        m_on = (lm > float("-inf")) & row_ok
        if m_on:
            mmin = param(mmin_ptr, mmin_val, row, MMIN_ROW, tl.int64)
            count = tl.minimum(c_p, tl.maximum(n_m.to(tl.int64), mmin))
        if HAS_T:
            count = tl.where(t > 0, count, 1)  # temperature 0: only the first maximum

        ty, cy = final_cut(
            x_row,
            V,
            t,
            count,
            width,
            vv,
            row_ok,
            m_on,
            n_m,
            key_m,
            count_p,
            v_p,
            above_p,
            ky_lo,
            ky_hi,
            n_in,
            tk,
            ck,
            top64,
            total,
            HAS_T,
            SWAP,
            BLOCK,
            NP,
        )
        tl.store(k_key_ptr + row, tk)
        tl.store(k_last_ptr + row, ck)
        tl.store(cut_key_ptr + row, ty)
        tl.store(cut_last_ptr + row, cy)
        tl.store(count_ptr + row, count)
        tl.store(top_ptr + row, top)

        if MASK:
            mask_pass(x_row, V, t, tk, ck, ty, cy, mask_ptr + row * stride_mask, HAS_T, SWAP, BLOCK)

        if DRAW:
            k1, k2 = row_keys(tl.load(seed_ptr + row), tl.load(pos_ptr + row), salt)
            dt = param(dt_ptr, dt_val, row, DT_ROW, tl.float32)
            tok, lp = draw_kept(x_row, V, t, tk, ck, ty, cy, top, row_ok, k1, k2, dt, HAS_T, SWAP, DRAW_T, BLOCK)
            tl.store(tok_ptr + row, tok)
            tl.store(lp_ptr + row, lp.to(tl.float32))

else:  # pragma: no cover - without triton `launch` raises before launching
    truncate_kernel = None


# ------------------------------------------------------------------------------------------------- functions


def _scalar_or_rows(value: Any, device: torch.device) -> tuple[Any, float, bool]:
    """A float parameter as the kernel reads it: (a (B,) float32 tensor, 0.0, True) per row, or (None, its float32
    value, False) for a Python number (the same for every row)."""
    if isinstance(value, torch.Tensor):
        return value.to(device=device, dtype=torch.float32).contiguous(), 0.0, True
    return None, f32(value), False


def _log_min_p(min_p: Any, device: torch.device) -> tuple[Any, float, bool]:
    """min_p in logit space, log(p) (-inf: off), as the chain's scalar path (float32 of the double log) or its per-row
    one (torch.log in float32)."""
    if isinstance(min_p, torch.Tensor):
        m = min_p.to(device=device, dtype=torch.float32)
        on = m > 0
        return torch.where(on, torch.log(torch.where(on, m, torch.ones_like(m))), float("-inf")).contiguous(), 0.0, True
    p = f32(min_p)  # the chain's scalar: the float32 parameter as a Python float
    return None, (f32(math.log(p)) if p > 0 else float("-inf")), False


def launch(
    logits: torch.Tensor,
    temperature: Any,
    top_k: Any,
    top_p: Any,
    min_p: Any,
    min_keep: Any,
    seed: torch.Tensor | None,
    position: torch.Tensor | None,
    stream: int,
    mask: bool,
    draw: bool,
    temperature_last: Any = None,
) -> Launch:
    """One launch of truncate_kernel over the rows of logits (B, V): the parameters as in `truncate`; with `draw`, the
    Gumbel-max draw for seed / position / stream too; with `mask`, the keep mask."""
    check(logits)
    batch, vocab = logits.shape
    device = logits.device
    logits = row_major(logits)
    keeps = min_keep if isinstance(min_keep, (tuple, list)) else (min_keep,) * 3
    # temperature: a Python float is the chain's scalar case (the executor runs top_k before it: top_k ranks x);
    # 1.0 and None mean none
    t_args = _scalar_or_rows(1.0 if temperature is None else temperature, device)
    has_t, swap = (True, False) if t_args[2] else (t_args[1] != 1.0, t_args[1] > 0)
    # a temperature after the truncation (only for the draw; 0: the first maximum): a Python float or a (B,) tensor
    dt_args = _scalar_or_rows(1.0 if temperature_last is None else temperature_last, device)
    draw_t = dt_args[2] or dt_args[1] != 1.0
    k_args = param_arg(0 if top_k is None else top_k, torch.int64, device)
    kmin, pmin, mmin = (param_arg(v, torch.int64, device) for v in keeps)
    if draw:
        # a draw comes with its seed and position (sample() passes both)
        assert seed is not None and position is not None
        seed, position = counter(seed, device), counter(position, device)
    thresholds = torch.empty(5, batch, dtype=torch.int64, device=device)  # Truncation's k_key ... count, one row each
    top = torch.empty(batch, dtype=torch.float32, device=device)
    k_key, k_last, cut_key, cut_last, count = thresholds
    out = Launch(
        Truncation(k_key, k_last, cut_key, cut_last, count, top),
        torch.empty(batch, dtype=torch.int64, device=device),
        torch.empty(batch, dtype=torch.float32, device=device),
        torch.empty(batch, vocab, dtype=torch.int8, device=device) if mask else None,
    )
    if batch == 0:
        return out
    p_args, lm_args = _scalar_or_rows(top_p, device), _log_min_p(min_p, device)
    per_row = (t_args, k_args, kmin, p_args, pmin, lm_args, mmin, dt_args)
    block = block_size(vocab, 512)
    truncate_kernel[(batch,)](
        logits,
        logits.stride(0),
        vocab,
        *(x for ptr, val, _ in per_row for x in (ptr, val)),
        seed,
        position,
        stream_salt(stream),
        *out.truncation,
        out.tokens,
        out.logprobs,
        out.keep,
        out.keep.stride(0) if out.keep is not None else 0,
        HAS_T=has_t,
        **{flag: rows for flag, (_, _, rows) in zip(_ROW_FLAGS, per_row)},
        SWAP=swap,
        DRAW_T=draw_t,
        DRAW=draw,
        MASK=mask,
        BLOCK=block,
        NP=min(256, (1 << 20) // block) if interpreted() else 16,
        num_warps=8,
    )
    return out


_ROW_FLAGS = ("T_ROW", "K_ROW", "KMIN_ROW", "P_ROW", "PMIN_ROW", "LM_ROW", "MMIN_ROW", "DT_ROW")


def truncate(
    logits: torch.Tensor,
    *,
    temperature: float | torch.Tensor | None = None,
    top_k: int | torch.Tensor = 0,
    top_p: float | torch.Tensor = 1.0,
    min_p: float | torch.Tensor = 0.0,
    min_keep: Any = 1,
    mask: bool = False,
) -> tuple[Truncation, torch.Tensor | None]:
    """Per row of logits (B, V) float32 (the full vocabulary: position = token id), what the chain
    temperature -> top_k -> top_p -> min_p keeps on the cpu backend: (Truncation, a (B, V) bool keep mask or None).

    Each parameter is a Python number (the same for every row) or a (B,) tensor. temperature None / 1.0: none; a
    float is the chain's scalar temperature (top_k ranks the raw logits), a tensor its per-row one. top_k <= 0,
    top_p >= 1, min_p <= 0: that filter off. min_keep: one value or (top_k's, top_p's, min_p's), numbers or (B,)
    tensors."""
    out = launch(logits, temperature, top_k, top_p, min_p, min_keep, None, None, 0, mask, False)
    return out.truncation, (out.keep.view(torch.bool) if out.keep is not None else None)


def sample_top_k_top_p_min_p(
    logits: torch.Tensor,
    seed: torch.Tensor,
    position: torch.Tensor,
    stream: int,
    *,
    temperature: float | torch.Tensor | None = None,
    top_k: int | torch.Tensor = 0,
    top_p: float | torch.Tensor = 1.0,
    min_p: float | torch.Tensor = 0.0,
    min_keep: Any = 1,
) -> torch.Tensor:
    """(B,) int64 token ids: `truncate` then the Gumbel-max draw over the kept tokens (rng's noise for seed,
    position, stream), in one kernel: the token the chain temperature -> top_k -> top_p -> min_p -> dist draws on
    the cpu backend, stream being dist's index in the chain."""
    return sample(
        logits,
        seed,
        position,
        stream,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
        min_keep=min_keep,
    )[0]


def sample(
    logits: torch.Tensor,
    seed: torch.Tensor,
    position: torch.Tensor,
    stream: int,
    *,
    temperature: float | torch.Tensor | None = None,
    top_k: int | torch.Tensor = 0,
    top_p: float | torch.Tensor = 1.0,
    min_p: float | torch.Tensor = 0.0,
    min_keep: Any = 1,
    temperature_last: float | torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(token ids (B,) int64, their logprobs (B,) float32) in one kernel: `truncate`, then the Gumbel-max draw over
    the kept tokens and the chosen token's log-probability under them (float64 log-sum-exp). temperature_last (a
    Python float or a (B,) tensor; None: none) divides the kept values before the draw, 0 keeping only the first
    maximum: the chain top_k -> top_p -> min_p -> temperature -> dist (llama.cpp's order), its truncation on the raw
    logits."""
    out = launch(
        logits, temperature, top_k, top_p, min_p, min_keep, seed, position, stream, False, True, temperature_last
    )
    return out.tokens, out.logprobs
