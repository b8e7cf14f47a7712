"""Guards in beam search (docs/guards.md): a continuation whose text a guard refuses is never a hypothesis.

Beam search cannot take a token back, and needs not: it holds several continuations at once. Every step, each of
the top continuations is shown to its prompt's guards; one they refuse (its text completes a banned phrase) has its
(beam, token) pair set to -inf and the top continuations are taken again, so the search goes on exactly as if that
continuation had never had any probability (as transformers' `bad_words_ids` masks a banned token sequence, for
every way of spelling the text). A continuation that ends a hypothesis (a stopping criterion hit it) is checked
as final text too, so a match decided only by the end of the text (whole words, a regular expression's `$`) is
refused there: that hypothesis is dropped. A prompt left with no hypothesis ends empty, its finish reason naming
the guard and what it refused.

Guard rows follow the running beams: row `b * num_beams + j` holds beam j of prompt b's tokens. A beam that
continues another's lineage takes that beam's row; where two beams continue one, the second gets a row no beam
continues, cut back to no tokens so the guard reads its lineage from the start.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..guards import Guard, Rewind
from .guarding import failed, start_guards

__all__ = ["BeamGuards"]


class BeamGuards:
    """The guards of a beam search: per prompt, its guards and why its last refused continuation was refused."""

    def __init__(
        self,
        per_prompt: Sequence[Sequence[tuple[Guard, int]]],
        num_beams: int,
        prompt_len: int,
        tokenizer: Any,
        request_ids: Sequence[str],
    ) -> None:
        self.nb, self.prompt_len = num_beams, prompt_len
        self.per_prompt = [[g for g, _ in row] for row in per_prompt]
        self.slot_row = list(range(len(per_prompt) * num_beams))  # running beam b * nb + j -> its guard row
        self.refusal: list[str | None] = [None] * len(per_prompt)  # the last refusal's reason, per prompt
        self.failed: list[bool] = [False] * len(per_prompt)
        self._lineages: list[list[list[int]]] | None = None  # per prompt and beam: its generated tokens
        start_guards([row for row in per_prompt for _ in range(num_beams)], tokenizer, request_ids)

    def dead(self) -> list[int]:
        """The prompts whose guard failed: they run no continuation any more."""
        return [b for b, failed in enumerate(self.failed) if failed]

    def refused(
        self,
        running: torch.Tensor,
        topk_indices: torch.Tensor,
        topk_scores: torch.Tensor,
        vocab: int,
        cur_len: int,
        final: torch.Tensor | None = None,
    ) -> list[tuple[int, int]]:
        """The continuations among the top K (`topk_indices` (batch, K) into beam * vocab + token) that a guard
        refuses, as (prompt, index into its beam * vocab + token), or (prompt, candidate) with `final` (batch, K):
        then only the candidates that end their hypothesis are checked, as final text."""
        if self._lineages is None:
            self._lineages = running[:, :, self.prompt_len : cur_len].tolist()
        indices = topk_indices.tolist()
        finite = torch.isfinite(topk_scores).tolist()
        ends = None if final is None else final.tolist()
        out: list[tuple[int, int]] = []
        for b, guards in enumerate(self.per_prompt):
            if not guards or self.failed[b]:
                continue
            for c, index in enumerate(indices[b]):
                if not finite[b][c] or (ends is not None and not ends[b][c]):
                    continue
                beam, token = divmod(index, vocab)
                row = self.slot_row[b * self.nb + beam]
                if self._check(b, row, self._lineages[b][beam] + [token], ends is not None):
                    out.append((b, index if ends is None else c))
                if self.failed[b]:
                    break
        return out

    def _check(self, b: int, row: int, tokens: list[int], final: bool) -> bool:
        for guard in self.per_prompt[b]:
            try:
                rewind = guard.check(row, tokens, final)
                if rewind is not None and not isinstance(rewind, Rewind):
                    raise TypeError(f"check() returned {rewind!r}, not a Rewind or None")
            except Exception as exc:  # noqa: BLE001 - a broken guard ends its prompt's search, never the batch
                self._fail(b, guard, exc)
                return False
            if rewind is not None:
                self.refusal[b] = f"guard:{guard.name}:{rewind.reason}"
                return True
        return False

    def _fail(self, b: int, guard: Guard, exc: Exception) -> None:
        self.failed[b] = True
        outcome = "its beam search ends with the hypotheses it has finished, or an empty one"
        self.refusal[b] = failed(guard, exc, f"prompt {b}", outcome, stacklevel=6)

    def reorder(self, parents: torch.Tensor) -> None:
        """The running beams now continue beams `parents` (batch, nb) of the step before: each takes its parent's
        guard row, or, where a parent already gave its row away, a row no beam continues, cut back to no tokens."""
        self._lineages = None
        nb = self.nb
        new = list(self.slot_row)
        for b, row_parents in enumerate(parents.tolist()):
            if not self.per_prompt[b]:
                continue
            given: set[int] = set()
            later: list[int] = []
            for j, p in enumerate(row_parents):
                if p in given:
                    later.append(j)
                else:
                    given.add(p)
                    new[b * nb + j] = self.slot_row[b * nb + p]
            free = [self.slot_row[b * nb + p] for p in range(nb) if p not in given]
            for j in later:
                row = free.pop()
                for guard in self.per_prompt[b]:
                    try:
                        guard.check(row, [], False)
                    except Exception as exc:  # noqa: BLE001 - as in _check
                        self._fail(b, guard, exc)
                new[b * nb + j] = row
        self.slot_row = new
