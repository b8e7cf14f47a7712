"""`penalties`: repeat, frequency and presence penalties, as llama.cpp's `llama_sampler_init_penalties`.

For every candidate token seen `count > 0` times in the counted tokens:
repeat divides a positive logit by `repeat` and multiplies a non-positive one by it; then
`logit -= count * frequency + (count > 0) * presence`.

`scope` says which tokens are counted (prompt tokens included unless stated):
- "llama.cpp": the last `last_n` tokens of the history, prompt then generated (llama.cpp's ring buffer of
  accepted tokens; llama-server accepts the prompt too); -1 = the whole history, 0 disables.
- "transformers": RepetitionPenaltyLogitsProcessor: the whole history (prompt + output), no window;
  `last_n` is not used. frequency / presence (which transformers lacks) count the same tokens.
- "vllm": repetition over prompt + output, frequency / presence over the generated tokens only; `last_n` unused.
"""

from __future__ import annotations

import attrs
import numpy as np
import torch

from samplechain import Candidates, Sampler, Stage, StepContext, finite, hookimpl, in_range, one_of
from samplechain.contracts import in_sync_free_step
from samplechain.tokens import TokenGroups, write_tokens

SCOPES = ("llama.cpp", "transformers", "vllm")


@attrs.frozen
class PenaltiesParams:
    repeat: float = attrs.field(default=1.0, validator=[finite, in_range(0.0, None, low_open=True, hint="1 disables")])
    frequency: float = attrs.field(default=0.0, validator=[finite])
    presence: float = attrs.field(default=0.0, validator=[finite])
    last_n: int = attrs.field(default=64, validator=in_range(-1, None, hint="-1 = whole context, 0 disables"))
    scope: str = attrs.field(default="llama.cpp", validator=one_of(*SCOPES))


def token_counts(history: torch.Tensor, counted: torch.Tensor, vocab: int) -> torch.Tensor:
    """(B, V) float32: how often each token occurs among the history entries where counted (B, L) is True."""
    counted = counted & (history >= 0) & (history < vocab)
    out = torch.zeros(history.shape[0], vocab, dtype=torch.float32, device=history.device)
    return out.scatter_add_(1, history.clamp(0, vocab - 1), counted.to(torch.float32))


class Penalties(Sampler):
    name = "penalties"
    sync_free = True  # no host read in a sync-free step (plugins/cuda/tests/test_sync_free.py)
    stage = Stage.TRANSFORM
    role = "penalty"
    Params = PenaltiesParams
    request_aliases = {
        "repeat_penalty": "repeat",
        "repetition_penalty": "repeat",
        "frequency_penalty": "frequency",
        "presence_penalty": "presence",
        "penalty_last_n": "last_n",
        "repeat_last_n": "last_n",
    }
    summary = "repeat / frequency / presence penalties over a window of previous tokens"
    has_sparse_changes = True

    def needs_history(self) -> bool:
        return True

    def is_noop(self, ctx: StepContext) -> bool:
        s = ctx.scalar
        if s("repeat") == 1.0 and s("frequency") == 0.0 and s("presence") == 0.0:
            return True
        return self.params.scope == "llama.cpp" and s("last_n") == 0

    def sparse_changes(
        self, cand: Candidates, ctx: StepContext
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        if cand.ids is not None or self.is_noop(ctx):
            return None
        ids, new, _targets, first = self._changes(cand, *self._windows(ctx))
        return ids, new, first

    def _windows(self, ctx: StepContext) -> tuple[torch.Tensor, ...]:
        """The history and, per position, whether it counts for the repeat and for the frequency / presence terms
        under this scope; the per-row parameters and the rows where the sampler is off."""
        scope = self.params.scope
        rep, freq, pres = ctx.param("repeat"), ctx.param("frequency"), ctx.param("presence")
        off = (rep == 1.0) & (freq == 0.0) & (pres == 0.0)
        history = ctx.history
        assert history is not None  # needs_history() is declared, so the chain passes it
        B, L = history.shape
        from_end = torch.arange(L - 1, -1, -1, device=history.device)[None, :]  # 0 = the latest token
        valid = history >= 0
        if scope == "llama.cpp":
            last_n = ctx.param("last_n")
            off |= last_n == 0
            counted = valid & ((last_n[:, None] < 0) | (from_end < last_n[:, None]))
            rep_counted = freq_counted = counted
        else:
            rep_counted = freq_counted = valid
            if scope == "vllm":
                assert ctx.prompt_lengths is not None  # given together with the history
                generated = valid.sum(dim=1) - ctx.prompt_lengths
                freq_counted = valid & (from_end < generated[:, None])
        return history, rep_counted, freq_counted, rep, freq, pres, off

    def apply(self, cand: Candidates, ctx: StepContext) -> Candidates:
        if self.is_noop(ctx):
            return cand
        windows = self._windows(ctx)
        history, rep_counted, freq_counted, rep, freq, pres, off = windows
        scope = self.params.scope
        vocab = cand.vocab_size
        if cand.ids is None:  # the full vocabulary: only the tokens in the history change
            ids, new, targets, _ = self._changes(cand, *windows)
            if not in_sync_free_step() and not bool(targets.any()):
                return cand
            out = cand.owned(ctx.backend)
            write_tokens(out.logits, ids, new, targets)
            return out
        counts = token_counts(history, freq_counted, vocab)
        seen = counts > 0 if rep_counted is freq_counted else token_counts(history, rep_counted, vocab) > 0
        if cand.ids is not None:
            counts, seen = counts.gather(1, cand.ids), seen.gather(1, cand.ids)
        x = cand.logits
        r = rep[:, None]
        logits = torch.where(seen, torch.where(x <= 0, x * r, x / r), x)
        if scope == "vllm":  # vLLM subtracts the two terms one after the other
            logits = logits - counts * freq[:, None]
            logits = logits - (counts > 0).to(x.dtype) * pres[:, None]
        else:  # llama.cpp: logit -= count * freq + (count > 0) * presence
            logits = logits - (counts * freq[:, None] + (counts > 0).to(x.dtype) * pres[:, None])
        if in_sync_free_step() or bool(off.any()):
            logits = torch.where(off[:, None], x, logits)
        return cand.replace_logits(logits)

    def _changes(
        self,
        cand: Candidates,
        history: torch.Tensor,
        rep_counted: torch.Tensor,
        freq_counted: torch.Tensor,
        rep: torch.Tensor,
        freq: torch.Tensor,
        pres: torch.Tensor,
        off: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The dense path's arithmetic at the history positions only, O(B * L log L) instead of O(B * V): the
        token ids (B, L), their new logits, where a change applies (positions of one token carry one value) and
        the first position of each changed token. Small CPU batches take numpy (~1 us an operation against
        torch's ~4): the same float32 operations in the same order, so the same bits (tests/test_tokens.py)."""
        if (
            history.device.type == "cpu"
            and cand.logits.device.type == "cpu"
            and history.numel() <= _NP_SMALL
            and not in_sync_free_step()
        ):
            return _changes_np(cand.logits, history, rep_counted, freq_counted, rep, freq, pres, off, self.params.scope)
        vocab = cand.vocab_size
        inside = (history >= 0) & (history < vocab)
        targets = (rep_counted | freq_counted) & inside & ~off[:, None]
        ids = history.clamp(0, vocab - 1)
        ones = torch.ones(history.shape, dtype=torch.float32, device=history.device)
        groups = TokenGroups.of(ids, targets)
        counts = groups.reduce(ones, freq_counted & inside)
        seen = counts > 0 if rep_counted is freq_counted else groups.reduce(ones, rep_counted & inside) > 0
        x = cand.logits.gather(1, ids)  # (B, L) the current logits of the history's tokens
        r = rep[:, None]
        new = torch.where(seen, torch.where(x <= 0, x * r, x / r), x)
        if self.params.scope == "vllm":
            new = new - counts * freq[:, None]
            new = new - (counts > 0).to(x.dtype) * pres[:, None]
        else:
            new = new - (counts * freq[:, None] + (counts > 0).to(x.dtype) * pres[:, None])
        return ids, new, targets, groups.first()


_NP_SMALL = 4096  # history elements (B * L) up to which the changes are computed with numpy


def _changes_np(
    logits: torch.Tensor,
    history: torch.Tensor,
    rep_counted: torch.Tensor,
    freq_counted: torch.Tensor,
    rep: torch.Tensor,
    freq: torch.Tensor,
    pres: torch.Tensor,
    off: torch.Tensor,
    scope: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Penalties._changes in numpy: tokens grouped per row by np.unique on row * V + id."""
    h = history.numpy()
    batch, length = h.shape
    vocab = logits.shape[1]
    inside = (h >= 0) & (h < vocab)
    freq_in = freq_counted.numpy() & inside
    targets = (rep_counted.numpy() | freq_counted.numpy()) & inside & ~off.numpy()[:, None]
    ids = np.clip(h, 0, vocab - 1)
    rows = np.arange(batch)[:, None]
    key = np.where(targets, rows * vocab + ids, -1 - np.arange(batch * length).reshape(batch, length)).ravel()
    _, first_at, group = np.unique(key, return_index=True, return_inverse=True)
    counts = np.bincount(group, weights=freq_in.ravel())[group].reshape(batch, length)
    counts = np.where(targets, counts, 0.0).astype(np.float32)
    if rep_counted is freq_counted:
        seen = counts > 0
    else:
        rep_in = (rep_counted.numpy() & inside).ravel()
        seen = (np.bincount(group, weights=rep_in)[group].reshape(batch, length) > 0) & targets
    first = np.zeros(batch * length, dtype=bool)
    first[first_at] = True
    first = first.reshape(batch, length) & targets
    x = logits.numpy()[rows, ids]
    r = rep.numpy()[:, None]
    present = (counts > 0).astype(np.float32)
    with np.errstate(over="ignore"):  # a logit near float32's limit pushed past it is +-inf, as torch and C give it
        new = np.where(seen, np.where(x <= 0, x * r, x / r), x)
        if scope == "vllm":
            new = new - counts * freq.numpy()[:, None]
            new = new - present * pres.numpy()[:, None]
        else:
            new = new - (counts * freq.numpy()[:, None] + present * pres.numpy()[:, None])
    return (
        torch.from_numpy(ids),
        torch.from_numpy(new.astype(np.float32, copy=False)),
        torch.from_numpy(targets),
        torch.from_numpy(first),
    )


@hookimpl
def register_samplers(register):
    register(Penalties)
