"""Speculative decoding that never changes the tokens: the `match` mode of `Generation(..., draft=...)`.

A drafter (samplechain.drafters) guesses the next tokens of each row; the runner's `extend` gives the model's
logits at every guessed position in one call; the chain then samples those positions one by one exactly as the
plain loop samples its steps (`Generation._one_step`: the same store, seeds, history, stopping criteria). A guess is
kept only when the chain's own draw at its position equals it, so the store accepts exactly the tokens that come out,
and a seeded or greedy request gives the tokens it gives without a drafter, for any chain.

One call, in order:
1. each unfinished row's drafter proposes up to `limit` tokens (`limit`: the new tokens the length limits still
   allow, less one); the batch drafts K = the shortest proposal (0: the call is a plain `step`);
2. `runner.extend([last token, d_1 .. d_K])` -> logits (B, K + 1, V): the next position's, then after each d_j;
3. for j = 0..K: the chain samples column j for every row, the criteria check it (a stop ends a row there), the
   column is yielded (final: it is never taken back); the call ends after column j when j = K or a row that is
   still generating drew something other than d_{j+1};
4. the cache is cut back to the tokens so far but the newest, which the next call feeds.

Rows advance together (the Generation's tokens stay one rectangle), so in a batch a call keeps the drafted tokens
up to the first position where any row's draw differs; that holds on every runner, whether or not it cuts rows to
different lengths. Numerically, a multi-token forward pass equals one-token steps up to float32 summation order on
transformers (about 1e-5 on the logits of the models tested), and bit for bit on llama.cpp with flash attention
(without it, llama.cpp's attention over several tokens differs by up to ~1.3: docs/speculative.md): a draw that such
a difference flips is the only way the tokens can differ from a generation without a drafter.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch

from ..drafters import Drafter
from ..engine.config import parse_params
from ..engine.discovery import PluginHost
from ..errors import ConfigError, GenerationWarning
from ..runners import ModelRunner
from .outputs import GenerationOutput

if TYPE_CHECKING:
    from .session import Generation

__all__ = ["Speculation", "load_drafter"]


def load_drafter(draft: Any, host: PluginHost) -> Drafter:
    """A drafter from a name ("prompt_lookup", "prompt_lookup.v1"), a table {"use": NAME, ...its parameters} or a
    Drafter object; unknown names and bad parameters are one ConfigError naming them."""
    if isinstance(draft, Drafter):
        return draft
    if isinstance(draft, str):
        name, raw = draft, {}
    elif isinstance(draft, Mapping):
        raw = dict(draft)
        name = raw.pop("use", None)
        if not isinstance(name, str):
            raise ConfigError(
                f"draft = {draft!r}: a table names its drafter with `use`, e.g. {{'use': 'prompt_lookup', "
                "'num_tokens': 10}"
            )
    else:
        raise ConfigError(
            f"draft = {draft!r}: pass a drafter name ('prompt_lookup'), a table {{'use': 'prompt_lookup', ...}} "
            "or a samplechain.drafters.Drafter object"
        )
    cls = host.get("drafter", name)
    return cls(parse_params(cls, raw, source="draft", path=f"draft[{cls.name}]"))


class Speculation:
    """A generation's drafter and its per-row counts: `drafted` tokens sent to the model, `kept` (drafted tokens
    that came out), `model_calls` (forward passes that produced the row's tokens, the prefill included)."""

    def __init__(self, drafter: Drafter, rows: int) -> None:
        self.drafter = drafter
        self.drafted = torch.zeros(rows, dtype=torch.int64)
        self.kept = torch.zeros(rows, dtype=torch.int64)
        self.model_calls = torch.zeros(rows, dtype=torch.int64)
        self.off = [False] * rows  # rows whose drafter raised: they go on without drafts
        drafter.start(rows)

    @classmethod
    def prepare(cls, draft: Any, gen: Generation) -> Speculation | None:
        """The speculation of a generation about to start, or None without `draft`; refusals come here, before
        any model call."""
        if draft is None:
            return None
        if gen.uncond_ids is not None:
            raise ConfigError(
                "draft= with negative_prompt (classifier-free guidance): speculation does not run the "
                "unconditional context; drop one of them"
            )
        return cls(load_drafter(draft, gen.host), len(gen.request_ids))

    def report(self, out: GenerationOutput) -> None:
        """The counts into the output's drafted / kept / model_calls."""
        out.drafted, out.kept, out.model_calls = self.drafted.clone(), self.kept.clone(), self.model_calls.clone()

    # ----------------------------------------------------------------- the loop
    def run(
        self, gen: Generation, runner: ModelRunner, logits: torch.Tensor, step: int
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Generation's steps from `logits` (the next position's, the cache holding every token so far) to the end,
        each column yielded as the plain loop yields its steps."""
        columns, drafts = logits[:, None], None  # columns: (B, K + 1, V); drafts: (B, K)
        while True:
            self.model_calls += (~gen.finished).cpu().long()
            for j in range(columns.shape[1]):
                step += 1
                token_ids, active = gen._one_step(columns[:, j].contiguous(), step)
                yield token_ids, active
                if gen._all_finished:
                    return
                if drafts is None or j == drafts.shape[1]:
                    break
                same = (token_ids == drafts[:, j]) & active
                self.kept += same.cpu().long()
                if bool((active & ~same).any()):
                    break
            width = gen.input_ids.shape[1]
            if drafts is not None and drafts.shape[1] > j:  # the cache holds drafts past the last kept one
                runner.truncate(width - 1)
            drafts = self._propose(gen, columns.shape[-1])
            if drafts is None:
                columns = runner.step(gen.input_ids)[:, None]
            else:
                self.drafted += drafts.shape[1] * (~gen.finished).cpu().long()
                columns = runner.extend(torch.cat([gen.input_ids[:, -1:], drafts], dim=1))

    def _propose(self, gen: Generation, vocab: int) -> torch.Tensor | None:
        """(B, K) drafted tokens on the inputs' device (finished rows: zeros), or None for no draft."""
        limit = self._limit(gen)
        if limit < 1:
            return None
        rows = (~gen.finished).nonzero().flatten().tolist()
        if any(self.off[b] for b in rows):
            return None
        ids = gen.input_ids.cpu()
        start = gen.attention_mask.shape[1] - gen.prompt_lengths.cpu()  # each row's first real token
        proposals: dict[int, torch.Tensor] = {}
        for b in rows:
            draft = self._ask(b, ids[b, int(start[b]) :], limit, vocab)
            if draft is None or len(draft) == 0:
                return None
            proposals[b] = draft
        k = min(len(d) for d in proposals.values())
        drafts = torch.zeros((ids.shape[0], k), dtype=torch.int64)
        for b, d in proposals.items():
            drafts[b] = d[:k]
        return drafts.to(gen.input_ids.device)

    def _limit(self, gen: Generation) -> int:
        """The most tokens a call may draft: the new tokens the length limits still allow, less the one every call
        samples after its drafts."""
        bound = gen.stopping.max_new_tokens(gen.setup)
        return 1 << 30 if bound is None else bound - gen._steps - 1

    def _ask(self, row: int, tokens: torch.Tensor, limit: int, vocab: int) -> torch.Tensor | None:
        """The drafter's proposal for one row, checked; a drafter that raises or proposes something that is not a
        token is switched off for the row, with a warning (the row goes on without drafts)."""
        name = self.drafter.qualified_name()
        try:
            draft = torch.as_tensor(self.drafter.propose(row, tokens, limit), dtype=torch.int64).flatten()
            draft = draft[:limit]
            if bool(((draft < 0) | (draft >= vocab)).any()):
                raise ValueError(f"proposed {draft.tolist()}: token ids in [0, {vocab}) expected")
        except Exception as exc:  # noqa: BLE001 - a drafter's failure costs speed, never tokens
            self.off[row] = True
            warnings.warn(
                f"drafter {name} failed on row {row} ({type(exc).__name__}: {exc}); the row goes on without "
                "speculation, its tokens unchanged",
                GenerationWarning,
                stacklevel=2,
            )
            return None
        return draft
