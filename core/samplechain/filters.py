"""Building blocks shared by filter samplers (import them as `from samplechain.filters import ...`).

- `kth_largest(cand, backend, k)`: the k[b]-th largest logit of each row, from the sorted order or one partial
  top-k.
- `with_min_keep(cand, backend, keep, min_keep)`: a keep mask widened so that the min_keep most likely candidates
  survive, with every candidate tied with the min_keep-th in logit (transformers' `min_tokens_to_keep` of
  EpsilonLogitsWarper / EtaLogitsWarper); min_keep 0 counts as 1.

For filters whose survivors are a prefix of the descending order, see `Candidates.keep_best`.
"""

from __future__ import annotations

import torch

from .contracts import Backend, Candidates

__all__ = ["kth_largest", "with_min_keep"]


def kth_largest(cand: Candidates, backend: Backend, k: torch.Tensor) -> torch.Tensor:
    """(B,) the k[b]-th largest logit of each row (k >= 1, clamped to the width)."""
    k = torch.clamp(k, 1, cand.width)
    if cand.is_sorted:
        return cand.logits.gather(1, (k - 1)[:, None]).squeeze(1)
    values, _ = backend.topk(cand.logits, int(k.max()))
    return values.gather(1, (k - 1)[:, None]).squeeze(1)


def with_min_keep(cand: Candidates, backend: Backend, keep: torch.Tensor, min_keep: torch.Tensor) -> torch.Tensor:
    """(B, K) keep | (logit >= the min_keep[b]-th largest logit of the row): ties at the boundary all survive."""
    floor = kth_largest(cand, backend, min_keep)
    return keep | (cand.logits >= floor[:, None])
