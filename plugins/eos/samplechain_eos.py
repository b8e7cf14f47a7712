"""`eos`: a row stops when it emits one of the end-of-sequence ids (transformers' EosTokenCriteria).

`ids = []` (the default) takes them, once per generation, from the tokenizer's eos_token_id, the generation
config's eos_token_id (an int or a list) and the model config's, in that order, without duplicates. When none of
them has one, a warning says so and the criterion never fires.
"""

from __future__ import annotations

import warnings

import attrs
import torch

from samplechain import StopContext, StoppingCriterion, StopSetup, hookimpl, token_id_list


def _non_negative(_inst, _attr, value) -> None:
    bad = [v for v in value if v < 0]
    if bad:
        raise ValueError(f"token ids must be >= 0 (got {bad[0]})")


@attrs.frozen
class EosParams:
    ids: tuple[int, ...] = attrs.field(default=(), validator=_non_negative)


class Eos(StoppingCriterion):
    name = "eos"
    Params = EosParams
    summary = "stop a row at an end-of-sequence token"
    min_new_tokens_gate = "tokens"  # vLLM's check_stop: not before min_tokens

    def __init__(self, params: EosParams) -> None:
        super().__init__(params)
        self._ids: torch.Tensor | None = None

    def prepare(self, setup: StopSetup) -> None:
        found = list(self.params.ids)
        if not found:
            for source in (
                getattr(setup.tokenizer, "eos_token_id", None),
                getattr(setup.generation_config, "eos_token_id", None),
                getattr(setup.model_config, "eos_token_id", None),
            ):
                found += [i for i in token_id_list(source) if i not in found]
        if not found:
            warnings.warn(
                "eos: no eos token id in the tokenizer, the generation config or the model config; this "
                "criterion never fires (give ids = [...] in the chain's stop list)",
                UserWarning,
                stacklevel=2,
            )
        self._ids = torch.tensor(found, dtype=torch.int64, device=setup.device)

    def resolved_ids(self) -> list[int]:
        return [] if self._ids is None else self._ids.tolist()

    def check(self, ctx: StopContext) -> torch.Tensor:
        if self._ids is None:
            self.prepare(ctx.setup)
        assert self._ids is not None  # prepare() sets it
        return torch.isin(ctx.token_ids, self._ids.to(ctx.token_ids.device))


@hookimpl
def register_stopping_criteria(register):
    register(Eos)
