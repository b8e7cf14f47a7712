"""`no_repeat_ngram`: transformers' NoRepeatNGramLogitsProcessor.

A token is banned (-inf) when it would complete an n-gram that already occurs in the row's history (prompt and
generated tokens): every earlier n-gram whose first n - 1 tokens equal the last n - 1 tokens bans its last token.
n = 0 disables; rows shorter than n - 1 tokens ban nothing (transformers: `cur_len + 1 < n`). Left padding (-1)
never takes part in an n-gram (transformers counts the pad token like any other).
"""

from __future__ import annotations

import attrs
import torch

from samplechain import Candidates, Sampler, Stage, StepContext, hookimpl, in_range


@attrs.frozen
class NoRepeatNGramParams:
    n: int = attrs.field(default=0, validator=in_range(0, None, hint="0 disables"))


def banned_by_ngrams(history: torch.Tensor, n: int, vocab: int) -> torch.Tensor:
    """(B, V) bool: tokens that would repeat an n-gram of history (B, L)."""
    B, L = history.shape
    banned = torch.zeros(B, vocab + 1, dtype=torch.bool, device=history.device)  # column V: a sink for non-hits
    if L < n:
        return banned[:, :vocab]
    grams = history.unfold(1, n, 1)  # (B, L - n + 1, n)
    prefix = history[:, L - (n - 1) :]  # (B, n - 1)
    last = grams[:, :, n - 1]
    hit = (grams[:, :, : n - 1] == prefix[:, None, :]).all(dim=-1) & (grams >= 0).all(dim=-1) & (last < vocab)
    hit &= (prefix >= 0).all(dim=-1, keepdim=True)
    banned.scatter_(1, torch.where(hit, last, vocab), True)
    return banned[:, :vocab]


class NoRepeatNGram(Sampler):
    name = "no_repeat_ngram"
    stage = Stage.TRANSFORM
    role = "mask"
    Params = NoRepeatNGramParams
    request_aliases = {"no_repeat_ngram_size": "n"}
    summary = "ban tokens that would repeat an n-gram of the sequence"

    def needs_history(self) -> bool:
        return True

    def is_noop(self, ctx: StepContext) -> bool:
        return ctx.scalar("n") == 0

    def apply(self, cand: Candidates, ctx: StepContext) -> Candidates:
        if self.is_noop(ctx):
            return cand
        n = ctx.param("n")
        banned = torch.zeros(cand.batch_size, cand.vocab_size, dtype=torch.bool, device=cand.logits.device)
        for size in torch.unique(n[n > 0]).tolist():  # one pass per distinct n, never per row
            rows = n == size
            history = ctx.history  # read only when a row is on: a batch with none on runs without a history
            assert history is not None  # needs_history() is declared, so the chain passes it
            banned[rows] = banned_by_ngrams(history[rows], int(size), cand.vocab_size)
        if not bool(banned.any()):
            return cand
        if cand.ids is not None:
            banned = banned.gather(1, cand.ids)
        return cand.masked(~banned)


@hookimpl
def register_samplers(register):
    register(NoRepeatNGram)
