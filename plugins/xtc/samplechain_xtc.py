"""`xtc`: Exclude Top Choices: with probability `probability` per step, remove every token whose probability is
at least `threshold`, except the least likely of them.

llama.cpp's `llama_sampler_xtc` (src/llama-sampler.cpp), per row:
- `probability <= 0` or `threshold > 0.5` is a no-op (above 0.5 at most one token can meet the threshold), as is
  a row with fewer than two candidates;
- a uniform draw u per row and step; XTC acts iff u < probability (webui's `random.random() >= probability`
  skips; llama.cpp skips when u > probability: the same but for u == probability exactly). The draw is
  counter-based, keyed by (seed, stream, position), so a seeded request draws the same alone or in any batch;
- p = softmax over the current candidates (-inf ones count as removed); the m tokens with p >= threshold are a
  prefix of the descending order; when m >= 2 the m - 1 most likely are removed, unless fewer than `min_keep`
  candidates would remain (then the row is left as is, as llama.cpp). Equal probabilities at the least likely
  qualifying level keep the highest token id (llama.cpp's sort leaves this unspecified; here the order is the
  other filters' one, equal logits by ascending id, whose last is the highest id), in any batch and on any backend.

`keep_special` (text-generation-webui's `XTCLogitsWarper`): when "\\n" or an eos token would be removed, the row is
left unchanged for that step. The ids come from `prepare()`: the last token of the tokenizer's encoding of "\\n"
and the generation's eos ids (only the eos ids without a tokenizer).

Probabilities are compared in logit space (`logit >= log(threshold) + logsumexp`), in float64 (llama.cpp uses
float32); rows of at least `filters.WIDE` unsorted candidates read only the qualifying candidates
(`Backend.at_least`), on the rows that act this step, at the lower edge of a ~1e-6 bound on the float64 cut (float32
exponentials summed in float64); a row with a logit inside the bound takes the float64 cut itself, so the same
candidates qualify at every width.
"""

from __future__ import annotations

import math

import attrs
import torch

from samplechain import (
    Backend,
    Candidates,
    Sampler,
    SamplerSetup,
    Stage,
    StepContext,
    filters,
    finite,
    hookimpl,
    in_range,
    seed_field,
)
from samplechain.contracts import in_sync_free_step

NEG_INF = float("-inf")


@attrs.frozen
class XtcParams:
    probability: float = attrs.field(validator=[finite, in_range(0.0, 1.0, hint="0 disables")])
    threshold: float = attrs.field(default=0.1, validator=[finite, in_range(0.0, 1.0, hint="> 0.5 disables")])
    min_keep: int = attrs.field(default=1, validator=in_range(0, None))
    keep_special: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    seed: int | None = seed_field()


def newline_id(tokenizer) -> int | None:
    """The last token of the tokenizer's encoding of "\\n" (text-generation-webui's choice), or None."""
    try:
        ids = tokenizer.encode("\n", add_special_tokens=False)
    except TypeError:  # a tokenizer without the keyword
        ids = tokenizer.encode("\n")
    ids = list(ids)
    return int(ids[-1]) if ids else None


def xtc_cut(logits: torch.Tensor, threshold: torch.Tensor) -> torch.Tensor:
    """(B,) float64 log(threshold) + logsumexp of each row's finite logits: a candidate qualifies (p >= threshold)
    iff its logit is >= it. log(0) = -inf: every finite candidate qualifies."""
    x = logits.double()
    valid = torch.isfinite(x)
    top = torch.where(valid, x, torch.full_like(x, NEG_INF)).amax(dim=-1, keepdim=True)
    lse = top + torch.log(torch.where(valid, torch.exp(x - top), torch.zeros_like(x)).sum(dim=-1, keepdim=True))
    return torch.log(threshold.double()) + lse[:, 0]


def removal_mask(logits: torch.Tensor, threshold: torch.Tensor, ids: torch.Tensor | None = None) -> torch.Tensor:
    """(B, K) bool: the candidates XTC removes when it acts: every candidate with p >= threshold except the least
    likely of them (ties: the highest token id is kept; ids None: id = position); nothing when fewer than two
    qualify."""
    x = logits.double()
    valid = torch.isfinite(x)
    qualify = valid & (x >= xtc_cut(logits, threshold)[:, None])
    lowest = torch.where(qualify, x, torch.full_like(x, math.inf)).amin(dim=-1, keepdim=True)
    ids = torch.arange(x.shape[1], device=x.device)[None, :] if ids is None else ids
    last = torch.where(qualify & (x == lowest), ids, -1).amax(dim=-1, keepdim=True)
    remove = qualify & (ids != last)
    return remove & (qualify.sum(dim=-1, keepdim=True) >= 2)


def cut_bounds(logits: torch.Tensor, threshold: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(low, high) (B,) float64 with low <= xtc_cut <= high, without a float64 copy of the rows: e**(x - top) in
    float32 is within (4 + |x - top|) units of float32 roundoff u of its value (one rounding of x - top, an exp
    within 1 ulp, 2 on CUDA), so their float64 sum is within u * (4 + E_p[top - x]) <= u * (4 + log n) relative
    (E_p[top - x] is at most the entropy), and log Z within twice that. Rows whose maximum is not finite (NaN,
    +inf) get xtc_cut itself for both."""
    top = logits.amax(dim=-1)
    if not bool(torch.isfinite(top).all()):
        cut = xtc_cut(logits, threshold)
        return cut, cut
    total = torch.exp(logits - top[:, None]).sum(dim=-1, dtype=torch.float64)
    scale = torch.log(threshold.double())  # -inf for threshold 0: every finite candidate qualifies
    cut = scale + top.double() + torch.log(total)
    margin = 2.0**-24 * (8.0 + 2.0 * math.log(logits.shape[1])) + 2.0**-40 * (
        top.double().abs() + torch.where(torch.isfinite(scale), scale.abs(), 0.0)
    )
    return cut - margin, cut + margin


def wide_removals(
    logits: torch.Tensor, threshold: torch.Tensor, backend: Backend, ids: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`removal_mask` for wide unsorted rows without a (B, K) mask: (rows, positions) of the removed candidates and
    the (B,) count removed per row. The qualifying candidates are the few >= the cut, read in descending order by
    `at_least` at the lower edge of cut_bounds; only a row with a logit between the edges takes removal_mask's
    float64 cut (xtc_cut) itself, so both paths qualify the same candidates. Of the least likely level, the
    highest token id stays, as in removal_mask."""
    low, high = cut_bounds(logits, threshold)
    down = low.float()
    down = torch.where(down.double() > low, torch.nextafter(down, torch.full_like(down, -math.inf)), down)
    # threshold 0 (log 0 = -inf) qualifies every finite candidate, never a removed (-inf) one
    down = down.clamp(min=torch.finfo(torch.float32).min)
    values, positions, counts = backend.at_least(logits, down)
    j = torch.arange(values.shape[1], device=logits.device)[None, :]
    inside = j < counts[:, None]
    unsure = ((values.double() < high[:, None]) & inside).any(dim=-1)
    if bool(unsure.any()):  # a logit between the edges: the float64 cut decides those rows
        rows = unsure.nonzero().flatten()
        exact = xtc_cut(logits[rows], threshold[rows])
        counts = counts.clone()
        counts[rows] = ((values[rows].double() >= exact[:, None]) & inside[rows]).sum(dim=-1)
        inside = j < counts[:, None]
    lowest = values.gather(1, (counts - 1).clamp(min=0)[:, None])
    tokens = positions if ids is None else ids.gather(1, positions)
    last = torch.where(inside & (values == lowest), tokens, -1).amax(dim=-1, keepdim=True)
    remove = inside & (tokens != last) & (counts >= 2)[:, None]
    rows, cols = remove.nonzero(as_tuple=True)
    return rows, positions[rows, cols], remove.sum(dim=-1)


class Xtc(Sampler):
    name = "xtc"
    sync_free = True  # no host read in a sync-free step (plugins/cuda/tests/test_sync_free.py)
    stage = Stage.FILTER
    Params = XtcParams
    request_aliases = {
        "xtc_probability": "probability",
        "xtc_threshold": "threshold",
        "min_keep": "min_keep",
        "seed": "seed",
    }
    summary = "exclude top choices: with some probability, remove all but the least likely token above a threshold"

    _protected: tuple[int, ...] = ()

    def prepare(self, setup: SamplerSetup) -> None:
        ids = list(setup.eos_token_ids)
        if setup.tokenizer is not None:
            nl = newline_id(setup.tokenizer)
            if nl is not None:
                ids.append(nl)
        self._protected = tuple(sorted(set(int(i) for i in ids)))

    def protected_ids(self) -> tuple[int, ...]:
        """The ids `keep_special` protects (from the last `prepare()`)."""
        return self._protected

    def is_noop(self, ctx: StepContext) -> bool:
        s = ctx.scalar
        return (s("probability") is not None and s("probability") <= 0.0) or (
            s("threshold") is not None and s("threshold") > 0.5
        )

    def apply(self, cand: Candidates, ctx: StepContext) -> Candidates:
        if self.is_noop(ctx):
            return cand
        probability, threshold = ctx.param("probability"), ctx.param("threshold")
        logits = cand.logits
        draw_ids = torch.zeros(cand.batch_size, 1, dtype=torch.int64, device=logits.device)
        u = ctx.backend.uniform(ctx.param("seed"), ctx.positions, draw_ids, ctx.stream)[:, 0]  # (B,) float64
        act = (probability > 0.0) & (threshold <= 0.5) & (u < probability.double())
        sync_free = in_sync_free_step()  # no host read: the dense float64 mask on every row, whether it acts or not
        if not sync_free and not bool(act.any()):
            return cand
        if not cand.is_sorted and cand.width >= filters.WIDE and not sync_free:
            return self._wide(cand, ctx, act)
        n = torch.isfinite(logits).sum(dim=-1)
        act &= n >= 2
        remove = removal_mask(logits, threshold, cand.ids) & act[:, None]
        removed = remove.sum(dim=-1)
        act &= (n - removed) >= ctx.param("min_keep")  # llama.cpp: too few left -> the row is unchanged
        if self._protected:
            special = torch.tensor(self._protected, dtype=torch.int64, device=logits.device)
            hits = (remove & torch.isin(cand.token_ids(), special)).any(dim=-1)
            act &= ~(ctx.param("keep_special") & hits)
        remove &= act[:, None]
        if not sync_free and not bool(remove.any()):
            return cand
        return cand.masked(~remove)  # sorted rows stay sorted, the survivors moved to the front

    def _wide(self, cand: Candidates, ctx: StepContext, act: torch.Tensor) -> Candidates:
        """The rows that act: their removed candidates (wide_removals) set to -inf in the chain's own logits."""
        rows = act.nonzero().flatten()
        sub = cand.logits.index_select(0, rows) if len(rows) < cand.batch_size else cand.logits
        n = torch.isfinite(sub).sum(dim=-1)
        ids = None if cand.ids is None else cand.ids.index_select(0, rows)
        removed_rows, positions, removed = wide_removals(sub, ctx.param("threshold")[rows], ctx.backend, ids)
        ok = (n >= 2) & ((n - removed) >= ctx.param("min_keep")[rows])  # llama.cpp: too few left -> unchanged
        if self._protected:
            special = torch.tensor(self._protected, dtype=torch.int64, device=sub.device)
            tokens = positions if cand.ids is None else cand.ids[rows[removed_rows], positions]
            hit = torch.isin(tokens, special)
            spoiled = torch.zeros_like(ok).index_fill_(0, removed_rows[hit], True)
            ok &= ~(ctx.param("keep_special")[rows] & spoiled)
        take = ok[removed_rows]
        if not bool(take.any()):
            return cand
        out = cand.owned(ctx.backend)
        out.logits[rows[removed_rows[take]], positions[take]] = NEG_INF
        return out


@hookimpl
def register_samplers(register):
    register(Xtc)
