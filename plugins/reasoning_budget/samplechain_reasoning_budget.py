"""`reasoning_budget`: a per-request thinking budget, llama.cpp's `--reasoning-budget` state machine
(common/reasoning-budget.cpp) with vLLM's per-request `thinking_token_budget`.

Per request, over the tokens accepted so far (each row its own machine, all rows advanced at once):

    IDLE          watching for the start marker (a token sequence, matched as llama.cpp's token_matcher does)
      -> COUNTING   on the start marker; budget 0: straight to FORCING
    COUNTING      every token that does not complete the end marker counts; the model may close the block itself
      -> DONE       the end marker completed (natural end)
      -> FORCING    the budget is spent and the text so far ends on a whole UTF-8 character
      -> WAITING    the budget is spent inside a multi-byte character
    WAITING       tokens pass until the text ends on a whole character (or the model closes the block)
    FORCING       every logit but the next forced token's is -inf (that one is 0): the message, then the end marker
      -> DONE       the forced sequence is out
    DONE          passthrough; with `rearm`, a new start marker starts a new block with a fresh budget

Differences from llama.cpp, each on purpose:
- budget -1 means unlimited (llama.cpp does not create the sampler; its machine would force at once).
- "a whole character" is decided on the text so far (a (V, 4) table: token x continuation bytes still awaited ->
  continuation bytes awaited after it), not on the token's piece alone: llama.cpp's `common_utf8_is_complete(piece)`
  calls a piece of continuation bytes incomplete even when it completes the character, so it lets one more token
  through after a character split over byte tokens.
- a partly emitted end marker is continued, not restarted (as vLLM): when the budget runs out right after the first
  tokens of the end marker, the rest of the end marker is forced (the message is skipped); llama.cpp forces the
  whole message + end marker after the fragment.
- one budget per request: after the block ends the machine stays DONE (llama.cpp re-arms on every start marker, as
  vLLM does); `rearm = true` gives each block its own budget.
- a prompt that ends inside an open block (a chat template that writes `<think>` for the model) starts the
  request in COUNTING, its thinking tokens in the prompt counted, as vLLM does (llama.cpp's server passes an initial
  state instead); earlier, closed blocks of the prompt change nothing. The prompt is read from the history the
  chain gets (generate(), model.generate, vLLM); without history a request starts IDLE.
- an accepted token other than the forced one (a caller accepting its own tokens) still advances the forced
  sequence, as llama.cpp.

Markers are chain-level: `start` / `end` strings resolved with the tokenizer in prepare() (encode without special
tokens: an added token such as Qwen's `<think>` is one id, on other tokenizers the string is several), or
`start_ids` / `end_ids` given directly. `message` (or `message_ids`) is forced before the end marker.
"""

from __future__ import annotations

import weakref
from typing import Any

import attrs
import torch

from samplechain import (
    Candidates,
    ConfigError,
    Sampler,
    SamplerSetup,
    Stage,
    StepContext,
    hookimpl,
    in_range,
    token_ids_field,
)
from samplechain.strings import byte_table

IDLE, COUNTING, WAITING, FORCING, DONE = 0, 1, 2, 3, 4
_UTF8: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # strings.ByteTable -> its utf8_table

_BUDGET = in_range(-1, None, hint="-1 unlimited, 0 closes the block at once")


@attrs.frozen
class ReasoningBudgetParams:
    budget: int = attrs.field(default=-1, validator=_BUDGET)  # thinking tokens per request (per block with rearm)
    rearm: bool = False  # give every thinking block its own budget (llama.cpp, vLLM); default: one per request
    start: str = "<think>"  # the start marker, tokenized in prepare() (an added token is one id)
    end: str = "</think>"  # the end marker: the model may write it itself; forced when the budget is spent
    start_ids: tuple[int, ...] = token_ids_field()  # non-empty: used instead of `start`
    end_ids: tuple[int, ...] = token_ids_field()  # non-empty: used instead of `end`
    message: str = ""  # forced before the end marker when the budget runs out
    message_ids: tuple[int, ...] = token_ids_field()  # non-empty: used instead of `message`


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def utf8_table(tokenizer: Any) -> torch.Tensor:
    """(V, 4) int64: for token v and n continuation bytes still awaited before it, how many are awaited after its
    bytes. A lead byte awaits 1-3, a continuation byte settles one, anything else (ASCII, a stray continuation, a
    broken sequence) awaits none; a token without bytes (special) leaves the count as it was."""
    table = byte_table(tokenizer)
    if table in _UTF8:  # one per distinct vocabulary, as the byte table itself
        return _UTF8[table]
    data, lengths = table.bytes.long(), table.lengths
    need = torch.arange(4).expand(data.shape[0], 4).clone()  # (V, 4): column n starts awaiting n
    for j in range(data.shape[1]):  # the byte columns, vectorised over the vocabulary
        b = data[:, j : j + 1]
        after = torch.where(
            (b & 0xC0) == 0x80,
            (need - 1).clamp(min=0),
            torch.where(
                (b & 0xE0) == 0xC0, 1, torch.where((b & 0xF0) == 0xE0, 2, torch.where((b & 0xF8) == 0xF0, 3, 0))
            ),
        )
        need = torch.where((j < lengths)[:, None], after, need)
    _UTF8[table] = need
    return need


def _match(seq: torch.Tensor, pos: torch.Tensor, tok: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """llama.cpp's token_matcher.advance, per row: (new position, matched). A mismatch restarts at 1 when the token
    is the sequence's first, else at 0 (no fallback to shorter prefixes, as llama.cpp)."""
    n = seq.numel()
    advanced = tok == seq[pos.clamp(max=n - 1)]
    new = torch.where(advanced, pos + 1, (tok == seq[0]).long())
    hit = new >= n
    return torch.where(hit, 0, new), hit


def _last_at(history: torch.Tensor, seq: torch.Tensor, end: torch.Tensor) -> torch.Tensor:
    """(B,) the column where the last occurrence of seq starts among columns < end[b] (its tokens too), -1 if
    none."""
    n, width = seq.numel(), history.shape[1]
    if width < n:
        return torch.full((history.shape[0],), -1, dtype=torch.int64, device=history.device)
    windows = history.unfold(1, n, 1)  # (B, width - n + 1, n)
    found = (windows == seq).all(dim=-1)
    cols = torch.arange(width - n + 1, device=history.device)
    found &= cols + n <= end[:, None]
    return torch.where(found, cols, -1).amax(dim=1)


# the start, end and forced (message then end) marker ids on a device, and the tokenizer's UTF-8 table there (None
# without a tokenizer)
_Consts = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]


class ReasoningBudget(Sampler):
    name = "reasoning_budget"
    stage = Stage.TRANSFORM
    role = "mask"
    Params = ReasoningBudgetParams
    request_aliases = {
        "reasoning_budget": "budget",
        "thinking_token_budget": "budget",
        "reasoning_budget_rearm": "rearm",
    }
    summary = "a thinking budget: force the end marker after N tokens of a thinking block (llama.cpp, vLLM)"

    def __init__(self, params: ReasoningBudgetParams) -> None:
        super().__init__(params)
        # resolved token ids, see prepare()
        self._start: list[int] | None = None
        self._end: list[int] | None = None
        self._message: list[int] | None = None
        self._utf8: torch.Tensor | None = None
        self._on: dict[Any, _Consts] = {}
        self._seen: tuple | None = None  # (request ids, positions, state) the last prompt read gave
        self._resolve(None)

    # ----------------------------------------------------------------- set-up
    def _resolve(self, tokenizer: Any) -> None:
        p = self.params

        def ids(key: str, given: tuple[int, ...], text: str, *, may_be_empty: bool = False) -> list[int] | None:
            if given:
                return list(given)
            if not text:
                if may_be_empty:
                    return []
                raise ConfigError(f"reasoning_budget.{key} = '': give the {key} marker as a string or {key}_ids")
            if tokenizer is None:
                return None  # resolved when prepare() gets a tokenizer
            found = _encode(tokenizer, text)
            if not found:
                raise ConfigError(f"reasoning_budget.{key} = {text!r} tokenizes to no tokens: give {key}_ids")
            return found

        self._start = ids("start", p.start_ids, p.start)
        self._end = ids("end", p.end_ids, p.end)
        self._message = ids("message", p.message_ids, p.message, may_be_empty=True)
        self._on = {}

    def prepare(self, setup: SamplerSetup) -> None:
        self._resolve(setup.tokenizer)
        self._utf8 = utf8_table(setup.tokenizer) if setup.tokenizer is not None else None
        if setup.vocab_size is not None:
            for key, found in (("start", self._start), ("end", self._end), ("message", self._message)):
                bad = [t for t in found or () if t >= setup.vocab_size]
                if bad:
                    raise ConfigError(
                        f"reasoning_budget.{key} has token ids {bad} outside the vocabulary of {setup.vocab_size}"
                    )

    def _tensors(self, device: Any) -> _Consts:
        if self._start is None or self._end is None or self._message is None:
            missing = [
                k for k, v in (("start", self._start), ("end", self._end), ("message", self._message)) if v is None
            ]
            raise ConfigError(
                f"reasoning_budget cannot resolve {', '.join(missing)} without a tokenizer: run the chain through "
                "generate() / model.generate / vLLM, call chain.prepare(tokenizer=...), or give "
                + ", ".join(f"{k}_ids" for k in missing)
            )
        key = torch.device(device)
        if key not in self._on:
            as_t = lambda v: torch.tensor(v, dtype=torch.int64, device=key)  # noqa: E731
            utf8 = None if self._utf8 is None else self._utf8.to(key)
            self._on[key] = (as_t(self._start), as_t(self._end), as_t(self._message + self._end), utf8)
        return self._on[key]

    # ----------------------------------------------------------------- declared properties
    def is_stateful(self) -> bool:
        return True

    def needs_history(self) -> bool:
        return True  # the prompt, read once per request: does it leave a thinking block open?

    def is_noop(self, ctx: StepContext) -> bool:
        return ctx.scalar("budget") == -1

    def state_spec(self):
        return {
            "state": (torch.int64, (), IDLE),
            "remaining": (torch.int64, (), 0),
            "force_pos": (torch.int64, (), 0),
            "start_pos": (torch.int64, (), 0),
            "end_pos": (torch.int64, (), 0),
            "utf8_need": (torch.int64, (), 0),
            "started": (torch.bool, (), False),
        }

    # ----------------------------------------------------------------- the machine
    def _step(
        self,
        s: dict[str, torch.Tensor],
        tok: torch.Tensor,
        budget: torch.Tensor,
        rearm: torch.Tensor,
        consts: _Consts,
    ) -> dict[str, torch.Tensor]:
        """Every row's machine after accepting tok (B,): llama.cpp's common_reasoning_budget_accept, vectorised."""
        start, end, forced, utf8 = consts
        st, rem, fpos, spos, epos, need = (
            s[k] for k in ("state", "remaining", "force_pos", "start_pos", "end_pos", "utf8_need")
        )
        if utf8 is not None:
            known = (tok >= 0) & (tok < utf8.shape[0])  # ids past the tokenizer (padded vocabularies): no bytes
            need = torch.where(known, utf8[tok.clamp(0, utf8.shape[0] - 1), need], need)
        whole = need == 0  # the text so far ends on a whole character

        watching = (st == IDLE) | ((st == DONE) & rearm)
        spos_next, opened = _match(start, spos, tok)
        opened &= watching
        inside = (st == COUNTING) | (st == WAITING)
        epos_next, closed = _match(end, epos, tok)
        closed &= inside
        counts = inside & ~closed & (st == COUNTING) & (budget >= 0)
        rem_next = rem - counts.long()
        spent = counts & (rem_next <= 0)
        force = (spent & whole) | (inside & ~closed & (st == WAITING) & whole)
        wait = spent & ~whole
        forcing = st == FORCING
        # a partly emitted end marker goes on where it stands (the message skipped), else message + end from 0
        resume_at = torch.where(epos_next > 0, forced.numel() - end.numel() + epos_next, 0)

        new_st = torch.where(opened, torch.where(budget == 0, FORCING, COUNTING), st)
        new_st = torch.where(closed, DONE, new_st)
        new_st = torch.where(force, FORCING, torch.where(wait, WAITING, new_st))
        new_fpos = torch.where(opened, 0, torch.where(force, resume_at, fpos))
        new_fpos = torch.where(forcing, fpos + 1, new_fpos)
        new_st = torch.where(forcing & (new_fpos >= forced.numel()), DONE, new_st)
        return {
            "state": new_st,
            "remaining": torch.where(opened, budget, torch.where(counts, rem_next, rem)),
            "force_pos": new_fpos,
            "start_pos": torch.where(watching, spos_next, spos),
            # inside a block the end matcher runs; it starts afresh on a new block and when waiting or forcing
            "end_pos": torch.where(inside & ~force & ~wait, epos_next, torch.where(opened | force | wait, 0, epos)),
            "utf8_need": need,
            "started": torch.ones_like(s["started"]),
        }

    def _from_prompt(
        self, ctx: StepContext, rows: torch.Tensor, consts: _Consts, state: dict[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        """The state of requests not seen before (rows (B,) bool): a prompt whose last start marker is not closed
        opens the block (its thinking tokens counted, as vLLM); then any tokens generated before this sampler saw
        the request (a resumed vLLM request) are replayed."""
        history = None if ctx.missing_history is not None else ctx.history
        if history is None:
            return state
        start, end, _, _ = consts
        budget = ctx.param("budget")
        width = history.shape[1]
        known = (history >= 0).sum(dim=1)
        lengths = ctx.prompt_lengths if ctx.prompt_lengths is not None else known - ctx.positions
        prompt_end = width - known + lengths  # column after the prompt's last token
        last_start, last_end = _last_at(history, start, prompt_end), _last_at(history, end, prompt_end)
        open_ = rows & (last_start > last_end)
        remaining = budget - (prompt_end - last_start - start.numel())
        begin = torch.where(open_ & (budget >= 0) & (remaining <= 0), FORCING, COUNTING)
        state = dict(state)
        state["state"] = torch.where(open_, begin, torch.where(rows, IDLE, state["state"]))
        state["remaining"] = torch.where(open_, torch.where(budget >= 0, remaining, budget), state["remaining"])
        for key in ("force_pos", "start_pos", "end_pos", "utf8_need"):
            state[key] = torch.where(rows, 0, state[key])
        generated = known - lengths
        most = int(torch.where(rows, generated, 0).max()) if rows.any() else 0
        rearm = ctx.param("rearm")
        for j in range(most):  # replay, oldest first, the generated tokens of the rows being set up
            col = width - most + j
            active = rows & (j >= most - generated)
            stepped = self._step(state, history[:, col].clamp(min=0), budget, rearm, consts)
            state = {k: torch.where(active, stepped[k], v) for k, v in state.items()}
        return state

    def _current(self, ctx: StepContext, consts: _Consts) -> dict[str, torch.Tensor]:
        """Every row's state before this step's token: the stored one, or for a request not seen before the one its
        prompt gives. An accept() without history (transformers' select=False path: `chain.accept` after
        `chain.process`) takes what the apply() of the same step read from its history."""
        state = {k: ctx.state[k] for k in self.state_spec()}
        fresh = ~state["started"]
        if not bool(fresh.any()):
            return state
        if ctx.missing_history is None and ctx.history is not None:
            state = self._from_prompt(ctx, fresh, consts, state)
            self._seen = (ctx.request_ids, ctx.positions.clone(), state)
        elif self._seen is not None and self._seen[0] == ctx.request_ids and torch.equal(self._seen[1], ctx.positions):
            state = {k: torch.where(fresh, self._seen[2][k], v) for k, v in state.items()}
        return state

    # ----------------------------------------------------------------- hooks
    def apply(self, cand: Candidates, ctx: StepContext) -> Candidates:
        if ctx.scalar("budget") == -1 and self._start is None:
            return cand  # unlimited everywhere and no markers yet: nothing to watch
        consts = self._tensors(cand.logits.device)
        state = self._current(ctx, consts)
        forcing = state["state"] == FORCING
        if not bool(forcing.any()):
            return cand
        forced = consts[2][state["force_pos"].clamp(0, consts[2].numel() - 1)]  # (B,)
        cand = cand.full()  # the forced token comes back even when an earlier filter removed it
        one = torch.where(cand.token_ids() == forced[:, None], 0.0, float("-inf")).to(cand.logits.dtype)
        return cand.replace_logits(torch.where(forcing[:, None], one, cand.logits), is_sorted=False)

    def accept(self, ctx: StepContext, token_ids: torch.Tensor):
        if ctx.scalar("budget") == -1 and self._start is None:
            return {}
        consts = self._tensors(token_ids.device)
        state = self._current(ctx, consts)
        return self._step(state, token_ids.long(), ctx.param("budget"), ctx.param("rearm"), consts)


@hookimpl
def register_samplers(register):
    register(ReasoningBudget)
