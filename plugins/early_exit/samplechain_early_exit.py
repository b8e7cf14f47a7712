"""`early_exit`: the generation's own model, cut after its first `layers` decoder layers, drafts (self-speculation).

transformers' `assistant_early_exit`: the embeddings, the first `layers` decoder layers, then the model's final norm
and head, with the model's own weights (nothing is copied). On the generation's own cache where its runner can take
passes back (`ModelRunner.lookahead`: the transformers runner on a cache of plain layers), as LayerSkip's
self-speculation does: the keys and values of the first layers are the ones the model computed for the row's
tokens, so a draft runs only its own tokens, with nothing to fill first, and its passes are taken back before the
model checks the draft. Elsewhere (a sliding-window or quantized cache) it keeps a cache of its own per row, filled
with the row's tokens on its first draft. Each drafted token is
drawn through the verifying chain with the request's own noise, as `draft_model` draws (samplechain_draft_model_base):
the deeper the exit, the closer the two distributions and the more drafts are kept. Models trained for early exit
(LayerSkip) keep the most at shallow exits; on others an exit a few layers short of the top pays best.

It runs transformers decoders whose layers are a `model.layers` list (Llama, SmolLM2, Qwen, Mistral, Gemma and most
decoder-only models) or GPT-2's `transformer.h`; for the time of each drafting call the model's layer list holds
only the first `layers` (the generation's own calls see the whole model), so the model object must not run in
another thread meanwhile.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import attrs
import torch

from samplechain import ConfigError, hookimpl
from samplechain.drafters import DraftContext, Proposal
from samplechain_draft_model_base import ModelDrafter, noise_field, num_tokens_field, p_min_field, swapped

__all__ = ["EarlyExit", "EarlyExitParams", "decoder_layers"]

_ALTERNATIVES = "draft with prompt_lookup, or with draft_model and a smaller model of the same vocabulary"


def _layers_ok(_inst: Any, _attr: attrs.Attribute, value: int | None) -> None:
    if value is None:
        raise ValueError(
            "give how many of the model's decoder layers draft: at least 1, fewer than the model has "
            "(e.g. {'use': 'early_exit', 'layers': 8})"
        )
    if value < 1:
        raise ValueError("must be in [1, inf) (the decoder layers that draft; fewer than the model has)")


@attrs.frozen
class EarlyExitParams:
    layers: int | None = attrs.field(default=None, validator=_layers_ok)
    num_tokens: int = num_tokens_field()
    noise: str = noise_field()
    p_min: float = p_min_field()


def decoder_layers(model: Any) -> tuple[Any, str, torch.nn.ModuleList] | None:
    """(module, attribute, the layer list) of a transformers decoder: `<base model>.layers` or `.h`; None when
    the model has no such list."""
    prefix = getattr(model, "base_model_prefix", None)
    base = getattr(model, prefix, None) if isinstance(prefix, str) and prefix else None
    for owner in (base, model):
        for attr in ("layers", "h"):
            layers = getattr(owner, attr, None) if owner is not None else None
            if isinstance(layers, torch.nn.ModuleList) and len(layers) > 0:
                return owner, attr, layers
    return None


class EarlyExit(ModelDrafter):
    name = "early_exit"
    Params = EarlyExitParams
    summary = "drafter: the generation model's first layers (self-speculation), drawing with the request's own noise"

    def __init__(self, params: EarlyExitParams | None = None) -> None:
        super().__init__(params)
        self._exit: tuple[Any, str, torch.nn.ModuleList] | None = None
        self._generation_runner: Any = None  # DraftContext.generation_runner
        self._shared: Any = None  # inside propose_rows: the generation's runner, drafting in its lookahead
        self._sharing = False  # the current proposal's rows draft on the generation's cache

    def drafting_model(self, context: DraftContext) -> Any:
        model = context.model
        runner = context.runner_for(model)
        if runner.name != "transformers":
            raise ConfigError(
                f"draft[early_exit]: the {runner.name} runner's model cannot run part of itself; early exit drafts "
                f"with the first layers of a transformers model: {_ALTERNATIVES}"
            )
        found = decoder_layers(model)
        if found is None:
            raise ConfigError(
                f"draft[early_exit]: {type(model).__name__} has no decoder layer list early exit can cut (a "
                "transformers decoder's `model.layers`, as Llama, SmolLM2, Qwen or Mistral have, or GPT-2's "
                f"`transformer.h`): {_ALTERNATIVES}"
            )
        owner, attr, layers = found
        k = self.params.layers
        if k >= len(layers):
            raise ConfigError(
                f"draft[early_exit].layers = {k}: {type(model).__name__} has {len(layers)} decoder layers; give "
                f"1 to {len(layers) - 1} (the layers that draft; all of them would be the model itself)"
            )
        self._exit = (owner, attr, torch.nn.ModuleList(list(layers)[:k]))  # the same modules: no weight copied
        return model

    def start(self, rows: int, context: DraftContext) -> None:
        super().start(rows, context)
        self._generation_runner = context.generation_runner

    def running(self) -> contextlib.AbstractContextManager[Any]:
        assert self._exit is not None  # set by start
        return swapped(*self._exit)

    def propose_rows(
        self, rows: Sequence[int], tokens: Sequence[torch.Tensor], limits: Sequence[int]
    ) -> list[Proposal]:
        runner = self._generation_runner() if callable(self._generation_runner) else None
        ahead = runner.lookahead() if runner is not None and runner.model is self._model else None
        if ahead is None:
            return super().propose_rows(rows, tokens, limits)
        with ahead:  # the drafted tokens' passes are taken back, also after an error
            self._shared = runner
            try:
                return super().propose_rows(rows, tokens, limits)
            finally:
                self._shared, self._sharing = None, False

    def _logits_after(self, rows: Sequence[int], tokens: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """On the generation's cache where it holds each row's tokens but the newest (as it does between the
        loop's calls): a pass of the newest tokens through the first layers; otherwise the drafter's own caches."""
        shared = self._shared
        self._sharing = shared is not None and all(torch.equal(shared.holds(r), t[:-1]) for r, t in zip(rows, tokens))
        if not self._sharing:
            return super()._logits_after(rows, tokens)
        return [out[-1] for out in shared.extend_rows(list(rows), [t[-1:] for t in tokens])]

    def _feed(self, rows: Sequence[int], tokens: Sequence[int]) -> list[torch.Tensor]:
        if not self._sharing:
            return super()._feed(rows, tokens)
        if not rows:
            return []
        feeds = [torch.tensor([token], dtype=torch.int64) for token in tokens]
        return [out[-1] for out in self._shared.extend_rows(list(rows), feeds)]


@hookimpl
def register_drafters(register):
    register(EarlyExit)
