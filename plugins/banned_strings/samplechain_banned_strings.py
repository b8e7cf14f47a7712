"""`banned_strings` and `banned_regex`: phrase bans that take text back (koboldcpp's anti-slop banned tokens,
exllamav3's and TabbyAPI's banned_strings, ik_llama.cpp's string and regex bans), as guards.

When a row's generated text completes a banned phrase (or a match of a banned regular expression), the guard asks
the loop to rewind the row to the token holding the match's first character; the loop bans that token there and
draws again. Matching is on the decoded text, so a phrase is caught whatever tokens spell it, and a stream holds
back the text that may still become a match (samplechain_banned_strings_match: the rules).

    [[guard]]
    use = "banned_strings"
    phrases = ["a testament to", "shivers down her spine"]
    ignore_case = true      # every case form
    whole_words = true      # not inside a longer word
    max_rewinds = 64        # then the request ends, finish reason "guard"
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from samplechain import hookimpl, in_range
from samplechain.guards import Guard, GuardContext, Rewind
from samplechain_banned_strings_match import PhraseMatcher


def _phrases(regex: bool) -> Any:
    def check(inst: Any, attr: Any, value: Sequence[str]) -> None:
        PhraseMatcher(value, (), regex=regex)  # the matcher's own errors, naming the pattern

    return check


def _as_tuple(value: Any) -> Any:
    return value if isinstance(value, (str, bytes)) else tuple(value)


@attrs.frozen
class BannedStringsParams:
    phrases: tuple[str, ...] = attrs.field(converter=_as_tuple, validator=_phrases(False))
    ignore_case: bool = False
    whole_words: bool = False


@attrs.frozen
class BannedRegexParams:
    patterns: tuple[str, ...] = attrs.field(converter=_as_tuple, validator=_phrases(True))
    ignore_case: bool = False
    whole_words: bool = False
    window: int = attrs.field(default=256, validator=in_range(1, None, hint="characters a match is searched in"))


class _Bans(Guard):
    """One PhraseMatcher per watched row."""

    regex = False

    def start(self, rows: int, context: GuardContext) -> None:
        p = self.params
        patterns = p.patterns if self.regex else p.phrases
        extra = {"window": p.window} if self.regex else {}
        self.matchers = {
            row: PhraseMatcher(
                patterns,
                context.pieces,
                regex=self.regex,
                ignore_case=p.ignore_case,
                whole_words=p.whole_words,
                **extra,
            )
            for row in context.rows
        }

    def check(self, row: int, tokens: Sequence[int], final: bool) -> Rewind | None:
        hit = self.matchers[row].find(tokens, final=final)
        return None if hit is None else Rewind(hit.token, hit.pattern)

    def hold(self, row: int, tokens: Sequence[int]) -> int:
        return self.matchers[row].held_from(tokens)


class BannedStrings(_Bans):
    name = "banned_strings"
    Params = BannedStringsParams
    summary = "guard: phrases that must not appear, taken back and redrawn (case-insensitive, whole words)"


class BannedRegex(_Bans):
    name = "banned_regex"
    Params = BannedRegexParams
    summary = "guard: regular expressions that must not match the text, taken back and redrawn"
    regex = True


@hookimpl
def register_guards(register):
    register(BannedStrings)
    register(BannedRegex)
