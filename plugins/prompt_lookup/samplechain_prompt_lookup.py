"""`prompt_lookup`: draft the tokens that followed an earlier occurrence of the row's last n-gram.

transformers' `PromptLookupCandidateGenerator` (`prompt_lookup_num_tokens`): for n from `max_ngram` down to
`min_ngram`, take the row's last n tokens, find their first earlier occurrence in the prompt and the text so far
(left to right), and propose up to `num_tokens` of the tokens that followed it; the largest n with a match wins, no
match is no draft. Quoting, editing and summarising a given text repeat long runs of it, which this finds for free.
Differences from transformers: each row of a batch looks up its own tokens (transformers' works on one sequence),
and a draft is not cut at an eos token (the chain decides whether the eos is kept; a stop ends the row there).
"""

from __future__ import annotations

import attrs
import torch

from samplechain import ConfigError, hookimpl, in_range
from samplechain.drafters import Drafter


@attrs.frozen
class PromptLookupParams:
    num_tokens: int = attrs.field(default=10, validator=in_range(1, None, hint="the longest draft"))
    max_ngram: int = attrs.field(default=3, validator=in_range(1, None))
    min_ngram: int = attrs.field(default=1, validator=in_range(1, None))


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

    def propose(self, row: int, tokens: torch.Tensor, limit: int) -> torch.Tensor:
        p = self.params
        n_tokens = tokens.shape[0]
        want = min(p.num_tokens, limit)
        for n in range(min(p.max_ngram, n_tokens - 1), p.min_ngram - 1, -1):
            # windows: (n_tokens - n + 1, n); the last one is the n-gram itself, never its own match
            windows = tokens.unfold(0, n, 1)[:-1]
            hits = (windows == tokens[-n:]).all(dim=1).nonzero().flatten()
            if len(hits):
                start = int(hits[0]) + n  # the first occurrence, as transformers takes it
                return tokens[start : start + want]
        return tokens[:0]


@hookimpl
def register_drafters(register):
    register(PromptLookup)
