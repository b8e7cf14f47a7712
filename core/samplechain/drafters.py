"""The drafter contract: what speculative decoding needs from a source of guessed tokens.

A drafter proposes, for each row, up to `limit` tokens that may come next; the generation loop feeds them to the
model in one pass and, in mode match (the default), keeps each one only if the chain's own draw at that position
picks it (docs/speculative.md). There a drafter never changes which tokens come out, only how many model calls they
take: a bad guess costs a little work, never a different text.

Required: `name` (a lowercase identifier) and `propose`. Optional: `Params` (an attrs class, validated like a
sampler's; the drafter gets its instance as `self.params`), `version`, `summary`, `start` (called once per
generation, before the first proposal, with its number of rows and a `DraftContext`: reset per-row state there),
`propose_rows` (all rows that draft in one call at once: a drafter that runs a model batches them there),
`expect` (the kind of draft it would give next and how likely its first token is kept, where the drafter can tell
good guesses from poor ones cheaply: the draft lengths keep each kind's record apart), `finish` (rows that will not
draft again) and `checkpoint` / `restore` (per-row state a resumed generation needs).

A proposal is a sequence of token ids, or a `Draft` that also carries the drafter's probabilities of them (the
`rejection` mode's q; without them a guess counts as certain).

A drafter class is registered like a sampler (the `register_drafters` hook of a plugin found through the
`samplechain` entry points). Built in: `prompt_lookup`, `draft_model` and `early_exit`.

A draft table (`draft=` or a chain's `[draft]`) names its drafter with `use`, gives the drafter's parameters, and
may set the loop with `SETTINGS`: `mode` ("match": keep a guess where the chain draws it; "rejection": speculative
sampling's test), `adaptive` (the draft length follows acceptance and cost; false keeps it at the drafter's
`num_tokens`) and `cost` (what checking one drafted token costs, as a fraction of a model call per row; unset: timed
while generating; samplechain.generation.draft_length).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import torch

from .candidates import PluginClass
from .errors import ConfigError

__all__ = ["SETTINGS", "Draft", "DraftContext", "Drafter", "Proposal", "draft_settings"]


@attrs.frozen
class Draft:
    """A proposal with its probabilities: `tokens` (k,) int64, `probs` (k, V) the drafter's distribution at each
    drafted position (the token's own probability at [j, tokens[j]]), or None for a guess it holds certain."""

    tokens: torch.Tensor
    probs: torch.Tensor | None = None


Proposal = Sequence[int] | torch.Tensor | Draft


@attrs.frozen
class DraftContext:
    """What a drafter may read about the generation it drafts for.

    `store` is the generation's request store: when `propose` / `propose_rows` is called for a row, the state of
    `request_ids[row]` there (its RNG position, penalties' counts, mirostat's mu) is the state after that row's
    `tokens`. A drafter reads it (`store.snapshot([...])` into a store of its own from `chain.new_store`) and never
    changes it: a coupled drafter draws through `chain` from that state with the request's seed, so its draw at a
    position uses the noise the verifying draw will use there."""

    model: Any  # the generation's model (a drafter that runs part of it reads it)
    tokenizer: Any
    chain: Any  # the Chain (or MixedChains) the drafts are verified with
    store: Any  # the generation's RequestStore
    request_ids: tuple[str, ...]  # row -> its request in `store`
    vocab_size: int  # logit columns: drafted ids are in [0, vocab_size)
    device: torch.device  # the generation's device
    # what a drafter that runs a model of its own needs from the engine: runner_for(model) -> the ModelRunner class
    # that drives it; load_model(path) -> (model, tokenizer) as samplechain.models.load_model opens a file
    runner_for: Any = None
    load_model: Any = None
    # generation_runner() -> the generation's own ModelRunner while it runs (None before): a drafter that runs part
    # of the generation's model on its cache (early exit) calls it inside `runner.lookahead()`, which takes its
    # passes back, and reads what a row's cache holds with `runner.holds(row)`
    generation_runner: Any = None


class Drafter(PluginClass):
    """Base class of drafters. Subclasses set `name` and implement `propose` (or `propose_rows`)."""

    def start(self, rows: int, context: DraftContext) -> None:
        """A generation of `rows` rows begins (row indices 0..rows-1 in `propose`); optional."""

    def propose(self, row: int, tokens: torch.Tensor, limit: int) -> Proposal:
        """At most `limit` (>= 1) token ids that may follow `tokens` in row `row`; empty when there is no guess.

        tokens: (n,) int64 on the CPU, the row's prompt (without padding) then every token generated so far."""
        raise NotImplementedError

    def expect(self, row: int, tokens: torch.Tensor) -> tuple[str, float] | None:
        """The kind of draft `propose` would give after `tokens` and the drafter's prior chance that its first token
        is kept, or None (the default: all its drafts alike). Called before every draft, so it must be cheap; the
        draft lengths keep a record per kind for each row, begun at that chance (docs/speculative.md)."""
        return None

    def propose_rows(
        self, rows: Sequence[int], tokens: Sequence[torch.Tensor], limits: Sequence[int]
    ) -> list[Proposal]:
        """`propose` for several rows at once (the rows that draft in one model call), in their order."""
        return [self.propose(row, t, limit) for row, t, limit in zip(rows, tokens, limits)]

    def finish(self, rows: Sequence[int]) -> None:
        """`rows` will not be asked again in this generation (finished, or their drawn tokens end them): a drafter
        may free what it holds for them (a drafting model's cache rows); optional."""

    def checkpoint(self) -> Any:
        """What a resumed generation needs of the drafter's per-row state to draft as the interrupted one would have:
        plain data (JSON), or None (the default: nothing, or what `propose` rebuilds from the tokens). Drafts change
        no token in mode match; in mode rejection they decide which draws come out."""
        return None

    def restore(self, state: Any) -> None:
        """Take back what `checkpoint` gave, after `start` of the resumed generation; optional."""


MODES = (
    "'match' (the tokens of generation without a drafter) or 'rejection' (speculative sampling's test: the chain's "
    "distribution)"
)


SETTINGS = ("mode", "adaptive", "cost")  # keys of a draft table that set the loop, not the drafter


def draft_settings(spec: Any) -> dict[str, Any]:
    """The loop settings of a draft spec: a table's `mode` ("match" / "rejection"), `adaptive` (bool) and `cost`
    (a number >= 0)."""
    if not isinstance(spec, Mapping):
        return {}
    settings = {key: spec[key] for key in SETTINGS if key in spec}
    if not isinstance(settings.get("adaptive", True), bool):
        raise ConfigError(
            f"draft.adaptive = {settings['adaptive']!r}: true (the draft length follows acceptance) or false "
            "(always the drafter's num_tokens)"
        )
    cost = settings.get("cost", 0.0)
    if isinstance(cost, bool) or not isinstance(cost, (int, float)) or not 0 <= cost < float("inf"):
        raise ConfigError(
            f"draft.cost = {cost!r}: a number >= 0, what checking one drafted token costs as a fraction of a model "
            "call (e.g. 0.1); leave it out to have it timed"
        )
    if settings.get("mode", "match") not in ("match", "rejection"):
        raise ConfigError(f"draft.mode = {settings['mode']!r}: {MODES}")
    return settings
