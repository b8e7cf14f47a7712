"""The batched candidate set a step works on (`Candidates`, `StepContext`) and how its cuts settle ties.

Part of the contract (plugins import it through `samplechain` or `samplechain.contracts`): the candidates a
sampler receives and returns, the step's context (parameters, positions, noise), the lowest-id tie rule every cut
shares (`ranked_topk`, `settle_ties`) and whether the step must not wait for the host (`in_sync_free_step`).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar

import attrs
import numpy as np
import torch

from . import rng

__all__ = [
    "Backend",
    "Candidates",
    "StepContext",
    "NoParams",
    "PluginClass",
    "compact_kept",
    "lowest_equal",
    "ranked_keys",
    "ranked_topk",
    "settle_ties",
    "tied_rows",
    "sync_free_step",
    "in_sync_free_step",
]

NEG_INF = float("-inf")


def compact_kept(
    logits: torch.Tensor, keep: torch.Tensor, counts: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The entries of each row where keep (B, V) is True, compacted in column order into (B, max count): values
    (-inf past a row's count), positions and the counts (B,). A shorter row's spare slots take distinct columns
    it does not keep, so positions stay unique per row: the s-th column missing from its ascending survivors is
    s + #{i : col_i - i <= s}."""
    counts = keep.sum(dim=-1) if counts is None else counts
    batch, width = logits.shape[0], int(counts.max()) if counts.numel() else 0
    rows, cols = keep.nonzero(as_tuple=True)  # row-major: each row's entries are contiguous, in column order
    slot = torch.arange(rows.numel(), device=logits.device) - (torch.cumsum(counts, 0) - counts)[rows]
    values = torch.full((batch, width), NEG_INF, dtype=logits.dtype, device=logits.device)
    positions = torch.zeros((batch, width), dtype=torch.int64, device=logits.device)
    values[rows, slot] = logits[rows, cols]
    positions[rows, slot] = cols
    ranks = torch.arange(width, device=logits.device)
    spare = ranks[None, :] >= counts[:, None]
    if bool(spare.any()):
        gaps = torch.where(spare, torch.iinfo(torch.int64).max, positions - ranks)  # non-decreasing per row
        wanted = (ranks[None, :] - counts[:, None]).clamp(min=0)
        positions = torch.where(spare, wanted + torch.searchsorted(gaps, wanted, right=True), positions)
    return values, positions, counts


def tied_rows(values: torch.Tensor, counts: torch.Tensor) -> list[int]:
    """Rows b whose counts[b]-th and next value in values (B, W) (descending) are equal and finite: where keeping
    "the counts[b] best" must choose among equal logits. Small CPU batches are checked with numpy (a few
    microseconds instead of a handful of torch calls: this runs on every top-k / top-p step)."""
    width = values.shape[1]
    if (
        values.device.type == "cpu"
        and counts.device.type == "cpu"
        and values.shape[0] <= 256
        and values.dtype == torch.float32
        and not values.requires_grad
    ):
        v = values.numpy()
        if len(v) <= 8:  # a few rows: plain Python over two values each
            out = []
            for b, c in enumerate(counts.tolist()):
                c = min(max(c, 1), width)
                if c < width and v[b, c - 1] == v[b, c] and v[b, c - 1] > -np.inf:
                    out.append(b)
            return out
        c = np.clip(counts.numpy(), 1, width)
        r = np.arange(len(c))
        at, after = v[r, c - 1], v[r, np.minimum(c, width - 1)]
        return np.flatnonzero((c < width) & (at == after) & (at > -np.inf)).tolist()
    c = counts.clamp(min=1, max=width)
    at = values.gather(1, (c - 1)[:, None])[:, 0]
    after = values.gather(1, c.clamp(max=width - 1)[:, None])[:, 0]
    return ((c < width) & (at == after) & (at > NEG_INF)).nonzero().flatten().tolist()


def settle_ties(
    values: torch.Tensor, index: torch.Tensor, counts: torch.Tensor, logits: torch.Tensor, ids: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Make "keep the counts[b] best" independent of how it was computed: where the counts[b]-th and the next
    value of a row's partial sort (values, index: (B, W), descending, W > counts[b] where the row has more
    candidates) are equal, the tied candidates kept are those with the lowest token ids, not the ones the partial
    sort happened to pick (its choice changes with its width, so with the batch). Rows without a tie at their
    boundary (nearly always, in float32) are untouched; the tied rows (most rows of bfloat16 logits) are settled
    together, vectorised: every place the cut's value v holds in the partial sort gets, in order, the next of the
    row's lowest-id candidates equal to v (`lowest_equal`), so the ids stay unique. logits: the candidates the
    partial sort ran on; ids None: token id = position."""
    rows = tied_rows(values, counts)
    if not rows:
        return values, index
    tied = torch.tensor(rows, device=values.device)
    vals, idx = values.index_select(0, tied), index.index_select(0, tied)
    cut = (counts.index_select(0, tied).clamp(1, values.shape[1]) - 1)[:, None]
    v = vals.gather(1, cut)  # (T, 1) the value at each tied row's cut
    places = vals == v  # (T, W) where the partial sort put it (a run, in descending order)
    lowest = lowest_equal(
        logits.index_select(0, tied),
        v,
        int(places.sum(dim=-1).max()),
        None if ids is None else ids.index_select(0, tied),
    )
    rank = (torch.cumsum(places, dim=-1) - 1).clamp(min=0)  # the n-th place of v takes the n-th lowest id
    return values, index.index_copy(0, tied, torch.where(places, lowest.gather(1, rank), idx))


def lowest_equal(logits: torch.Tensor, value: torch.Tensor, n: int, ids: torch.Tensor | None = None) -> torch.Tensor:
    """(B, n) positions of the candidates equal to value (B, 1), lowest token id first (ids None: id = position);
    a row with fewer than n such candidates repeats its last one. Vectorised over rows: the equal entries found
    by one nonzero (row-major, so in position order: id order when ids is None) and the first n of each row kept,
    or a top-k of negated ids among the equal ones."""
    equal = logits == value
    if ids is None:
        rows, cols = equal.nonzero(as_tuple=True)
        found = torch.bincount(rows, minlength=logits.shape[0])  # (B,) how many equal entries per row
        slot = torch.arange(rows.numel(), device=logits.device) - (torch.cumsum(found, 0) - found)[rows]
        keep = slot < n
        positions = torch.full((logits.shape[0], n), -1, dtype=torch.int64, device=logits.device)
        positions[rows[keep], slot[keep]] = cols[keep]
        last = positions.gather(1, (found.clamp(max=n) - 1).clamp(min=0)[:, None])
        return torch.where(positions < 0, last, positions)
    keys = torch.where(equal, -ids, torch.iinfo(torch.int64).min)
    top, positions = torch.topk(keys, n, dim=-1)
    return torch.where(top == torch.iinfo(torch.int64).min, positions[:, :1], positions)


def ranked_topk(logits: torch.Tensor, k: int, ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`Backend.ranked_topk` on any device: one top-k over `ranked_keys`, vectorised, without a host read. Costs a
    (B, K) int64 pass: backends override it for wide rows (the cpu backend's chunked version)."""
    index = torch.topk(ranked_keys(logits, ids), k, dim=-1, largest=True, sorted=True).indices
    return logits.gather(1, index), index


_LOW32 = 0xFFFFFFFF


def ranked_keys(logits: torch.Tensor, ids: torch.Tensor | None = None) -> torch.Tensor:
    """(B, K) int64 keys whose descending order is the filters' order: by float32 logit, then by lowest token id
    (ids None: id = position). The high 32 bits are the logit's bits made monotone (negative floats have their
    magnitude bits flipped; -0.0 is taken as +0.0, -inf is the lowest), the low 32 bits 2**32 - 1 - id: every key
    of a row is distinct, so a top-k over them has no ties left to break."""
    bits = (logits.float() + 0.0).view(torch.int32)  # + 0.0: -0.0 becomes +0.0, an equal logit
    order = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # signed-int order == float order
    ids = torch.arange(logits.shape[-1], device=logits.device) if ids is None else ids
    return (order.to(torch.int64) << 32) | (_LOW32 - ids)


_SYNC_FREE: contextvars.ContextVar[bool] = contextvars.ContextVar("samplechain_sync_free", default=False)


@contextlib.contextmanager
def sync_free_step(on: bool = True) -> Iterator[None]:
    """Run a step (the executor does, for a `Backend.sync_free` backend) where Candidates never read the host:
    widths stay fixed (masks replace compaction) and ties are settled by ranked keys, not a search of tied rows."""
    token = _SYNC_FREE.set(on)
    try:
        yield
    finally:
        _SYNC_FREE.reset(token)


def in_sync_free_step() -> bool:
    """Whether the current step must not wait for the host (samplers pick their sync-free paths by it)."""
    return _SYNC_FREE.get()


_COMPACT_WIDTH = 16384  # full-vocabulary masks this wide are compacted when they keep few (<= 1/8) candidates


@attrs.frozen
class NoParams:
    """Params class of a sampler that takes none."""


class PluginClass:
    """What every class a plugin registers has (sampler, stopping criterion, backend, runner, drafter, guard):
    `name` (a lowercase identifier), `version` (an integer >= 1: a chain may ask for `name.vN`), `Params` (an attrs
    class whose fields are its parameters, validated where a chain or a table gives them; an instance gets them as
    `self.params`) and a one-line `summary` (`samplechain plugins`)."""

    name: ClassVar[str] = ""
    version: ClassVar[int] = 1
    Params: ClassVar[type] = NoParams
    summary: ClassVar[str] = ""

    def __init__(self, params: Any = None) -> None:
        self.params = params if params is not None else self.Params()

    @classmethod
    def qualified_name(cls) -> str:
        """`name.vN`; a class without a name (an object given to generate() directly) goes by its class's name."""
        return f"{cls.name or cls.__name__}.v{cls.version}"


@attrs.define(slots=True)
class Candidates:
    """A batched candidate set: the batched analogue of llama.cpp's `llama_token_data_array`.

    logits: (B, K) float32; a masked candidate is -inf. Row b's candidate j is token ids[b, j].
    ids:    (B, K) int64, or None while K == vocab_size and ids[b, j] == j (the full, untouched vocabulary:
            materialising arange(V) per row would cost as much as the logits).
    is_sorted: every row is in descending logit order, its -inf (removed) candidates last (top-k leaves it so;
               top-p and min-p use it; `masked` keeps it so).
    writable:  logits belong to the chain and may be modified in place (never the caller's tensor).
    """

    logits: torch.Tensor
    ids: torch.Tensor | None
    vocab_size: int
    is_sorted: bool = False
    writable: bool = False

    @property
    def batch_size(self) -> int:
        return self.logits.shape[0]

    @property
    def width(self) -> int:
        return self.logits.shape[1]

    def token_ids(self) -> torch.Tensor:
        """(B, K) int64 token ids, materialised if still implicit."""
        if self.ids is not None:
            return self.ids
        return torch.arange(self.vocab_size, device=self.logits.device).expand(self.batch_size, -1)

    def ids_at(self, index: torch.Tensor) -> torch.Tensor:
        """Token ids at candidate positions index (B, J) -> (B, J)."""
        return index if self.ids is None else self.ids.gather(1, index)

    def holding(self, ids: torch.Tensor) -> torch.Tensor:
        """bool: which candidates are one of the token ids `ids` (1-D); (1, V) over the whole vocabulary (ids past
        it hold nothing), (B, K) over compacted candidates."""
        if self.ids is None:
            mask = torch.zeros(1, self.vocab_size, dtype=torch.bool, device=self.logits.device)
            return mask.index_fill_(1, ids[ids < self.vocab_size].to(mask.device), True)
        return torch.isin(self.ids, ids.to(self.ids.device))

    def replace_logits(self, logits: torch.Tensor, *, is_sorted: bool = False) -> Candidates:
        """Same candidates, new logits (which the chain owns). They are taken as unsorted unless the caller says
        otherwise: a transform keeps `is_sorted=cand.is_sorted` only when it never reorders a row (a positive
        temperature); a bias or penalty can move any token to the front."""
        return Candidates(logits, self.ids, self.vocab_size, is_sorted, True)

    def full(self) -> Candidates:
        """These candidates over the whole vocabulary again (ids None, -inf for every token not among them), for
        a transform that must give a logit to a token an earlier filter removed (forced_bos / forced_eos, as
        transformers' processors do). Costs a (B, V) write: for the rare steps that need it."""
        if self.ids is None:
            return self
        return Candidates(self.scores(), None, self.vocab_size, False, True)

    def owned(self, backend: Backend) -> Candidates:
        """These candidates with logits the chain may write: self when they already are, else a copy into the
        backend's reusable workspace (never the caller's tensor)."""
        if self.writable:
            return self
        copy = backend.scratch("candidates", self.logits).copy_(self.logits)
        return self.replace_logits(copy, is_sorted=self.is_sorted)

    def take(self, values: torch.Tensor, index: torch.Tensor, *, is_sorted: bool) -> Candidates:
        """Compact to candidates at positions index (B, K'), whose logits are values (B, K')."""
        return Candidates(values, self.ids_at(index), self.vocab_size, is_sorted, True)

    def masked(self, keep: torch.Tensor) -> Candidates:
        """Set every candidate where keep (B, K) is False to -inf. On the full vocabulary of a wide row, when every
        row keeps at most 1/8 of it, the survivors are compacted instead (in token-id order, as they stood), so
        later samplers and the selector read K survivors, not the vocabulary: the same candidates either way.
        Sorted rows stay sorted: their survivors move to the front in order, the removed ones behind them (a -inf
        hole among sorted survivors would be taken for a candidate by a later cut at the k-th place)."""
        if self.is_sorted:
            order = torch.argsort((~keep).to(torch.uint8), dim=-1, stable=True)  # survivors first, each in order
            logits = self.logits.gather(1, order).masked_fill_(~keep.gather(1, order), NEG_INF)
            return Candidates(logits, self.ids_at(order), self.vocab_size, True, True)
        if self.ids is None and self.width >= _COMPACT_WIDTH and not _SYNC_FREE.get():
            counts = keep.sum(dim=-1)
            if int(counts.max()) * 8 <= self.width:
                values, positions, _ = compact_kept(self.logits, keep, counts)
                return Candidates(values, positions, self.vocab_size, False, True)
        if self.writable:
            self.logits.masked_fill_(~keep, NEG_INF)
            return self
        return self.replace_logits(self.logits.masked_fill(~keep, NEG_INF))

    def keep_first(self, counts: torch.Tensor) -> Candidates:
        """Keep the first counts[b] candidates of each (sorted) row and compact K to max(counts)."""
        assert self.is_sorted, "keep_first needs rows sorted by descending logit"
        if _SYNC_FREE.get():  # the width stays: a mask, no host read
            cut = torch.arange(self.width, device=self.logits.device)[None, :] >= counts[:, None]
            return Candidates(self.logits.masked_fill(cut, NEG_INF), self.ids, self.vocab_size, True, True)
        width = int(counts.max())  # one host read: the new K
        logits = self.logits[:, :width]
        ids = self.ids[:, :width] if self.ids is not None else None
        if ids is None and width < self.vocab_size:
            ids = torch.arange(width, device=logits.device).expand(self.batch_size, -1)
        cut = torch.arange(width, device=logits.device)[None, :] >= counts[:, None]
        logits = logits.masked_fill(cut, NEG_INF) if bool(cut.any()) else logits
        return Candidates(logits, ids, self.vocab_size, True, logits is not self.logits or self.writable)

    def restrict(
        self,
        values: torch.Tensor,
        index: torch.Tensor,
        counts: torch.Tensor,
        keep_all: torch.Tensor,
        *,
        ranked: bool = False,
    ) -> Candidates:
        """Keep, per row, the counts[b] best candidates given by a partial sort (values, index: (B, J), descending).

        Rows where keep_all[b] is True keep every candidate (a disabled parameter). Compacts K to max(counts)
        when no row keeps all; otherwise masks in place of compaction (K unchanged). Equal logits at a row's cut
        are settled by token id here (settle_ties), for every filter that cuts a partial sort: give the partial
        sort one column more than the largest count so a tie at the cut can be seen; ranked=True: values and index
        are already in the filters' order (`Backend.ranked_topk`, `Backend.at_least`), nothing to settle.
        """
        if not ranked:
            values, index = settle_ties(
                values, index, torch.where(keep_all, values.shape[1], counts), self.logits, self.ids
            )
        if not bool(keep_all.any()):
            return self.take(values, index, is_sorted=True).keep_first(counts)
        if self.is_sorted:
            return self.keep_first_settled(torch.where(keep_all, self.width, counts))
        ranks = torch.arange(index.shape[1], device=index.device)[None, :]
        keep = torch.zeros(self.logits.shape, dtype=torch.bool, device=self.logits.device)
        keep.scatter_(1, index, ranks < counts[:, None])
        keep |= keep_all[:, None]
        return self.masked(keep)

    def keep_best(self, counts: torch.Tensor, off: torch.Tensor, backend: Backend) -> Candidates:
        """Keep, per row, the counts[b] (<= width) highest-logit candidates; rows where off[b] is True keep all.

        For filters whose survivors are a prefix of the descending order (top-a, top-n-sigma): sorted rows are cut
        with `keep_first`; otherwise one partial top-k of the largest count and `restrict` (which of equal logits
        at the boundary survives is the partial sort's choice). Returns self when every row keeps all.
        """
        width = self.width
        counts = torch.where(off, width, counts)
        if self.is_sorted or _SYNC_FREE.get():  # sync-free: one sort instead of a top-k as wide as the data says
            return self.sorted(backend).keep_first_settled(counts)
        if bool((counts >= width).all()):
            return self
        kmax = int(torch.where(off, 0, counts).max())
        values, index = backend.topk(self.logits, min(kmax + 1, width))  # one column more: restrict sees ties
        return self.restrict(values, index, counts, off | (counts >= width))

    def best(self) -> torch.Tensor:
        """(B,) the position of each row's largest logit; of equal maxima the lowest token id (not the first in
        candidate order, which earlier filters may have set differently in another batch)."""
        if self.ids is None:  # position == token id: the first maximum is the lowest id
            return self.logits.argmax(dim=-1)
        top = self.logits.amax(dim=-1, keepdim=True)
        return torch.where(self.logits == top, self.ids, torch.iinfo(torch.int64).max).argmin(dim=-1)

    def best_first(self) -> tuple[Candidates, torch.Tensor]:
        """(candidates, (B, 1) positions of best()). Sorted candidates get the lowest-id maximum swapped into
        position 0 (with its logit: position 0 holds either an equal maximum or a -inf hole, so the row stays
        sorted) and the positions are 0; unsorted ones are returned as they are, with best()'s positions."""
        if not self.is_sorted or self.ids is None:
            return self, self.best()[:, None]
        pos = self.best()[:, None]
        first = torch.zeros_like(pos)

        def swapped(t: torch.Tensor) -> torch.Tensor:  # position 0 <-> pos, per row
            return t.clone().scatter_(1, pos, t[:, :1]).scatter_(1, first, t.gather(1, pos))

        # logits move with their ids: position 0 may hold a -inf hole (sorted rows may have them), not the max
        return Candidates(swapped(self.logits), swapped(self.ids), self.vocab_size, True, True), first

    def keep_first_settled(self, counts: torch.Tensor) -> Candidates:
        """keep_first(counts) where, at a row's cut, candidates equal to the last kept one are chosen by lowest
        token id, not by the order an earlier sort left them in: in each row with a tie at its cut, the run of
        candidates equal to the cut's value (contiguous in a sorted row) is put in ascending id order, all tied
        rows at once; the row stays sorted."""
        if _SYNC_FREE.get():  # every row put in the filters' order by its ranked keys: no search for tied rows
            values, order = ranked_topk(self.logits, self.width, self.token_ids())
            return Candidates(values, self.ids_at(order), self.vocab_size, True, True).keep_first(counts)
        rows = tied_rows(self.logits, counts)
        if not rows:
            return self.keep_first(counts)
        width = self.width
        tied = torch.tensor(rows, device=self.logits.device)
        x = self.logits.index_select(0, tied)
        cut = x.gather(1, (counts.index_select(0, tied).clamp(1, width) - 1)[:, None])  # (T, 1)
        start = (x > cut).sum(dim=-1, keepdim=True)  # where the run of the cut's value begins
        length = (x == cut).sum(dim=-1, keepdim=True)
        steps = torch.arange(int(length.max()), device=x.device)[None, :]
        inside = steps < length  # (T, run)
        places = torch.where(inside, start + steps, start)  # outside the run: its first place, written alike
        ids = self.token_ids().index_select(0, tied)
        if not bool((x.gather(1, places) == cut).all()):  # not one run (a row that is not sorted after all)
            reach = int((x >= cut).sum(dim=-1).max())
            order = ranked_topk(x[:, :reach], reach, ids[:, :reach])[1]
            logits, all_ids = self.logits.clone(), self.token_ids().clone()
            logits[tied, :reach] = x[:, :reach].gather(1, order)
            all_ids[tied, :reach] = ids[:, :reach].gather(1, order)
            return Candidates(logits, all_ids, self.vocab_size, True, True).keep_first(counts)
        run = torch.where(inside, ids.gather(1, places), torch.iinfo(torch.int64).max).sort(dim=-1).values
        ids = ids.scatter(1, places, torch.where(inside, run, run[:, :1]))
        all_ids = self.token_ids().index_copy(0, tied, ids)
        return Candidates(self.logits, all_ids, self.vocab_size, True, self.writable).keep_first(counts)

    def sorted(self, backend: Backend) -> Candidates:
        """Rows in descending logit order (a full sort: filters that can should use a partial top-k)."""
        if self.is_sorted:
            return self
        values, index = backend.sort_desc(self.logits)
        return self.take(values, index, is_sorted=True)

    def draw(self, keep: torch.Tensor | None, ctx: StepContext, seed: torch.Tensor) -> torch.Tensor:
        """(B,) the Gumbel-max pick among the candidates where keep (B, K) is True (all when None), as positions in
        these candidates. The noise of a token depends only on its id, so drawing among the survivors alone (wide
        rows keeping few are compacted first: the noise of thousands of tokens instead of the vocabulary) picks
        the same token as drawing over the masked row."""
        if keep is None:
            return ctx.backend.gumbel_argmax(self.logits, seed, ctx.positions, self.ids, ctx.stream)
        sub = Candidates(self.logits, self.ids, self.vocab_size, False, False).masked(keep)  # positions kept
        pick = ctx.backend.gumbel_argmax(sub.logits, seed, ctx.positions, sub.ids, ctx.stream)
        if sub.ids is self.ids:
            return pick
        assert sub.ids is not None  # masked() compacted the rows: these are the survivors' ids
        return sub.ids.gather(1, pick[:, None]).squeeze(1)

    def scores(self) -> torch.Tensor:
        """(B, V) float32 processed scores as transformers reports them: -inf for every removed token."""
        if self.ids is None:
            return self.logits.clone()
        out = torch.full((self.batch_size, self.vocab_size), NEG_INF, device=self.logits.device)
        return out.scatter_(1, self.ids, self.logits)


@attrs.define(slots=True)
class StepContext:
    """What a sampler sees of the batch at one step.

    params: field name -> (B,) tensor of that field's per-request value (float32, int64 or bool).
    scalars: field name -> the value when every row of this batch shares it, else None (cached per batch
             composition, so samplers can take a scalar fast path without reading the tensor).
    bounds:  field name -> (min, max) of the field over the batch, on the host (cached likewise; `bound`).
    positions: (B,) int64, tokens accepted so far per request (the RNG counter).
    stream: this sampler's index in the chain: random samplers draw independent noise per stream.
    state: per-request state columns of this sampler, (B, ...) tensors gathered for this batch.
    history: (B, L) int64 every token of each row so far, prompt then generated, left-padded with -1; given to
             samplers that declare `needs_history()` (penalties, DRY, n-gram bans), None otherwise. When a chain
             that needs it runs without one, reading it raises an error that says how to pass it (a sampler that
             is off for the whole batch never reads it, so such chains still run on bare logits).
    prompt_lengths: (B,) int64 how many of a row's history tokens are its prompt (the rest were generated).
    unconditional_logits: (B, V) float32 logits of the same step's unconditional forward (the negative prompt
             and the tokens so far), for samplers that declare `needs_unconditional_logits()` (cfg); else None.
    selected_candidates / selected: in the selector's `accept` after a `sample()` of the same step, the candidates
             it chose from and the positions it returned (None when tokens are accepted without a draw, e.g.
             `chain.accept` of forced tokens).
    """

    backend: Backend
    params: Mapping[str, torch.Tensor]
    scalars: Mapping[str, Any]
    positions: torch.Tensor
    stream: int
    request_ids: tuple[str, ...]
    state: Mapping[str, torch.Tensor] = attrs.field(factory=dict)
    _history: torch.Tensor | None = None
    prompt_lengths: torch.Tensor | None = None
    selected_candidates: Candidates | None = None
    selected: torch.Tensor | None = None
    unconditional_logits: torch.Tensor | None = None
    missing_history: str | None = None  # why history is None although a sampler declared it needs it
    bounds: Mapping[str, tuple[Any, Any]] = attrs.field(factory=dict)  # field -> (min, max) over the batch

    @property
    def history(self) -> torch.Tensor | None:
        if self._history is None and self.missing_history is not None:
            from .errors import SamplingError  # contracts stays importable without the rest of the core

            raise SamplingError(self.missing_history)
        return self._history

    def generated(self) -> torch.Tensor:
        """(B,) int64: how many tokens each row has generated (its history's tokens less its prompt), for samplers
        that declare `needs_history()`."""
        history = self.history
        assert history is not None and self.prompt_lengths is not None  # the chain passes both to such samplers
        return (history >= 0).sum(dim=1) - self.prompt_lengths

    def param(self, name: str) -> torch.Tensor:
        return self.params[name]

    def scalar(self, name: str) -> Any:
        return self.scalars[name]

    def value(self, name: str) -> Any:
        """The parameter as a Python number where every row of the batch shares it (`scalar`), else its (B,)
        tensor (`param`)."""
        shared = self.scalars[name]
        return self.params[name] if shared is None else shared

    def bound(self, name: str) -> tuple[Any, Any]:
        """(smallest, largest) value of a per-request field over this batch, known on the host without a read of
        the device (gathered with the batch composition): what a sync-free step sizes its widths by."""
        return self.bounds[name]

    def gumbel(self, cand: Candidates, seed: torch.Tensor) -> torch.Tensor:
        """Counter-based Gumbel noise (B, K) float64 for the candidates, keyed by token id, not by position."""
        return self.backend.gumbel(seed, self.positions, cand.token_ids(), self.stream)


class Backend(PluginClass):
    """The hot primitives for one device type. `cpu` is the reference; others state their equivalence to it.

    `kernels` maps a qualified sampler name (e.g. "top_p.v1") to a fast path a sampler may use instead of its
    reference code; samplers call `backend.kernel(name)` and fall back to their own torch code on None.
    """

    device_type: ClassVar[str]
    equivalence: ClassVar[str] = "bitwise"  # bitwise | allclose | statistical, relative to the cpu backend
    kernels: ClassVar[Mapping[str, Callable[..., Any]]] = {}
    # True: a step never waits for the host (docs/backends.md, "cuda"): the executor defers its checks
    # to device flags (SampleOutput.check) and samplers take their sync-free paths (StepContext.sync_free)
    sync_free: ClassVar[bool] = False

    @classmethod
    def is_available(cls) -> bool:
        return True

    @classmethod
    def unavailable_reason(cls) -> str:
        return ""

    def kernel(self, name: str) -> Callable[..., Any] | None:
        return self.kernels.get(name)

    def scratch(self, name: str, like: torch.Tensor) -> torch.Tensor:
        """A contiguous tensor shaped like `like` (contents undefined), reused from step to step under `name`.

        A (B, V) temporary allocated afresh every step costs its page faults, several times the copy itself; the
        buffer grows to the largest size asked for and is shared by nothing else. A backend belongs to one chain,
        and a chain runs one step at a time, so a step's buffer is free again at the next step."""
        cache: dict[tuple[str, torch.dtype, torch.device], torch.Tensor] = self.__dict__.setdefault("_scratch", {})
        key = (name, like.dtype, like.device)
        buf = cache.get(key)
        if buf is None or buf.numel() < like.numel():
            buf = cache[key] = torch.empty(like.numel(), dtype=like.dtype, device=like.device)
        return buf[: like.numel()].view(like.shape)

    def topk(self, logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The k largest logits per row, in descending order, and their positions. (B, K) -> (B, k) x2."""
        raise NotImplementedError

    def sort_desc(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows sorted by descending logit, and the permutation. (B, K) -> (B, K) x2."""
        raise NotImplementedError

    def ranked_topk(
        self, logits: torch.Tensor, k: int, ids: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The k best candidates per row in the order every filter cuts by: descending logit, of equal logits the
        lowest token id first (ids (B, K), None: id = position). Values (B, k) in descending order and their
        positions: the set is the same on every backend and for a row alone or in any batch (the order among equal
        values inside it may differ). Default: one top-k over `ranked_keys` (vectorised, no host read); backends
        may do better (the cpu backend reads only the chunks that can hold the k best)."""
        return ranked_topk(logits, k, ids)

    def at_least(
        self, logits: torch.Tensor, threshold: torch.Tensor, k: int = 0, *, ordered: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per row, the entries >= threshold[b] (B,) and at least the k best, in the filters' order (`ranked_topk`:
        descending, equal logits lowest position first, so a cut anywhere in them needs no settling): values and
        positions (B, J) with J = max(count, k) (a row's entries past max(count, k) may be anything) and the
        count of entries >= threshold per row (B,). ordered=False (k = 0, a caller that keeps exactly the entries
        >= the threshold, whose ties are kept or cut together): any descending order. Default: count, then one
        ranked top-k; backends may do better (the cpu backend only reads the chunks whose maximum reaches the
        threshold)."""
        counts = (logits >= threshold[:, None]).sum(dim=-1)
        width = min(max(int(counts.max()), k, 1), logits.shape[-1])
        values, index = ranked_topk(logits, width)  # the keys' full order (a backend's ranked_topk need only
        return values, index, counts  # give the set)

    def gumbel(self, seed: torch.Tensor, position: torch.Tensor, ids: torch.Tensor, stream: int) -> torch.Tensor:
        """Counter-based Gumbel(0, 1) noise (B, K) float64, a pure function of (seed, stream, position, id)."""
        raise NotImplementedError

    def uniform(self, seed: torch.Tensor, position: torch.Tensor, ids: torch.Tensor, stream: int) -> torch.Tensor:
        """Counter-based U(0, 1) noise (B, K) float64."""
        raise NotImplementedError

    def gumbel_argmax(
        self, logits: torch.Tensor, seed: torch.Tensor, position: torch.Tensor, ids: torch.Tensor | None, stream: int
    ) -> torch.Tensor:
        """(B,) argmax(rng.shifted(logits) + gumbel noise) per row, first index on ties: a Gumbel-max draw (rows of
        huge logits shifted by their maximum, so the noise is not lost next to them). ids None
        means ids[b, j] == j. Backends may fuse it (the cpu backend hashes in place); the index must be the same."""
        full = torch.arange(logits.shape[1], device=logits.device).expand(logits.shape[0], -1) if ids is None else ids
        return (rng.shifted(logits).double() + self.gumbel(seed, position, full, stream)).argmax(dim=-1)
