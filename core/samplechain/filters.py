"""Building blocks shared by filter samplers (import them as `from samplechain.filters import ...`).

- `kth_largest(cand, backend, k)`: the k[b]-th largest logit of each row, from the sorted order or one partial
  top-k.
- `with_min_keep(cand, backend, keep, min_keep)`: a keep mask widened so that the min_keep most likely candidates
  survive, with every candidate tied with the min_keep-th in logit (transformers' `min_tokens_to_keep` of
  EpsilonLogitsWarper / EtaLogitsWarper); min_keep 0 counts as 1.

- `bucket_keys(values)`, `bucket_sums(keys, weights)`, `bucket_edge(keys)`: a sort-free histogram of
  non-negative float32 values (probabilities, distances) by their bit pattern, for cuts by mass (top_p, typical);
  `bucket_mass(values, backend)` the values' own histogram, by the backend's kernel (`BUCKET_MASS`) where it has
  one.
- `log_softmax64(x)`: float64 log-probabilities of each row whose rounding does not follow the row's width or
  candidate order (a row alone and in a batch get the same float32 values).
- `patched_top(cand, changes, counts, backend)`: the counts[b] best candidates of rows changed at a few positions,
  without writing the change into a copy of the rows (the executor's penalties -> top_k fusion).
- `divided(cand, t, cold)`: logits / t per row, rows with t <= 0 keeping only their first maximum (llama.cpp's
  temperature 0), without a host read (temperature, temp_ext).

- `at_tokens(values, ids, token_ids)`: each row's value at a given token among its candidates, 0 where the row
  has none (a selector's accept of a token it did not draw: mirostat's surprise).
- `SurpriseSteering`: the base of the mirostat selectors (v1 and v2): mu, a bound on surprise that each drawn
  token moves toward the target tau, the move committed when the chain accepts the step; a subclass says which
  candidates a row keeps under its mu.

For filters whose survivors are a prefix of the descending order, see `Candidates.keep_best`.
"""

from __future__ import annotations

from typing import Any

import torch

from .contracts import BUCKET_MASS, Backend, Candidates, Sampler, Stage, StepContext

__all__ = [
    "BUCKETS",
    "MASS_MARGIN",
    "WIDE",
    "SurpriseSteering",
    "at_tokens",
    "bucket_edge",
    "bucket_keys",
    "bucket_mass",
    "bucket_sums",
    "divided",
    "kth_largest",
    "log_softmax64",
    "patched_top",
    "with_min_keep",
]

WIDE = 16384  # rows at least this wide take the fast paths (chunked reads, partial top-k); read at call time
_BUCKET_SHIFT = 20  # float32 bits >> 20: sign, exponent and 3 mantissa bits
BUCKETS = 1 << (31 - _BUCKET_SHIFT)  # 2048 buckets of non-negative float32 values, ~9% wide, in value order
MASS_MARGIN = 1e-4  # bucket sums are float32: aim past a mass by this much so a wanted set is surely covered


def log_softmax64(x: torch.Tensor) -> torch.Tensor:
    """(B, K) float64 log_softmax of the float32 rows x, -inf where x is -inf.

    A float32 softmax's sums round differently with the row's width and candidate order, which follow the batch
    after a truncation. Here the sum is float64 and taken over the row without one of its maxima, m + log1p(s): s is
    tiny next to 1 exactly where a plain log(1 + s) would lose it (a dominant token's log-probability, -s, would
    then carry the sum's rounding), so cast to float32 a row gets the same values alone and in any batch.
    (Rows without a finite entry give NaN, as torch's.)"""
    x = x.double()
    top = x.amax(dim=-1, keepdim=True)
    first = (x == top).int().argmax(dim=-1, keepdim=True)  # one of the maxima: its exp(0) = 1 is the log1p's 1
    rest = torch.exp(x - top).scatter_(1, first, 0.0).sum(dim=-1, keepdim=True)
    return x - top - torch.log1p(rest)


def divided(cand: Candidates, t: torch.Tensor, cold: bool) -> Candidates:
    """The candidates' logits divided by t (B,) per row (IEEE float32, as x / t); rows with t <= 0 keep only their
    first maximum, its logit unchanged (of equal maxima the lowest id; sorted rows: moved to the front). cold:
    whether any row may have t <= 0 (a caller in a sync-free step takes it from the batch's bounds)."""
    t = t[:, None]
    hot = t > 0
    logits = cand.logits / torch.where(hot, t, torch.ones_like(t))
    if cold:
        cand, top = cand.best_first()
        cold_keep = torch.zeros_like(logits, dtype=torch.bool).scatter_(1, top, True)
        logits = logits.masked_fill(~hot & ~cold_keep, float("-inf"))
    return cand.replace_logits(logits, is_sorted=cand.is_sorted)  # t > 0 never reorders; t = 0 keeps the front


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


_FIRST_EXTRA = 16


def patched_top(
    cand: Candidates, changes: tuple[torch.Tensor, torch.Tensor, torch.Tensor], counts: torch.Tensor, backend: Backend
) -> Candidates | None:
    """The counts[b] largest logits of each row of `cand` (the full vocabulary) after `changes` = (ids, new logits,
    mask) (B, L), each id at most once per row, are applied; sorted and compacted, as top_k leaves them. None when
    a row has fewer finite candidates than it keeps (the caller applies the change and filters the usual way).

    The k best of the changed row are the changed tokens (with their new logits) and unchanged ones: the best
    unchanged tokens, which are the best unchanged of the original row. A partial top-k of k + m of the original
    holds k unchanged tokens unless more than m of its entries are changed ones; m = 16 first, then L (which
    always suffices). One partial top-k of ~k instead of a (B, V) copy and a top-k of it.
    """
    ids, new, mask = changes
    width = int(mask.sum(dim=1).max())  # compact the changes: the masked ones first, as many columns as needed
    order = torch.argsort((~mask).to(torch.uint8), dim=1, stable=True)[:, :width]
    ids, new, mask = ids.gather(1, order), new.gather(1, order), mask.gather(1, order)
    kmax = int(counts.max())
    for extra in (min(width, _FIRST_EXTRA), width):  # a few more than k first; k + L always suffices
        values, index = backend.topk(cand.logits, min(kmax + extra, cand.width))
        changed = ((index[:, :, None] == ids[:, None, :]) & mask[:, None, :]).any(dim=-1)  # (B, J)
        if bool(((~changed).sum(dim=1) >= counts).all()) or index.shape[1] == cand.width:
            break  # every row's k best unchanged tokens are among these
    pool = torch.cat([values.masked_fill(changed, float("-inf")), new.masked_fill(~mask, float("-inf"))], dim=1)
    positions = torch.cat([index, ids], dim=1)
    top, where = torch.topk(pool, kmax, dim=-1)
    if not bool(torch.isfinite(top).all()):  # -inf fillers could repeat an id: leave such rows to the usual path
        return None
    # a tie at a row's cut is settled by token id (contracts.settle_ties), which needs the whole changed row: when
    # the pool holds more of the cut value than the row keeps, or tokens outside the pool could equal it, the
    # usual path (apply the change, then top_k) decides instead
    cut = top.gather(1, (counts - 1)[:, None])
    kept_equal = ((top == cut) & (torch.arange(kmax, device=top.device)[None, :] < counts[:, None])).sum(dim=1)
    if bool(((pool == cut).sum(dim=1) > kept_equal).any() or (cut[:, 0] <= values[:, -1]).any()):
        return None
    return Candidates(top, cand.ids_at(positions.gather(1, where)), cand.vocab_size, True, True).keep_first(counts)


def bucket_keys(values: torch.Tensor) -> torch.Tensor:
    """(B, K) int64 bucket of each non-negative finite float32 value: its bit pattern >> 20, monotone in the value
    (a NaN, as rows that overflowed give, falls in some bucket: the step fails where its logprob is checked)."""
    return ((values.view(torch.int32) >> _BUCKET_SHIFT) & (BUCKETS - 1)).long()


def bucket_sums(keys: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """(B, BUCKETS) the sum of weights (B, K) in each bucket of keys (B, K)."""
    out = torch.zeros(keys.shape[0], BUCKETS, dtype=weights.dtype, device=weights.device)
    return out.scatter_add_(1, keys, weights)


def bucket_mass(values: torch.Tensor, backend: Backend | None = None) -> torch.Tensor:
    """(B, BUCKETS) float32: bucket_sums(bucket_keys(values), values) for non-negative float32 values (B, K), the
    sums in each row's order as scatter_add's: by the backend's BUCKET_MASS kernel where it has one (the cpu
    backend's compiled loop: no (B, K) int64 keys), else those torch ops. The same values either way."""
    kernel = backend.kernel(BUCKET_MASS) if backend is not None else None
    found = kernel(values) if kernel is not None else None
    return found if found is not None else bucket_sums(bucket_keys(values), values)


def bucket_edge(keys: torch.Tensor) -> torch.Tensor:
    """float64 smallest value of each bucket in keys (a key past the last float32 gives float32's largest)."""
    return (keys << _BUCKET_SHIFT).clamp(max=0x7F7FFFFF).to(torch.int32).view(torch.float32).double()


def at_tokens(values: torch.Tensor, ids: torch.Tensor | None, token_ids: torch.Tensor) -> torch.Tensor:
    """(B,) each row's value at token_ids (B,) among candidates of these ids (None: the full vocabulary); 0 where a
    row has no such candidate."""
    width = values.shape[1]
    if ids is None:
        inside = (token_ids >= 0) & (token_ids < width)
        found = values.gather(1, token_ids.clamp(0, width - 1)[:, None]).squeeze(1)
    else:
        hit = ids == token_ids[:, None]  # at most one True per row
        inside = hit.any(dim=1)
        found = values.gather(1, hit.to(torch.int32).argmax(dim=1, keepdim=True)).squeeze(1)
    return torch.where(inside, found, torch.zeros_like(found))


class SurpriseSteering(Sampler):
    """Base of llama.cpp's mirostat selectors (v1 and v2): per row, keep the candidates `kept()` allows under the
    row's mu, draw among them and move mu by the drawn token's surprise, mu <- mu - eta * (-log2 p'(token) - tau),
    p' the kept candidates' softmax (float64: a float32 sum's rounding would follow the row's width, so the batch).
    A subclass sets `name`, `Params` (with tau, eta and seed) and the rest of a sampler's class attributes, and
    implements `kept`.

    A request's state holds `mu` and `started` (mu starts at 2 * tau, which depends on the request's tau). `select`
    computes the move and `accept` commits it, so a step sampled with accept=False (or one that fails) leaves mu as
    it was; tokens accepted without a `select` of the same step (forced tokens) leave it unchanged, as llama.cpp's
    mirostat has no accept. A token other than the draw accepted for the step `select` saw (teacher forcing) moves
    mu by its own surprise under p', as though it had been drawn; one outside the kept set leaves mu unchanged."""

    stage = Stage.SELECT
    replaces_truncation = True

    def __init__(self, params: Any) -> None:
        super().__init__(params)
        # (request ids, positions, mu, new mu, drawn ids, kept probabilities, candidate ids) from the last select
        self._pending: tuple | None = None

    def is_stateful(self) -> bool:
        return True

    def state_spec(self) -> dict[str, tuple[torch.dtype, tuple[int, ...], float | int]]:
        return {"mu": (torch.float32, (), 0.0), "started": (torch.bool, (), False)}

    def kept(self, cand: Candidates, ctx: StepContext, mu: torch.Tensor) -> torch.Tensor:
        """(B, W) bool: the candidates a row with mu `mu` (B,) draws among; at least one a row."""
        raise NotImplementedError(f"{self.qualified_name()} does not say which candidates it keeps (kept())")

    @staticmethod
    def mu(ctx: StepContext) -> torch.Tensor:
        """(B,) each row's mu: its state's, or 2 * tau before its first accepted step."""
        return torch.where(ctx.state["started"], ctx.state["mu"], 2.0 * ctx.param("tau"))

    def select(self, cand: Candidates, ctx: StepContext) -> torch.Tensor:
        """(B,) the candidate positions drawn among the kept ones (the noise of the kept tokens only)."""
        mu = self.mu(ctx)
        keep = self.kept(cand, ctx, mu)
        kept = cand.logits.masked_fill(~keep, float("-inf"))
        chosen = cand.draw(keep, ctx, ctx.param("seed"))
        probs = torch.softmax(kept.double(), dim=-1)
        surprise = -torch.log2(probs.gather(1, chosen[:, None]).squeeze(1))
        moved = (mu - ctx.param("eta") * (surprise - ctx.param("tau"))).float()
        drawn = cand.ids_at(chosen[:, None])[:, 0]
        self._pending = (ctx.request_ids, ctx.positions.clone(), mu, moved, drawn, probs, cand.ids)
        return chosen

    def accept(self, ctx: StepContext, token_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """The state to commit for the accepted `token_ids` (B,); nothing when `select` did not see this step."""
        pending, self._pending = self._pending, None
        if pending is None or pending[0] != ctx.request_ids or not torch.equal(pending[1], ctx.positions):
            return {}
        _, _, mu, moved, drawn, probs, ids = pending
        token_ids = token_ids.to(drawn.device)
        p = at_tokens(probs, ids, token_ids)
        given = torch.where(p > 0, (mu - ctx.param("eta") * (-torch.log2(p) - ctx.param("tau"))).float(), mu.float())
        return {"mu": torch.where(token_ids == drawn, moved, given), "started": torch.ones_like(ctx.state["started"])}
