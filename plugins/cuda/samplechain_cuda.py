"""The `cuda` backend: the sampling primitives in torch CUDA ops, with no host synchronisation inside.

No primitive reads a tensor's value on the host (.item(), .tolist(), bool(tensor)) or makes an output whose shape
depends on data (nonzero, masked_select, unique), so a step's primitives queue on the GPU without waiting and can be
captured in a CUDA graph.

    primitive   ops                                     equivalence to the cpu reference
    topk        torch.topk (radix select on the GPU)    bitwise values; which of equal logits at the k-th place is
                                                        returned is unspecified (as with the cpu chunked top-k)
    sort_desc   torch.sort(stable=True)                 bitwise values and permutation
    uniform     rng.uniform on the device: row keys     bitwise: the row keys' int64 multiplies are split into
                by the int64 hash, per-candidate bits   16-bit halves (no overflow), the int32 multiplies wrap
                by the int32 hash; exact float64        modulo 2**32 on CUDA as on the CPU, and the float64
                conversion                              conversion and scaling are exact
    gumbel      rng.gumbel: -log(-log(uniform))         allclose: CUDA's float64 log and the CPU's are each within
                                                        1 ulp, not always the same ulp (differences ~1e-15)

With triton installed (pip install 'samplechain-cuda[triton]') the backend runs Triton kernels
(samplechain_cuda_kernels) on CUDA tensors: the Gumbel-max draw in one pass, and `kernel(FUSED_SAMPLE)`, the chain's
tail temperature / top_k / top_p / min_p -> dist in one launch (pivot searches instead of a sort; the executor
dispatches it, `samplechain.FusedPart`): the cpu backend's kept sets and seeded tokens, batch-invariant.
SAMPLECHAIN_CUDA_TRITON=0 turns them off (the torch ops above run). FlashInfer's sampling kernels are not used: they
draw with their own Philox stream, neither seeded per request nor batch-invariant (benchmarks/bench_gpu.py compares
against them).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import torch

from samplechain import FUSED_SAMPLE, Backend, BackendError, FusedPart, hookimpl, rng
from samplechain.contracts import FusedDraw
from samplechain.params import env_switch

__all__ = ["CudaBackend", "ENV_TRITON", "cuda_unavailable_reason"]

ENV_TRITON = "SAMPLECHAIN_CUDA_TRITON"  # 0: the torch ops instead of the Triton kernels (samplechain_cuda_kernels)
_CUTS = ("top_k", "top_p", "min_p")  # the fused kernel's truncation order


def cuda_unavailable_reason() -> str:
    """Why torch cannot use a CUDA device here, or "" when it can."""
    if torch.cuda.is_available():
        return ""
    if torch.version.cuda is None:
        return f"this torch ({torch.__version__}) was built without CUDA; install a CUDA build of torch"
    return (
        f"torch {torch.__version__} (CUDA {torch.version.cuda}) finds no usable CUDA device: no NVIDIA GPU, a "
        f"driver older than CUDA {torch.version.cuda} needs, or CUDA_VISIBLE_DEVICES hides them"
    )


class CudaBackend(Backend):
    """The primitives in torch CUDA ops, without host synchronisation (CUDA-graph friendly)."""

    name = "cuda"
    device_type = "cuda"
    equivalence = "allclose"  # bitwise but for gumbel's float64 log (see the module docstring)
    sync_free = True  # the executor defers its checks to device flags; samplers take their sync-free paths
    summary = "NVIDIA GPUs: torch CUDA ops without host synchronisation, fused Triton sampling kernels"

    def __init__(self, device: str | torch.device = "cuda", *, triton: bool | None = None) -> None:
        # device: where this backend's tensors live; tests pass "cpu" to run this logic without a GPU.
        # triton: None runs the Triton kernels on CUDA tensors (unless SAMPLECHAIN_CUDA_TRITON=0); True also on CPU
        # tensors under triton's interpreter (TRITON_INTERPRET=1: how the tests run them without a GPU); False never.
        self.device = torch.device(device)
        self._triton = _triton_kernels(self.device, triton)
        self._kernels: dict[str, Callable[..., Any]] = {}
        if self._triton is not None:
            self._kernels[FUSED_SAMPLE] = functools.partial(_fused_sample, self._triton)

    @classmethod
    def is_available(cls) -> bool:
        return torch.cuda.is_available()

    @classmethod
    def unavailable_reason(cls) -> str:
        return cuda_unavailable_reason()

    def kernel(self, name: str) -> Callable[..., Any] | None:
        return self._kernels.get(name)

    def topk(self, logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        # one radix select on the GPU; the cpu backend's chunk trick pays for CPU caches, not here
        values, index = torch.topk(logits, k, dim=-1, largest=True, sorted=True)
        return values, index

    def sort_desc(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # stable: equal logits keep ascending candidate order, so the permutation equals the cpu backend's
        values, index = torch.sort(logits, dim=-1, descending=True, stable=True)
        return values, index

    def gumbel(self, seed: torch.Tensor, position: torch.Tensor, ids: torch.Tensor, stream: int) -> torch.Tensor:
        # the reference hash in its torch ops (int64 row keys, int32 per token), on whatever device the tensors are
        return torch.log(rng.device_uniform(seed, position, ids, stream)).neg_().log_().neg_()

    def uniform(self, seed: torch.Tensor, position: torch.Tensor, ids: torch.Tensor, stream: int) -> torch.Tensor:
        return rng.device_uniform(seed, position, ids, stream)

    def gumbel_argmax(
        self, logits: torch.Tensor, seed: torch.Tensor, position: torch.Tensor, ids: torch.Tensor | None, stream: int
    ) -> torch.Tensor:
        # no host read: on a GPU one Triton kernel (hash, noise and running argmax in one pass over each row, the
        # same token: samplechain_cuda_kernels); else torch ops, huge rows shifted on the device (rng.device_shifted)
        if self._triton is not None:
            return self._triton.gumbel_argmax(logits, seed, position, stream, ids)
        return rng.device_gumbel_argmax(logits, seed, position, ids, stream)


def _triton_kernels(device: torch.device, wanted: bool | None) -> ModuleType | None:
    """samplechain_cuda_kernels where its kernels run for this backend, else None (the torch ops): on a CUDA device
    with triton installed, unless SAMPLECHAIN_CUDA_TRITON=0 or wanted is False; on CPU tensors only when wanted is
    True (under triton's interpreter: tests), which raises when they cannot run."""
    switch = env_switch(
        ENV_TRITON, default=True, on="use the Triton kernels on a GPU, the default", off="torch ops", error=BackendError
    )
    if wanted is False or not switch or (device.type != "cuda" and not wanted):
        return None
    import samplechain_cuda_kernels as kernels

    reason = kernels.kernels_unavailable_reason(device)
    if reason and wanted:
        raise BackendError(f"CudaBackend(triton=True) on {device}: {reason}")
    return None if reason else kernels


def _fused_sample(
    kernels: ModuleType,
    logits: torch.Tensor,
    parts: Sequence[FusedPart],
    select: FusedPart,
    positions: torch.Tensor,
    stream: int,
) -> FusedDraw | None:
    """The executor's FUSED_SAMPLE: the chain's tail (temperature first or last, then top_k, top_p, min_p in that
    order, each at most once, at least one) and dist in one kernel (samplechain_cuda_kernels.sample); None for any
    other order."""
    kinds = [part.kind for part in parts]
    cuts = [kind for kind in kinds if kind != "temperature"]
    if select.kind != "dist" or not cuts or cuts != sorted(set(cuts), key=_CUTS.index) or len(kinds) - len(cuts) > 1:
        return None  # no truncation: temperature and the draw run as they are (already one pass each)
    first = last = None
    if "temperature" in kinds:
        where = kinds.index("temperature")
        if 0 < where < len(kinds) - 1:
            return None
        first, last = (parts[where].value, None) if where == 0 else (None, parts[where].value)
    by_kind = {part.kind: part for part in parts}
    keeps = tuple(by_kind[kind].min_keep if kind in by_kind else 1 for kind in _CUTS)
    off = {"top_k": 0, "top_p": 1.0, "min_p": 0.0}
    values = {kind: by_kind[kind].value if kind in by_kind else off[kind] for kind in _CUTS}
    return FusedDraw(
        *kernels.sample(
            logits, select.value, positions, stream, temperature=first, temperature_last=last, min_keep=keeps, **values
        )
    )


@hookimpl
def register_backends(register):
    register(CudaBackend)
