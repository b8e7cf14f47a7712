"""The compiled Gumbel-max draws (rng.gumbel_argmax, and `[temperature ->] [min_p ->] dist` fused) and the
executor's normaliser (ROW_LSE), numba-compiled passes over each row.

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
L - x / t in float32, samplechain_cpu_jit.noise_bound32), and a bound counts as beaten only above a bar that covers
float32's rounding (_bar32); it also counts the tokens not beaten, so a block with none skips the second loop. On
LLM-like rows almost every token and block is skipped, and the draw costs ~1.2 reads of the logits (B = 8, V =
128256, 2 threads).

ROW_LSE (row_lse, at the end): the executor's float64 normaliser of float32 rows, in eight position-strided lanes.

numba is optional: this module imports it (through samplechain_cpu_jit, the shared compiled helpers), and
samplechain_cpu imports this module only when it draws over a wide input with numba installed and
SAMPLECHAIN_CPU_NUMBA not "0". The kernel compiles on its first call (a few seconds) and is cached on disk: ~0.5 s
in later processes. numba's threads run on GNU OpenMP, which does not survive a fork: a child forked after the first
draw takes rng's torch path (which itself needs torch's threads set in the child, as after any use of torch's OpenMP
threads before a fork).
"""

from __future__ import annotations

import math

import numba
import numpy as np
import torch

from samplechain import rng
from samplechain_cpu_jit import (
    BLOCK,
    HUGE,
    exp64,
    jit,
    largest,
    noise,
    noise_bound,
    noise_bound32,
    per_row,
    row_keys,
    salt,
    threads,
    token_bits,
)
from samplechain_cpu_torch import min_p_floor

__all__ = ["gumbel_argmax", "scaled_draw", "row_lse"]


_HUGE_32, _INF_32 = np.float32(rng.HUGE), np.float32(np.inf)


@jit(inline="always")
def _bar32(best):
    """A float32 at which a float32 bound L - q (rounded from L - q by at most 2**-24 of itself) that exceeds it
    still exceeds best in exact arithmetic: best + 4e-6 * (1 + |best|), rounded to float32 (+inf for +inf)."""
    return np.float32(best + 4e-6 * (1.0 + abs(best))) if best < np.inf else _INF_32


@jit(inline="always")
def _bounds32(xr, ir, has_ids, start, n, t, ts, floor, k1, k2, bar, low):
    """The float32 bound L - q of each token of a float32 block (q = x / t, -inf where x / ts is below floor) into
    low[:n], vectorised in 32-bit lanes: how many do not exceed bar (a NaN bound counts) and how many finite q lie
    beyond +-2**24."""
    near = 0
    big = 0
    for j in range(n):
        q = xr[j] / t if not (xr[j] / ts < floor) else -_INF_32
        tok = ir[j] if has_ids else start + j
        low[j] = noise_bound32(token_bits(tok, k1, k2)) - q
        near += not (low[j] > bar)
        big += (abs(q) > _HUGE_32) & (abs(q) < _INF_32)
    return near, big


# Cephes' expf: e**y = 2**n * e**r, |r| <= ln 2 / 2, e**r a degree-7 polynomial (~1 ulp of float32)
_LOG2E = np.float32(1.44269504088896341)
_LN2_HI, _LN2_LO = np.float32(0.693359375), np.float32(-2.12194440e-4)
_P0, _P1, _P2 = np.float32(1.9875691500e-4), np.float32(1.3981999507e-3), np.float32(8.3334519073e-3)
_P3, _P4, _P5 = np.float32(4.1665795894e-2), np.float32(1.6666665459e-1), np.float32(5.0000001201e-1)
_EXP32_FLOOR = np.float32(-87.0)  # below it e**y is under float32's smallest normal: taken as 0
_ONE32, _HALF32 = np.float32(1.0), np.float32(0.5)


@jit(fastmath={"reassoc", "nsz", "contract"})
def _block_mass(xr, n, t):
    """(m, s) of q = xr[:n] / t (float32's division, t > 0): the largest q, max(xr) / t (rounding is monotone),
    and the float64 sum of e**(q - m), in one vectorised pass each (float32 e**, the summation order fixed by the
    compiled code, not by the data). m = -inf: s = 0; NaN entries are the caller's to catch (the draw returns a
    NaN's position, whose logprob is NaN)."""
    m32 = largest(xr, n) / t
    m = np.float64(m32)
    if not (m > -np.inf and m < np.inf):
        return m, 0.0
    s = 0.0
    for j in range(n):
        y = xr[j] / t - m32  # <= 0
        z = max(y, _EXP32_FLOOR)
        k = np.floor(z * _LOG2E + _HALF32)
        r = z - k * _LN2_HI - k * _LN2_LO
        poly = (((((_P0 * r + _P1) * r + _P2) * r + _P3) * r + _P4) * r + _P5) * r * r + r + _ONE32
        scale = np.int32((np.int32(k) + np.int32(127)) << np.int32(23)).view(np.float32)
        s += np.float64(poly * scale) if y >= _EXP32_FLOOR else 0.0
    return m, s


@jit(nogil=True, fastmath={"contract"})
def _kept_exps(xr, t, floor, ts, top, e):
    """e[j] = e**(x[j] / t - top) in float64 where x[j] / ts (ts: 1 or t) is not below floor, else 0; vectorised
    (no branch: `&`, not `and`), and not under `reassoc` (see exp64)."""
    for j in range(xr.shape[0]):
        v = exp64(np.float64(xr[j] / t) - top)
        e[j] = v if xr[j] / ts >= floor else 0.0


@jit(nogil=True)
def _below(xr, n, ts, floor):
    """Whether every x / ts of a block is below floor (a NaN anywhere in the row makes the floor NaN: see
    scaled_draw). Not inlined: numba cannot inline largest twice into one function."""
    return largest(xr, n) / ts < floor


@jit(nogil=True, fastmath={"reassoc", "nsz", "contract"})
def _total(e, n):
    s = 0.0
    for j in range(n):
        s += e[j]
    return s


@jit(inline="always")
def _scan(x, ids, has_ids, row, lo, hi, k1, k2, shift, t, floor, scaled, top, mass_m, mass_s):
    """The first argmin of M - (x / t - shift) over x[row, lo:hi] among the tokens not below floor (x, or with
    `scaled` x / t, compared with it; the others are as -inf), the first NaN's position (-1 if none), and how many
    finite x / t lie beyond +-2**24. x / t is float32's division, as torch's; t = 1 reads x as it is. With
    mass_m / mass_s of a row's width (not of zero), also each BLOCK of the row's mass by block number: lo is a
    multiple of BLOCK, so the blocks are the same however the row is cut into parts. The mass is _block_mass's
    (float32 e**) where top is NaN, else (a floor) the float64 sum of e**(x / t - top) over the tokens kept."""
    best_v = np.inf
    best_i = lo
    big = 0
    narrow = x.itemsize == 4 and shift == 0.0  # float32 bounds (_bounds32) into low32; else float64 ones into low
    low32 = np.empty(BLOCK if narrow else 0, dtype=x.dtype)
    low = np.empty(0 if narrow else BLOCK)
    bar = np.float64(_bar32(best_v)) if narrow else best_v  # a bound above it cannot win
    kept = np.empty(BLOCK) if top == top else low[:0]
    mass = mass_m.shape[1] > 0
    ts = t if scaled else t / t  # what x is divided by before the floor (x / 1 is x)
    for start in range(lo, hi, BLOCK):
        n = min(BLOCK, hi - start)
        xr = x[row, start : start + n]  # slices: indices from 0 need no wraparound test, so the loop vectorises
        ir = ids[row, start : start + n] if has_ids else ids[0, :0]
        # a floor (min_p) leaves most blocks of an LLM's row without a token: their largest is below it
        skip = floor > -np.inf and _below(xr, n, ts, floor)
        if mass and top == top:
            if not skip:
                _kept_exps(xr, t, floor, ts, top, kept)
            mass_m[row, start // BLOCK], mass_s[row, start // BLOCK] = top, 0.0 if skip else _total(kept, n)
        elif mass:
            mass_m[row, start // BLOCK], mass_s[row, start // BLOCK] = _block_mass(xr, n, t)
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
                low[j] = noise_bound(token_bits(tok, k1, k2)) - xs
                near += not (low[j] > bar)
                out += (abs(xs) > HUGE) & (abs(xs) < np.inf)
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
            val = noise(token_bits(tok, k1, k2)) - xs
            if val < best_v:  # strictly: an equal value later in the row never replaces the first
                best_v = val
                best_i = start + j
                bar = np.float64(_bar32(best_v)) if narrow else best_v
    return best_v, best_i, -1, big


@jit(nogil=True)
def _amax(xr, n):
    """torch.amax of xr[:n] (n >= 1): NaN where an entry is NaN (of either sign), else largest's (vectorised).
    Not inlined: numba cannot inline largest twice into one function."""
    nan = 0
    for j in range(n):
        nan += xr[j] != xr[j]
    return xr.dtype.type(np.nan) if nan else largest(xr, n)


@jit(inline="always")
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


# kernel: one compiled call per draw: its three parallel loops (the floors' maxima, the scan, the rescan of rows of
# huge logits) and the parts' combination share the rows' keys and arrays; as separate kernels each pass would be
# another call from Python
@jit(parallel=True, nogil=True)
def _draw(x, ids, has_ids, seed, position, salt, chunks, t, floor, scaled, around, mass_m, mass_s, out, logp):
    """out[b] = the draw of row b over x[b] / t[b] (the tokens not below floor[b], see _scan) under the row keys of
    seed[b], position[b] and the stream's salt (row_keys), each row cut into `chunks` parts (whole _BLOCKs) that
    the threads take in any order; the parts' results are combined in row order (first NaN, else the first of the
    least values). With mass_m / mass_s (B, blocks), also each block's mass (_scan, around[b] its top: NaN for
    _block_mass's). With logp (B,) (min_p's log p, float64; -inf: p <= 0), floor and around are written first:
    _min_p_floors, over the same parts."""
    batch, width = x.shape
    k1 = np.empty(batch, dtype=np.uint32)
    k2 = np.empty(batch, dtype=np.uint32)
    row_keys(seed, position, salt, k1, k2)
    size = ((width + chunks - 1) // chunks + BLOCK - 1) // BLOCK * BLOCK
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
            if abs(top) > HUGE and abs(top) < np.inf:
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


@jit(nogil=True)
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
_MIN_CHUNK = 8192  # tokens per task at least: below it a thread's wake-up outweighs its share of the work


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
    if not threads(logits.numel()):
        return None
    batch, width = logits.shape
    out = np.empty(batch, dtype=np.int64)
    if batch == 0:
        return out, np.empty(0, dtype=np.float32)
    if logits.dtype not in (torch.float32, torch.float64):
        logits = logits.float()
    x = logits.detach().contiguous().numpy()
    idn = _NO_IDS if ids is None else ids.to(torch.int64).contiguous().numpy()
    workers = numba.get_num_threads()
    chunks = max(1, min((2 * workers + batch - 1) // batch, width // _MIN_CHUNK))  # B = 1 too: every thread busy
    scale = per_row(t, batch, x.dtype)
    blocks = (width + BLOCK - 1) // BLOCK
    mass_m, mass_s = (np.empty((batch, blocks)), np.empty((batch, blocks))) if mass else (_NO_MASS, _NO_MASS)
    if log_p is not None:  # written by the kernel
        edge, around = np.empty(batch, dtype=x.dtype), np.empty(batch)
    else:
        edge = np.full(batch, -np.inf, dtype=x.dtype) if floor is None else per_row(floor, batch, x.dtype)
        around = np.full(batch, np.nan) if top is None else per_row(top, batch, np.dtype(np.float64))
    _draw(
        x,
        idn,
        ids is not None,
        per_row(seed, batch, np.dtype(np.int64)),
        per_row(position, batch, np.dtype(np.int64)),
        salt(stream),
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
    bit the samplechain_cpu_torch.min_p_floor of it, on x / t where `scaled` (the temperature first), with no torch op
    before the draw. None in a forked child (the caller runs the samplers)."""
    log_p = None
    if min_p is not None:
        log_p = _log_p(min_p, logits.shape[0])
    elif floor is not None and top is None:  # the largest logit / t, the survivors' normaliser's shift
        top = logits.amax(dim=1) / (t if not isinstance(t, torch.Tensor) else t.to(logits.dtype))
    found = _run(logits, seed, position, None, stream, t, True, floor, scaled, top, log_p)
    return None if found is None else (torch.from_numpy(found[0]), torch.from_numpy(found[1]))


def _log_p(p: torch.Tensor | float, batch: int) -> np.ndarray:
    """(B,) float64: the log p that samplechain_cpu_torch.min_p_floor adds to a row's top, as it adds it (its floor of a
    zero top: a number's log as float32, a tensor's in its dtype), -inf where p <= 0."""
    if not isinstance(p, torch.Tensor):  # torch adds a number's log to a float32 top as the float32 nearest it
        return np.full(batch, np.float32(math.log(p)) if p > 0 else -np.inf)
    return per_row(min_p_floor(torch.zeros(batch), p), batch, np.dtype(np.float64))


# ----------------------------------------------------------------------------- the executor's normaliser (ROW_LSE)
@jit(nogil=True, fastmath={"contract"})
def _shifted_exps(xr, top, e):
    """e[j] = e**(x[j] - top) in float64 (vectorised; 0 for -inf and NaN) and how many x[j] are NaN."""
    nan = 0
    for j in range(xr.shape[0]):
        e[j] = exp64(np.float64(xr[j]) - top)
        nan += xr[j] != xr[j]
    return nan


@jit(nogil=True)
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


@jit(nogil=True)
def lse64(xr):
    """top + log sum e**(xr - top) of one row (float64; top the row's maximum, 0 where it is not finite: -inf for a
    row of -inf, +inf where one is +inf; NaN where one is NaN). The blocks are multiples of 8 wide, so position j
    always adds to lane j % 8."""
    top = np.float64(largest(xr, xr.shape[0]))
    if top == np.inf:
        return np.inf
    if not top > -np.inf:  # every entry -inf (or a NaN: found below)
        top = 0.0
    e = np.empty(BLOCK)
    acc = np.zeros(8)
    nan = 0
    for start in range(0, xr.shape[0], BLOCK):
        n = min(BLOCK, xr.shape[0] - start)
        nan += _shifted_exps(xr[start : start + n], top, e)
        _lane_sums(e, n, start, acc)
    total = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]))
    return np.nan if nan else top + np.log(total)


@jit(parallel=True, nogil=True)
def _row_lse(x, out):
    """out[b] = lse64(x[b])."""
    for row in numba.prange(x.shape[0]):
        out[row] = lse64(x[row])


def row_lse(logits: torch.Tensor) -> torch.Tensor | None:
    """The ROW_LSE kernel: (B,) float32 log-sum-exp of float32 rows (B, W), summed in float64 (the exponentials
    within an ulp of libm's, added in eight position-strided lanes): engine.logprobs.row_lse's value to the float32
    rounding, ~3x faster, and each row's the same to the bit alone and in any batch (padding -inf adds zeros).
    None in a forked child (the caller's torch path)."""
    if not threads(logits.numel()):
        return None
    out = np.empty(logits.shape[0])
    _row_lse(logits.detach().contiguous().numpy(), out)
    return torch.from_numpy(out).float()
