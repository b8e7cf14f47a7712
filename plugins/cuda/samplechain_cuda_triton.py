"""The shared part of the cuda backend's Triton kernels (a leaf: it imports no other module of the plugin): whether
and where the kernels can run, the launch helpers, and the `@triton.jit` helpers every kernel calls (rng's counter
hash and noise, a row's block load with its order keys, one pass of the Gumbel-max draw).

Importable without triton: `kernels_unavailable_reason()` then says why the kernels cannot run. The kernels run on
CUDA tensors, or on CPU tensors under triton's interpreter (TRITON_INTERPRET=1 set before this module is imported:
how CI tests them without a GPU).
"""

from __future__ import annotations

import struct
from typing import Any

import torch

try:  # optional: the backend works without it (torch ops); pip install 'samplechain-cuda[triton]'
    import triton
    import triton.language as tl
except ImportError as _exc:  # pragma: no cover - depends on the environment
    triton = tl = None
    _IMPORT_ERROR = f"triton is not installed ({_exc}); pip install 'samplechain-cuda[triton]' (or triton>=3.6)"
else:
    _IMPORT_ERROR = ""

HUGE = float(2**24)  # rng.HUGE: rows whose largest finite logit is beyond it are shifted by it
INTERPRETED_BLOCK = 8192  # the interpreter: few large blocks (each operation costs ~50 us); tests lower it


def kernels_unavailable_reason(device: Any = None) -> str:
    """Why the kernels cannot run on `device` (a torch device or its name; None: CUDA), or "" when they can."""
    if triton is None:
        return _IMPORT_ERROR
    kind = torch.device(device).type if device is not None else "cuda"
    if interpreted():
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


def interpreted() -> bool:
    return triton is not None and type(mix32).__name__ == "InterpretedFunction"


def check(t: torch.Tensor) -> None:
    reason = kernels_unavailable_reason(t.device)
    if reason:
        raise RuntimeError(f"samplechain_cuda_kernels: {reason}")


def stream_salt(stream: int) -> int:
    return (int(stream) * 0x9E3779B9) & 0xFFFFFFFF


def block_size(width: int, device_block: int) -> int:
    top = INTERPRETED_BLOCK if interpreted() else device_block
    return max(16, min(top, triton.next_power_of_2(max(width, 1))))


def row_major(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def counter(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """seed / position as the kernels read them: (B,) int64, contiguous, on the logits' device (a no-op when so)."""
    return t.to(device=device, dtype=torch.int64).contiguous()


def f32(value: float) -> float:
    """A Python float rounded to float32, as the chain's parameter columns hold it."""
    return struct.unpack("f", struct.pack("f", value))[0]


def param_arg(value: Any, dtype: torch.dtype, device: torch.device) -> tuple[Any, Any, bool]:
    """(pointer or None, scalar or 0, per row): a tensor parameter is read per row, a Python number is a scalar."""
    if isinstance(value, torch.Tensor):
        return value.to(device=device, dtype=dtype).contiguous(), 0, True
    return None, value, False


# ------------------------------------------------------------------------------------------ shared jit helpers
if triton is not None:

    @triton.jit
    def mix32(x):
        """rng.mix32 (lowbias32) on uint32: the multiplies wrap modulo 2**32, the shifts are logical."""
        x = x ^ (x >> 16)
        x = x * 0x7FEB352D
        x = x ^ (x >> 15)
        x = x * 0x846CA68B
        return x ^ (x >> 16)

    @triton.jit
    def row_keys(seed, pos, salt):
        """rng.row_keys for one row: seed, pos int64 scalars, salt = (stream * 0x9E3779B9) mod 2**32."""
        k = mix32(((seed >> 32) & 0xFFFFFFFF).to(tl.uint32) ^ salt.to(tl.uint32))
        k = mix32((seed & 0xFFFFFFFF).to(tl.uint32) ^ k)
        k = mix32(k ^ (pos & 0xFFFFFFFF).to(tl.uint32))
        k = mix32(k ^ ((pos >> 32) & 0xFFFFFFFF).to(tl.uint32))
        return k, mix32(k ^ 0x5BD1E995)

    @triton.jit
    def uniform64(tok, k1, k2):
        """rng.uniform's u for token ids tok (uint32 block): (bits + 0.5) / 2**32, exact in float64."""
        bits = mix32(mix32(tok + k1) ^ k2)
        return (bits.to(tl.float64) + 0.5) * 2.3283064365386963e-10  # 2**-32: exact in float32 and float64

    @triton.jit
    def unkey(k):
        """The float32 value of an order key (scalar)."""
        k32 = k.to(tl.int32)
        return (k32 ^ ((k32 >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)

    @triton.jit
    def param(ptr, value, row, PER_ROW: tl.constexpr, DTYPE: tl.constexpr):
        """A parameter's value for this row: read from its (B,) tensor, or the scalar argument."""
        if PER_ROW:
            return tl.load(ptr + row).to(DTYPE)
        else:
            return (tl.zeros((), DTYPE) + value).to(DTYPE)

    @triton.jit
    def load_row(x_row, offs, valid, t, HAS_T: tl.constexpr, SWAP: tl.constexpr):
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
    def draw_pass(
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
                y, kx, ky = load_row(x_row, offs, valid, t, HAS_T, SWAP)
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
                u = uniform64(tok, k1, k2)
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
