"""Counter-based randomness: the noise for (seed, stream, position, token id) is a pure function.

A seeded request's draw therefore does not depend on its batch neighbours, its row, the batch size or the
thread count. The hash is 32-bit integer mixing (Wellons' "lowbias32") carried in int64 tensors. Every
multiplication is split into 16-bit halves so no intermediate exceeds 2**49: signed int64 overflow never happens,
so the result is bit-identical on every torch device and compiler.

Layout of a draw:
    row_key = H(H(H(seed_lo ^ H(seed_hi ^ STREAM_SALT*stream)) ^ position))   # per row, (B,)
    bits    = H(H(token_id + row_key) ^ row_key2)                              # per candidate, (B, K)
    u       = (bits + 0.5) / 2**32       in (0, 1), float64, never 0 or 1
"""

from __future__ import annotations

import os

import numpy as np
import torch

__all__ = [
    "mix32",
    "row_keys",
    "uniform",
    "gumbel",
    "gumbel_argmax",
    "exponential",
    "fresh_seed",
    "SEED_MAX",
    "device_row_keys",
    "device_uniform",
    "device_shifted",
    "device_gumbel_argmax",
]

_M32 = 0xFFFFFFFF
SEED_MAX = 2**63 - 1


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    # (x * c) mod 2**32 for x in [0, 2**32): split c into 16-bit halves so every product stays below 2**49.
    lo, hi = c & 0xFFFF, c >> 16
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & _M32


def mix32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 finaliser on int64 tensors holding values in [0, 2**32)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


_NP_M32 = np.uint64(_M32)
_NP_SMALL = 1 << 16  # below this many elements, numpy's per-op cost (~1 us) beats torch's (~5 us)


def _mix32_np(x: np.ndarray) -> np.ndarray:
    """mix32 on uint64 arrays of values < 2**32: the products stay below 2**64, so uint64 wrapping never occurs
    and the result equals the int64 torch version bit for bit."""
    x = x ^ (x >> np.uint64(16))
    x = (x * np.uint64(0x7FEB352D)) & _NP_M32
    x = x ^ (x >> np.uint64(15))
    x = (x * np.uint64(0x846CA68B)) & _NP_M32
    return x ^ (x >> np.uint64(16))


def _mix32_int(x: int) -> int:
    """mix32 on one Python int in [0, 2**32): a handful of rows costs less this way than in numpy's per-call cost."""
    x ^= x >> 16
    x = (x * 0x7FEB352D) & _M32
    x ^= x >> 15
    x = (x * 0x846CA68B) & _M32
    return x ^ (x >> 16)


def _row_key_int(seed: int, position: int, stream: int) -> tuple[int, int]:
    k = _mix32_int((seed >> 32) & _M32 ^ ((stream * 0x9E3779B9) & _M32))
    k = _mix32_int((seed & _M32) ^ k)
    k = _mix32_int(k ^ (position & _M32))
    k = _mix32_int(k ^ ((position >> 32) & _M32))
    return k, _mix32_int(k ^ 0x5BD1E995)


_FEW_ROWS = 8  # up to this many rows, the row keys are Python ints


def _row_keys_np(seed: np.ndarray, position: np.ndarray, stream: int) -> tuple[np.ndarray, np.ndarray]:
    if seed.size <= _FEW_ROWS:
        keys = [_row_key_int(int(a), int(b), stream) for a, b in zip(seed.tolist(), position.tolist())]
        return (
            np.array([k for k, _ in keys], dtype=np.uint64).reshape(seed.shape),
            np.array([k for _, k in keys], dtype=np.uint64).reshape(seed.shape),
        )
    seed = seed.astype(np.uint64)
    position = position.astype(np.uint64)
    k = _mix32_np((seed >> np.uint64(32)) & _NP_M32 ^ np.uint64((stream * 0x9E3779B9) & _M32))
    k = _mix32_np((seed & _NP_M32) ^ k)
    k = _mix32_np(k ^ (position & _NP_M32))
    k = _mix32_np(k ^ ((position >> np.uint64(32)) & _NP_M32))
    return k, _mix32_np(k ^ np.uint64(0x5BD1E995))


def row_keys(seed: torch.Tensor, position: torch.Tensor, stream: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two 32-bit keys per row from seed (B,) int64 >= 0, position (B,) int64 and a stream number."""
    if seed.device.type == "cpu" and position.device.type == "cpu" and seed.numel() <= _NP_SMALL:
        k1, k2 = _row_keys_np(seed.numpy(), position.numpy(), stream)
        return torch.from_numpy(k1.astype(np.int64)), torch.from_numpy(k2.astype(np.int64))
    return device_row_keys(seed, position, stream)


def device_row_keys(seed: torch.Tensor, position: torch.Tensor, stream: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`row_keys` in torch ops only, on any device: what a GPU runs (no numpy, no host read, capturable)."""
    seed_lo = seed & _M32
    seed_hi = (seed >> 32) & _M32
    k = mix32(seed_hi ^ ((stream * 0x9E3779B9) & _M32))
    k = mix32(seed_lo ^ k)
    k = mix32(k ^ (position & _M32))
    k = mix32(k ^ ((position >> 32) & _M32))
    return k, mix32(k ^ 0x5BD1E995)


def _as_i32(x: torch.Tensor) -> torch.Tensor:
    """int64 values in [0, 2**32) as int32 with the same 32 bits (two's complement)."""
    return (x - ((x >> 31) << 32)).to(torch.int32)


_C1_I32, _C2_I32 = 0x7FEB352D, 0x846CA68B - (1 << 32)


def _mix32_i32(x: torch.Tensor) -> torch.Tensor:
    """mix32 on int32 tensors holding the 32 bits: multiplication wraps modulo 2**32 (as the vectorised CPU and the
    CUDA integer multiplies do) and the right shifts are made logical by masking the sign extension. Bit-identical
    to the int64 version (tests/test_rng.py), ~4x faster: half the bytes and a third of the operations."""
    x = x ^ ((x >> 16) & 0xFFFF)
    x = x * _C1_I32
    x = x ^ ((x >> 15) & 0x1FFFF)
    x = x * _C2_I32
    return x ^ ((x >> 16) & 0xFFFF)


def uniform(seed: torch.Tensor, position: torch.Tensor, ids: torch.Tensor, stream: int = 0) -> torch.Tensor:
    """U(0, 1) noise, float64 (B, K), for token ids (B, K) of rows with seed/position (B,)."""
    if (
        ids.device.type == "cpu"
        and seed.device.type == "cpu"
        and position.device.type == "cpu"
        and ids.numel() <= _NP_SMALL
    ):
        k1, k2 = _row_keys_np(seed.numpy(), position.numpy(), stream)
        x = (ids.numpy().astype(np.uint64) + k1[:, None]) & _NP_M32
        bits = _mix32_np(_mix32_np(x) ^ k2[:, None])
        return torch.from_numpy((bits.astype(np.float64) + 0.5) * (1.0 / 4294967296.0))
    return device_uniform(seed, position, ids, stream)


def device_uniform(seed: torch.Tensor, position: torch.Tensor, ids: torch.Tensor, stream: int = 0) -> torch.Tensor:
    """`uniform` in torch ops only, on any device (the same bits as the numpy path): what a GPU runs."""
    k1, k2 = device_row_keys(seed, position, stream)
    # token ids are < 2**31, so their int32 sum with the key wraps exactly as the int64 sum modulo 2**32
    bits = _mix32_i32(_mix32_i32(ids.to(torch.int32) + _as_i32(k1)[:, None]) ^ _as_i32(k2)[:, None])
    # flipping the sign bit gives s = bits - 2**31 as a signed int32; (s + 2**31 + 0.5) / 2**32, computed as
    # 2**-32 * s + (0.5 + 2**-33), is exact in float64 (33 significant bits): the same u as the int64 path
    signed = (bits ^ torch.iinfo(torch.int32).min).to(torch.float64)
    half = torch.full((), 0.5 + 0.5 / 4294967296.0, dtype=torch.float64, device=signed.device)
    return torch.add(half, signed, alpha=1.0 / 4294967296.0)


def exponential(seed: torch.Tensor, position: torch.Tensor, ids: torch.Tensor, stream: int = 0) -> torch.Tensor:
    """Exp(1) noise, float64 (B, K): the exponential race picks argmax(p / E)."""
    return -torch.log(uniform(seed, position, ids, stream))


def gumbel(seed: torch.Tensor, position: torch.Tensor, ids: torch.Tensor, stream: int = 0) -> torch.Tensor:
    """Gumbel(0, 1) noise, float64 (B, K): argmax(logits + G) is a draw from softmax(logits)."""
    return torch.log(uniform(seed, position, ids, stream)).neg_().log_().neg_()  # -log(-log u), in place


def _mix32_i32_(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """`_mix32_i32` in place on x, with t (same shape, int32) as the only temporary: the same bits, no allocation."""
    for shift, mask, mult in ((16, 0xFFFF, _C1_I32), (15, 0x1FFFF, _C2_I32), (16, 0xFFFF, None)):
        torch.bitwise_right_shift(x, shift, out=t).bitwise_and_(mask)
        x.bitwise_xor_(t)
        if mult is not None:
            x.mul_(mult)
    return x


HUGE = float(2**24)  # beyond this a row's logits are shifted by its maximum before the noise is added


def shifted(logits: torch.Tensor) -> torch.Tensor:
    """The logits the Gumbel noise is added to: unchanged (float32, promoted exactly) in every row whose largest
    finite logit is within +-2**24, else that row minus its maximum, in float64. float64 keeps G to ~1e-9 next to
    logits up to 2**24; next to 1e30 (ulp ~1e14) G would vanish and the first maximum would always win. The choice
    is per row, so a row draws the same in any batch."""
    top = logits.amax(dim=-1)
    huge = top.abs() > HUGE
    if not bool((huge & torch.isfinite(top)).any()):
        return logits
    return device_shifted(logits, top)


def device_shifted(logits: torch.Tensor, top: torch.Tensor | None = None) -> torch.Tensor:
    """`shifted` without its host read: always float64, every row minus its shift (0.0 in all but the huge rows),
    the same values (float32 to float64 is exact, and x - 0.0 is x)."""
    top = logits.amax(dim=-1) if top is None else top
    huge = (top.abs() > HUGE) & torch.isfinite(top)
    return logits.double() - torch.where(huge, top, torch.zeros_like(top)).double()[:, None]


def gumbel_argmax(
    logits: torch.Tensor,
    seed: torch.Tensor,
    position: torch.Tensor,
    ids: torch.Tensor | None,
    stream: int = 0,
    work: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """argmax(shifted(logits) + gumbel(seed, position, ids, stream)) per row (B,), the same index bit for bit
    (first index on ties), computed in place on three (B, K) workspaces (int32, int32, float64) instead of a dozen
    fresh temporaries. ids None means ids[b, j] == j. `work` (contents undefined) may be given to reuse buffers.

    It forms the same float64 u, then M = log(-log u) and M - x (= -(x + G) exactly: IEEE negation and subtraction
    are exact mirrors), whose first argmin is the first argmax of x + G. Rows with huge logits are shifted by
    their maximum first (`shifted`)."""
    B, K = logits.shape
    base = shifted(logits)
    if logits.device.type != "cpu" or B * K <= _NP_SMALL:
        full = torch.arange(K, device=logits.device).expand(B, -1) if ids is None else ids
        return torch.log(uniform(seed, position, full, stream)).neg_().log_().sub_(base).argmin(dim=-1)
    x, t, g = (
        work
        if work is not None
        else (
            torch.empty(B, K, dtype=torch.int32),
            torch.empty(B, K, dtype=torch.int32),
            torch.empty(B, K, dtype=torch.float64),
        )
    )
    k1, k2 = row_keys(seed, position, stream)
    if ids is None:
        torch.add(torch.arange(K, dtype=torch.int32)[None, :], _as_i32(k1)[:, None], out=x)
    else:
        x.copy_(ids).add_(_as_i32(k1)[:, None])
    _mix32_i32_(_mix32_i32_(x, t).bitwise_xor_(_as_i32(k2)[:, None]), t)
    x.bitwise_xor_(torch.iinfo(torch.int32).min)
    g.copy_(x).mul_(1.0 / 4294967296.0).add_(0.5 + 0.5 / 4294967296.0)  # exact, as in uniform()
    return g.log_().neg_().log_().sub_(base).argmin(dim=-1)


def device_gumbel_argmax(
    logits: torch.Tensor, seed: torch.Tensor, position: torch.Tensor, ids: torch.Tensor | None, stream: int = 0
) -> torch.Tensor:
    """`gumbel_argmax` in torch ops only, without a host read (what a GPU runs, capturable in a CUDA graph): the
    same index bit for bit."""
    B, K = logits.shape
    full = torch.arange(K, device=logits.device).expand(B, -1) if ids is None else ids
    noise = torch.log(device_uniform(seed, position, full, stream)).neg_().log_()
    return noise.sub_(device_shifted(logits)).argmin(dim=-1)


def fresh_seed() -> int:
    """A seed for an unseeded request, from the OS entropy pool (not from torch's global generator)."""
    return int.from_bytes(os.urandom(8), "little") & SEED_MAX
