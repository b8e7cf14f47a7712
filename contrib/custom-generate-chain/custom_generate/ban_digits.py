"""`ban_digits`: mask every token whose decoded text contains a digit (0-9)."""

import torch

from samplechain import Candidates, Sampler, Stage, StepContext, hookimpl


class BanDigits(Sampler):
    name = "ban_digits"
    stage = Stage.TRANSFORM
    role = "mask"
    summary = "mask tokens whose text contains a digit"

    def __init__(self, params):
        super().__init__(params)
        self.banned = None

    def prepare(self, setup):
        if setup.tokenizer is None:
            return
        tok = setup.tokenizer
        ids = [i for i in range(len(tok)) if any(c.isdigit() for c in tok.decode([i]))]
        self.banned = torch.tensor(ids, dtype=torch.int64)

    def apply(self, cand: Candidates, ctx: StepContext) -> Candidates:
        if self.banned is None:
            raise ValueError("ban_digits needs the tokenizer: run it through generate() or chain.prepare(tokenizer=)")
        hit = torch.isin(cand.token_ids(), self.banned.to(cand.logits.device))
        return cand.masked(~hit)


@hookimpl
def register_samplers(register):
    register(BanDigits)
