"""eta.v1 against transformers' EtaLogitsWarper (eta = min(epsilon, sqrt(epsilon) * exp(-entropy))).

Equivalence level: probabilities within 1e-5 (kept sets equal except tokens whose probability is within float
rounding of the cutoff: the oracle runs on float64 logits, we compute float64 probabilities of the float32 logits).
Kept logits are bitwise the input logits, removed ones -inf. The tests are samplechain.tools.testing.CutoffWarperTests
(shared with epsilon): random logits, float16 / bfloat16 input with ties, -inf entries, min_keep, after top_k,
per-row parameters equal rows alone, 0 is a bitwise no-op, bad values refused.
"""

from __future__ import annotations

from transformers.generation.logits_process import EtaLogitsWarper

from samplechain.tools.testing import CutoffWarperTests


class TestEta(CutoffWarperTests):
    sampler, field, alias, warper = "eta", "epsilon", "eta_cutoff", EtaLogitsWarper
