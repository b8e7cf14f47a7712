"""The sampling step captured in a CUDA graph and replayed, for a fixed batch.

A step on a sync-free backend (cuda) never waits for the host and copies nothing from it: the request store keeps
positions, parameters and state on the device, and its checks are device flags. Such a step can be recorded once as
a `torch.cuda.CUDAGraph` and replayed each step, one launch for the dozens of kernels the step queues, saving the
host's time to queue them (the step is host-bound at small batches).

What a replay cannot see: Python decisions taken while the step was recorded (a shared parameter's value, the
batch's bounds, the scalar paths) are baked into the graph. They depend only on the batch composition (its
requests and their parameters), so a `StepGraphs` belongs to one store and one list of request ids, and records a
graph per bucket of input shapes: the logits' (B, V) and dtype, and the width of the token history (rounded up to a
multiple of `HISTORY_BUCKET`, left-padded with -1, the history's own padding). Inputs are copied into the graph's
static buffers, outputs copied out (the next replay overwrites them).

generate() uses it on CUDA for `Chain`s whose step is sync-free, without scores, unconditional logits or a
logits_processor; `SAMPLECHAIN_CUDA_GRAPHS=0` or generate(cuda_graphs=False) turns it off. A capture that fails
falls back to the eager step with a warning. Tested without a GPU by `samplechain.tools.testing.ReplayGraph`, which
replays the recorded aten ops on CPU tensors the way a CUDA graph replays its kernels.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch

from ..errors import ConfigError
from ..params import env_switch
from .chain import Chain, SampleOutput
from .step import Step
from .store import RequestStore

__all__ = ["ENV_GRAPHS", "HISTORY_BUCKET", "StepGraphs", "graphs_unavailable_reason"]

ENV_GRAPHS = "SAMPLECHAIN_CUDA_GRAPHS"
HISTORY_BUCKET = 256  # history widths are rounded up to a multiple of this: one graph per 256 steps, not per step


class Graph(Protocol):
    def capture(self, step: Callable[[], Any]) -> Any:
        """Record step() and return its outputs, valid after the step has run (a CUDA graph replays it once)."""

    def replay(self) -> None:
        """Run the recorded step again, on the same buffers."""


class CudaGraph:
    """torch.cuda.CUDAGraph behind the `Graph` protocol: capture records without running, so the step is then
    replayed once."""

    def __init__(self) -> None:
        self._graph = torch.cuda.CUDAGraph()

    def capture(self, step: Callable[[], Any]) -> Any:
        torch.cuda.synchronize()
        with torch.cuda.graph(self._graph):
            out = step()
        self._graph.replay()
        return out

    def replay(self) -> None:
        self._graph.replay()


def graphs_unavailable_reason(
    chain: Any, device: torch.device, store: RequestStore | None = None, request_ids: Sequence[str] | None = None
) -> str:
    """Why the step of `chain` on `device` cannot be captured, or "" when it can. With the batch (store and
    request_ids), host-bound samplers that do not read the device on it (`Sampler.syncs_on`: the presets' disabled
    entries, temp_ext with delta 0) do not count."""
    if not env_switch(
        ENV_GRAPHS,
        default=True,
        on="capture the sampling step in a CUDA graph on CUDA, the default",
        off="run it eagerly",
        error=ConfigError,
    ):
        return f"{ENV_GRAPHS}=0"
    if not isinstance(chain, Chain):
        return "a mixed batch of chains (MixedChains) is run eagerly"
    if device.type != "cuda":
        return f"CUDA graphs need a CUDA device, the logits are on {device.type}"
    backend = chain._backend_for(device.type)
    if not backend.sync_free:
        return f"the {backend.name} backend's step waits for the host"
    host_bound = [i for i, s in enumerate(chain.samplers) if not type(s).sync_free]
    if host_bound and store is not None and request_ids is not None:  # on this batch (`Sampler.syncs_on`)
        view = store.batch(request_ids)
        step = Step(store, view, store.positions(view), backend)
        host_bound = [i for i in host_bound if chain.samplers[i].syncs_on(chain._context(step, i))]
    if host_bound:
        names = ", ".join(chain.samplers[i].qualified_name() for i in host_bound)
        return f"host-bound samplers ({names}) read the device during the step"
    if chain.needs_unconditional_logits:
        return "classifier-free guidance runs a second forward per step"
    return ""


class StepGraphs:
    """chain.sample for one batch (store, request_ids), recorded as a graph per input-shape bucket and replayed.

    sample(logits, history=None, prompt_lengths=None) -> SampleOutput, the same tokens as chain.sample(logits,
    store, request_ids, ...). The first call for a bucket records it (and runs it); the inputs of every call are
    copied into that bucket's buffers. Call `check()` on the output as for a sync-free step."""

    def __init__(
        self,
        chain: Chain,
        store: RequestStore,
        request_ids: Sequence[str],
        *,
        make_graph: Callable[[], Graph] | None = None,
    ) -> None:
        # make_graph: a new Graph per recording (None: CudaGraph; tests pass samplechain.tools.testing.ReplayGraph)
        self.chain, self.store, self.request_ids = chain, store, list(request_ids)
        self._make_graph = make_graph or CudaGraph
        self._graphs: dict[tuple, tuple[Graph, dict[str, torch.Tensor], SampleOutput]] = {}

    def sample(
        self, logits: torch.Tensor, *, history: torch.Tensor | None = None, prompt_lengths: torch.Tensor | None = None
    ) -> SampleOutput:
        if history is not None:
            width = -(-history.shape[1] // HISTORY_BUCKET) * HISTORY_BUCKET
            history = torch.nn.functional.pad(history, (width - history.shape[1], 0), value=-1)
            if prompt_lengths is None:  # the chain's default counts the known tokens: the padding is not one
                raise ConfigError("StepGraphs.sample: pass prompt_lengths= with history=")
        inputs = {"logits": logits, "history": history, "prompt_lengths": prompt_lengths}
        given = {name: t for name, t in inputs.items() if t is not None}
        key = tuple((name, tuple(t.shape), t.dtype) for name, t in given.items())
        entry = self._graphs.get(key)
        if entry is None:
            return self._record(key, inputs)
        graph, static, out = entry
        for name, buffer in static.items():
            buffer.copy_(given[name])
        graph.replay()
        return _copied(out)

    def _record(self, key: tuple, inputs: dict[str, torch.Tensor | None]) -> SampleOutput:
        static = {name: t.clone() for name, t in inputs.items() if t is not None}
        self.store.batch(self.request_ids)  # the composition gathered on the host (cached), not while recording
        self._graphs.clear()  # one bucket at a time: an earlier width never comes back in a generation
        graph = self._make_graph()
        out = graph.capture(
            lambda: self.chain.sample(
                static["logits"],
                self.store,
                self.request_ids,
                history=static.get("history"),
                prompt_lengths=static.get("prompt_lengths"),
            )
        )
        self._graphs[key] = (graph, static, out)
        return _copied(out)


def _copied(out: SampleOutput) -> SampleOutput:
    """The outputs out of the graph's buffers, which its next replay overwrites (the deferred check included)."""
    deferred = None
    if out.deferred is not None:
        failed, error = out.deferred
        deferred = (failed.clone(), error)
    return SampleOutput(out.token_ids.clone(), out.logprobs.clone(), None, deferred)
