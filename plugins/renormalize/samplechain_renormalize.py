"""`renormalize`: transformers' LogitNormalization: logits become log_softmax over the remaining candidates.

Removed candidates stay -inf; the result is the log-probability of each candidate. The argmax is unchanged.
transformers runs it last (`renormalize_logits=True`), after the warpers, so reported scores are normalised.
No parameters.
"""

from __future__ import annotations

from samplechain import Candidates, Sampler, Stage, StepContext, hookimpl
from samplechain.filters import log_softmax64


class Renormalize(Sampler):
    name = "renormalize"
    sync_free = True  # no host read in a sync-free step (plugins/cuda/tests/test_sync_free.py)
    stage = Stage.TRANSFORM
    summary = "log-softmax over the remaining candidates"

    def is_argmax_invariant(self) -> bool:
        return True

    def apply(self, cand: Candidates, ctx: StepContext) -> Candidates:
        # not torch's float32 log_softmax: its rounding follows the row's width, so the batch (see log_softmax64)
        return cand.replace_logits(log_softmax64(cand.logits).float(), is_sorted=cand.is_sorted)


@hookimpl
def register_samplers(register):
    register(Renormalize)
