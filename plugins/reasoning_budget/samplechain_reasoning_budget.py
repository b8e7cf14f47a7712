"""`reasoning_budget`: a per-request thinking budget, llama.cpp's `--reasoning-budget` state machine
(common/reasoning-budget.cpp) with vLLM's per-request `thinking_token_budget`, plus warnings along the way and no cut
inside an open code fence or tool call.

Per request, over the tokens accepted so far (each row its own machine, all rows advanced at once):

    IDLE          watching for the start marker (a token sequence, matched as llama.cpp's token_matcher does)
      -> COUNTING   on the start marker; budget 0: straight to FORCING
    COUNTING      every token that does not complete the end marker counts; the model may close the block itself
      -> DONE       the end marker completed (natural end)
      -> WARNING    a warning point (`warn_at`) is passed, the text ends on a whole UTF-8 character outside every
                    span (`spans`) and budget is left: its text is forced (once per block; a point passed while an
                    earlier warning waits replaces it)
      -> HOLDING    the budget is spent inside an open span and `max_wait` is not 0
      -> FORCING    the budget is spent and the text so far ends on a whole UTF-8 character
      -> WAITING    the budget is spent inside a multi-byte character
    WARNING       every logit but the next warning token's is -inf; its tokens do not count; then COUNTING
    HOLDING       tokens pass until the span closes or `max_wait` tokens have passed (-1: no cap; the model may
                  close the block), then FORCING, or WAITING inside a character
    WAITING       tokens pass until the text ends on a whole character (or the model closes the block)
    FORCING       every logit but the next forced token's is -inf: the message, then the end marker
      -> DONE       the forced sequence is out
    DONE          passthrough; with `rearm`, a new start marker starts a new block with a fresh budget

Differences from llama.cpp, each on purpose:
- budget -1 means unlimited (llama.cpp does not create the sampler; its machine would force at once).
- "a whole character" is decided on the text so far (a (V, 4) table: token x continuation bytes still awaited ->
  continuation bytes awaited after it), not on the token's piece alone: llama.cpp's `common_utf8_is_complete(piece)`
  calls a piece of continuation bytes incomplete even when it completes the character, so it lets one more token
  through after a character split over byte tokens; it calls a piece without bytes (a special token) complete even
  inside a character.
- a partly emitted end marker is continued, not restarted (as vLLM): when the budget runs out right after the first
  tokens of the end marker, the rest of the end marker is forced (the message is skipped); llama.cpp forces the
  whole message + end marker after the fragment.
- one budget per request: after the block ends the machine stays DONE (llama.cpp re-arms on every start marker, as
  vLLM does); `rearm = true` gives each block its own budget.
- a prompt that ends inside an open block (a chat template that writes `<think>` for the model) starts the
  request in COUNTING, its thinking tokens in the prompt counted, as vLLM does (llama.cpp's server passes an initial
  state instead); earlier, closed blocks of the prompt change nothing. The prompt is read from the history the
  chain gets (generate(), model.generate, vLLM); without history a request starts IDLE.
- warnings (`warn_at`) and the hold in an open span (`max_wait`) are ours; with neither set the machine is
  llama.cpp's with the differences above.
- an accepted token other than the forced one (a caller accepting its own tokens) still advances the forced
  sequence, as llama.cpp.

Markers are chain-level: `start` / `end` strings resolved with the tokenizer in prepare() (encode without special
tokens: an added token such as Qwen's `<think>` is one id, on other tokenizers the string is several), or
`start_ids` / `end_ids` given directly. `message` (or `message_ids`) is forced before the end marker, each warning's
text (`warn_messages` or `warn_message_ids`) at its point. Spans are found in the decoded text
(samplechain_reasoning_budget_text), so a fence split over tokens is seen; without a tokenizer there is no text: no
UTF-8 wait, no span.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

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
from samplechain_reasoning_budget_text import span_table, utf8_table

IDLE, COUNTING, WAITING, FORCING, DONE, WARNING, HOLDING = range(7)

_BUDGET = in_range(-1, None, hint="-1 unlimited, 0 closes the block at once")
_MAX_WAIT = in_range(-1, None, hint="0 cuts where the budget runs out, -1 waits however long the span stays open")
SPANS = (("```", "```"), ("<tool_call>", "</tool_call>"))
_MILLION = 1_000_000


def _warn_at_ok(inst: Any, _attr: attrs.Attribute, value: tuple[float, ...]) -> None:
    for i, at in enumerate(value):
        if not (math.isfinite(at) and 0 < at < 1):
            raise ValueError(
                f"warn_at[{i}] = {at!r}: each point is a fraction of the budget in (0, 1) (the end itself forces "
                "`message`)"
            )
        if i and at <= value[i - 1]:
            raise ValueError(f"warn_at[{i}] = {at!r}: the points go in increasing order, after {value[i - 1]!r}")
    if value and not (inst.warn_messages or inst.warn_message_ids):
        raise ValueError("a warning needs its text: give warn_messages (or warn_message_ids)")


def _warn_texts_ok(inst: Any, attr: attrs.Attribute, value: tuple[Any, ...]) -> None:
    points = len(inst.warn_at)
    if value and not points:
        raise ValueError(f"{attr.name} without warn_at: give the points too, e.g. warn_at = [0.5, 0.8]")
    if len(value) not in (0, 1, points):
        raise ValueError(f"{len(value)} texts for {points} warn_at points: give one text for all, or one each")
    for i, text in enumerate(value):
        if not text:
            raise ValueError(f"{attr.name}[{i}] is empty")
        if not isinstance(text, str) and any(t < 0 for t in text):
            raise ValueError(f"{attr.name}[{i}] = {list(text)}: token ids are non-negative")


def _spans_ok(_inst: Any, _attr: attrs.Attribute, value: tuple[tuple[str, ...], ...]) -> None:
    for i, span in enumerate(value):
        if len(span) != 2 or not all(span):
            raise ValueError(f"spans[{i}] = {list(span)}: each span is [open, close], two non-empty strings")


def _help(text: str) -> dict[str, str]:
    return {"help": text}  # the field's line in the generated reference


@attrs.frozen
class ReasoningBudgetParams:
    budget: int = attrs.field(default=-1, validator=_BUDGET)  # thinking tokens per request (per block with rearm)
    rearm: bool = False  # give every thinking block its own budget (llama.cpp, vLLM); default: one per request
    max_wait: int = attrs.field(
        default=0,
        validator=_MAX_WAIT,
        metadata=_help("tokens the cut may wait past the budget while the thinking is inside an open span (`spans`)"),
    )
    start: str = "<think>"  # the start marker, tokenized in prepare() (an added token is one id)
    end: str = "</think>"  # the end marker: the model may write it itself; forced when the budget is spent
    start_ids: tuple[int, ...] = token_ids_field()  # non-empty: used instead of `start`
    end_ids: tuple[int, ...] = token_ids_field()  # non-empty: used instead of `end`
    message: str = ""  # forced before the end marker when the budget runs out
    message_ids: tuple[int, ...] = token_ids_field()  # non-empty: used instead of `message`
    warn_at: tuple[float, ...] = attrs.field(
        default=(),
        validator=_warn_at_ok,
        metadata=_help(
            "fractions of the budget, increasing, each in (0, 1), at which a warning is forced (once a block)"
        ),
    )
    warn_messages: tuple[str, ...] = attrs.field(
        default=(), validator=_warn_texts_ok, metadata=_help("the warnings' texts: one for every point, or one each")
    )
    warn_message_ids: tuple[tuple[int, ...], ...] = attrs.field(
        default=(), validator=_warn_texts_ok, metadata=_help("non-empty: used instead of `warn_messages`")
    )
    spans: tuple[tuple[str, ...], ...] = attrs.field(
        default=SPANS,
        validator=_spans_ok,
        metadata=_help("[open, close] markers in the decoded text: the cut waits for them to close (with `max_wait`)"),
    )


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


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


class _Consts(NamedTuple):
    """The resolved ids and tables on one device."""

    start: torch.Tensor
    end: torch.Tensor
    forced: torch.Tensor  # message then end marker
    utf8: torch.Tensor | None  # (V, 4), None without a tokenizer
    spans: torch.Tensor | None  # (V, S) token x span state -> span state; None without a tokenizer or spans
    region: torch.Tensor | None  # (S,) the span a state is inside, 0 outside
    warn_at: torch.Tensor  # (W,) int64 the warn_at points in millionths
    warn_ids: torch.Tensor  # every warning's ids one after the other (one 0 more, so that indexing never fails)
    warn_start: torch.Tensor  # (W,) where each warning's ids start in warn_ids
    warn_len: torch.Tensor  # (W,)

    def span_after(self, span: torch.Tensor, tok: torch.Tensor) -> torch.Tensor:
        if self.spans is None:
            return span
        size = self.spans.shape[0]
        known = (tok >= 0) & (tok < size)  # ids past the tokenizer (padded vocabularies): no bytes
        return torch.where(known, self.spans[tok.clamp(0, size - 1), span], span)

    def outside(self, span: torch.Tensor) -> torch.Tensor:
        if self.region is None:
            return torch.ones_like(span, dtype=torch.bool)
        return self.region[span] == 0

    def warning_token(self, warned: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        which = (warned - 1).clamp(0, max(self.warn_len.numel() - 1, 0))
        at = (self.warn_start[which] + pos) if self.warn_len.numel() else pos
        return self.warn_ids[at.clamp(0, self.warn_ids.numel() - 1)]


class _Row(NamedTuple):
    """The per-request parameters of a step, (B,) each."""

    budget: torch.Tensor
    rearm: torch.Tensor
    max_wait: torch.Tensor


def _row(ctx: StepContext) -> _Row:
    return _Row(ctx.param("budget"), ctx.param("rearm"), ctx.param("max_wait"))


class ReasoningBudget(Sampler):
    name = "reasoning_budget"
    stage = Stage.TRANSFORM
    role = "mask"
    Params = ReasoningBudgetParams
    request_aliases = {
        "reasoning_budget": "budget",
        "thinking_token_budget": "budget",
        "reasoning_budget_rearm": "rearm",
        "reasoning_budget_max_wait": "max_wait",
    }
    summary = "a thinking budget: force the end marker after N tokens of a thinking block (llama.cpp, vLLM)"

    def __init__(self, params: ReasoningBudgetParams) -> None:
        super().__init__(params)
        # resolved token ids, see prepare()
        self._start: list[int] | None = None
        self._end: list[int] | None = None
        self._message: list[int] | None = None
        self._warnings: list[list[int]] | None = None
        self._utf8: torch.Tensor | None = None
        self._spans: tuple[torch.Tensor, torch.Tensor] | None = None
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
        self._warnings = self._warning_ids(tokenizer)
        self._on = {}

    def _warning_ids(self, tokenizer: Any) -> list[list[int]] | None:
        """Each warn_at point's ids (one text given for all: repeated); None while texts wait for a tokenizer."""
        p = self.params
        found = [list(t) for t in p.warn_message_ids]
        if not found and p.warn_messages:
            if tokenizer is None:
                return None
            for i, text in enumerate(p.warn_messages):
                found.append(_encode(tokenizer, text))
                if not found[-1]:
                    raise ConfigError(
                        f"reasoning_budget.warn_messages[{i}] = {text!r} tokenizes to no tokens: give warn_message_ids"
                    )
        return found * len(p.warn_at) if len(found) == 1 else found

    def prepare(self, setup: SamplerSetup) -> None:
        self._resolve(setup.tokenizer)
        tok = setup.tokenizer
        self._utf8 = utf8_table(tok) if tok is not None else None
        self._spans = span_table(tok, self.params.spans) if tok is not None and self.params.spans else None
        if setup.vocab_size is not None:
            found = [("start", self._start), ("end", self._end), ("message", self._message)]
            found += [(f"warn_message_ids[{i}]", w) for i, w in enumerate(self._warnings or ())]
            for key, seq in found:
                bad = [t for t in seq or () if t >= setup.vocab_size]
                if bad:
                    raise ConfigError(
                        f"reasoning_budget.{key} has token ids {bad} outside the vocabulary of {setup.vocab_size}"
                    )

    def _tensors(self, device: Any) -> _Consts:
        if self._start is None or self._end is None or self._message is None or self._warnings is None:
            resolved = (("start", self._start), ("end", self._end), ("message", self._message))
            missing = [k for k, v in (*resolved, ("warn_message", self._warnings)) if v is None]
            raise ConfigError(
                f"reasoning_budget cannot resolve {', '.join(missing)} without a tokenizer: run the chain through "
                "generate() / model.generate / vLLM, call chain.prepare(tokenizer=...), or give "
                + ", ".join(f"{k}_ids" for k in missing)
            )
        key = torch.device(device)
        if key not in self._on:
            as_t = lambda v: torch.tensor(v, dtype=torch.int64, device=key)  # noqa: E731
            lengths = [len(w) for w in self._warnings]
            spans, region = self._spans if self._spans is not None else (None, None)
            self._on[key] = _Consts(
                as_t(self._start),
                as_t(self._end),
                as_t(self._message + self._end),
                None if self._utf8 is None else self._utf8.to(key),
                None if spans is None else spans.to(key),
                None if region is None else region.to(key),
                as_t([round(at * _MILLION) for at in self.params.warn_at]),
                as_t([t for w in self._warnings for t in w] + [0]),
                as_t([sum(lengths[:i]) for i in range(len(lengths))]),
                as_t(lengths),
            )
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
            "force_pos": (torch.int64, (), 0),  # the next forced token: of message + end marker, or of a warning
            "start_pos": (torch.int64, (), 0),
            "end_pos": (torch.int64, (), 0),
            "utf8_need": (torch.int64, (), 0),
            "warned": (torch.int64, (), 0),  # warning points passed in this block (fired or replaced)
            "span": (torch.int64, (), 0),  # the span automaton's state over this block's text
            "waited": (torch.int64, (), 0),  # tokens let through past the budget inside an open span
            "started": (torch.bool, (), False),
        }

    # ----------------------------------------------------------------- the machine
    def _step(self, s: dict[str, torch.Tensor], tok: torch.Tensor, p: _Row, c: _Consts) -> dict[str, torch.Tensor]:
        """Every row's machine after accepting tok (B,): llama.cpp's common_reasoning_budget_accept, vectorised,
        with the warnings and the hold inside a span."""
        st, need = s["state"], s["utf8_need"]
        if c.utf8 is not None:
            known = (tok >= 0) & (tok < c.utf8.shape[0])  # ids past the tokenizer (padded vocabularies): no bytes
            need = torch.where(known, c.utf8[tok.clamp(0, c.utf8.shape[0] - 1), need], need)
        whole = need == 0  # the text so far ends on a whole character

        watching = (st == IDLE) | ((st == DONE) & p.rearm)
        spos_next, opened = _match(c.start, s["start_pos"], tok)
        opened &= watching
        span = torch.where(opened, 0, c.span_after(s["span"], tok))  # the block's text starts after its marker
        outside = c.outside(span)
        inside = (st == COUNTING) | (st == WAITING) | (st == HOLDING)
        epos_next, closed = _match(c.end, s["end_pos"], tok)
        closed &= inside
        live = inside & ~closed
        counts = live & (st == COUNTING) & (p.budget >= 0)
        rem_next = s["remaining"] - counts.long()
        spent = counts & (rem_next <= 0)
        holding = live & (st == HOLDING)
        waited = torch.where(holding, s["waited"] + 1, torch.where(spent | opened, 0, s["waited"]))
        hold = spent & ~outside & (p.max_wait != 0)
        released = holding & (outside | ((p.max_wait >= 0) & (waited >= p.max_wait)))
        ready = (spent & ~hold) | released  # the cut may come: only a character may be left to finish
        force = (ready | (live & (st == WAITING))) & whole
        wait = ready & ~whole
        warned, warn = self._warning_due(s["warned"], counts & ~spent & whole & outside, rem_next, p.budget, c)
        new_st, fpos = self._next_state(s, opened, closed, force, wait, hold, warn, epos_next, p, c)
        reset_end = opened | force | wait | hold | warn  # the end matcher starts afresh
        return {
            "state": new_st,
            "remaining": torch.where(opened, p.budget, torch.where(counts, rem_next, s["remaining"])),
            "force_pos": fpos,
            "start_pos": torch.where(watching, spos_next, s["start_pos"]),
            "end_pos": torch.where(inside & ~reset_end, epos_next, torch.where(reset_end, 0, s["end_pos"])),
            "utf8_need": need,
            "warned": torch.where(opened, 0, warned),
            "span": span,
            "waited": waited,
            "started": torch.ones_like(s["started"]),
        }

    @staticmethod
    def _warning_due(
        warned: torch.Tensor, may: torch.Tensor, remaining: torch.Tensor, budget: torch.Tensor, c: _Consts
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(warning points passed, rows that start forcing the last of them now). A point `at` is passed once
        at * budget tokens are counted; `may`: the rows where a warning can go in (a counted token, budget
        left, a whole character, outside every span); until then a passed point waits."""
        if c.warn_at.numel() == 0:
            return warned, torch.zeros_like(may)
        used = budget - remaining
        # the smallest count >= at * budget, with `at` read to millionths: exact integers on every device
        points = (c.warn_at[None, :] * budget[:, None] + _MILLION - 1) // _MILLION  # (B, W)
        passed = (points <= used[:, None]).sum(dim=1)
        warn = may & (passed > warned)
        return torch.where(warn, passed, warned), warn

    @staticmethod
    def _next_state(
        s: dict[str, torch.Tensor],
        opened: torch.Tensor,
        closed: torch.Tensor,
        force: torch.Tensor,
        wait: torch.Tensor,
        hold: torch.Tensor,
        warn: torch.Tensor,
        epos_next: torch.Tensor,
        p: _Row,
        c: _Consts,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(state, force position) after the token, from the transitions _step found."""
        st, fpos = s["state"], s["force_pos"]
        forcing, warning = st == FORCING, st == WARNING
        # a partly emitted end marker goes on where it stands (the message skipped), else message + end from 0
        resume_at = torch.where(epos_next > 0, c.forced.numel() - c.end.numel() + epos_next, 0)
        new_fpos = torch.where(opened | warn, 0, torch.where(force, resume_at, fpos))
        new_fpos = torch.where(forcing | warning, fpos + 1, new_fpos)
        new_st = torch.where(opened, torch.where(p.budget == 0, FORCING, COUNTING), st)
        new_st = torch.where(closed, DONE, new_st)
        new_st = torch.where(force, FORCING, torch.where(wait, WAITING, torch.where(hold, HOLDING, new_st)))
        new_st = torch.where(warn, WARNING, new_st)
        new_st = torch.where(forcing & (new_fpos >= c.forced.numel()), DONE, new_st)
        if c.warn_len.numel():
            length = c.warn_len[(s["warned"] - 1).clamp(0, c.warn_len.numel() - 1)]
            out = warning & (new_fpos >= length)  # the warning is out: counting goes on
            new_st = torch.where(out, COUNTING, new_st)
            new_fpos = torch.where(out, 0, new_fpos)
        return new_st, new_fpos

    def _from_prompt(
        self, ctx: StepContext, rows: torch.Tensor, c: _Consts, state: dict[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        """The state of requests not seen before (rows (B,) bool): a prompt whose last start marker is not closed
        opens the block (its thinking tokens counted, as vLLM; its text read for spans); then any tokens generated
        before this sampler saw the request (a resumed vLLM request) are replayed."""
        history = None if ctx.missing_history is not None else ctx.history
        if history is None:
            return state
        p = _row(ctx)
        width = history.shape[1]
        known = (history >= 0).sum(dim=1)
        lengths = ctx.prompt_lengths if ctx.prompt_lengths is not None else known - ctx.positions
        prompt_end = width - known + lengths  # column after the prompt's last token
        last_start, last_end = _last_at(history, c.start, prompt_end), _last_at(history, c.end, prompt_end)
        open_ = rows & (last_start > last_end)
        remaining = p.budget - (prompt_end - last_start - c.start.numel())
        span = self._prompt_span(history, open_, last_start + c.start.numel(), prompt_end, c)
        spent = open_ & (p.budget >= 0) & (remaining <= 0)
        hold = spent & ~c.outside(span) & (p.max_wait != 0)
        begin = torch.where(hold, HOLDING, torch.where(spent, FORCING, COUNTING))
        state = dict(state)
        state["state"] = torch.where(open_, begin, torch.where(rows, IDLE, state["state"]))
        state["remaining"] = torch.where(open_, torch.where(p.budget >= 0, remaining, p.budget), state["remaining"])
        for key in ("force_pos", "start_pos", "end_pos", "utf8_need", "warned", "waited"):
            state[key] = torch.where(rows, 0, state[key])
        state["span"] = torch.where(rows, span, state["span"])
        generated = known - lengths
        most = int(torch.where(rows, generated, 0).max()) if rows.any() else 0
        for j in range(most):  # replay, oldest first, the generated tokens of the rows being set up
            col = width - most + j
            active = rows & (j >= most - generated)
            stepped = self._step(state, history[:, col].clamp(min=0), p, c)
            state = {k: torch.where(active, stepped[k], v) for k, v in state.items()}
        return state

    @staticmethod
    def _prompt_span(
        history: torch.Tensor, rows: torch.Tensor, begin: torch.Tensor, end: torch.Tensor, c: _Consts
    ) -> torch.Tensor:
        """(B,) the span state after the prompt's columns [begin, end) of the rows (the open block's text)."""
        span = torch.zeros_like(begin)
        if c.spans is None or not bool(rows.any()):
            return span
        first = int(torch.where(rows, begin, history.shape[1]).min())
        for col in range(first, int(torch.where(rows, end, 0).max())):
            active = rows & (col >= begin) & (col < end)
            span = torch.where(active, c.span_after(span, history[:, col].clamp(min=0)), span)
        return span

    def _current(self, ctx: StepContext, c: _Consts) -> dict[str, torch.Tensor]:
        """Every row's state before this step's token: the stored one, or for a request not seen before the one its
        prompt gives. An accept() without history (transformers' select=False path: `chain.accept` after
        `chain.process`) takes what the apply() of the same step read from its history."""
        state = {k: ctx.state[k] for k in self.state_spec()}
        fresh = ~state["started"]
        if not bool(fresh.any()):
            return state
        if ctx.missing_history is None and ctx.history is not None:
            state = self._from_prompt(ctx, fresh, c, state)
            self._seen = (ctx.request_ids, ctx.positions.clone(), state)
        elif self._seen is not None and self._seen[0] == ctx.request_ids and torch.equal(self._seen[1], ctx.positions):
            state = {k: torch.where(fresh, self._seen[2][k], v) for k, v in state.items()}
        return state

    # ----------------------------------------------------------------- hooks
    def apply(self, cand: Candidates, ctx: StepContext) -> Candidates:
        if ctx.scalar("budget") == -1 and self._start is None:
            return cand  # unlimited everywhere and no markers yet: nothing to watch
        c = self._tensors(cand.logits.device)
        state = self._current(ctx, c)
        forcing, warning = state["state"] == FORCING, state["state"] == WARNING
        if not bool((forcing | warning).any()):
            return cand
        pos = state["force_pos"]
        forced = c.forced[pos.clamp(0, c.forced.numel() - 1)]  # (B,)
        forced = torch.where(warning, c.warning_token(state["warned"], pos), forced)
        on = (forcing | warning)[:, None]
        cand = cand.full()  # the forced token comes back even when an earlier filter removed it
        one = torch.where(cand.token_ids() == forced[:, None], 0.0, float("-inf")).to(cand.logits.dtype)
        return cand.replace_logits(torch.where(on, one, cand.logits), is_sorted=False)

    def accept(self, ctx: StepContext, token_ids: torch.Tensor):
        if ctx.scalar("budget") == -1 and self._start is None:
            return {}
        c = self._tensors(token_ids.device)
        state = self._current(ctx, c)
        return self._step(state, token_ids.long(), _row(ctx), c)


@hookimpl
def register_samplers(register):
    register(ReasoningBudget)
