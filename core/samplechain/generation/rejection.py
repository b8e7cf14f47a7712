"""Rejection mode's draw: speculative sampling's min(1, p / q) test with residual resampling, on counter-based
noise of its own, so that a seeded request draws the same in any batch."""

from __future__ import annotations

from typing import Any

import torch

from ..engine.mixed import MixedStore
from ..rng import SEED_MAX, gumbel, uniform

__all__ = ["noise_of", "rejection_draw"]

_ACCEPT_STREAM, _RESIDUAL_STREAM = 0x5EC1, 0x5EC2  # rejection mode's noise: streams no sampler uses


def rejection_draw(
    logp: torch.Tensor, q: torch.Tensor, draft: torch.Tensor, seed: torch.Tensor, position: torch.Tensor
) -> torch.Tensor:
    """Speculative sampling's test (Leviathan et al.; Chen et al.), one row per request: keep draft[i] with
    probability min(1, p / q) at it, else draw from max(p - q, 0) renormalised (p where that is empty). The
    uniform and the residual's Gumbel noise are counter-based at (seed, position), streams of their own: seeded,
    and the same in any batch. The result is distributed as p whatever q is.

    logp: (n, V) float64 the chain's processed log-probabilities; q: (n, V) the drafter's probabilities; draft,
    seed, position: (n,) int64. -> (n,) int64."""
    p = logp.exp()
    at = draft[:, None]
    p_d, q_d = p.gather(1, at)[:, 0], q.gather(1, at)[:, 0]
    u = uniform(seed, position, at, stream=_ACCEPT_STREAM)[:, 0]
    kept = u * q_d < p_d  # u < p/q without dividing by a q of 0 (a guess its drafter called impossible)
    residual = (p - q).clamp_(min=0.0)
    empty = residual.sum(dim=1) <= 0.0
    residual[empty] = p[empty]
    ids = torch.arange(p.shape[1]).expand(p.shape[0], -1)
    other = (residual.log() + gumbel(seed, position, ids, stream=_RESIDUAL_STREAM)).argmax(dim=1)
    return torch.where(kept, draft, other)


def noise_of(store: Any, request_ids: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """The requests' seeds (their chain's `seed`; a fresh one per call where it has none) and RNG positions; in a
    mixed batch (a MixedStore) each request's from its own chain's store."""
    if isinstance(store, MixedStore):
        seed = torch.empty(len(request_ids), dtype=torch.int64)
        position = torch.empty(len(request_ids), dtype=torch.int64)
        for key, rows in store.groups(request_ids).items():
            index = torch.tensor(rows, dtype=torch.int64)
            part = noise_of(store.stores[key], [request_ids[i] for i in rows])
            seed.index_copy_(0, index, part[0])
            position.index_copy_(0, index, part[1].to(torch.int64))
        return seed, position
    view = store.batch(request_ids)
    position = store.positions(view).cpu()
    targets = store.layout.aliases.get("seed")
    if not targets:
        return torch.randint(0, SEED_MAX, (len(request_ids),), dtype=torch.int64), position
    entry, field = targets[0]
    return view.params[entry][field].cpu().to(torch.int64), position
