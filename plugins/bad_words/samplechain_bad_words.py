"""`bad_words`: transformers' NoBadWordsLogitsProcessor.

`ids` is an array of token-id sequences. A one-token sequence is always banned (-inf); a longer one bans its
last token when the row's history ends with the sequence's other tokens. Sequences equal to `[eos]` for an id in
`eos_ids` are dropped, as transformers drops them. Chain-level; empty = no-op.
`words` (strings, vLLM's `bad_words`) are tokenised in `prepare` by the core's string service
(`samplechain.strings.word_token_ids`) as vLLM's `SamplingParams.update_from_tokenizer` does: each word without
special tokens as `word.lstrip()`, and again as `" " + word.lstrip()`, the second kept only
when it has as many tokens as the first and starts with another token (a distinct word-start token).
Difference: transformers skips a sequence longer than the (padded) input; here a sequence applies as soon as the
row has as many real tokens as its prefix; left padding (-1) never matches.
"""

from __future__ import annotations

import attrs

from samplechain import Candidates, Sampler, SamplingError, Stage, StepContext, hookimpl
from samplechain.strings import word_token_ids
from samplechain.tokens import SequenceMatcher


def _check_ids(_inst, attr: attrs.Attribute, value) -> None:
    for seq in value:
        if not seq:
            raise ValueError("every sequence needs at least one token id")
        if any(t < 0 for t in seq):
            raise ValueError(f"token ids must be non-negative, got {list(seq)}")


def _check_words(_inst, _attr: attrs.Attribute, value) -> None:
    if any(not w.strip() for w in value):
        raise ValueError("every bad word needs a non-blank string")


@attrs.frozen
class BadWordsParams:
    ids: tuple[tuple[int, ...], ...] = attrs.field(default=(), validator=_check_ids)
    eos_ids: tuple[int, ...] = attrs.field(default=())
    words: tuple[str, ...] = attrs.field(default=(), validator=_check_words)


class BadWords(Sampler):
    name = "bad_words"
    sync_free = True  # no host read in a sync-free step (plugins/cuda/tests/test_sync_free.py)
    stage = Stage.TRANSFORM
    role = "mask"
    Params = BadWordsParams
    summary = "ban the last token of a sequence whose prefix the row ends with"

    def __init__(self, params: BadWordsParams) -> None:
        super().__init__(params)
        self._words_ready = not params.words
        self._build(params.ids)

    def _build(self, seqs) -> None:
        eos = {(e,) for e in self.params.eos_ids}
        pairs = [(tuple(s), float("-inf")) for s in dict.fromkeys(tuple(s) for s in seqs) if s not in eos]
        self.matcher = SequenceMatcher(pairs, self.qualified_name())

    def prepare(self, setup) -> None:
        if self.params.words and setup.tokenizer is not None:
            self._build([*self.params.ids, *word_token_ids(setup.tokenizer, self.params.words)])
            self._words_ready = True

    def needs_history(self) -> bool:
        # with words a sequence may be longer than one token once they are tokenised: read the history
        return bool(self.params.words) or any(p > 0 for p in self.matcher.groups)

    def apply(self, cand: Candidates, ctx: StepContext) -> Candidates:
        if not self._words_ready:
            raise SamplingError(
                f"{self.qualified_name()}: words need a tokenizer: run the chain through generate() "
                "or call chain.prepare(tokenizer=...) first, or give token ids as `ids`"
            )
        if not self.matcher.groups:
            return cand
        ban = self.matcher.bias(ctx.history, cand.vocab_size, cand.batch_size, cand.logits.device) < 0
        if cand.ids is not None:
            ban = ban.gather(1, cand.ids)
        return cand.masked(~ban)


@hookimpl
def register_samplers(register):
    register(BadWords)
