"""Test doubles for plugin authors: a recording backend, a scripted-logits source, and a one-call runner.

    from samplechain.testing import run_chain
    out = run_chain([MySampler], {"samplers": [{"use": "mine", "x": 0.5}, {"use": "greedy"}]}, logits)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from . import rng
from .chain import Chain, SampleOutput
from .contracts import Backend, Candidates, Sampler, Stage, StepContext
from .hookspecs import hookimpl
from .plugins import PluginHost

__all__ = ["RecordingBackend", "ScriptedLogits", "ArgmaxSelector", "host_with", "run_chain"]


class RecordingBackend(Backend):
    """The reference primitives in plain torch, recording every call as (primitive, input shape)."""

    name = "recording"
    device_type = "cpu"
    equivalence = "bitwise"

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[int, ...]]] = []

    def topk(self, logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.calls.append(("topk", tuple(logits.shape)))
        return torch.topk(logits, k, dim=-1)

    def sort_desc(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.calls.append(("sort_desc", tuple(logits.shape)))
        return torch.sort(logits, dim=-1, descending=True, stable=True)

    def gumbel(self, seed: torch.Tensor, position: torch.Tensor, ids: torch.Tensor, stream: int) -> torch.Tensor:
        self.calls.append(("gumbel", tuple(ids.shape)))
        return rng.gumbel(seed, position, ids, stream)

    def uniform(self, seed: torch.Tensor, position: torch.Tensor, ids: torch.Tensor, stream: int) -> torch.Tensor:
        self.calls.append(("uniform", tuple(ids.shape)))
        return rng.uniform(seed, position, ids, stream)


class ArgmaxSelector(Sampler):
    """A selector for tests that must not depend on the greedy plugin being installed."""

    name = "test_argmax"
    stage = Stage.SELECT

    def select(self, cand: Candidates, ctx: StepContext) -> torch.Tensor:
        return cand.logits.argmax(dim=-1)


class ScriptedLogits:
    """Logits from a script instead of a model: step t of request r returns script[r][t] (a 1-D tensor)."""

    def __init__(self, script: Mapping[str, Sequence[torch.Tensor]]) -> None:
        self.script = {rid: list(rows) for rid, rows in script.items()}
        self.steps = {rid: 0 for rid in self.script}

    def __call__(self, request_ids: Sequence[str]) -> torch.Tensor:
        rows = []
        for rid in request_ids:
            rows.append(self.script[rid][self.steps[rid]])
            self.steps[rid] += 1
        return torch.stack(rows)


def host_with(*classes: type, backend: type[Backend] = RecordingBackend) -> PluginHost:
    """A plugin host with the installed plugins plus `classes` (samplers, criteria, backends) registered
    in-process, and the test backend and ArgmaxSelector."""
    host = PluginHost(use_env=False)

    class _Plugin:
        @hookimpl
        def register_samplers(self, register: Any) -> None:
            register(ArgmaxSelector)
            for cls in classes:
                if issubclass(cls, Sampler):
                    register(cls)

        @hookimpl
        def register_backends(self, register: Any) -> None:
            register(backend)

    host.register_plugin(_Plugin(), name="samplechain-testing")
    return host


def run_chain(
    classes: Sequence[type],
    config: Mapping[str, Any],
    logits: torch.Tensor,
    params: Sequence[Mapping[str, Any]] | None = None,
) -> SampleOutput:
    """One step of `config` over `logits` with `classes` registered; params: one dict per row (optional)."""
    host = host_with(*classes)
    chain = Chain.load({"backend": "recording", **config}, host=host)
    store = chain.new_store()
    ids = [f"row{i}" for i in range(logits.shape[0])]
    for rid, row in zip(ids, params or [{}] * len(ids)):
        store.add(rid, row)
    return chain.sample(logits, store, ids, return_scores=True)
