"""`early_exit`: the generation's own model, cut after its first `layers` decoder layers, drafts (self-speculation).

transformers' `assistant_early_exit`: the embeddings, the first `layers` decoder layers, then the model's final norm
and head, with the model's own weights (nothing is copied) and a KV cache of its own per row. Each drafted token is
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
from typing import Any

import attrs
import torch

from samplechain import ConfigError, hookimpl
from samplechain.drafters import DraftContext
from samplechain_draft_model_base import ModelDrafter, noise_field, num_tokens_field, swapped

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

    def running(self) -> contextlib.AbstractContextManager[Any]:
        assert self._exit is not None  # set by start
        return swapped(*self._exit)


@hookimpl
def register_drafters(register):
    register(EarlyExit)
