"""The `mps` backend: the sampling primitives on Apple-silicon GPUs, in torch ops that PyTorch's MPS backend runs.

Each primitive, the ops it uses, and their MPS status (checked against PyTorch's own sources and issue tracker):

    primitive   ops                                  on MPS
    topk        torch.topk(largest, sorted)          native. torch 1.12-1.13: k <= 16 only (pytorch#78915); torch
                                                     >= 2.0: any k on macOS >= 13 (pytorch#94639; on macOS 12 torch
                                                     itself runs k > 16 on the CPU and warns); k = 0 crashed before
                                                     2.0 (#91878)
    sort_desc   .contiguous(), torch.sort(stable)    native (sort_stable_out_mps). `.contiguous()` first: MPS sort has
                                                     read strided inputs as if contiguous (pytorch#175187)
    gumbel      rng.gumbel: int64 & ^ >> * +, float64 CPU FALLBACK: the contract's noise is float64, a dtype MPS
                conversion, log                      does not have; computed on the CPU and returned there
    uniform     rng.uniform: as gumbel, without log  CPU FALLBACK, as gumbel
    isin        == broadcast, any                    native in every torch 2.x; torch.isin itself is native only from
    (helper)                                         torch 2.4 (pytorch#124896) and wrong on macOS 13 (#154010), so
                                                     this is the "mps-friendly isin" of transformers (#33099)

Which ops run on the CPU is the declared table `CPU_FALLBACKS`, never a try/except that guesses: each warns once per
process, naming the op and why. Equivalence to the `cpu` reference is bitwise: top-k values and the stable sort's
values and permutation are selections (no arithmetic), the noise is the reference's own code on the CPU. As with the
cpu backend's chunked top-k, which of equal logits at the k-th place top-k returns is unspecified.
"""

from __future__ import annotations

import platform
import sys
import warnings
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

import torch

from samplechain import Backend, hookimpl, rng

__all__ = ["CPU_FALLBACKS", "Fallback", "MpsBackend", "MpsFallbackWarning", "mps_unavailable_reason"]

_MIN_MACOS = (12, 3)  # the first macOS with the MPS framework torch needs


class MpsFallbackWarning(UserWarning):
    """An op of the mps backend ran on the CPU (see CPU_FALLBACKS)."""


class Fallback(NamedTuple):
    reason: str
    keep_on_cpu: bool  # the result's dtype has no MPS counterpart, so it cannot move back


_NO_FLOAT64 = "its result is float64 (the Backend contract's noise dtype), and MPS has no float64"
# The declared table: the primitives that run on the CPU under this backend, and why. Tests check it.
CPU_FALLBACKS: Mapping[str, Fallback] = MappingProxyType(
    {
        "gumbel": Fallback(_NO_FLOAT64, keep_on_cpu=True),
        "uniform": Fallback(_NO_FLOAT64, keep_on_cpu=True),
    }
)

_warned: set[str] = set()  # ops that have warned in this process


def _macos_version() -> tuple[int, ...]:
    release = platform.mac_ver()[0]
    return tuple(int(p) for p in release.split(".") if p.isdigit())


def mps_unavailable_reason() -> str:
    """Why torch cannot use an MPS device here, or "" when it can: the platform, the torch build, the macOS version."""
    if torch.backends.mps.is_available():
        return ""
    if sys.platform != "darwin":
        return f"MPS needs macOS on an Apple-silicon (or AMD-GPU) Mac, this is {platform.system() or sys.platform}"
    if not torch.backends.mps.is_built():
        return f"this torch ({torch.__version__}) was built without MPS; install the macOS arm64 wheel of torch"
    version = _macos_version()
    if version and version < _MIN_MACOS:
        return (
            f"macOS {'.'.join(map(str, version))} is older than {'.'.join(map(str, _MIN_MACOS))}, the first "
            f"with MPS; upgrade macOS"
        )
    return "torch finds no MPS device (no Metal GPU, or a virtual machine without GPU access)"


class MpsBackend(Backend):
    """The primitives on torch's MPS device; bitwise equal to the cpu reference (noise is computed on the CPU)."""

    name = "mps"
    device_type = "mps"
    equivalence = "bitwise"
    summary = "Apple-silicon GPUs through torch's MPS device; noise falls back to the CPU (no float64 on MPS)"

    def __init__(self, device: str | torch.device = "mps") -> None:
        # The device results of CPU fallbacks move back to; tests pass "cpu" to run this logic without a Mac.
        self.device = torch.device(device)

    @classmethod
    def is_available(cls) -> bool:
        return torch.backends.mps.is_available()

    @classmethod
    def unavailable_reason(cls) -> str:
        return mps_unavailable_reason()

    def _fallback(self, op: str, fn: Callable[..., Any], *tensors: torch.Tensor) -> Any:
        """Run `fn` on CPU copies of `tensors` for an op declared in CPU_FALLBACKS; move the result back to this
        backend's device unless the table says its dtype cannot live there. Warns once per op per process."""
        entry = CPU_FALLBACKS[op]  # a KeyError here is a bug: only declared ops may fall back
        if op not in _warned:
            _warned.add(op)
            warnings.warn(
                f"samplechain-mps: {op!r} runs on the CPU, not on the MPS device: {entry.reason}"
                + ("; the result stays on the CPU" if entry.keep_on_cpu else "; the result is copied back")
                + ". This is declared in samplechain_mps.CPU_FALLBACKS and warned once per process.",
                MpsFallbackWarning,
                stacklevel=3,
            )
        out = fn(*(t.cpu() for t in tensors))
        if entry.keep_on_cpu:
            return out
        return tuple(t.to(self.device) for t in out) if isinstance(out, tuple) else out.to(self.device)

    def topk(self, logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        # one partial selection on the device (no chunk trick: it pays on CPU caches, not on a GPU)
        values, index = torch.topk(logits, k, dim=-1, largest=True, sorted=True)
        return values, index

    def sort_desc(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # contiguous: some MPS sorts read strided storage linearly; stable: ties keep ascending candidate order
        values, index = torch.sort(logits.contiguous(), dim=-1, descending=True, stable=True)
        return values, index

    def gumbel(self, seed: torch.Tensor, position: torch.Tensor, ids: torch.Tensor, stream: int) -> torch.Tensor:
        return self._fallback("gumbel", lambda s, p, i: rng.gumbel(s, p, i, stream), seed, position, ids)

    def uniform(self, seed: torch.Tensor, position: torch.Tensor, ids: torch.Tensor, stream: int) -> torch.Tensor:
        return self._fallback("uniform", lambda s, p, i: rng.uniform(s, p, i, stream), seed, position, ids)

    def isin(self, elements: torch.Tensor, test_elements: torch.Tensor) -> torch.Tensor:
        """torch.isin(elements, test_elements) as a broadcast compare: native on MPS in every torch 2.x.

        Costs elements.numel() x test_elements.numel() comparisons, so meant for short id lists (eos, banned ids).
        """
        tests = test_elements.reshape(-1).to(elements.device)
        if tests.numel() == 0:
            return torch.zeros(elements.shape, dtype=torch.bool, device=elements.device)
        return (elements.unsqueeze(-1) == tests).any(dim=-1)


@hookimpl
def register_backends(register):
    register(MpsBackend)
