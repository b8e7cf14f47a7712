"""The cuda backend's Gumbel-max draw as Triton kernels, one program per row reading the row in blocks, with no
(B, V) temporaries and no host synchronisation: `gumbel_argmax` (rng.gumbel_argmax in one pass) and `uniform`
(rng.uniform's noise, for tests of the hash). What each computes, exactly, is samplechain_cuda_kernels' docstring.
"""

from __future__ import annotations

import torch

from samplechain_cuda_triton import block_size, check, counter, row_major, stream_salt, triton

__all__ = ["gumbel_argmax", "gumbel_argmax_kernel", "uniform", "uniform_kernel"]

if triton is not None:
    from samplechain_cuda_triton import draw_pass, row_keys, tl, uniform64

    @triton.jit(do_not_specialize=["stride_x", "stride_ids", "V", "salt"])
    def gumbel_argmax_kernel(
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
        k1, k2 = row_keys(tl.load(seed_ptr + row), tl.load(pos_ptr + row), salt)
        zero = tl.full((), 0.0, tl.float64)
        _, best, nan_i, top, _ = draw_pass(
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
            _, best, nan_i, top, _ = draw_pass(
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
    def uniform_kernel(ids_ptr, stride_ids, K, seed_ptr, pos_ptr, salt, out_ptr, stride_out, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        k1, k2 = row_keys(tl.load(seed_ptr + row), tl.load(pos_ptr + row), salt)
        for start in range(0, K, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            valid = offs < K
            tok = tl.load(ids_ptr + row * stride_ids + offs, mask=valid, other=0).to(tl.uint32)
            tl.store(out_ptr + row * stride_out + offs, uniform64(tok, k1, k2), mask=valid)
else:  # pragma: no cover - without triton the functions below raise before launching
    gumbel_argmax_kernel = uniform_kernel = None


def gumbel_argmax(
    logits: torch.Tensor, seed: torch.Tensor, position: torch.Tensor, stream: int, ids: torch.Tensor | None = None
) -> torch.Tensor:
    """(B,) int64: rng.gumbel_argmax(logits, seed, position, ids, stream), the position of each row's draw (first
    index on ties). logits (B, K) float (any float dtype: promoted exactly), seed / position (B,) int64, ids (B, K)
    int64 token ids (None: position = id). One pass over each row (two for rows of huge logits)."""
    check(logits)
    batch, width = logits.shape
    out = torch.empty(batch, dtype=torch.int64, device=logits.device)
    if batch == 0:
        return out
    logits = row_major(logits)
    if ids is not None:
        ids = row_major(ids)
    seed, position = counter(seed, logits.device), counter(position, logits.device)
    gumbel_argmax_kernel[(batch,)](
        logits,
        logits.stride(0),
        ids if ids is not None else logits,
        ids.stride(0) if ids is not None else 0,
        width,
        seed,
        position,
        stream_salt(stream),
        out,
        HAS_IDS=ids is not None,
        BLOCK=block_size(width, 1024),
        num_warps=4,
    )
    return out


def uniform(seed: torch.Tensor, position: torch.Tensor, ids: torch.Tensor, stream: int) -> torch.Tensor:
    """(B, K) float64: rng.uniform(seed, position, ids, stream), bit for bit."""
    check(ids)
    batch, width = ids.shape
    out = torch.empty(batch, width, dtype=torch.float64, device=ids.device)
    if batch == 0 or width == 0:
        return out
    ids = row_major(ids)
    seed, position = counter(seed, ids.device), counter(position, ids.device)
    uniform_kernel[(batch,)](
        ids,
        ids.stride(0),
        width,
        seed,
        position,
        stream_salt(stream),
        out,
        out.stride(0),
        BLOCK=block_size(width, 1024),
    )
    return out
