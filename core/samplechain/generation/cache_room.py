"""Key/value cache layers that append a pass's states in place, into room kept past their tokens.

transformers' DynamicLayer appends by concatenation: every pass copies each layer's whole cache into a new tensor,
work that grows with the context and the batch (docs/performance.md, "The cache appends in place"). `make_room` turns
a cache's plain DynamicLayers into `RoomyLayer`s, which keep their keys and values as the front of a larger tensor
and write a pass's states after them: a copy only when the room runs out (a quarter more than the tokens, at least
`ROOM` positions), or when the layer's tensors were replaced (a released row, beam search's reordering). What a pass
computes is unchanged: its attention reads the same keys and values, as a view.

A view the runner keeps to take passes back (`TransformersRunner.lookahead`) stays valid: while it is kept, `floor`
holds its length and a write below it goes to new room instead.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

ROOM = 256  # the fewest positions a layer makes room for past its tokens


@functools.cache
def dynamic_layers() -> tuple[type, ...]:
    """transformers' DynamicLayer and `RoomyLayer` (the layers a cache may hold that a runner can take passes back
    on); empty where transformers lacks DynamicLayer."""
    try:
        from transformers.cache_utils import DynamicLayer
    except ImportError:
        return ()

    class RoomyLayer(DynamicLayer):
        """A DynamicLayer whose keys and values are the front of a larger tensor, a pass's states written after
        them in place."""

        floor = 0  # positions below it are held by a kept view: never written in place
        key_room: torch.Tensor | None = None
        value_room: torch.Tensor | None = None

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            assert self.keys is not None and self.values is not None
            self.keys, self.key_room = _appended(self.keys, key_states, self.key_room, self.floor)
            self.values, self.value_room = _appended(self.values, value_states, self.value_room, self.floor)
            return self.keys, self.values

        def reset(self) -> None:
            self.key_room = self.value_room = None
            super().reset()

    return DynamicLayer, RoomyLayer


def make_room(cache: Any) -> None:
    """Each plain DynamicLayer of `cache` (a transformers cache with layers) appends in place from its next pass."""
    kinds = dynamic_layers()
    for layer in getattr(cache, "layers", ()):
        if kinds and type(layer) is kinds[0]:
            layer.__class__ = kinds[1]


def _appended(
    held: torch.Tensor, new: torch.Tensor, room: torch.Tensor | None, floor: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """`held` (B, H, T, D) followed by `new` (B, H, n, D), as the front of `room` where `held` is its front and
    `new` fits after it above `floor`, else of new room; and the room."""
    t = held.shape[-2] if held.dim() == new.dim() else 0  # an empty layer holds a 1-D empty tensor
    n = new.shape[-2]
    fits = (
        room is not None
        and floor <= t
        and t + n <= room.shape[-2]
        and room.dtype == new.dtype
        and room.shape[:-2] == new.shape[:-2]
        and (t == 0 or (held.data_ptr() == room.data_ptr() and held.stride() == room.stride()))
        # room made under torch.inference_mode cannot be written outside it (a stream consumed partly inside)
        and (not room.is_inference() or torch.is_inference_mode_enabled())
    )
    if not fits:
        room = new.new_empty((*new.shape[:-2], t + n + max(ROOM, (t + n) // 4), new.shape[-1]))
        if t:
            room[..., :t, :].copy_(held)
    assert room is not None
    room[..., t : t + n, :].copy_(new)
    return room[..., : t + n, :], room
