"""`stop_regex`: stop a row when one of its regular expressions matches the end of the row's generated text.

SGLang's `stop_regex` (sampling_params.py, schedule_batch.py `_check_str_based_finish`): the patterns (Python `re`
syntax, inline flags such as `(?i)` allowed) are searched in the decoded tail of the generated text. Only
generated text counts, never the prompt (as SGLang; stop_strings, like transformers, also sees the prompt's end).
A match must end inside the text the newest token added, so a pattern fires once, at the step its match
completes, however many tokens it spans; `^` is the start of the generated text. Patterns are tried in the given
order; the first that matches names the finish reason, `stop_regex:<pattern>` (SGLang reports
FINISH_MATCHED_STR(matched=<pattern>)). A pattern that can match the empty text would stop at once: a
ConfigError, as is one `re` cannot compile (naming its index, the pattern and `re`'s message).

Look-back: a match may start at most `max_lookback` characters before the newest token's text. 0 (the default)
derives it from the patterns as SGLang's `stop_regex_max_len`: the longest text any of them can match, less one
character, at most 1024 for unbounded ones (`\\d+`, `.*`). A lookahead past a match's end does not make the match
end later: `a(?=b)` fires only when "a" and "b" arrive in the same token.

The text is the one the string service reads (`samplechain.strings.byte_table`: each token's bytes, special
tokens none), kept per row between steps: per step one token's bytes are appended and one `re.search` runs per
row on at most `max_lookback` characters plus the newest token's, on the host (a regex has no tensor form: this
criterion reads the chosen tokens every step). A row whose earlier tokens changed since the last step (beam search
reorders rows; a resumed generation starts mid-way) has its text read again. A stopped row reports the matched
text (`matches`), so the output text is cut before it, or after it with include_stop_str_in_output; streams hold
back `max_lookback` characters. min_new_tokens holds it back as stop strings (the match must end in a token after
the first min_new_tokens).
"""

from __future__ import annotations

import codecs
import re

import attrs
import torch

from samplechain import ConfigError, StopContext, StopMatch, StoppingCriterion, StopSetup, hookimpl, in_range
from samplechain.strings import byte_table, decoded_tail

try:  # Python 3.11+
    import re._parser as _sre_parse  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - Python 3.10
    import sre_parse as _sre_parse

__all__ = ["StopRegex", "StopRegexParams", "longest_match"]

LOOKBACK_CAP = 1024  # characters: the derived look-back of unbounded patterns


def longest_match(pattern: str) -> int:
    """The most characters `pattern` can match (SGLang's get_max_seq_length; a huge number when unbounded)."""
    return int(_sre_parse.parse(pattern).getwidth()[1])


def _valid(_inst, _attr, value) -> None:
    if not value:
        raise ValueError('give at least one pattern, e.g. ["\\\\n\\\\n+", "(?i)the end"]')
    for i, pattern in enumerate(value):
        try:
            compiled = re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"pattern {i} ({pattern!r}) is not a valid regular expression: {exc}") from None
        if int(_sre_parse.parse(pattern).getwidth()[0]) == 0 or compiled.fullmatch(""):
            raise ValueError(
                f"pattern {i} ({pattern!r}) can match the empty text and would stop at once: require "
                f"at least one character (e.g. '+' instead of '*')"
            )


@attrs.frozen
class StopRegexParams:
    patterns: tuple[str, ...] = attrs.field(validator=_valid)
    max_lookback: int = attrs.field(default=0, validator=in_range(0, None, hint="0: from the patterns"))


def _text(data: bytes, whole: bool) -> str:
    """UTF-8 text of a byte window: a character cut at a trimmed window's start is dropped, one unfinished at its
    end waits for its next bytes (so the text of a prefix is a prefix of the text)."""
    skip = 0
    while not whole and skip < min(len(data), 3) and 0x80 <= data[skip] < 0xC0:
        skip += 1
    return codecs.getincrementaldecoder("utf-8")("replace").decode(data[skip:], final=False)


class StopRegex(StoppingCriterion):
    name = "stop_regex"
    Params = StopRegexParams
    summary = "stop when a regular expression matches the end of the generated text (SGLang's stop_regex)"
    min_new_tokens_gate = "text"

    def __init__(self, params: StopRegexParams) -> None:
        super().__init__(params)
        self._compiled = [re.compile(p) for p in params.patterns]
        longest = max(longest_match(p) for p in params.patterns)
        self.lookback = params.max_lookback or min(max(longest - 1, 0), LOOKBACK_CAP)
        self._keep = 4 * self.lookback + 4  # bytes of text before the newest token: >= lookback characters
        self._pieces: tuple[bytes, ...] | None = None
        self._reset()

    def _reset(self) -> None:
        self._bufs: list[bytearray] = []
        self._whole: list[bool] = []
        self._seen: torch.Tensor | None = None  # (B, T) the generated tokens the buffers hold the text of
        self._found: dict[int, StopMatch] = {}

    def prepare(self, setup: StopSetup) -> None:
        if setup.tokenizer is None:
            raise ConfigError(
                "stop_regex needs the tokenizer to read text: pass tokenizer= to generate() (or to "
                "as_stopping_criteria)"
            )
        self._table = byte_table(setup.tokenizer)
        self._pieces = self._table.pieces  # token id -> its bytes (host side, cached on the table)
        self._reset()

    def hold_back(self) -> int:
        return self.lookback

    def _piece(self, token: int) -> bytes:
        assert self._pieces is not None  # check() prepares before it reads a token
        return self._pieces[token] if 0 <= token < len(self._pieces) else b""

    def _sync(self, before: torch.Tensor) -> None:
        """The buffers hold each row's text before this step: rebuilt for rows whose earlier tokens are not the
        ones last seen (the first step, a resumed generation, beam search reordering its rows)."""
        batch = before.shape[0]
        if self._seen is None or self._seen.shape != before.shape:
            rows = list(range(batch))
            self._bufs, self._whole = [bytearray() for _ in rows], [True] * batch
        else:
            rows = (self._seen != before).any(dim=1).nonzero().flatten().tolist()
        for b in rows:
            data = decoded_tail(self._table, before[b].tolist(), self._keep + 1)
            self._whole[b] = len(data) <= self._keep
            self._bufs[b] = bytearray(data[-self._keep :])

    def _search(self, data: bytes, before: int, whole: bool) -> StopMatch | None:
        prev, text = _text(data[:before], whole), _text(data, whole)
        k = len(prev)  # the newest token's characters are text[k:]
        if len(text) <= k:
            return None
        start = max(k - self.lookback, 0 if whole else 1)  # a trimmed window's first character is no start (^)
        for pattern, rx in zip(self.params.patterns, self._compiled):
            m = rx.search(text, start)
            while m is not None and m.end() <= k:  # ended before the newest token (held back by min_new_tokens)
                m = rx.search(text, m.start() + 1)
            if m is not None:
                return StopMatch(f"{self.name}:{pattern}", m.group(), len(text) - m.end())
        return None

    def check(self, ctx: StopContext) -> torch.Tensor:
        if self._pieces is None:
            self.prepare(ctx.setup)
        batch = ctx.input_ids.shape[0]
        self._sync(ctx.new_tokens[:, :-1])
        self._seen = ctx.new_tokens.clone()
        self._found = {}
        hits = [False] * batch
        for b, token in enumerate(ctx.token_ids.tolist()):
            buf = self._bufs[b]
            if len(buf) > self._keep:
                del buf[: len(buf) - self._keep]
                self._whole[b] = False
            before = len(buf)
            piece = self._piece(token)
            if not piece:  # no text (a special token, a finished row's padding): nothing ends in it
                continue
            buf += piece
            found = self._search(bytes(buf), before, self._whole[b])
            if found is not None:
                hits[b] = True
                self._found[b] = found
        return torch.tensor(hits, dtype=torch.bool, device=ctx.input_ids.device)

    def matches(self, ctx: StopContext, rows: list[int]) -> list[StopMatch | None]:
        return [self._found.get(b) for b in rows]


@hookimpl
def register_stopping_criteria(register):
    register(StopRegex)
