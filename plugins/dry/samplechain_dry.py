"""`dry`: llama.cpp's DRY ("don't repeat yourself") sampler, `llama_sampler_init_dry`.

Over the last `penalty_last_n` tokens of the history (prompt then generated, as llama-server feeds the prompt to
the sampler; -1 = all, 0 disables): for each earlier position whose preceding tokens repeat the end of the
context for `len >= allowed_length` tokens, the token that followed it would extend the repetition; it gets
`logit -= multiplier * base ** (len - allowed_length)` (the largest len per token; the exponent capped at
`88.7228391 / ln(base)` so the penalty never overflows float32). Sequence breakers cut repetitions: a match never
reaches back past the most recent breaker occurrence, and a single-token breaker is never penalised.

Breakers are `breaker_ids` (token-id sequences: head then tail, as llama.cpp's processed breakers) and
`breakers` (strings, resolved in `prepare` through the core's string service, `samplechain.strings
.overlapping_sequences`, llama.cpp's `get_overlapping_token_sequences`: every token containing the string is a
single-token breaker; a token ending in a prefix of it, followed by the tokenized rest, is a sequence). The
default is llama.cpp's four ("\n", ":", "\"", "*"), resolved whenever the chain is prepared with a tokenizer
(`generate()` does it; on bare logits `chain.prepare(tokenizer=...)`). Without a tokenizer the defaults cannot be
resolved: a DRY that is on runs without string breakers and warns once (`breakers = []` says so without a
warning); other strings without a tokenizer are an error (give them as `breaker_ids`). The defaults are told
apart by value, so the presets, which restate them, behave the same.

The repeat lengths are the Z-array of the reversed window (llama.cpp computes it with the Z-algorithm); here they
come from a comparison of all shifts at once, one vectorised pass per matched length, batched over rows.
"""

from __future__ import annotations

import warnings
from typing import Any

import attrs
import torch

from samplechain import (
    Backend,
    Candidates,
    ChainWarning,
    Sampler,
    SamplingError,
    Stage,
    StepContext,
    finite,
    hookimpl,
    in_range,
)
from samplechain.strings import overlapping_sequences
from samplechain.tokens import per_token_reduce, write_tokens

FLOAT_MAX_LOG = 88.7228391  # as llama.cpp: ~ln(FLT_MAX)
MAX_TAIL = 20  # llama.cpp's MAX_SEQ_LEN: a breaker's tail is cut to 20 tokens
LLAMA_CPP_BREAKERS = ("\n", ":", '"', "*")


def _ids_ok(_inst, _attr, value) -> None:
    for seq in value:
        if not seq or any(t < 0 for t in seq):
            raise ValueError(f"each breaker is a non-empty sequence of non-negative token ids, got {list(seq)}")


def _strings_ok(_inst, _attr, value) -> None:
    for s in value:
        if not s:
            raise ValueError("a sequence breaker must be a non-empty string")


@attrs.frozen
class DryParams:
    multiplier: float = attrs.field(default=0.0, validator=[finite, in_range(0.0, None, hint="0 disables")])
    base: float = attrs.field(default=1.75, validator=[finite, in_range(1.0, None)])
    allowed_length: int = attrs.field(default=2, validator=in_range(0, None))
    penalty_last_n: int = attrs.field(default=-1, validator=in_range(-1, None, hint="-1 = whole context, 0 disables"))
    breakers: tuple[str, ...] = attrs.field(  # need a tokenizer; without one the defaults are off
        default=LLAMA_CPP_BREAKERS, validator=_strings_ok
    )
    breaker_ids: tuple[tuple[int, ...], ...] = attrs.field(default=(), validator=_ids_ok)


class Dry(Sampler):
    name = "dry"
    stage = Stage.TRANSFORM
    role = "penalty"
    Params = DryParams
    request_aliases = {
        "dry_multiplier": "multiplier",
        "dry_base": "base",
        "dry_allowed_length": "allowed_length",
        "dry_penalty_last_n": "penalty_last_n",
    }
    summary = "DRY: penalise tokens that would extend a repeated sequence"

    def __init__(self, params: DryParams) -> None:
        super().__init__(params)
        self._tokenizer = None
        self._warned = False
        self._set_breakers(tuple(tuple(s[: MAX_TAIL + 1]) for s in params.breaker_ids))

    def needs_history(self) -> bool:
        return True

    # ---------------------------------------------------------------- breakers
    def prepare(self, setup: Any) -> None:
        """Resolve string breakers through `setup.tokenizer` (the hook a generation would call once); the string
        service caches them per tokenizer vocabulary and string."""
        tokenizer = getattr(setup, "tokenizer", setup)
        if tokenizer is None or tokenizer is self._tokenizer:
            return
        seqs = list(tuple(s[: MAX_TAIL + 1]) for s in self.params.breaker_ids)
        for text in self.params.breakers:
            seqs.extend(overlapping_sequences(tokenizer, text, max_tail=MAX_TAIL))
        self._tokenizer = tokenizer
        self._set_breakers(tuple(dict.fromkeys(seqs)))

    def _set_breakers(self, seqs: tuple[tuple[int, ...], ...]) -> None:
        self._single = torch.tensor(sorted({s[0] for s in seqs if len(s) == 1}), dtype=torch.int64)
        groups: dict[int, list[tuple[int, ...]]] = {}
        for s in seqs:
            if len(s) > 1:
                groups.setdefault(len(s), []).append(s)
        self._multi = {n: torch.tensor(v, dtype=torch.int64) for n, v in groups.items()}

    # ---------------------------------------------------------------- apply
    def is_noop(self, ctx: StepContext) -> bool:
        return ctx.scalar("multiplier") == 0.0 or ctx.scalar("penalty_last_n") == 0

    def apply(self, cand: Candidates, ctx: StepContext) -> Candidates:
        if self.is_noop(ctx):
            return cand
        if self.params.breakers and self._tokenizer is None:
            self._no_tokenizer()
        mult, base = ctx.param("multiplier"), ctx.param("base")
        allowed, last_n = ctx.param("allowed_length"), ctx.param("penalty_last_n")
        history = ctx.history
        assert history is not None  # needs_history() is declared, so the chain passes it
        device = history.device
        L = history.shape[1]
        valid = history >= 0
        count_valid = valid.sum(dim=1)
        n_rep = torch.where(last_n < 0, count_valid, torch.minimum(count_valid, last_n.clamp(min=0)))  # (B,)
        off = (mult == 0.0) | (base < 1.0) | (last_n == 0) | (n_rep <= allowed)
        if bool(off.all()):
            return cand
        N = int(n_rep.max())
        window = history[:, L - N :]
        from_end = torch.arange(N - 1, -1, -1, device=device)[None, :]
        inside = from_end < n_rep[:, None]
        # outside a row's window: distinct negative sentinels, equal to nothing (not even each other)
        window = torch.where(inside, window, -1 - torch.arange(N, device=device)[None, :])
        rep_limit = self._rep_limit(window, from_end, n_rep)
        off |= rep_limit < allowed
        if bool(off.all()):
            return cand
        rev = window.flip(1)  # rev[:, 0] is the latest token
        repeat = _repeats(rev, off, rep_limit)

        # step 3: the token after each repeat would extend it; keep the longest per token
        ks = torch.arange(N, device=device)[None, :]
        counts = (ks >= 1) & (ks < n_rep[:, None]) & (repeat >= allowed[:, None]) & ~off[:, None]
        follower = torch.roll(rev, 1, dims=1)  # follower[:, k] = rev[:, k - 1]
        ok = counts & (follower >= 0) & (follower < cand.vocab_size)
        if cand.ids is None:  # the full vocabulary: penalise the followers in place, never touch the other tokens
            return self._sparse(cand, follower, repeat, ok, mult, base, allowed, ctx.backend)
        return self._dense(cand, follower, repeat, ok, mult, base, allowed)

    def _no_tokenizer(self) -> None:
        """String breakers without a tokenizer: llama.cpp's defaults are dropped with a warning (once), others
        refused."""
        if tuple(self.params.breakers) != LLAMA_CPP_BREAKERS:
            raise SamplingError(
                f"{self.qualified_name()}: string sequence breakers {list(self.params.breakers)} need a "
                "tokenizer: run the chain through generate() or call chain.prepare(tokenizer=...), or give "
                "them as breaker_ids (token-id sequences), or set breakers = []"
            )
        if not self._warned:
            self._warned = True
            warnings.warn(
                f"{self.qualified_name()}: no tokenizer, so llama.cpp's default sequence breakers "
                "are off: call chain.prepare(tokenizer=...) (generate() does), or set breakers = [] "
                "or breaker_ids to choose",
                ChainWarning,
                stacklevel=3,
            )

    def _rep_limit(self, window: torch.Tensor, from_end: torch.Tensor, n_rep: torch.Tensor) -> torch.Tensor:
        """Step 1: the most recent breaker bounds the repeat length; (B,) the longest repeat each row allows."""
        N, device = window.shape[1], window.device
        heads: list[torch.Tensor] = []  # per breaker group: (B,) index from the end of the most recent head
        tails: list[int] = []
        big = torch.full((), N + 1, dtype=torch.int64, device=device)
        if self._single.numel():
            hit = torch.isin(window, self._single.to(device))
            heads.append(torch.where(hit, from_end, big).amin(dim=1))
            tails.append(0)
        for n, seqs in self._multi.items():
            if N < n:
                continue
            grams = window.unfold(1, n, 1)  # (B, N - n + 1, n): grams[:, p] starts at window position p
            hit = (grams[:, :, None, :] == seqs.to(device)[None, None, :, :]).all(dim=-1).any(dim=-1)
            heads.append(torch.where(hit, from_end[:, : N - n + 1], big).amin(dim=1))
            tails.append(n - 1)
        if not heads:
            return n_rep
        head = torch.stack(heads, dim=1)  # (B, G)
        first = head.amin(dim=1)  # llama.cpp stops at the most recent head ...
        tail = torch.where(head == first[:, None], torch.tensor(tails, device=device)[None, :], -1).amax(dim=1)
        return torch.where(first <= N, first - tail, n_rep)  # ... and takes its longest breaker there

    def _dense(self, cand, follower, repeat, ok, mult, base, allowed) -> Candidates:
        """Steps 3-4 over a candidate set: each token's longest repeat through a (B, V) table, then the penalty at
        the candidates."""
        B, vocab = follower.shape[0], cand.vocab_size
        best = torch.full((B, vocab + 1), -1, dtype=torch.int64, device=follower.device)
        best.scatter_reduce_(1, torch.where(ok, follower, vocab), torch.where(ok, repeat, -1), reduce="amax")
        best = best[:, :vocab]
        if self._single.numel():  # single-token breakers are never penalised
            best[:, self._single[self._single < vocab].to(follower.device)] = -1
        # step 4: the penalty, exponent capped against float overflow
        penalty = dry_penalty(best, mult, base, allowed)
        has = best >= 0
        penalty, has = penalty.gather(1, cand.ids), has.gather(1, cand.ids)
        x = cand.logits
        return cand.replace_logits(torch.where(has, x - penalty, x))

    def _sparse(
        self,
        cand: Candidates,
        follower: torch.Tensor,
        repeat: torch.Tensor,
        ok: torch.Tensor,
        mult: torch.Tensor,
        base: torch.Tensor,
        allowed: torch.Tensor,
        backend: Backend,
    ) -> Candidates:
        """Steps 3-4 at the history positions only: each follower token gets its longest repeat (grouped by token
        within the row) and the same penalty as the dense path, written to those tokens alone."""
        if self._single.numel():  # single-token breakers are never penalised
            ok = ok & ~torch.isin(follower, self._single.to(follower.device))
        if not bool(ok.any()):
            return cand
        ids = follower.clamp(0, cand.vocab_size - 1)
        best = per_token_reduce(ids, repeat, ok, ok, reduce="amax")  # (B, N) the longest repeat of each follower
        penalty = dry_penalty(best, mult, base, allowed)
        x = cand.logits.gather(1, ids)
        out = cand.owned(backend)
        write_tokens(out.logits, ids, x - penalty, ok)
        return out


def dry_penalty(best: torch.Tensor, mult: torch.Tensor, base: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """multiplier * base ** (len - allowed_length), the exponent capped against float overflow (llama.cpp): pow in
    double, stored as float. best: (B, X) repeat lengths; the rest (B,)."""
    exp = best - allowed[:, None]
    hot = base > 1.000001
    max_exp = torch.where(hot, (torch.tensor(FLOAT_MAX_LOG) / torch.log(torch.where(hot, base, 2.0))).trunc(), 0.0)
    max_exp = max_exp.to(torch.int64)[:, None]
    exp = torch.where((max_exp > 0) & (exp > max_exp), max_exp, exp)
    return (mult.double()[:, None] * torch.pow(base.double()[:, None], exp.double())).to(torch.float32)


@hookimpl
def register_samplers(register):
    register(Dry)


def _repeats(rev: torch.Tensor, off: torch.Tensor, rep_limit: torch.Tensor) -> torch.Tensor:
    """Step 2: repeat[:, k] = how far the context read backwards from its end (rev: latest token first) matches
    itself shifted by k, capped at each row's rep_limit; rows `off` are not followed."""
    B, N = rev.shape
    repeat = torch.zeros(B, N, dtype=torch.int64, device=rev.device)
    alive = torch.ones(B, N, dtype=torch.bool, device=rev.device)
    alive[:, 0] = False
    limit = int(torch.where(off, 0, rep_limit).max())
    for n in range(min(limit, N - 1)):
        alive[:, N - n :] = False  # n + k < N
        alive[:, 1 : N - n] &= rev[:, n + 1 :] == rev[:, n : n + 1]
        if not bool(alive.any()):
            break
        repeat += alive
    return torch.minimum(repeat, rep_limit[:, None])
