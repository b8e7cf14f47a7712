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
M - x >= L - x after rounding too). On LLM-like rows almost every token is skipped, and the pass costs ~1.4 reads
of the logits.

numba is optional: this module imports it, and samplechain_cpu imports this module only when it draws over a wide
input with numba installed and SAMPLECHAIN_CPU_NUMBA not "0". The kernel compiles on its first call (a few
seconds) and is cached on disk: ~0.5 s in later processes. numba's threads run on GNU OpenMP, which does not
survive a fork: a child forked after the first draw takes rng's torch path (which itself needs torch's threads
set in the child, as after any use of torch's OpenMP threads before a fork).
"""

from __future__ import annotations

import math
import os
import threading

import numba
import numpy as np
import torch

from samplechain import rng

__all__ = ["gumbel_argmax"]


def _jit(**options):
    """numba.njit with the disk cache, or without where no cache location is writable."""
    def wrap(fn):
        try:
            return numba.njit(cache=True, **options)(fn)
        except RuntimeError:  # "no locator available": compiled anew in every process
            return numba.njit(**options)(fn)
    return wrap


_M32 = np.uint64(0xFFFFFFFF)
_C1, _C2 = np.uint64(0x7FEB352D), np.uint64(0x846CA68B)
_S15, _S16 = np.uint64(15), np.uint64(16)
_INV32 = 1.0 / 4294967296.0  # 2**-32: (bits + 0.5) * 2**-32 is exact in float64
_LN2 = math.log(2.0)
_EXP_BIAS = np.int64(1023 << 52)
_INV52 = 2.0**-52
_SLACK = 1e-6  # L is lowered by this much: far beyond the rounding of L and of libm's logs (~1e-14)
_HUGE = rng.HUGE
_BLOCK = 1024  # tokens whose bounds are formed in one vectorised loop


@_jit(inline="always")
def _mix32(x):
    """rng.mix32 on a uint64 holding 32 bits: the products stay below 2**64 (as rng._mix32_np)."""
    x ^= x >> _S16
    x = (x * _C1) & _M32
    x ^= x >> _S15
    x = (x * _C2) & _M32
    return x ^ (x >> _S16)


@_jit(inline="always")
def _scan(x, ids, has_ids, row, lo, hi, k1, k2, shift):
    """The first argmin of M - (x - shift) over x[row, lo:hi], the first NaN's position (-1 if none), and how many
    finite x lie beyond +-2**24."""
    best_v = np.inf
    best_i = lo
    big = 0
    low = np.empty(_BLOCK)
    for start in range(lo, hi, _BLOCK):
        n = min(_BLOCK, hi - start)
        xr = x[row, start:start + n]  # slices: indices from 0 need no wraparound test, so the loop vectorises
        ir = ids[row, start:start + n] if has_ids else ids[0, :0]
        for j in range(n):  # vectorised: the bound L - x of each token
            xs = np.float64(xr[j]) - shift
            tok = np.uint64(ir[j]) if has_ids else np.uint64(start + j)
            bits = _mix32(_mix32((tok + k1) & _M32) ^ k2)
            w = (np.float64(_M32 - bits) + 0.5) * _INV32  # 1 - u, exact
            low[j] = np.float64(np.float64(w).view(np.int64) - _EXP_BIAS) * _INV52 * _LN2 - _SLACK - xs
            big += (abs(xs) > _HUGE) & (abs(xs) < np.inf)
        for j in range(n):
            if low[j] > best_v:  # cannot win (a NaN bound is not greater: its token is looked at)
                continue
            xs = np.float64(xr[j]) - shift
            if xs != xs:
                return best_v, best_i, start + j, big
            tok = np.uint64(ir[j]) if has_ids else np.uint64(start + j)
            bits = _mix32(_mix32((tok + k1) & _M32) ^ k2)
            val = np.log(-np.log((np.float64(bits) + 0.5) * _INV32)) - xs
            if val < best_v:  # strictly: an equal value later in the row never replaces the first
                best_v = val
                best_i = start + j
    return best_v, best_i, -1, big


@_jit(parallel=True, nogil=True)
def _draw(x, ids, has_ids, k1, k2, chunks, out):
    """out[b] = the draw of row b, each row cut into `chunks` parts that the threads take in any order; the parts'
    results are combined in row order (first NaN, else the first of the least values)."""
    batch, width = x.shape
    size = (width + chunks - 1) // chunks
    tasks = batch * chunks
    best_v = np.empty(tasks)
    best_i = np.empty(tasks, dtype=np.int64)
    nan_i = np.empty(tasks, dtype=np.int64)
    big = np.empty(tasks, dtype=np.int64)
    for t in numba.prange(tasks):
        row = t // chunks
        lo = (t % chunks) * size
        best_v[t], best_i[t], nan_i[t], big[t] = _scan(x, ids, has_ids, row, lo, min(lo + size, width),
                                                       k1[row], k2[row], 0.0)
    shift = np.zeros(batch)
    for row in range(batch):
        if big[row * chunks:(row + 1) * chunks].sum() > 0:  # perhaps huge: rng.shifted's test on the maximum
            top = x[row].max()
            if abs(top) > _HUGE and abs(top) < np.inf:
                shift[row] = top
    for t in numba.prange(tasks):
        row = t // chunks
        if shift[row] != 0.0:  # a row of huge logits, again minus its maximum
            lo = (t % chunks) * size
            best_v[t], best_i[t], nan_i[t], _ = _scan(x, ids, has_ids, row, lo, min(lo + size, width),
                                                      k1[row], k2[row], shift[row])
    for row in range(batch):
        pick, value, nan = best_i[row * chunks], best_v[row * chunks], -1
        for t in range(row * chunks, (row + 1) * chunks):
            if nan_i[t] >= 0:  # the first NaN wins, as in torch's argmin
                nan = nan_i[t]
                break
            if best_v[t] < value:
                pick, value = best_i[t], best_v[t]
        out[row] = nan if nan >= 0 else pick


_NO_IDS = np.zeros((1, 1), dtype=np.int64)  # the ids argument when there are none
_owner = None  # the process that started numba's threads
_lock = threading.Lock()


def _start() -> None:
    """Compile (or load) the float32 kernel and start numba's threads, waiting passively.

    numba's OpenMP runtime is not torch's (another libgomp). Left at its default, each pool's idle threads spin
    for a while after every parallel region and hold the cores that the other pool's threads wait for: steps of
    tens of ms on 2 cores. The wait policy is read once, when the pool starts (the call below); one the user set
    is kept."""
    global _owner
    with _lock:
        if _owner is not None:
            return
        own = "OMP_WAIT_POLICY" not in os.environ
        if own:
            os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
        try:
            _draw(np.zeros((1, 1), dtype=np.float32), _NO_IDS, False, np.zeros(1, dtype=np.uint64),
                  np.zeros(1, dtype=np.uint64), 1, np.empty(1, dtype=np.int64))
        finally:
            if own:
                del os.environ["OMP_WAIT_POLICY"]
        _owner = os.getpid()


_MIN_CHUNK = 8192  # tokens per task at least: below it a thread's wake-up outweighs its share of the work
_SERIAL = 1 << 15  # below this many tokens the calling thread does it all (no wake-up at all)


def gumbel_argmax(logits: torch.Tensor, seed: torch.Tensor, position: torch.Tensor, ids: torch.Tensor | None,
                  stream: int = 0) -> torch.Tensor:
    """(B,) int64: rng.gumbel_argmax(logits, seed, position, ids, stream) in one compiled pass per row (two for
    rows of huge logits), on torch's number of threads. logits (B, K) on the CPU, any float dtype (float32 and
    float64 read as they are, others promoted exactly); ids (B, K) integer token ids or None (id = position)."""
    if _owner != os.getpid():
        if _owner is not None:  # a child forked after the threads started: GNU OpenMP's pool does not survive a
            return rng.gumbel_argmax(logits, seed, position, ids, stream)  # fork (numba ends the process)
        _start()
    batch, width = logits.shape
    out = np.empty(batch, dtype=np.int64)
    if batch == 0:
        return torch.from_numpy(out)
    if logits.dtype not in (torch.float32, torch.float64):
        logits = logits.float()
    x = logits.detach().contiguous().numpy()
    idn = _NO_IDS if ids is None else ids.to(torch.int64).contiguous().numpy()
    k1, k2 = rng.row_keys(seed, position, stream)
    threads = 1 if logits.numel() < _SERIAL else min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS)
    numba.set_num_threads(threads)
    chunks = max(1, min((2 * threads + batch - 1) // batch, width // _MIN_CHUNK))  # B = 1 too: every thread busy
    _draw(x, idn, ids is not None, k1.numpy().view(np.uint64), k2.numpy().view(np.uint64), chunks, out)
    return torch.from_numpy(out)
