"""`min_new_tokens`: transformers' MinNewTokensLengthLogitsProcessor (vLLM's `min_tokens`).

While a row has generated fewer than `n` tokens, the ids in `eos_ids` (eos and any stop token ids) are masked
(-inf). `n` may differ per row (`min_new_tokens`, `min_tokens`); 0 disables. `eos_ids` is chain-level; empty (the
default) means the generation's eos ids (tokenizer / generation config / model config, given by `prepare`).
As in vLLM, `n` also holds back the content stopping criteria (eos, stop strings, stop_regex, repetition: see
`StoppingCriterion.min_new_tokens_gate`); length limits still apply.
"""

from __future__ import annotations

import attrs

from samplechain import Candidates, EosIds, Sampler, Stage, StepContext, hookimpl, in_range, token_ids_field


@attrs.frozen
class MinNewTokensParams:
    eos_ids: tuple[int, ...] = token_ids_field()  # empty: the generation's eos ids
    n: int = attrs.field(default=0, validator=in_range(0, None, hint="0 disables"))


class MinNewTokens(EosIds, Sampler):
    name = "min_new_tokens"
    stage = Stage.TRANSFORM
    role = "mask"
    Params = MinNewTokensParams
    request_aliases = {"min_new_tokens": "n", "min_tokens": "n"}
    min_new_tokens_field = "n"  # vLLM's min_tokens: eos, stop strings, stop_regex, repetition wait for it too
    summary = "mask eos / stop ids until a row has generated n tokens"

    def needs_history(self) -> bool:
        return True

    def is_noop(self, ctx: StepContext) -> bool:
        return ctx.scalar("n") == 0

    def apply(self, cand: Candidates, ctx: StepContext) -> Candidates:
        if self.is_noop(ctx):
            return cand
        early = ctx.generated() < ctx.param("n")  # (B,)
        if not bool(early.any()):
            return cand
        hit = cand.holding(self.eos_tensor(cand.logits.device))
        return cand.masked(~(hit & early[:, None]))


@hookimpl
def register_samplers(register):
    register(MinNewTokens)
