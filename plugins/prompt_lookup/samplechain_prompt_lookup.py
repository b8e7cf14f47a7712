"""`prompt_lookup`: draft the tokens that followed an earlier occurrence of the row's last n-gram.

transformers' `PromptLookupCandidateGenerator` (`prompt_lookup_num_tokens`): for n from `max_ngram` down to
`min_ngram`, take the row's last n tokens, find an earlier occurrence of them in the prompt and the text so far, and
propose up to `num_tokens` of the tokens that followed it; the largest n with a match wins, no match is no draft.
Quoting, editing and summarising a given text repeat long runs of it, which this finds for free. `occurrence` picks
which earlier occurrence: "first" (transformers, vLLM), "last" (llama.cpp's ngram-simple), "switch" (the first
until the token it guessed next is not the token that came, then the last until that one misses, and so on, per
row) or "follow" (the default: "switch", and a cursor in the passage the row copies; where the row writes a word or
an item of its own in place of the passage's, no n-gram of its last tokens leads back, but the passage goes on one
token later; each row drafts from the lookup or the cursor, whichever guessed what came better of late). Where the
n-gram occurs several times, "follow" drafts what most of its occurrences go on with, token by token: a
continuation the text has taken more often is the likelier one.
Differences from transformers: each row of a batch looks up its own tokens (transformers' works on one sequence),
and a draft is not cut at an eos token (the chain decides whether the eos is kept; a stop ends the row there).

A longer match is a better guess: on SmolLM2-135M-Instruct over chat, code, list and quoting requests the first
token of a draft from a one-token match was kept 16% of the time (7-74% by task), from a two-token match 52%
(21-72%), from three tokens or more 84% (77-93%). `expect` tells the draft lengths which kind a row's next draft is,
with those shares as priors, so that a row keeps a record per kind (a one-token match in free chat rarely pays).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import attrs
import torch

from samplechain import ConfigError, hookimpl, in_range, one_of
from samplechain.drafters import DraftContext, Drafter

OCCURRENCES = ("follow", "switch", "first", "last")
_SWITCHING = ("follow", "switch")  # the occurrences that turn between the first and the last


@attrs.frozen
class PromptLookupParams:
    num_tokens: int = attrs.field(default=10, validator=in_range(1, None, hint="the longest draft"))
    max_ngram: int = attrs.field(default=3, validator=in_range(1, None))
    min_ngram: int = attrs.field(default=1, validator=in_range(1, None))
    occurrence: str = attrs.field(default="follow", validator=one_of(*OCCURRENCES))


# the share of drafts from an n-token match whose first token is kept, before a row has its own record
_KEPT = {1: 0.15, 2: 0.52}
_KEPT_LONGER = 0.85
# "follow": a draft from the cursor, its first token's prior (as often as not: a row's first draft from its cursor is
# not drafted whole, as a first n-gram match of two tokens or more is; it seldom starts a run); the weight of a guess's
# record per newer guess; what a guess that missed (before it or what came ended) counts against it, in kept tokens
CURSOR = -1
_KEPT_CURSOR = 0.5
_FOLLOW_DECAY = 0.8
_MISS = 0.5


@attrs.define
class _Follow:
    """A row's cursor and its record under "follow"."""

    # (a position in the row, the row's length then): the row copies from position + (its length now - length then)
    cursor: tuple[int, int] | None = None
    # the last guesses, judged by what came after them: (the row's length then, the lookup's guess, the position it
    # copied from, the cursor's guess)
    guess: tuple[int, list[int], int | None, list[int]] | None = None
    scores: list[float] = attrs.field(factory=lambda: [0.0, 0.0])  # the lookup's, the cursor's


class PromptLookup(Drafter):
    name = "prompt_lookup"
    Params = PromptLookupParams
    summary = "drafter: the continuation of an earlier occurrence of the last n-gram (prompt and text so far)"

    def __init__(self, params: PromptLookupParams | None = None) -> None:
        super().__init__(params)
        p = self.params
        if p.min_ngram > p.max_ngram:
            raise ConfigError(
                f"drafter prompt_lookup: min_ngram (= {p.min_ngram}) is larger than max_ngram (= {p.max_ngram}); "
                "give min_ngram <= max_ngram"
            )
        # row -> its last lookup: (the tokens, (n, the position it drafts from), its draft)
        self._last: dict[int, tuple[torch.Tensor, tuple[int, int], torch.Tensor]] = {}
        # row -> (takes the last occurrence, (the row's length at its last match, the token that match guessed next))
        self._side: dict[int, tuple[bool, tuple[int, int] | None]] = {}
        self._follow: dict[int, _Follow] = {}

    def start(self, rows: int, context: DraftContext) -> None:
        self._last.clear()
        self._side.clear()
        self._follow.clear()

    def checkpoint(self) -> dict[str, Any]:
        """Each row's choice of occurrence and the guess it is judged by; under "follow", its cursor and record."""
        side = [[row, last, guess] for row, (last, guess) in sorted(self._side.items())]
        follow = [[row, f.cursor, f.guess, list(f.scores)] for row, f in sorted(self._follow.items())]
        return {"side": side, "follow": follow}

    def restore(self, state: Any) -> None:
        for row, last, guess in (state or {}).get("side", []):
            self._side[int(row)] = (bool(last), None if guess is None else (int(guess[0]), int(guess[1])))
        for row, cursor, guess, scores in (state or {}).get("follow", []):
            if cursor is not None:
                cursor = (int(cursor[0]), int(cursor[1]))
            if guess is not None:
                at, lookup_guess, source, cursor_guess = guess
                source = None if source is None else int(source)
                guess = (int(at), [int(t) for t in lookup_guess], source, [int(t) for t in cursor_guess])
            self._follow[int(row)] = _Follow(cursor, guess, [float(x) for x in scores])

    def expect(self, row: int, tokens: torch.Tensor) -> tuple[str, float] | None:
        n, _ = self._match(row, tokens)
        if n == CURSOR:
            return ("cursor", _KEPT_CURSOR)
        return None if not n else (f"ngram{n}", _KEPT.get(n, _KEPT_LONGER))

    def propose(self, row: int, tokens: torch.Tensor, limit: int) -> torch.Tensor:
        self._match(row, tokens)
        return self._last[row][2][: max(limit, 0)]

    def _match(self, row: int, tokens: torch.Tensor) -> tuple[int, int]:
        """(n, the position after the earlier occurrence of the n-gram that the draft copies) for the largest n that
        matches; (0, 0) where none does; under "follow" (CURSOR, the cursor's position) where the row drafts from its
        cursor. Each row's last lookup and its draft are kept: the loop hands `expect` and `propose` the same
        tensor."""
        last = self._last.get(row)
        if last is not None and last[0] is tokens:
            return last[1]
        n_tokens, p = tokens.shape[0], self.params
        use_last = self._use_last(row, tokens)
        found, hits = (0, 0), tokens[:0]
        for n in range(min(p.max_ngram, n_tokens - 1), p.min_ngram - 1, -1):
            # windows: (n_tokens - n + 1, n); the last one is the n-gram itself, never its own match
            windows = tokens.unfold(0, n, 1)[:-1]
            hits = (windows == tokens[-n:]).all(dim=1).nonzero().flatten() + n
            if len(hits):
                found = (n, int(hits[-1 if use_last else 0]))
                break
        if p.occurrence in _SWITCHING:
            # every match is judged by the token that came after it, drafted or not
            self._side[row] = (use_last, (n_tokens, int(tokens[found[1]])) if found[0] else None)
        draft = tokens[found[1] : found[1] + p.num_tokens] if found[0] else tokens[:0]
        if p.occurrence == "follow":
            if len(hits) > 1:
                # each occurrence's continuation: up to num_tokens tokens, fewer near the end of the text
                width = min(p.num_tokens, n_tokens - int(hits[0]))
                rows = tokens[(hits[:, None] + torch.arange(width)).clamp_(max=n_tokens - 1)].tolist()
                starts = hits.tolist()
                continuations = {s: row[: n_tokens - s] for s, row in zip(starts, rows, strict=True)}
                path, source = _majority(continuations, found[1], p.num_tokens)
                found, draft = (found[0], source), torch.tensor(path, dtype=tokens.dtype)
            found = self._followed(row, tokens, found, draft.tolist())
            if found[0] == CURSOR:
                draft = tokens[found[1] : found[1] + p.num_tokens]
        self._last[row] = (tokens, found, draft)
        return found

    def _followed(self, row: int, tokens: torch.Tensor, found: tuple[int, int], guess: list[int]) -> tuple[int, int]:
        """Under "follow": the lookup's match `found` (its draft: `guess`), or (CURSOR, the cursor's position) where
        the cursor has guessed what came better of late. Each guess is judged by what came after it, drafted or not;
        the cursor moves to the lookup's passage wherever the lookup's guess was followed."""
        state = self._follow.setdefault(row, _Follow())
        n_tokens, longest = tokens.shape[0], self.params.num_tokens
        if state.guess is not None and n_tokens > state.guess[0]:  # judged once, by at least one token that came
            at, lookup_guess, source, cursor_guess = state.guess
            came = tokens[at : at + longest + 1].tolist()
            for i, judged in enumerate((lookup_guess, cursor_guess)):
                kept = _kept(judged, came)
                missed = bool(judged) and kept < min(len(judged), len(came))
                state.scores[i] = _FOLLOW_DECAY * state.scores[i] + kept - _MISS * missed
            if source is not None and _kept(lookup_guess, came):
                state.cursor = (source, at)
        cursor = None if state.cursor is None else state.cursor[0] + n_tokens - state.cursor[1]
        source = found[1] if found[0] else None
        cursor_guess = [] if cursor is None else tokens[cursor : cursor + longest].tolist()
        state.guess = (n_tokens, guess, source, cursor_guess)
        if state.cursor is None and source is not None:
            state.cursor = (source, n_tokens)
        if cursor is not None and cursor_guess and state.scores[1] > state.scores[0]:
            return (CURSOR, cursor)
        return found

    def _use_last(self, row: int, tokens: torch.Tensor) -> bool:
        occurrence = self.params.occurrence
        if occurrence not in _SWITCHING:
            return occurrence == "last"
        use_last, guess = self._side.get(row, (False, None))
        if guess is not None and tokens.shape[0] > guess[0] and int(tokens[guess[0]]) != guess[1]:
            return not use_last
        return use_last


def _majority(continuations: dict[int, list[int]], chosen: int, longest: int) -> tuple[list[int], int]:
    """The continuation most of the occurrences share (their positions: `continuations`' keys), token by token: at
    each step the token that goes on the most of the occurrences that agree with the draft so far and have a token
    there; the draft ends where none of them goes on (the end of the text). A tie goes to the token of the
    occurrence it copies: `chosen` while that agrees, else the latest that does, which it returns too."""
    draft: list[int] = []
    live, source = list(continuations), chosen
    for j in range(longest):
        live = [s for s in live if j < len(continuations[s])]
        if len(live) <= 1:  # one occurrence left: its continuation
            return (draft + continuations[live[0]][j:], live[0]) if live else (draft, source)
        if source not in live:
            source = live[-1]
        counts = Counter(continuations[s][j] for s in live)
        top, most = counts.most_common(1)[0]
        if counts[continuations[source][j]] == most:
            top = continuations[source][j]
        draft.append(top)
        live = [s for s in live if continuations[s][j] == top]
    return draft, source if source in live else live[-1]


def _kept(guess: list[int], came: list[int]) -> int:
    """How many of `guess`'s first tokens are the tokens that came."""
    k = 0
    while k < len(guess) and k < len(came) and guess[k] == came[k]:
        k += 1
    return k


@hookimpl
def register_drafters(register):
    register(PromptLookup)
