"""Token ids and token histories: the eos ids a model states, left-padded batches of rows, the sparse per-token
work penalties and DRY need without touching the whole vocabulary, and the token sequences a row's next token would
complete (bad_words, sequence_bias).

A history is (B, L) token ids. These helpers group a row's positions by token id (a sort per row, O(L log L))
instead of scattering into a (B, V) table, so a penalty over 64 or 4096 history tokens costs in L, not in V.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np
import torch

from .contracts import in_sync_free_step, token_id_list
from .errors import SamplingError

__all__ = [
    "SequenceMatcher",
    "TokenGroups",
    "eos_token_ids",
    "first_occurrence",
    "left_pad",
    "per_token_reduce",
    "write_tokens",
]


def eos_token_ids(tokenizer: Any = None, generation_config: Any = None, model_config: Any = None) -> list[int]:
    """The end-of-sequence ids the tokenizer, the generation config and the model config state (each an int, a
    list or a tensor, or absent), in that order and without repeats. Pass only the sources a caller trusts."""
    found: list[int] = []
    for source in (tokenizer, generation_config, model_config):
        for i in token_id_list(getattr(source, "eos_token_id", None)):
            if i not in found:
                found.append(i)
    return found


def left_pad(rows: Sequence[Sequence[int] | np.ndarray], fill: int, width: int = 1) -> torch.Tensor:
    """(B, W) int64 on the CPU: each row right-aligned, `fill` before the shorter ones; W is the longest row's
    length, or `width` where that is more. Rows may be lists or numpy arrays; numpy fills it, as one slice copy per
    row."""
    width = max(width, max((len(r) for r in rows), default=0))
    out = np.full((len(rows), width), fill, dtype=np.int64)
    for i, row in enumerate(rows):
        if len(row):
            out[i, width - len(row) :] = row
    return torch.from_numpy(out)


@attrs.frozen
class TokenGroups:
    """The target positions of each row (B, L) grouped by token id, from one stable sort; a non-target position
    is a group of its own. Reused for several reductions over the same positions."""

    targets: torch.Tensor
    order: torch.Tensor  # (B, L) the sort permutation
    starts: torch.Tensor  # (B, L) a group starts at this sorted position
    group: torch.Tensor  # (B, L) group number of each sorted position

    @classmethod
    def of(cls, ids: torch.Tensor, targets: torch.Tensor) -> TokenGroups:
        B, L = ids.shape
        lane = torch.arange(L, device=ids.device)
        key = torch.where(targets, ids, -1 - lane[None, :])
        sorted_key, order = key.sort(dim=1, stable=True)  # stable: the first position of a run is the earliest
        starts = torch.ones(B, L, dtype=torch.bool, device=ids.device)
        starts[:, 1:] = sorted_key[:, 1:] != sorted_key[:, :-1]
        return cls(targets, order, starts, starts.cumsum(dim=1) - 1)

    def reduce(self, values: torch.Tensor, include: torch.Tensor, reduce: str = "sum") -> torch.Tensor:
        """At every target position: the reduction of `values` over its group's positions where `include` is True;
        the reduction's identity elsewhere (0 for "sum", -1 for "amax", which assumes non-negative values)."""
        vals = values.gather(1, self.order)
        inc = include.gather(1, self.order)
        if reduce == "sum":
            acc = torch.zeros_like(vals).scatter_add_(1, self.group, torch.where(inc, vals, torch.zeros_like(vals)))
            identity = 0
        elif reduce == "amax":
            acc = torch.full_like(vals, -1).scatter_reduce_(
                1, self.group, torch.where(inc, vals, torch.full_like(vals, -1)), reduce="amax"
            )
            identity = -1
        else:
            raise ValueError(f"reduce must be 'sum' or 'amax', got {reduce!r}")
        out = torch.empty_like(vals).scatter_(1, self.order, acc.gather(1, self.group))
        return torch.where(self.targets, out, torch.full_like(out, identity))

    def first(self) -> torch.Tensor:
        """(B, L) bool: the first target position of each token of a row (later repeats False)."""
        return torch.zeros_like(self.targets).scatter_(1, self.order, self.starts) & self.targets


def per_token_reduce(
    ids: torch.Tensor, values: torch.Tensor, targets: torch.Tensor, include: torch.Tensor, reduce: str = "sum"
) -> torch.Tensor:
    """At every target position (b, l): the reduction of `values` over the target positions of row b whose id
    equals ids[b, l] and where `include` is True. Non-target positions get the reduction's identity (0 for "sum",
    -1 for "amax", which assumes non-negative values). ids, values (float or int), targets, include: (B, L)."""
    if ids.shape[1] == 0:
        return torch.zeros_like(values)
    return TokenGroups.of(ids, targets).reduce(values, include, reduce)


def first_occurrence(ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, L) bool: True at the first masked position of each distinct id of a row (later repeats False)."""
    if ids.shape[1] == 0:
        return mask.clone()
    return TokenGroups.of(ids, mask).first()


def write_tokens(logits: torch.Tensor, ids: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> None:
    """logits[b, ids[b, l]] = values[b, l] wherever mask[b, l], in place. Positions of one row that share an id
    must carry the same value (per_token_reduce gives that). In a sync-free step (no nonzero): one scatter, the
    positions outside the mask rewriting the row's first masked token with its own new value (or, in a row with
    none, the first token with its current one), so every write to one place carries one value."""
    if in_sync_free_step():
        if ids.shape[1]:
            first = mask.to(torch.uint8).argmax(dim=1, keepdim=True)  # (B, 1) the first masked position, or 0
            target = torch.where(mask, ids, ids.gather(1, first))
            spare = torch.where(
                mask.any(dim=1, keepdim=True),
                values.gather(1, first).to(logits.dtype),
                logits.gather(1, ids.gather(1, first)),
            )
            logits.scatter_(1, target, torch.where(mask, values.to(logits.dtype), spare))
        return
    rows, cols = mask.nonzero(as_tuple=True)
    if rows.numel():
        logits[rows, ids[rows, cols]] = values[rows, cols]


class SequenceMatcher:
    """Token sequences, each with a value, that the next token of a row would complete: the sequence's last token
    when the row's history ends with its other tokens. Grouped by prefix length, so a step makes one batched
    comparison per distinct length, never one per row or per sequence. `owner` (a sampler's qualified name) names
    the culprit of an out-of-vocabulary id."""

    def __init__(self, pairs: Sequence[tuple[Sequence[int], float]], owner: str) -> None:
        self.owner = owner
        self.groups: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}  # prefix length -> tensors
        by_len: dict[int, list[tuple[Sequence[int], float]]] = {}
        for seq, value in pairs:
            by_len.setdefault(len(seq) - 1, []).append((seq, value))
        for p, items in by_len.items():
            prefixes = torch.tensor([s[:-1] for s, _ in items], dtype=torch.int64).reshape(len(items), p)
            lasts = torch.tensor([s[-1] for s, _ in items], dtype=torch.int64)
            self.groups[p] = (prefixes, lasts, torch.tensor([v for _, v in items], dtype=torch.float32))
        self.max_id = max((max(s) for s, _ in pairs), default=-1)

    def bias(self, history: torch.Tensor | None, vocab: int, batch: int, device: Any) -> torch.Tensor:
        """(B, V) float32: the summed values of every sequence the next token would complete. `history` (B, L) is
        left-padded with -1, which matches no token; a sequence applies once a row has as many tokens as its
        prefix."""
        if self.max_id >= vocab:
            raise SamplingError(f"{self.owner}: token id {self.max_id} is outside the vocabulary (size {vocab})")
        out = torch.zeros(batch, vocab, dtype=torch.float32, device=device)
        for p, (prefixes, lasts, values) in self.groups.items():
            prefixes, lasts, values = prefixes.to(device), lasts.to(device), values.to(device)
            if p == 0:
                hit = torch.ones(batch, len(lasts), dtype=torch.bool, device=device)
            elif history is None or history.shape[1] < p:
                continue
            else:
                hit = (history[:, None, -p:] == prefixes[None, :, :]).all(dim=-1)  # (B, S)
            add = torch.where(hit, values[None, :], torch.zeros((), device=device))
            out.scatter_add_(1, lasts[None, :].expand(batch, -1), add)
        return out
