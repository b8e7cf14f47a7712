"""The guard contract: rules that read a row's decoded text as it is generated and may take text back.

A guard watches the tokens a row generates and, when they spell something it forbids (a banned phrase, a regular
expression), answers with a `Rewind`: the text from token t on must not stand. The generation loop then rewinds the
row to just before token t (the model's cache, the request's sampler state and RNG position, the stopping state),
bans the token that stood at t at that position only, and draws again there; further bans accumulate at t until a
token passes. Other rows of the batch go on untouched (docs/guards.md).

The loop draws a guarded row's tokens ahead of what it commits: a token is committed (counted, checked by the
stopping criteria, shown by `stream()`) only once no guard of the row may still take it back, which each guard
says with `hold`. So a stream never shows text a rewind takes back, and `max_new_tokens` counts kept tokens only.

Required: `name` (a lowercase identifier), `check` and `hold`. Optional: `Params` (an attrs class, validated like a
sampler's; the guard gets its instance as `self.params`), `version`, `summary`, and `start` (called once per
generation with its number of rows and a `GuardContext`: build per-row state there).

A guard class is registered like a sampler (the `register_guards` hook of a plugin found through the `samplechain`
entry points). Built in: `banned_strings` and `banned_regex` (samplechain-banned-strings).

A guard table (`guards=[...]`, a chain's `[[guard]]` tables) names its guard with `use`, gives the guard's
parameters, and may set the loop with `SETTINGS`: `max_rewinds` (the rewinds one request may take from this guard;
past them the request ends with finish reason "guard", keeping every token before the text the guard refused).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from .candidates import PluginClass
from .errors import ConfigError

__all__ = ["MAX_REWINDS", "SETTINGS", "Guard", "GuardContext", "Rewind", "guard_settings"]

MAX_REWINDS = 64  # a request's rewinds per guard unless its table says otherwise
SETTINGS = ("max_rewinds",)  # keys of a guard table that set the loop, not the guard


@attrs.frozen
class Rewind:
    """Take the row's text back from generated token `token` on (0: the first generated token): the loop bans
    the token that stood there, at that position, and draws again. `reason` names what was refused (the phrase,
    the pattern); it goes into the finish reason's match when the request runs out of rewinds."""

    token: int
    reason: str


@attrs.frozen
class GuardContext:
    """What a guard may read about the generation it guards."""

    tokenizer: Any
    pieces: tuple[bytes, ...]  # pieces[id]: the bytes token `id` adds to decoded text (samplechain.strings)
    request_ids: tuple[str, ...]  # row -> its request
    rows: tuple[int, ...]  # the rows this guard object watches


class Guard(PluginClass):
    """Base class of guards. Subclasses set `name` and implement `check` and `hold`."""

    def start(self, rows: int, context: GuardContext) -> None:
        """A generation of `rows` rows begins (row indices 0..rows-1 below); optional."""

    def check(self, row: int, tokens: Sequence[int], final: bool) -> Rewind | None:
        """A rewind if the text of `tokens` (row `row`'s generated token ids so far; a list that can also have
        become shorter, after a rewind) holds something this guard refuses, decided whatever text may follow (or
        `final`: the row ends here); else None."""
        raise NotImplementedError

    def hold(self, row: int, tokens: Sequence[int]) -> int:
        """The index of the first of `tokens` this guard may still take back (len(tokens): none): the loop commits
        only the tokens before it."""
        raise NotImplementedError


def guard_settings(spec: Any) -> dict[str, Any]:
    """The loop settings of a guard spec: a table's `max_rewinds` (an int >= 0)."""
    if not isinstance(spec, Mapping):
        return {}
    settings = {key: spec[key] for key in SETTINGS if key in spec}
    n = settings.get("max_rewinds", MAX_REWINDS)
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ConfigError(
            f"guard {spec.get('use', '?')}: max_rewinds = {n!r}: the rewinds one request may take (an int >= 0)"
        )
    return settings
