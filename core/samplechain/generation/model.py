"""Driving a Hugging Face causal LM one step at a time, with its KV cache, as transformers' generate does.

`ModelRunner` prepares the inputs the way `GenerationMixin.generate` prepares them for a decoder-only model
(position ids from the attention mask, the mask dropped when nothing is padded, `logits_to_keep=1`) and calls
the model's own `prepare_inputs_for_generation`, so any `AutoModelForCausalLM` that transformers can generate
with runs here too and gives the same logits.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from ..contracts import max_positions
from ..errors import ConfigError

__all__ = ["ModelRunner", "max_positions"]

_CACHE_NAMES = ("past_key_values", "cache_params", "state", "mems", "past_buckets_states")


class ModelRunner:
    """Prefill then one token per step. `logits()` is (B, V) float32 of the last position, a fresh tensor."""

    def __init__(self, model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> None:
        if getattr(model.config, "is_encoder_decoder", False):
            raise ConfigError(
                f"{type(model).__name__} is an encoder-decoder model; samplechain.generate drives decoder-only "
                "causal LMs (AutoModelForCausalLM). Use the chain as a logits processor inside model.generate()."
            )
        self.model = model
        params = set(inspect.signature(model.forward).parameters)
        self.device = input_ids.device
        mask = attention_mask if attention_mask is not None else torch.ones_like(input_ids)
        self.kwargs: dict[str, Any] = {"use_cache": True}
        if "position_ids" in params:
            pos = mask.long().cumsum(-1) - 1
            self.kwargs["position_ids"] = pos.masked_fill(mask == 0, 0)
        # transformers drops an all-ones mask (no padding): the model then takes its faster causal path. Doing
        # the same keeps our logits bit-identical to model.generate's.
        self.mask_length = input_ids.shape[1]
        self.kwargs["attention_mask"] = None if bool((mask == 1).all()) else mask
        if "logits_to_keep" in params:
            self.kwargs["logits_to_keep"] = 1
        self.input_ids = input_ids
        self._first = True

    def _forward(self, ids: torch.Tensor, next_len: int | None) -> torch.Tensor:
        inputs = self.model.prepare_inputs_for_generation(
            ids, next_sequence_length=next_len, is_first_iteration=self._first, **self.kwargs
        )
        out = self.model(**inputs, return_dict=True)
        for name in _CACHE_NAMES:
            if name in out and out[name] is not None:
                self.kwargs["past_key_values" if name in ("mems", "past_buckets_states") else name] = out[name]
                break
        self._first = False
        return out.logits[:, -1, :].to(copy=True, dtype=torch.float32, device=self.device)

    @torch.no_grad()
    def prefill(self) -> torch.Tensor:
        return self._forward(self.input_ids, None)

    @torch.no_grad()
    def step(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids: (B, L+1) every token so far; the model sees only the last one (the cache has the rest)."""
        pos = self.kwargs.get("position_ids")
        if pos is not None:
            self.kwargs["position_ids"] = torch.cat([pos, pos[:, -1:] + 1], dim=-1)
        mask = self.kwargs.get("attention_mask")
        if mask is not None:
            self.kwargs["attention_mask"] = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=-1)
        return self._forward(input_ids, 1)

    def reorder(self, beam_idx: torch.Tensor) -> None:
        """Beam search: rows of the cache follow their beams (mask and positions are equal within a prompt)."""
        for name in _CACHE_NAMES:
            cache = self.kwargs.get(name)
            if cache is None:
                continue
            if hasattr(self.model, "_reorder_cache"):
                self.kwargs[name] = self.model._reorder_cache(cache, beam_idx)
            elif hasattr(cache, "reorder_cache"):
                cache.reorder_cache(beam_idx)
            else:
                raise ConfigError(
                    f"{type(self.model).__name__}'s cache cannot be reordered, so beam search cannot "
                    "run on it; use greedy or sampling"
                )
            break
