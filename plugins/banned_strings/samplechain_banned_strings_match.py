"""The matching engine of phrase bans with backtracking (koboldcpp's anti-slop banned tokens, exllamav3 and
TabbyAPI's banned_strings, ik_llama.cpp's string and regex bans): which banned phrase a row's decoded generated text
completes, where it begins, and how much of the text a stream must still hold back.

`PhraseMatcher(patterns, pieces)` keeps the state of one row: `find(tokens)` answers the earliest decided match
(`Hit`: the index of the token holding its first character, its character span, the pattern and the matched
text), `holdback(tokens)` how many trailing characters may still be taken back. One matcher serves one request:
call both each step with the row's generated token ids so far; the list may also have become shorter (a rewind).

Text. The text of `tokens` is their `pieces` (each token id's bytes, `samplechain.strings.token_bytes`; special
tokens spell b"", ids outside the table nothing) joined and read as UTF-8, invalid bytes as U+FFFD. An incomplete
character at the end is not text yet. A character belongs to the token holding its first byte: that is the token
a hit names, since rewinding to it and banning it there takes the whole phrase back.

Phrases. Plain phrases are literal text, matched on the text whatever its tokenization. ignore_case compares
full case folds (`str.casefold`: "a testament to" matches "A TESTAMENT TO", "strasse" matches "Straße"), a
character at a time, so a match starts and ends on characters of the text. whole_words: the match is neither
preceded nor followed by a word character (\\w), whatever its own first and last characters are. At one start
the shortest phrase that matches is the match.

Regular expressions (regex=True): patterns of the `regex` package (Python `re` syntax and more; inline flags apply
to their pattern), whole_words wraps each in (?<!\\w)(?:...)(?!\\w), ignore_case adds IGNORECASE: simple case
folding, since the package's partial matching is unreliable under full case folding (FULLCASE, (?f)). ^ and \\A
are the start of the generated text; $ and \\Z its end, so a match ending in them is decided only with final=True.

Decided matches. A phrase's match is decided when it is complete, except that with whole_words one ending exactly
at the end of the text waits for the next character, or for `final=True` (the row has ended). A regular
expression's match is decided when no way of matching from its start reaches the end of the text: the match
cannot grow, and no alternative the pattern prefers can still complete there. The `regex` package's partial
matching tells: the pattern followed by a character class no character belongs to, searched with partial=True,
matches (partially) only at a start from which some path reaches the end. So "a+" in "xaa" and "ab|abcd" in
"abc" wait for the next character, "ab" in "abc" is decided; with final=True every complete match is. Matches
are independent: a decided match is reported even where another could still complete at an earlier start.
`find` answers the decided match with the earliest start, then the earliest end, then the first pattern given.

Holdback. A start is open when the text from it on may still become a match: for phrases, its case fold is a
prefix of a phrase's (a whole phrase included: with whole_words it waits for the next character); for regular
expressions, a path from it reaches the end of the text. A rewind goes back to the token holding an open start or
a decided match (not yet acted upon), or the token holding the first bytes of an incomplete character at the
end; and it brings back the shorter text of the tokens before it, with the starts that were open in it, which
later text may complete in turn. So `holdback(tokens)` counts from the first character of the earliest token a
rewind may go back to: that of the earliest of those starts now, then of the texts a rewind to it or a later
token brings back, repeated until it settles (0 when nothing is open). A stream that shows only the text before
the held-back characters never shows text a rewind takes back. For regular expressions this holds except for
zero-width assertions that fail at the end of the text and succeed once text follows (\\B, (?!$), (?!\\Z), \\b
after a non-word character): partial matching does not count them as reaching the end, so `a\\B` holds nothing
back after "xa" and then matches "xab" from the "a".

Cost. Per appended token the token is decoded and the search starts at the earliest start that was open before
it (a match decided now begins there or later), so the cost does not grow with the text. Phrases are matched by
walking the case folds of the open region's characters through the set of the phrases' prefixes. Regular
expressions are searched within the last `window` characters (a match is searched for from within them: one that
begins earlier by the time it is decided is found from the window's start on, if at all), with `LOOKBEHIND`
characters of context before a search's start; those that mean the same inside an alternation of all of them (no
backreferences, no global inline flags) are searched through that alternation first, and one by one only where it
finds a match. The matcher keeps per token the text's length, the open starts and the decided matches, so a
shorter list cuts the cache and gives the answers a fresh matcher gives; it compares the last `VERIFY` tokens it
shares with the previous call's list (all of them when the list grew by more), so call it at least once every
`VERIFY` appended tokens.
"""

from __future__ import annotations

import bisect
import codecs
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import regex as rx  # type: ignore[import-untyped]

try:  # Python 3.11+
    import re._parser as _sre_parse  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - Python 3.10
    import sre_parse as _sre_parse

__all__ = ["LOOKBEHIND", "VERIFY", "Hit", "PhraseMatcher"]

VERIFY = 32  # tokens compared with the previous call's list
LOOKBEHIND = 32  # characters before a regex search's start that lookbehinds and \b see
_NO_CHARACTER = "[^\\x00-\\U0010FFFF]"  # reaching it at the end of the text is a partial match, elsewhere a failure
_WORD = rx.compile(r"\w")
_WORDS: dict[str, bool] = {}
# texts where a pattern that can match the empty text shows it (besides fullmatch("") and re's minimum width)
_PROBES = ("a", "A b", "0_.", " \n\t", "é ß 日本", "ab, cd. EF!\n\nx-y")


def _is_word(char: str) -> bool:
    found = _WORDS.get(char)
    if found is None:
        found = _WORDS[char] = _WORD.match(char) is not None
    return found


@dataclass(frozen=True, slots=True)
class Hit:
    """A banned match: `token` indexes the row's generated tokens (the one holding the match's first character),
    `start_char`/`end_char` the decoded text; `pattern` is the banned phrase or regex as given, `text` what it
    matched."""

    token: int
    start_char: int
    end_char: int
    pattern: str
    text: str


@dataclass(frozen=True, eq=False)
class _Regex:
    """One pattern, compiled twice: `find` finds complete matches; `hold`, the same followed by a character no
    character is, matches only partially, at a start from which a path reaches the end."""

    source: str
    find: Any
    hold: Any


@dataclass(frozen=True)
class _Group:
    """Patterns searched together: `search` (the pattern itself, or the alternation of several) gives the
    group's earliest open start, and where its `find` finds no match no member has one; the members are then
    searched one by one."""

    search: _Regex
    members: tuple[_Regex, ...]


def _checked(patterns: Sequence[str], regex: bool) -> tuple[str, ...]:
    if isinstance(patterns, (str, bytes)):
        raise TypeError(f"patterns must be a sequence of strings, not one string ({patterns!r}): wrap it in a list")
    out = tuple(patterns)
    if not out:
        raise ValueError("give at least one banned phrase")
    kind = "pattern" if regex else "phrase"
    for i, p in enumerate(out):
        if not isinstance(p, str):
            raise TypeError(f"banned {kind} {i} ({p!r}) is a {type(p).__name__}, not a string")
        if not p:
            raise ValueError(f"banned {kind} {i} ({p!r}) is empty: give the text to ban")
    return out


def _can_match_empty(compiled: Any, source: str) -> bool:
    if compiled.fullmatch("") is not None:
        return True
    try:
        if int(_sre_parse.parse(source).getwidth()[0]) == 0:
            return True
    except Exception:  # syntax of the regex package that re does not read: the probes decide
        pass
    return any(m.start() == m.end() for probe in _PROBES for m in compiled.finditer(probe))


# what makes a pattern mean something else inside an alternation of all of them: backreferences, conditionals and
# recursion (group numbers shift), and global inline flags (they would apply to every pattern)
_REFERS = rx.compile(r"\\[1-9gk]|\(\?(?:P=|P>|\(|&|R|[0-9+-])")


def _combinable(source: str, flags: int) -> bool:
    return rx.compile(source, flags).flags == rx.compile("x", flags).flags and _REFERS.search(source) is None


def _groups(regexes: list[_Regex], flags: int, whole_words: bool) -> list[_Group]:
    """The patterns that mean the same inside an alternation of all of them as one group searched through that
    alternation (no match of it means none of any member; its earliest open start is at or before each one's),
    every other pattern a group of its own."""
    together = [r for r in regexes if _combinable(r.source, flags)]
    if len(together) > 1:
        try:
            search = _compile(-1, "|".join(f"(?:{r.source})" for r in together), flags, whole_words, check=False)
        except ValueError:  # a group name defined twice in ways the package refuses: searched one by one
            pass
        else:
            return [_Group(search, tuple(together)), *(_Group(r, (r,)) for r in regexes if r not in together)]
    return [_Group(r, (r,)) for r in regexes]


def _compile(i: int, source: str, flags: int, whole_words: bool, check: bool = True) -> _Regex:
    try:
        compiled = rx.compile(source, flags)
    except rx.error as exc:
        raise ValueError(f"banned pattern {i} ({source!r}) is not a valid regular expression: {exc}") from None
    if check and _can_match_empty(compiled, source):
        raise ValueError(
            f"banned pattern {i} ({source!r}) can match the empty text, which bans nothing: require at least "
            "one character (e.g. '+' instead of '*', no lone lookarounds or anchors)"
        )
    end = "\n" if compiled.flags & rx.VERBOSE else ""  # ends a trailing comment of a verbose pattern
    before, after = (r"(?<!\w)", r"(?!\w)") if whole_words else ("", "")
    body = f"{before}(?:{source}{end}){after}"
    return _Regex(source, rx.compile(body, flags), rx.compile(body + _NO_CHARACTER, flags))


class PhraseMatcher:
    """Banned phrases (or regular expressions) found in one row's decoded generated text; see the module
    docstring for the rules. `pieces[id]`: the bytes token `id` adds to decoded text."""

    def __init__(
        self,
        patterns: Sequence[str],
        pieces: Sequence[bytes],
        *,
        regex: bool = False,
        ignore_case: bool = False,
        whole_words: bool = False,
        window: int = 256,
    ) -> None:
        self.patterns = _checked(patterns, regex)
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"window={window!r}: give the number of characters regex matches are searched in (>= 1)")
        self.regex, self.ignore_case, self.whole_words, self.window = regex, ignore_case, whole_words, window
        self._pieces = tuple(pieces)
        flags = rx.IGNORECASE if ignore_case else 0
        regexes = [_compile(i, p, flags, whole_words) for i, p in enumerate(self.patterns)] if regex else []
        self._groups = _groups(regexes, flags, whole_words) if regex else []
        # phrases: every prefix of a phrase's fold, and each fold's first phrase
        self._rank = {p: i for i, p in reversed(list(enumerate(self.patterns)))}  # ties: the first pattern given
        self._phrase_of: dict[str, str] = {}
        for p in self.patterns:
            self._phrase_of.setdefault(self._fold(p), p)
        self._prefixes = {f[:k] for f in self._phrase_of for k in range(1, len(f) + 1)}
        self._start: tuple[int, ...] = (0,) * max(len(self._groups), 1)
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        # per token i of the cached list: the state of the text after tokens[: i + 1]
        self._ids: list[int] = []
        self._ends: list[int] = []  # characters of text
        self._heads: list[int] = []  # the token holding the first byte of the first character token i completes
        self._pend: list[bytes] = []  # the bytes of an incomplete character at the end
        self._pstart: list[int] = []  # the token holding the first of them (-1: none)
        self._opens: list[tuple[int, ...]] = []  # the earliest open start (regex: per group)
        self._found: list[tuple[Hit, ...]] = []  # the decided matches, by start, end, then pattern order
        self._chars: list[str] = []  # the text
        self._folds: list[str] = []  # each character's case fold (ignore_case) or the character

    def _fold(self, text: str) -> str:
        return text.casefold() if self.ignore_case else text

    # ------------------------------------------------------------------ the answers
    def find(self, tokens: Sequence[int], *, final: bool = False, from_char: int = 0) -> Hit | None:
        """The decided match of the text of `tokens` with the earliest start, or None. final=True: the row has
        ended, so every complete match is decided. Matches starting before `from_char` are left out (pass a hit's
        start_char + 1 to let that hit stand and look past it)."""
        self._sync(tokens)
        if not self._ids:
            return None
        best = next((h for h in self._found[-1] if h.start_char >= from_char), None)
        if final:
            last = self._final_hit(from_char)
            if last is not None and (best is None or self._order(last) < self._order(best)):
                best = last
        return best

    def holdback(self, tokens: Sequence[int], *, from_char: int = 0) -> int:
        """How many trailing characters of the text of `tokens` a stream holds back: those from the first
        character of the earliest token a rewind may go back to (module docstring, "Holdback"), leaving out
        matches that start before `from_char`; 0 when there is none."""
        low = self.held_from(tokens, from_char=from_char)
        return self._ends[-1] - (self._ends[low - 1] if low else 0) if self._ids else 0

    def held_from(self, tokens: Sequence[int], *, from_char: int = 0) -> int:
        """The index of the earliest token a rewind may go back to (len(tokens) when there is none): the held-back
        characters are those of tokens[held_from(tokens):]."""
        self._sync(tokens)
        n = len(self._ids)
        if not n:
            return 0
        # rewinding to token t brings back the text of tokens[:t] and what was open in it: the states from the
        # earliest token on are searched again until it settles
        low, high = self._earliest(n, from_char, exact=True), n
        while low < high:
            earliest = min(self._earliest(j, from_char, exact=False) for j in range(low, high))
            low, high = min(low, earliest), low
        return low

    def _earliest(self, j: int, from_char: int, exact: bool) -> int:
        """The earliest token a rewind may go back to in the text of tokens[:j]: the one holding its earliest open
        start or decided match (at or after `from_char`), or its incomplete character; j when there is none.
        exact=False takes open starts before `from_char` as `from_char` (no search: earlier at worst)."""
        if j == 0:
            return 0
        total, opens, found = self._ends[j - 1], self._opens[j - 1], self._found[j - 1]
        start = min(opens)
        if start < from_char:
            start = min(
                o if o >= from_char else self._open_from(k, from_char) if exact else from_char
                for k, o in enumerate(opens)
            )
        if found:
            start = min(start, next((h.start_char for h in found if h.start_char >= from_char), total))
        token = self._token_of(start) if start < total else j
        return min(token, self._pstart[j - 1]) if self._pend[j - 1] else token

    # ------------------------------------------------------------------ the cache
    def _sync(self, tokens: Sequence[int]) -> None:
        """Cut the cache to the tokens it shares with `tokens`, then read the rest one token at a time."""
        n, cached = len(tokens), len(self._ids)
        keep = min(n, cached)
        low = 0 if n - cached > VERIFY else max(0, keep - VERIFY)
        if low < keep:
            seen = tokens[low:keep]
            if not isinstance(seen, list):
                seen = [int(t) for t in seen]
            if seen != self._ids[low:keep]:
                keep = low + next(j for j, (a, b) in enumerate(zip(seen, self._ids[low:keep])) if a != b)
        if keep < cached:
            self._cut(keep)
        for i in range(keep, n):
            self._read(int(tokens[i]))

    def _cut(self, keep: int) -> None:
        chars = self._ends[keep - 1] if keep else 0
        del self._chars[chars:], self._folds[chars:]
        for cache in (self._ids, self._ends, self._heads, self._pend, self._pstart, self._opens, self._found):
            del cache[keep:]

    def _read(self, token: int) -> None:
        """Append one token: decode its bytes, then look for what its text completes."""
        i = len(self._ids)
        piece = self._pieces[token] if 0 <= token < len(self._pieces) else b""
        pend = self._pend[-1] if i else b""
        text, rest = None, b""
        if not pend:
            try:
                text = piece.decode("utf-8")
            except UnicodeDecodeError:
                pass
        if text is None:
            self._decoder.setstate((pend, 0))
            text = self._decoder.decode(piece)
            rest = self._decoder.getstate()[0]
        before = self._ends[-1] if i else 0
        self._ids.append(token)
        self._ends.append(before + len(text))
        self._heads.append(self._pstart[-1] if pend and text else i)
        self._pend.append(rest)
        self._pstart.append((self._pstart[-1] if pend and not text else i) if rest else -1)
        self._chars.extend(text)
        self._folds.extend(map(str.casefold, text) if self.ignore_case else text)
        if text:
            self._scan(before + len(text))
        else:  # no new text: nothing changes
            self._opens.append(self._opens[-1] if i else self._start)
            self._found.append(self._found[-1] if i else ())

    def _scan(self, total: int) -> None:
        """The open starts and the decided matches after the newest token's text. A match decided now begins at
        or after the earliest start open before (from an earlier one no path reached the end of the text then,
        so nothing there changed)."""
        previous = self._opens[-1] if self._opens else self._start
        if self._groups:
            opens, spans = self._regex_scan(previous, total, final=False)
        else:
            open_at, spans = self._phrase_scan(previous[0], total, final=False)
            opens = (open_at,)
        found = self._found[-1] if self._found else ()
        seen = {(h.start_char, h.pattern) for h in found} if spans else set()
        new = []
        for a, b, pattern in spans:
            if (a, pattern) not in seen:
                seen.add((a, pattern))
                new.append(Hit(self._token_of(a), a, b, pattern, "".join(self._chars[a:b])))
        self._opens.append(opens)
        self._found.append(tuple(sorted(found + tuple(new), key=self._order)) if new else found)

    def _final_hit(self, from_char: int) -> Hit | None:
        """The earliest complete match at or after the open starts (before them every match is decided)."""
        total = self._ends[-1]
        lows = tuple(max(o, from_char) for o in self._opens[-1])
        if self._groups:
            spans = self._regex_scan(lows, total, final=True)[1]
        else:
            spans = self._phrase_scan(lows[0], total, final=True)[1]
        if not spans:
            return None
        a, b, pattern = min(spans, key=lambda s: (s[0], s[1], self._rank[s[2]]))
        return Hit(self._token_of(a), a, b, pattern, "".join(self._chars[a:b]))

    def _order(self, hit: Hit) -> tuple[int, int, int]:
        return hit.start_char, hit.end_char, self._rank[hit.pattern]

    def _open_from(self, k: int, start: int) -> int:
        """The earliest open start at or after character `start` (regex: of group k)."""
        total = self._ends[-1]
        if not self._groups:
            return next((s for s in range(start, total) if self._walk(s, total)[1]), total)
        low = max(start, total - self.window)
        if low >= total:
            return total
        base = max(0, low - LOOKBEHIND)
        m = self._groups[k].search.hold.search("".join(self._chars[base:total]), low - base, partial=True)
        return total if m is None else base + m.start()

    def _token_of(self, char: int) -> int:
        """The token holding the first byte of character `char` (< the text's length)."""
        t = bisect.bisect_right(self._ends, char)
        first = self._ends[t - 1] if t else 0
        return self._heads[t] if char == first else t

    # ------------------------------------------------------------------ phrases
    def _walk(self, s: int, total: int) -> tuple[list[tuple[int, str]], bool]:
        """From character s on: the phrases the text matches there ((end, phrase), shortest first), and whether
        the case fold of all the text from s is a prefix of a phrase's (s is open)."""
        if self.whole_words and s and _is_word(self._chars[s - 1]):
            return [], False
        folds, prefixes, phrase_of = self._folds, self._prefixes, self._phrase_of
        matches: list[tuple[int, str]] = []
        acc = ""
        for e in range(s, total):
            acc += folds[e]
            if acc not in prefixes:
                return matches, False
            phrase = phrase_of.get(acc)
            if phrase is not None:
                matches.append((e + 1, phrase))
        return matches, True

    def _phrase_scan(self, low: int, total: int, final: bool) -> tuple[int, list[tuple[int, int, str]]]:
        """The earliest open start at or after `low`, and at each start there the shortest decided match."""
        open_at = total
        spans = []
        folds, prefixes = self._folds, self._prefixes
        for s in range(low, total):
            if folds[s] not in prefixes:  # no phrase starts here
                continue
            matches, reaches_end = self._walk(s, total)
            if reaches_end and open_at == total:
                open_at = s
            for end, phrase in matches:
                if self.whole_words and (not final if end == total else _is_word(self._chars[end])):
                    continue
                spans.append((s, end, phrase))
                break
        return open_at, spans

    # ------------------------------------------------------------------ regular expressions
    def _regex_scan(
        self, lows: tuple[int, ...], total: int, final: bool
    ) -> tuple[tuple[int, ...], list[tuple[int, int, str]]]:
        """Per group, from its start in `lows` (within the window): the earliest open start, and its members'
        decided matches (with final=True each member's first complete one)."""
        lows = tuple(max(low, total - self.window) for low in lows)
        base = max(0, min(lows) - LOOKBEHIND)
        text = "".join(self._chars[base:total])
        opens, spans = [], []
        for group, low in zip(self._groups, lows):
            if low >= total:
                opens.append(total)
                continue
            m = group.search.hold.search(text, low - base, partial=True)
            opens.append(total if m is None else base + m.start())
            if group.search.find.search(text, low - base) is None:  # no member matches
                continue
            for member in group.members:
                for a, b in _decided(member, text, low - base, final):
                    spans.append((base + a, base + b, member.source))
                    if final:
                        break
        return tuple(opens), spans


def _decided(unit: _Regex, text: str, pos: int, final: bool) -> Iterator[tuple[int, int]]:
    """The decided matches of `unit` in `text` from `pos` on, by start: those from whose start no path reaches the
    end of the text; with final=True every complete one."""
    while pos < len(text):
        m = unit.find.search(text, pos)
        if m is None:
            return
        a, b = m.span()
        if b > a and (final or unit.hold.match(text, a, partial=True) is None):
            yield a, b
        pos = a + 1
