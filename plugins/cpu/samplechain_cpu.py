"""The `cpu` backend: the reference implementation of the sampling primitives, in plain torch ops."""

from __future__ import annotations

import torch

from samplechain import Backend, hookimpl, rng


class CpuBackend(Backend):
    """Reference backend. Other backends state their equivalence to this one."""

    name = "cpu"
    device_type = "cpu"
    equivalence = "reference"
    summary = "reference implementation on the CPU"

    def topk(self, logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        # a partial selection: O(V) per row, not a sort of the vocabulary
        return torch.topk(logits, k, dim=-1, largest=True, sorted=True)

    def sort_desc(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # stable: equal logits keep ascending candidate order, so ties resolve to the lower token id
        return torch.sort(logits, dim=-1, descending=True, stable=True)

    def gumbel(self, seed: torch.Tensor, position: torch.Tensor, ids: torch.Tensor, stream: int) -> torch.Tensor:
        return rng.gumbel(seed, position, ids, stream)

    def uniform(self, seed: torch.Tensor, position: torch.Tensor, ids: torch.Tensor, stream: int) -> torch.Tensor:
        return rng.uniform(seed, position, ids, stream)


@hookimpl
def register_backends(register):
    register(CpuBackend)
