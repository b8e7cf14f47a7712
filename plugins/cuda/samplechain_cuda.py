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

Optional FlashInfer fast path (statistical equivalence, opt-in): with `flashinfer` installed and
SAMPLECHAIN_CUDA_FLASHINFER=1 (or CudaBackend(flashinfer=True)), `backend.kernel(FLASHINFER_TOP_K_TOP_P)` returns
FlashInfer's fused top-k/top-p sampling from logits. FlashInfer draws with its own Philox RNG, not our counter-based
noise, so seeded tokens are no longer batch-invariant nor equal to the cpu backend's; hence never on by default.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

from samplechain import Backend, BackendError, hookimpl, rng

__all__ = ["CudaBackend", "ENV_FLASHINFER", "ENV_TRITON", "FLASHINFER_TOP_K_TOP_P", "cuda_unavailable_reason"]

ENV_FLASHINFER = "SAMPLECHAIN_CUDA_FLASHINFER"
ENV_TRITON = "SAMPLECHAIN_CUDA_TRITON"  # 0: the torch ops instead of the Triton kernels (samplechain_cuda_kernels)
FLASHINFER_TOP_K_TOP_P = "flashinfer.top_k_top_p_sampling"  # the kernel name samplers ask for
_ON, _OFF = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")


def cuda_unavailable_reason() -> str:
    """Why torch cannot use a CUDA device here, or "" when it can."""
    if torch.cuda.is_available():
        return ""
    if torch.version.cuda is None:
        return f"this torch ({torch.__version__}) was built without CUDA; install a CUDA build of torch"
    return (f"torch {torch.__version__} (CUDA {torch.version.cuda}) finds no usable CUDA device: no NVIDIA GPU, a "
            f"driver older than CUDA {torch.version.cuda} needs, or CUDA_VISIBLE_DEVICES hides them")


def _import_flashinfer() -> ModuleType | None:
    try:
        import flashinfer.sampling as sampling  # optional: only for the opt-in fast path
    except ImportError:
        return None
    return sampling


def _opted_in(flag: bool | None) -> bool:
    if flag is not None:
        return flag
    value = os.environ.get(ENV_FLASHINFER, "").strip().lower()
    if value not in _ON + _OFF:
        raise BackendError(f"{ENV_FLASHINFER}={os.environ[ENV_FLASHINFER]!r}: expected 1 (use FlashInfer's "
                           f"sampling kernel) or 0 (do not); unset means 0")
    return value in _ON


class CudaBackend(Backend):
    """The primitives in torch CUDA ops, without host synchronisation (CUDA-graph friendly)."""

    name = "cuda"
    device_type = "cuda"
    equivalence = "allclose"  # bitwise but for gumbel's float64 log (see the module docstring)
    sync_free = True  # the executor defers its checks to device flags; samplers take their sync-free paths
    summary = "NVIDIA GPUs: torch CUDA ops without host synchronisation; FlashInfer sampling opt-in"

    def __init__(self, device: str | torch.device = "cuda", *, flashinfer: bool | None = None) -> None:
        # device: where this backend's tensors live; tests pass "cpu" to run this logic without a GPU.
        # flashinfer: expose FlashInfer's fused sampling kernel (None: read SAMPLECHAIN_CUDA_FLASHINFER).
        self.device = torch.device(device)
        self._kernels: dict[str, Callable[..., Any]] = {}
        self._triton = _triton_kernels(self.device)
        if _opted_in(flashinfer):
            sampling = _import_flashinfer()
            if sampling is None:
                raise BackendError(f"FlashInfer sampling was asked for ({ENV_FLASHINFER}=1 or flashinfer=True) but "
                                   f"flashinfer is not installed; pip install 'samplechain-cuda[flashinfer]' or "
                                   f"unset {ENV_FLASHINFER}")
            self._kernels[FLASHINFER_TOP_K_TOP_P] = _flashinfer_top_k_top_p(sampling)

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

    def gumbel_argmax(self, logits: torch.Tensor, seed: torch.Tensor, position: torch.Tensor,
                      ids: torch.Tensor | None, stream: int) -> torch.Tensor:
        # no host read: on a GPU one Triton kernel (hash, noise and running argmax in one pass over each row, the
        # same token: samplechain_cuda_kernels); else torch ops, huge rows shifted on the device (rng.device_shifted)
        if self._triton is not None and logits.is_cuda:
            return self._triton.gumbel_argmax(logits, seed, position, stream, ids)
        return rng.device_gumbel_argmax(logits, seed, position, ids, stream)


def _triton_kernels(device: torch.device) -> ModuleType | None:
    """samplechain_cuda_kernels where its kernels can run on this device (triton installed, a CUDA device) and
    SAMPLECHAIN_CUDA_TRITON is not 0; else None (the torch ops)."""
    value = os.environ.get(ENV_TRITON, "1").strip().lower()
    if value not in _ON + _OFF:
        raise BackendError(f"{ENV_TRITON}={os.environ[ENV_TRITON]!r}: expected 1 (use the Triton kernels on a GPU, "
                           f"the default) or 0 (torch ops)")
    if value in _OFF or device.type != "cuda":
        return None
    import samplechain_cuda_kernels as kernels

    return None if kernels.kernels_unavailable_reason(device) else kernels


def _flashinfer_top_k_top_p(sampling: ModuleType) -> Callable[..., torch.Tensor]:
    def top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                    generator: torch.Generator | None = None) -> torch.Tensor:
        """Token ids (B,) int64 drawn from softmax(logits (B, V) float32) after top-k (B,) int then top-p (B,) float,
        per row; top_k = V and top_p = 1.0 switch a row's filter off. Statistically equivalent to the chain
        top_k -> top_p -> dist, not bitwise: FlashInfer's own Philox RNG (seeded by `generator`) draws."""
        ids = sampling.top_k_top_p_sampling_from_logits(
            logits, top_k.to(torch.int32), top_p.to(torch.float32), filter_apply_order="top_k_first",
            deterministic=True, generator=generator)
        return ids.to(torch.int64)

    return top_k_top_p


@hookimpl
def register_backends(register):
    register(CudaBackend)
