"""Logprobs at any stage of a chain: which stage a `logprobs_at` value names, and each row's chosen-token logprob,
top-n and rank under it (`Chain.sample(logprobs_at=..., top_logprobs=n)`).

`row_lse` is every step's normaliser, the default (processed) logprobs included.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Any

import torch

from ..candidates import Candidates
from ..contracts import LSE64_WIDTH, ROW_LSE, Backend
from ..errors import ConfigError
from .config import EntrySpec

__all__ = ["VLLM_LOGPROBS_MODES", "at_stages", "kept_copy", "logit_of", "parse_stage", "row_lse"]

# vLLM's logprobs_mode names: (stage, as logits)
VLLM_LOGPROBS_MODES = {
    "raw_logprobs": ("raw", False),
    "raw_logits": ("raw", True),
    "processed_logprobs": ("processed", False),
    "processed_logits": ("processed", True),
}
_INF = float("inf")


def row_lse(x: torch.Tensor, backend: Backend | None = None) -> torch.Tensor:
    """(B,) float32 log-sum-exp of each row. Up to 65536 candidates it is accumulated in float64, so the sum's
    rounding does not depend on how a reduction splits the row (its width, which after truncation follows the
    batch) and a row's logprob is the same to the bit alone and in any batch. Wider rows (the full vocabulary,
    where a float64 pass would cost several times the rest of the step) use torch's float32 logsumexp (per row on
    the CPU): a row that is truncated alone but full-width in a batch may then differ in the last bit of its
    logprob (never its token). With a backend offering `ROW_LSE` (the cpu backend with numba), the float64 sum is
    the backend's (the same value to float32 rounding).
    """
    if x.shape[1] > LSE64_WIDTH:
        if x.device.type != "cpu" or x.shape[0] == 1:
            return torch.logsumexp(x, dim=-1)
        # on the CPU one row at a time: torch's (B, V) temporaries cost ~3x the reduction (their page faults); a
        # row's temporaries stay in cache (B = 128, V = 128256: 1.6x one read of the logits instead of 4.7x)
        out = torch.empty(x.shape[0], dtype=x.dtype)
        for row in range(x.shape[0]):
            torch.logsumexp(x[row : row + 1], dim=-1, out=out[row : row + 1])
        return out
    kernel = backend.kernel(ROW_LSE) if backend is not None else None
    found = kernel(x) if kernel is not None else None
    if found is not None:  # the backend's float64 sum (the cpu backend's: compiled, ~3x faster)
        return found
    top = x.amax(dim=-1, keepdim=True)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    total = torch.exp(x.double() - top.double()).sum(dim=-1)
    return (top[:, 0].double() + torch.log(total)).float()


def parse_stage(entries: Sequence[EntrySpec], value: Any) -> tuple[int, bool]:
    """(stage, as logits) of a `logprobs_at` value (`Chain.sample`) for a chain of these entries: stage -1 is
    the logits as given, i the distribution right after entry i, len(entries) - 1 the processed one."""
    last = len(entries) - 1
    listed = ", ".join(f"{e.id!r} ({e.path}, {e.cls.qualified_name()})" for e in entries)
    valid = (
        f"'processed' (the default), 'raw', an entry's id: {listed}; add ':logits' for logit values, or "
        "give one of vLLM's raw_logprobs, raw_logits, processed_logprobs, processed_logits"
    )
    if not isinstance(value, str):
        raise ConfigError(f"logprobs_at = {value!r}: expected a string (or one per row): {valid}")
    name, as_logits = VLLM_LOGPROBS_MODES.get(value, (value, False))
    if value not in VLLM_LOGPROBS_MODES and ":" in value:
        name, _, kind = value.rpartition(":")
        if kind not in ("logprobs", "logits"):
            raise ConfigError(f"logprobs_at = {value!r}: the part after ':' must be 'logprobs' or 'logits'")
        as_logits = kind == "logits"
    if name == "raw":
        return -1, as_logits
    if name == "processed":
        return last, as_logits
    index = next((i for i, e in enumerate(entries) if e.id == name), None)
    if index is None:
        hits = [i for i, e in enumerate(entries) if name in (e.use, e.cls.name, e.cls.qualified_name())]
        if len(hits) > 1:
            raise ConfigError(
                f"logprobs_at = {value!r}: {len(hits)} entries are {name!r} "
                f"({', '.join(entries[i].path for i in hits)}): name one by its id ({listed})"
            )
        index = hits[0] if hits else None
    if index is None:
        close = difflib.get_close_matches(name, [e.id for e in entries] + ["raw", "processed"], n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"logprobs_at = {value!r}: the chain has no entry of that name{hint} (valid: {valid})")
    return (last if index >= last - 1 else index), as_logits


def kept_copy(cand: Candidates) -> Candidates:
    """A stage's candidates as they stand now: later samplers may write logits the chain owns, so those are copied."""
    if not cand.writable:
        return cand
    return Candidates(cand.logits.clone(), cand.ids, cand.vocab_size, cand.is_sorted, False)


def logit_of(cand: Candidates, token_ids: torch.Tensor) -> torch.Tensor:
    """(B,) logit of token_ids (B,) among the candidates; -inf where a row no longer holds that token."""
    if cand.ids is None:
        return cand.logits.gather(1, token_ids[:, None]).squeeze(1)
    hit = cand.ids == token_ids[:, None]  # (B, K): at most one True per row
    value = cand.logits.gather(1, hit.to(torch.int32).argmax(dim=1, keepdim=True)).squeeze(1)
    return torch.where(hit.any(dim=1), value, torch.full_like(value, -_INF))


def at_stages(
    kept: dict[int, Candidates],
    modes: Sequence[tuple[int, bool]],
    token_ids: torch.Tensor,
    processed: torch.Tensor,
    selected: tuple[torch.Tensor | None, torch.Tensor],
    n: int,
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None, torch.Tensor | None]:
    """Each row's chosen-token logprob (or logit), its n best and its rank under the stage and kind its mode names:
    every (stage, kind) asked for is computed once for the whole batch, then each row takes its own (no modes, as in
    an empty batch: the ranks are None).
    kept: the candidates after each stage asked for, the largest key being what the selector saw; processed: the
    chosen tokens' processed logprobs; selected: (the selector's positions, its candidates' log-sum-exp); positions
    None: token_ids are not the selector's choice (teacher forcing), looked up among its candidates instead."""
    last = max(kept)
    pairs = sorted(set(modes))
    device = processed.device
    out, tops, ranks = processed, None, None
    for stage, as_logits in pairs:
        cand = kept[stage]
        if stage == last:
            chosen, lse = selected
            logit = logit_of(cand, token_ids) if chosen is None else cand.logits.gather(1, chosen[:, None]).squeeze(1)
        else:
            logit, lse = logit_of(cand, token_ids), row_lse(cand.logits)
        rank = (cand.logits >= logit[:, None]).sum(dim=1)  # the same for logits and logprobs: one order
        # a token the stage removed ties with every other removed one at -inf, the kept candidates above it: rank V
        rank = torch.where(torch.isneginf(logit), torch.full_like(rank, cand.vocab_size), rank)
        value = logit if as_logits else (processed if stage == last else logit - lse)
        top = None
        if n:
            width = min(n, cand.vocab_size)
            src = cand if cand.width >= width else cand.full()  # fewer than n left: -inf fills the rest
            top_values, at = src.logits.topk(width, dim=-1)
            top = (top_values if as_logits else top_values - lse[:, None], src.ids_at(at))
        if len(pairs) == 1:
            return value, top, rank
        rows = torch.tensor([m == (stage, as_logits) for m in modes], device=device)
        out = torch.where(rows, value, out)
        ranks = rank if ranks is None else torch.where(rows, rank, ranks)
        if top is not None:
            tops = (
                top
                if tops is None
                else (torch.where(rows[:, None], top[0], tops[0]), torch.where(rows[:, None], top[1], tops[1]))
            )
    return out, tops, ranks
