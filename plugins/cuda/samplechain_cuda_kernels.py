"""Triton kernels for the cuda backend: the Gumbel-max draw and the fused top-k -> top-p -> min-p truncation, one
program per row, reading the row in blocks, with no (B, V) temporaries and no host synchronisation.

Importable without triton (`kernels_unavailable_reason()` then says why the kernels cannot run). The kernels run on
CUDA tensors, or on CPU tensors under triton's interpreter (TRITON_INTERPRET=1 set before this module is imported:
how CI tests them without a GPU).

    gumbel_argmax(logits, seed, position, stream, ids=None)
        rng.gumbel_argmax in one pass: the counter hash of rng (row keys and per-token bits, uint32 arithmetic that
        wraps as rng's int32 path does), u in float64 as rng.uniform, M = log(-log u) - x in float64 and a running
        first argmin. Rows whose largest logit is finite and beyond +-2**24 are drawn again, shifted by it
        (rng.shifted); the first NaN wins, as torch's argmin; an all -inf row gives 0.
    uniform(seed, position, ids, stream)
        rng.uniform's float64 noise, bit for bit (for tests of the hash).
    truncate(logits, temperature=, top_k=, top_p=, min_p=, ..., mask=False)
        per row, the candidates the chain temperature -> top_k -> top_p -> min_p keeps on the cpu backend, found
        by pivot searches over the row (FlashInfer's idea: no sort) and returned as thresholds (`Truncation`),
        optionally as a (B, V) keep mask.
    sample_top_k_top_p_min_p(logits, seed, position, stream, ...)
        truncate + gumbel_argmax over the kept tokens, in one kernel: the token the chain
        temperature -> top_k -> top_p -> min_p -> dist draws on the cpu backend (stream = dist's index in the chain).
    sample(logits, seed, position, stream, ..., temperature_last=None)
        the same, with the chosen tokens' logprobs, and optionally a temperature after the truncation (llama.cpp's
        order top_k -> top_p -> min_p -> temperature -> dist): what the cuda backend's FUSED_SAMPLE kernel runs.

Kept sets, as the plugins define them (every filter settles equal logits at its cut by lowest token id):
  y = x / t in float32 (IEEE division, as torch on the CPU); t = 0 keeps the first maximum only. A temperature
  given as a Python float is the chain's scalar case, where the executor runs top_k before the temperature (top_k
  ranks the raw logits); a tensor is the per-row case (top_k ranks y). The two differ only where x / t rounds two
  different logits at the k-th place to the same value.
  top_k: S = the max(k, min_keep) best (k <= 0 or >= V: off).
  top_p (p >= 1 off): over S, probabilities exp(y - max y) / sum(exp) in float64; the first C_p of S in
  (y desc, id asc) order, C_p = max(#{tokens whose mass strictly above is < p}, min_keep, 1).
  min_p (p <= 0 off): thr = max y + log(p) in float32 (a Python float: float32(math.log(p)), as the chain's scalar
  path; a tensor: torch.log in float32, as its per-row path); keeps the first max(#{y >= thr}, min_keep) of those.
  The result is a prefix of S in (y desc, id asc) order: kept iff in S and (key(y) > cut or key(y) == cut and
  id <= last id), S itself given the same way in the order top_k ranks by.

Exactness (see the tests): the hash and u are bit for bit rng's; the token of gumbel_argmax equals rng's unless two
candidates' M - x lie within an ulp or two (float64 log may round differently on the device, in numpy under the
interpreter, and in torch: never seen; the cuda backend's own noise has the same caveat). top_k and min_p kept sets
are exact (integer counts, one float32 add). top_p's masses are float64 sums in another order than the chain's
torch.sum / cumsum, so a cut can differ where a cumulative mass lies within ~1e-15 of p; rows of V >= 16384 with
top_k off are cut by the chain with a float32 normaliser (top_p's wide path), where the kernel's float64 cut may
differ within ~1e-6 of p.
"""

from __future__ import annotations

import math
import struct
from typing import Any, NamedTuple

import torch

try:  # optional: the backend works without it (torch ops); pip install 'samplechain-cuda[triton]'
    import triton
    import triton.language as tl
except ImportError as _exc:  # pragma: no cover - depends on the environment
    triton = tl = None
    _IMPORT_ERROR = f"triton is not installed ({_exc}); pip install 'samplechain-cuda[triton]' (or triton>=3.6)"
else:
    _IMPORT_ERROR = ""

__all__ = [
    "Truncation",
    "gumbel_argmax",
    "kernels_unavailable_reason",
    "sample",
    "sample_top_k_top_p_min_p",
    "truncate",
    "uniform",
    "HUGE",
]

HUGE = float(2**24)  # rng.HUGE: rows whose largest finite logit is beyond it are shifted by it


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
    count: torch.Tensor
    top: torch.Tensor


def kernels_unavailable_reason(device: Any = None) -> str:
    """Why the kernels cannot run on `device` (a torch device or its name; None: CUDA), or "" when they can."""
    if triton is None:
        return _IMPORT_ERROR
    kind = torch.device(device).type if device is not None else "cuda"
    if _interpreted():
        return "" if kind in ("cpu", "cuda") else f"triton's interpreter runs kernels on cpu tensors, not {kind}"
    if kind == "cpu":
        return (
            "the kernels run on CPU tensors only under triton's interpreter: set TRITON_INTERPRET=1 before "
            "samplechain_cuda_kernels is imported"
        )
    if kind != "cuda":
        return f"the triton kernels run on cuda tensors, not {kind}"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} finds no CUDA device (a CPU build, no GPU or no driver)"
    return ""


def _interpreted() -> bool:
    return triton is not None and type(_gumbel_argmax_kernel).__name__ == "InterpretedFunction"


def _check(t: torch.Tensor) -> None:
    reason = kernels_unavailable_reason(t.device)
    if reason:
        raise RuntimeError(f"samplechain_cuda_kernels: {reason}")


def _salt(stream: int) -> int:
    return (int(stream) * 0x9E3779B9) & 0xFFFFFFFF


INTERPRETED_BLOCK = 8192  # the interpreter: few large blocks (each operation costs ~50 us); tests lower it


def _block(width: int, device_block: int) -> int:
    top = INTERPRETED_BLOCK if _interpreted() else device_block
    return max(16, min(top, triton.next_power_of_2(max(width, 1))))


def _rows(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _counter(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """seed / position as the kernels read them: (B,) int64, contiguous, on the logits' device (a no-op when so)."""
    return t.to(device=device, dtype=torch.int64).contiguous()


# ----------------------------------------------------------------------------------------------------- kernels
if triton is not None:

    @triton.jit
    def _mix32(x):
        """rng.mix32 (lowbias32) on uint32: the multiplies wrap modulo 2**32, the shifts are logical."""
        x = x ^ (x >> 16)
        x = x * 0x7FEB352D
        x = x ^ (x >> 15)
        x = x * 0x846CA68B
        return x ^ (x >> 16)

    @triton.jit
    def _row_keys(seed, pos, salt):
        """rng.row_keys for one row: seed, pos int64 scalars, salt = (stream * 0x9E3779B9) mod 2**32."""
        k = _mix32(((seed >> 32) & 0xFFFFFFFF).to(tl.uint32) ^ salt.to(tl.uint32))
        k = _mix32((seed & 0xFFFFFFFF).to(tl.uint32) ^ k)
        k = _mix32(k ^ (pos & 0xFFFFFFFF).to(tl.uint32))
        k = _mix32(k ^ ((pos >> 32) & 0xFFFFFFFF).to(tl.uint32))
        return k, _mix32(k ^ 0x5BD1E995)

    @triton.jit
    def _uniform64(tok, k1, k2):
        """rng.uniform's u for token ids tok (uint32 block): (bits + 0.5) / 2**32, exact in float64."""
        bits = _mix32(_mix32(tok + k1) ^ k2)
        return (bits.to(tl.float64) + 0.5) * 2.3283064365386963e-10  # 2**-32: exact in float32 and float64

    @triton.jit
    def _unkey(k):
        """The float32 value of an order key (scalar)."""
        k32 = k.to(tl.int32)
        return (k32 ^ ((k32 >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)

    @triton.jit
    def _param(ptr, value, row, PER_ROW: tl.constexpr, DTYPE: tl.constexpr):
        """A parameter's value for this row: read from its (B,) tensor, or the scalar argument."""
        if PER_ROW:
            return tl.load(ptr + row).to(DTYPE)
        else:
            return (tl.zeros((), DTYPE) + value).to(DTYPE)

    @triton.jit
    def _load_row(x_row, offs, valid, t, HAS_T: tl.constexpr, SWAP: tl.constexpr):
        """y = x / t (float32, IEEE; t = 0: x), and the keys top_k ranks by (kx) and the later filters cut by (ky):
        the float32 bits made monotone (as int64), -0.0 as +0.0. (Written out rather than calling _key: every jit
        call costs ~1 ms under the interpreter.)"""
        x = tl.load(x_row + offs, mask=valid, other=float("-inf")).to(tl.float32)
        if HAS_T:
            hot = t > 0
            y = tl.where(hot, tl.math.div_rn(x, tl.where(hot, t, 1.0)), x)
        else:
            y = x
        b = y.to(tl.int32, bitcast=True)
        ky = tl.where(y == 0.0, 0, b ^ ((b >> 31) & 0x7FFFFFFF)).to(tl.int64)
        if SWAP:
            b = x.to(tl.int32, bitcast=True)
            kx = tl.where(x == 0.0, 0, b ^ ((b >> 31) & 0x7FFFFFFF)).to(tl.int64)
        else:
            kx = ky
        return y, kx, ky

    @triton.jit
    def _draw_pass(
        x_row,
        ids_row,
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
        HAS_IDS: tl.constexpr,
        TRUNC: tl.constexpr,
        HAS_T: tl.constexpr,
        SWAP: tl.constexpr,
        DRAW_T: tl.constexpr,
        MASS: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        """One pass of the Gumbel-max draw: the first argmin of M - (x - shift) over the (kept) tokens, the first
        NaN's position (V if none), the largest (kept) value and (MASS) the kept tokens' sum of exp(x - ref) in
        float64. DRAW_T: the kept tokens' values are divided by dt (a temperature after the truncation) first; dt <= 0
        draws the first largest kept value instead (temperature 0 keeps only the first maximum)."""
        best_v = tl.full((), float("inf"), tl.float64)
        best_i = tl.full((), 0, tl.int64)
        nan_i = tl.full((), 0, tl.int64) + V
        top = tl.full((), float("-inf"), tl.float64)
        mass = tl.full((), 0.0, tl.float64)
        for start in range(0, V, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            valid = offs < V
            if TRUNC:
                y, kx, ky = _load_row(x_row, offs, valid, t, HAS_T, SWAP)
                keep = valid & ((kx > tk) | ((kx == tk) & (offs <= ck))) & ((ky > ty) | ((ky == ty) & (offs <= cy)))
                if DRAW_T:
                    y = tl.where(dt > 0, tl.math.div_rn(y, tl.where(dt > 0, dt, 1.0)), y)
                x = y.to(tl.float64)
            else:
                keep = valid
                x = tl.load(x_row + offs, mask=valid, other=float("-inf")).to(tl.float64)
            if tl.max(keep.to(tl.int32), axis=0) > 0:  # blocks without a kept token cost no hashing
                if HAS_IDS:
                    tok = tl.load(ids_row + offs, mask=valid, other=0).to(tl.uint32)
                else:
                    tok = offs.to(tl.uint32)
                u = _uniform64(tok, k1, k2)
                val = tl.log(-tl.log(u)) - (x - shift)  # -(x + G), exactly as rng's in-place ops
                if DRAW_T:
                    val = tl.where(dt > 0, val, -x)
                val = tl.where(keep, val, float("inf"))
                isnan = val != val
                nan_i = tl.minimum(nan_i, tl.min(tl.where(isnan, offs, V), axis=0).to(tl.int64))
                val = tl.where(isnan, float("inf"), val)
                blk_v, blk_i = tl.min(val, axis=0, return_indices=True)  # ties: the first
                better = blk_v < best_v  # strictly: an equal value later in the row never replaces the first
                best_i = tl.where(better, (start + blk_i).to(tl.int64), best_i)
                best_v = tl.where(better, blk_v, best_v)
                top = tl.maximum(top, tl.max(tl.where(keep, x, float("-inf")), axis=0))
                if MASS:
                    mass += tl.sum(tl.where(keep, tl.exp(x - ref), 0.0), axis=0)
        return best_v, best_i, nan_i, top, mass

    # integer arguments that may be 1 (a width, a stride, a min_keep) must not be specialised into constants: the
    # kernels carry them into loop-carried values and jit helpers, which a constexpr breaks (tests compile them so)
    @triton.jit(do_not_specialize=["stride_x", "stride_ids", "V", "salt"])
    def _gumbel_argmax_kernel(
        x_ptr,
        stride_x,
        ids_ptr,
        stride_ids,
        V,
        seed_ptr,
        pos_ptr,
        salt,
        out_ptr,
        HAS_IDS: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        x_row = x_ptr + row * stride_x
        ids_row = ids_ptr + row * stride_ids
        k1, k2 = _row_keys(tl.load(seed_ptr + row), tl.load(pos_ptr + row), salt)
        zero = tl.full((), 0.0, tl.float64)
        _, best, nan_i, top, _ = _draw_pass(
            x_row,
            ids_row,
            V,
            k1,
            k2,
            zero,
            1.0,
            0,
            0,
            0,
            0,
            1.0,
            zero,
            HAS_IDS,
            False,
            False,
            False,
            False,
            False,
            BLOCK,
        )
        if (tl.abs(top) > 16777216.0) & (tl.abs(top) < float("inf")):  # rng.shifted: noise next to huge logits
            _, best, nan_i, top, _ = _draw_pass(
                x_row,
                ids_row,
                V,
                k1,
                k2,
                top,
                1.0,
                0,
                0,
                0,
                0,
                1.0,
                zero,
                HAS_IDS,
                False,
                False,
                False,
                False,
                False,
                BLOCK,
            )
        tl.store(out_ptr + row, tl.where(nan_i < V, nan_i, best))

    @triton.jit(do_not_specialize=["stride_ids", "K", "salt", "stride_out"])
    def _uniform_kernel(ids_ptr, stride_ids, K, seed_ptr, pos_ptr, salt, out_ptr, stride_out, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        k1, k2 = _row_keys(tl.load(seed_ptr + row), tl.load(pos_ptr + row), salt)
        for start in range(0, K, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            valid = offs < K
            tok = tl.load(ids_ptr + row * stride_ids + offs, mask=valid, other=0).to(tl.uint32)
            tl.store(out_ptr + row * stride_out + offs, _uniform64(tok, k1, k2), mask=valid)

    @triton.jit
    def _pivot_pass(
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
            y, kx, ky = _load_row(x_row, offs, valid, t, HAS_T, SWAP)
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
    def _search(
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
            cnt, mass = _pivot_pass(
                x_row, V, t, piv, tk, ck, top64, total, HAS_T, SWAP, ON_X, RESTRICT, MASS, BLOCK, NP
            )
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
    def _nth_equal(
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
            y, kx, ky = _load_row(x_row, offs, valid, t, HAS_T, SWAP)
            if RESTRICT:
                eq = valid & ((kx > tk) | ((kx == tk) & (offs <= ck))) & (ky == tau)
            else:
                eq = valid & (kx == tau)
            rank = tl.cumsum(eq.to(tl.int32), axis=0) + run
            found = tl.maximum(found, tl.max(tl.where(eq & (rank == n), offs, -1), axis=0).to(tl.int64))
            run += tl.sum(eq.to(tl.int32), axis=0)
        return found

    @triton.jit(do_not_specialize=["stride_x", "V", "k_val", "kmin_val", "pmin_val", "mmin_val", "salt", "stride_mask"])
    def _truncate_kernel(
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
        thr_ptr,
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
        row = tl.program_id(0).to(tl.int64)
        x_row = x_ptr + row * stride_x
        t = _param(t_ptr, t_val, row, T_ROW, tl.float32)
        none_key = tl.full((), -2147483649, tl.int64)
        vv = tl.full((), 0, tl.int64) + V

        # pass 1: the largest y, the key ranges
        top = tl.full((), float("-inf"), tl.float32)
        kx_lo = tl.full((), 2147483647, tl.int64)
        kx_hi = tl.full((), -2147483648, tl.int64)
        ky_lo = tl.full((), 2147483647, tl.int64)
        ky_hi = tl.full((), -2147483648, tl.int64)
        for start in range(0, V, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            valid = offs < V
            y, kx, ky = _load_row(x_row, offs, valid, t, HAS_T, SWAP)
            top = tl.maximum(top, tl.max(y, axis=0))
            kx_lo = tl.minimum(kx_lo, tl.min(tl.where(valid, kx, 2147483647), axis=0))
            kx_hi = tl.maximum(kx_hi, tl.max(tl.where(valid, kx, -2147483648), axis=0))
            ky_lo = tl.minimum(ky_lo, tl.min(tl.where(valid, ky, 2147483647), axis=0))
            ky_hi = tl.maximum(ky_hi, tl.max(tl.where(valid, ky, -2147483648), axis=0))
        row_ok = (top > float("-inf")) & (top < float("inf"))  # an all -inf (or NaN / +inf) row: no cut
        top64 = tl.where(row_ok, top.to(tl.float64), 0.0)

        # top_k: the kk-th largest rank key, and of the tokens equal to it the (kk - above)-th lowest id
        k = _param(k_ptr, k_val, row, K_ROW, tl.int64)
        kk = tl.minimum(tl.maximum(k, _param(kmin_ptr, kmin_val, row, KMIN_ROW, tl.int64)), vv)
        tk = none_key
        ck = vv
        width = vv
        take = tl.full((), 0, tl.int32)  # how many of the tokens equal to tk S keeps
        if (k > 0) & (kk < vv) & row_ok:
            tk, _, above, _ = _search(
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
            ck = tl.full((), -1, tl.int64)  # found in the next pass
            width = kk

        # pass: S's last id at tk, its normaliser (float64, as top_p's row_mass), min_p's count
        lm = _param(lm_ptr, lm_val, row, LM_ROW, tl.float32)
        thr_m = top + lm
        total = tl.full((), 0.0, tl.float64)
        n_in = tl.full((), 0, tl.int32)
        n_m = tl.full((), 0, tl.int32)
        key_m = tl.full((), 2147483647, tl.int64)  # the smallest key of S at or above min_p's threshold
        run = tl.full((), 0, tl.int32)
        for start in range(0, V, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            valid = offs < V
            y, kx, ky = _load_row(x_row, offs, valid, t, HAS_T, SWAP)
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

        # top_p: the largest value v whose mass at or above it reaches p; of the tokens equal to v, those whose
        # mass above (G + r * q, r = 0, 1, ...) is still below p
        p = _param(p_ptr, p_val, row, P_ROW, tl.float32)
        pmin = _param(pmin_ptr, pmin_val, row, PMIN_ROW, tl.int64)
        c_p = width
        count_p = tl.full((), -1, tl.int64)
        v_p = none_key
        above_p = tl.full((), 0, tl.int64)
        if (p < 1.0) & row_ok:
            p64 = p.to(tl.float64)
            count_p = tl.full((), 0, tl.int64)
            if p64 > 0:
                v_p, at, above, g = _search(
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
                q = tl.exp(_unkey(v_p).to(tl.float64) - top64) / total
                n = (at - above).to(tl.float64)
                r = tl.where(q > 0, tl.minimum(tl.math.ceil((p64 - g) / tl.where(q > 0, q, 1.0)), n), n)
                above_p = above.to(tl.int64)
                count_p = above_p + tl.maximum(r, 1.0).to(tl.int64)
            c_p = tl.minimum(tl.maximum(tl.maximum(count_p, pmin), 1), width)

        # min_p: at least min_keep of the tokens >= max y + log(p), among top_p's
        count = c_p
        m_on = (lm > float("-inf")) & row_ok
        if m_on:
            mmin = _param(mmin_ptr, mmin_val, row, MMIN_ROW, tl.int64)
            count = tl.minimum(c_p, tl.maximum(n_m.to(tl.int64), mmin))
        if HAS_T:
            count = tl.where(t > 0, count, 1)  # temperature 0: only the first maximum

        # the count-th token of S in (y desc, id asc) order: its key and id
        ty = none_key
        cy = vv
        if (count < width) & row_ok:
            if m_on & (count == n_m):  # min_p's own cut: all of S at or above its threshold, no search
                ty = key_m
            else:
                if count == count_p:  # top_p's own cut: the token lies among those equal to v_p
                    ty = v_p
                    nth = count - above_p
                else:  # a min_keep or temperature 0: search for it
                    ty, _, above, _ = _search(
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
                cy = _nth_equal(x_row, V, t, ty, nth, tk, ck, HAS_T, SWAP, True, BLOCK)

        tl.store(thr_ptr + row * 5 + 0, tk)
        tl.store(thr_ptr + row * 5 + 1, ck)
        tl.store(thr_ptr + row * 5 + 2, ty)
        tl.store(thr_ptr + row * 5 + 3, cy)
        tl.store(thr_ptr + row * 5 + 4, count)
        tl.store(top_ptr + row, top)

        if MASK:
            for start in range(0, V, BLOCK):
                offs = start + tl.arange(0, BLOCK)
                valid = offs < V
                y, kx, ky = _load_row(x_row, offs, valid, t, HAS_T, SWAP)
                keep = ((kx > tk) | ((kx == tk) & (offs <= ck))) & ((ky > ty) | ((ky == ty) & (offs <= cy)))
                tl.store(mask_ptr + row * stride_mask + offs, keep.to(tl.int8), mask=valid)

        if DRAW:
            k1, k2 = _row_keys(tl.load(seed_ptr + row), tl.load(pos_ptr + row), salt)
            dt = _param(dt_ptr, dt_val, row, DT_ROW, tl.float32)
            hot = dt > 0
            if DRAW_T:  # a temperature after the truncation: the kept values are divided before the draw
                top = tl.where(hot, tl.math.div_rn(top, tl.where(hot, dt, 1.0)), top)
            ref = tl.where(row_ok, top.to(tl.float64), 0.0)  # the largest drawn value: kept, so the mass is >= 1
            big = (tl.abs(top) > 16777216.0) & row_ok  # rng.shifted, on the kept tokens (which hold the maximum)
            shift = tl.where(big, ref, 0.0)
            _, best, nan_i, _, mass = _draw_pass(
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
            tl.store(tok_ptr + row, tok)
            # the token's logprob under the kept distribution: its drawn value - log sum exp over the kept ones
            xb = tl.load(x_row + tok).to(tl.float32)
            if HAS_T:
                xb = tl.where(t > 0, tl.math.div_rn(xb, tl.where(t > 0, t, 1.0)), xb)
            if DRAW_T:
                xb = tl.where(hot, tl.math.div_rn(xb, tl.where(hot, dt, 1.0)), xb)
            lp = xb.to(tl.float64) - ref - tl.log(mass)
            if DRAW_T:  # temperature 0: the first maximum, alone (NaN where the row has no finite maximum: an error)
                lp = tl.where(hot, lp, tl.where(row_ok, 0.0, float("nan")))
            tl.store(lp_ptr + row, lp.to(tl.float32))


# ------------------------------------------------------------------------------------------------- functions


def gumbel_argmax(
    logits: torch.Tensor, seed: torch.Tensor, position: torch.Tensor, stream: int, ids: torch.Tensor | None = None
) -> torch.Tensor:
    """(B,) int64: rng.gumbel_argmax(logits, seed, position, ids, stream), the position of each row's draw (first
    index on ties). logits (B, K) float (any float dtype: promoted exactly), seed / position (B,) int64, ids (B, K)
    int64 token ids (None: position = id). One pass over each row (two for rows of huge logits)."""
    _check(logits)
    batch, width = logits.shape
    out = torch.empty(batch, dtype=torch.int64, device=logits.device)
    if batch == 0:
        return out
    logits = _rows(logits)
    if ids is not None:
        ids = _rows(ids)
    seed, position = _counter(seed, logits.device), _counter(position, logits.device)
    _gumbel_argmax_kernel[(batch,)](
        logits,
        logits.stride(0),
        ids if ids is not None else logits,
        ids.stride(0) if ids is not None else 0,
        width,
        seed,
        position,
        _salt(stream),
        out,
        HAS_IDS=ids is not None,
        BLOCK=_block(width, 1024),
        num_warps=4,
    )
    return out


def uniform(seed: torch.Tensor, position: torch.Tensor, ids: torch.Tensor, stream: int) -> torch.Tensor:
    """(B, K) float64: rng.uniform(seed, position, ids, stream), bit for bit."""
    _check(ids)
    batch, width = ids.shape
    out = torch.empty(batch, width, dtype=torch.float64, device=ids.device)
    if batch == 0 or width == 0:
        return out
    ids = _rows(ids)
    seed, position = _counter(seed, ids.device), _counter(position, ids.device)
    _uniform_kernel[(batch,)](
        ids, ids.stride(0), width, seed, position, _salt(stream), out, out.stride(0), BLOCK=_block(width, 1024)
    )
    return out


def _arg(value: Any, dtype: torch.dtype, device: torch.device) -> tuple[Any, Any, bool]:
    """(pointer or None, scalar or 0, per row): a tensor parameter is read per row, a Python number is a scalar."""
    if isinstance(value, torch.Tensor):
        return value.to(device=device, dtype=dtype).contiguous(), 0, True
    return None, value, False


def _launch(
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
):
    _check(logits)
    batch, vocab = logits.shape
    device = logits.device
    logits = _rows(logits)
    keeps = min_keep if isinstance(min_keep, (tuple, list)) else (min_keep,) * 3
    # temperature: a Python float is the chain's scalar case (the executor runs top_k before it: top_k ranks x);
    # 1.0 and None mean none
    if isinstance(temperature, torch.Tensor):
        t_ptr, t_val, t_row = temperature.to(device=device, dtype=torch.float32).contiguous(), 0.0, True
        has_t, swap = True, False
    else:
        t_ptr, t_val, t_row = None, _f32(1.0 if temperature is None else temperature), False
        has_t, swap = t_val != 1.0, t_val > 0
    if isinstance(top_p, torch.Tensor):
        p = top_p.to(device=device, dtype=torch.float32).contiguous()
        p_args = (p, 0.0, True)
    else:
        p_args = (None, _f32(top_p), False)
    # min_p in logit space: log(p) as the chain's scalar (float32 of the double log) or per-row (torch.log) path
    if isinstance(min_p, torch.Tensor):
        m = min_p.to(device=device, dtype=torch.float32)
        on = m > 0
        lm = torch.where(on, torch.log(torch.where(on, m, torch.ones_like(m))), float("-inf")).contiguous()
        lm_args = (lm, 0.0, True)
    else:
        m = _f32(min_p)  # the chain's scalar: the float32 parameter as a Python float
        lm_args = (None, _f32(math.log(m)) if m > 0 else float("-inf"), False)
    # a temperature after the truncation (only for the draw; 0: the first maximum): a Python float or a (B,) tensor
    if isinstance(temperature_last, torch.Tensor):
        dt_args, draw_t = (temperature_last.to(device=device, dtype=torch.float32).contiguous(), 0.0, True), True
    else:
        dt = _f32(1.0 if temperature_last is None else temperature_last)
        dt_args, draw_t = (None, dt, False), dt != 1.0
    k_args = _arg(0 if top_k is None else top_k, torch.int64, device)
    kmin, pmin, mmin = (_arg(v, torch.int64, device) for v in keeps)
    if draw:
        seed, position = _counter(seed, device), _counter(position, device)
    thr = torch.empty(batch, 5, dtype=torch.int64, device=device)
    top = torch.empty(batch, dtype=torch.float32, device=device)
    tok = torch.empty(batch, dtype=torch.int64, device=device)
    logprob = torch.empty(batch, dtype=torch.float32, device=device)
    keep = torch.empty(batch, vocab, dtype=torch.int8, device=device) if mask else None
    if batch == 0:
        return thr, top, tok, logprob, keep
    block = _block(vocab, 512)
    _truncate_kernel[(batch,)](
        logits,
        logits.stride(0),
        vocab,
        t_ptr,
        t_val,
        k_args[0],
        k_args[1],
        kmin[0],
        kmin[1],
        p_args[0],
        p_args[1],
        pmin[0],
        pmin[1],
        lm_args[0],
        lm_args[1],
        mmin[0],
        mmin[1],
        dt_args[0],
        dt_args[1],
        seed,
        position,
        _salt(stream),
        thr,
        top,
        tok,
        logprob,
        keep,
        keep.stride(0) if keep is not None else 0,
        HAS_T=has_t,
        T_ROW=t_row,
        K_ROW=k_args[2],
        KMIN_ROW=kmin[2],
        P_ROW=p_args[2],
        PMIN_ROW=pmin[2],
        LM_ROW=lm_args[2],
        MMIN_ROW=mmin[2],
        SWAP=swap,
        DRAW_T=draw_t,
        DT_ROW=dt_args[2],
        DRAW=draw,
        MASK=mask,
        BLOCK=block,
        NP=min(256, (1 << 20) // block) if _interpreted() else 16,
        num_warps=8,
    )
    return thr, top, tok, logprob, keep


def _f32(value: float) -> float:
    """A Python float rounded to float32, as the chain's parameter columns hold it."""
    return struct.unpack("f", struct.pack("f", value))[0]


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
    thr, top, _, _, keep = _launch(logits, temperature, top_k, top_p, min_p, min_keep, None, None, 0, mask, False)
    trunc = Truncation(thr[:, 0], thr[:, 1], thr[:, 2], thr[:, 3], thr[:, 4], top)
    return trunc, (keep.view(torch.bool) if keep is not None else None)


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
    _, _, tok, logprob, _ = _launch(
        logits, temperature, top_k, top_p, min_p, min_keep, seed, position, stream, False, True, temperature_last
    )
    return tok, logprob
