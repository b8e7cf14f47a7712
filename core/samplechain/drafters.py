"""The drafter contract: what speculative decoding needs from a source of guessed tokens.

A drafter proposes, for one row at a time, up to `limit` tokens that may come next; the generation loop feeds them to
the model in one pass and keeps each one only if the chain's own draw at that position picks it
(docs/speculative.md). A drafter never changes which tokens come out, only how many model calls they take: a bad
guess costs a little work, never a different text.

Required: `name` (a lowercase identifier) and `propose`. Optional: `Params` (an attrs class, validated like a
sampler's; the drafter gets its instance as `self.params`), `version`, `summary`, and `start` (called once per
generation with its number of rows, before the first proposal: reset per-row state there).

A drafter class is registered like a sampler (the `register_drafters` hook of a plugin found through the
`samplechain` entry points). `prompt_lookup` (samplechain-prompt-lookup) is built in.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from .candidates import NoParams

__all__ = ["Drafter"]


class Drafter:
    """Base class of drafters. Subclasses set `name` and implement `propose`."""

    name: ClassVar[str] = ""
    version: ClassVar[int] = 1
    Params: ClassVar[type] = NoParams
    summary: ClassVar[str] = ""

    def __init__(self, params: Any = None) -> None:
        self.params = params if params is not None else self.Params()

    @classmethod
    def qualified_name(cls) -> str:
        return f"{cls.name}.v{cls.version}"

    def start(self, rows: int) -> None:
        """A generation of `rows` rows begins (row indices 0..rows-1 in `propose`); optional."""

    def propose(self, row: int, tokens: torch.Tensor, limit: int) -> Sequence[int] | torch.Tensor:
        """At most `limit` (>= 1) token ids that may follow `tokens` in row `row`; empty when there is no guess.

        tokens: (n,) int64 on the CPU, the row's prompt (without padding) then every token generated so far."""
        raise NotImplementedError
