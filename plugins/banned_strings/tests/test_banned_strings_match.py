"""The phrase-ban matcher against brute force: at every prefix of a token stream, `find` equals a whole-text search
of every start and end (the hit's token: the one whose bytes begin its first character), whatever the text's
tokenization (SmolLM2's and the tiny GPT-2's tokenizers, random re-spellings down to single bytes); case forms,
whole words, multi-byte characters split over byte tokens, regular expressions; a shorter token list answers as a
fresh matcher; text released by `holdback` is never taken back by a rewind; invalid patterns are named."""

from __future__ import annotations

import codecs
import random

import pytest
import regex
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from samplechain.strings import byte_table, spellings
from samplechain_banned_strings_match import Hit, PhraseMatcher

PROPERTY = settings(
    max_examples=120,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
WORD = regex.compile(r"\w")


# ----------------------------------------------------------------- tokenizers
@pytest.fixture(scope="module")
def smollm2():
    transformers = pytest.importorskip("transformers")
    from samplechain.errors import ConfigError
    from samplechain.models import default_gguf_path, gguf_tokenizer_path

    try:
        path = gguf_tokenizer_path(default_gguf_path())
    except (ConfigError, OSError, ImportError) as exc:
        pytest.skip(f"the SmolLM2 tokenizer is not available: {exc}")
    return transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)


@pytest.fixture(scope="module")
def tiny_gpt2():
    transformers = pytest.importorskip("transformers")
    from samplechain.models import tiny_model_path

    try:
        path = tiny_model_path()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    return transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)


@pytest.fixture(params=["smollm2", "tiny_gpt2"])
def tokenizer(request):
    return request.getfixturevalue(request.param)


def pieces_of(tokenizer) -> tuple[bytes, ...]:
    return byte_table(tokenizer).pieces


def encode(tokenizer, text: str) -> list[int]:
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert b"".join(pieces_of(tokenizer)[i] for i in ids) == text.encode()
    return ids


def respell(tokenizer, text: str, rng: random.Random) -> list[int]:
    """`text` as a random valid token sequence: its bytes cut at random places (inside characters too), each
    part spelt by one of its fewest-token spellings."""
    data = text.encode()
    cuts = sorted(rng.sample(range(1, len(data)), rng.randint(0, (len(data) - 1) // 2)))
    ids: list[int] = []
    for a, b in zip([0, *cuts], [*cuts, len(data)]):
        ids.extend(rng.choice(spellings(byte_table(tokenizer), data[a:b], limit=4, truncate=True)))
    assert b"".join(pieces_of(tokenizer)[i] for i in ids) == data
    return ids


# ----------------------------------------------------------------- brute force
def decode(pieces, ids) -> str:
    """The text of `ids`: their bytes as UTF-8, invalid bytes U+FFFD, an incomplete last character left out."""
    return codecs.getincrementaldecoder("utf-8")("replace").decode(b"".join(pieces[i] for i in ids), final=False)


def token_of(pieces, ids, char: int) -> int:
    """The token whose bytes hold the first byte of character `char` of the text of `ids`: the last byte offset
    whose prefix decodes (an unfinished character replaced) to exactly `char` characters."""
    data = b"".join(pieces[i] for i in ids)
    offset = max(k for k in range(len(data) + 1) if len(data[:k].decode("utf-8", "replace")) == char)
    pos = 0
    for i, token in enumerate(ids):
        pos += len(pieces[token])
        if pos > offset:
            return i
    raise AssertionError("no such character")


def phrase_oracle(text, phrases, *, ignore_case=False, whole_words=False, final=False):
    """(start, end, phrase) of the decided match with the earliest start, then end, then phrase order."""
    fold = str.casefold if ignore_case else str
    for s in range(len(text)):
        for e in range(s + 1, len(text) + 1):
            for p in phrases:
                if fold(text[s:e]) != fold(p):
                    continue
                if whole_words and (
                    (s and WORD.match(text[s - 1]))
                    or (e < len(text) and WORD.match(text[e]))
                    or (e == len(text) and not final)
                ):
                    continue
                return s, e, p
    return None


def regex_oracle(text, patterns, *, ignore_case=False, whole_words=False, final=False):
    """The module's rule on the whole text: at each start each pattern's preferred match, decided when no path
    from that start reaches the end (the pattern then a character no character is, partially matched there)."""
    flags = regex.IGNORECASE if ignore_case else 0
    best = None
    for p in patterns:
        body = rf"(?<!\w)(?:{p})(?!\w)" if whole_words else p
        find, hold = regex.compile(body, flags), regex.compile(f"(?:{body})[^\\x00-\\U0010FFFF]", flags)
        for s in range(len(text)):
            m = find.match(text, s)
            if m and m.end() > s and (final or hold.match(text, s, partial=True) is None):
                if best is None or (s, m.end()) < best[:2]:
                    best = (s, m.end(), p)
                break
    return best


def assert_stream_matches(matcher, pieces, ids, oracle, **options):
    """At every prefix of `ids` (one growing list, as a generation loop passes it), find() against brute force."""
    row: list[int] = []
    for token in ids:
        row.append(token)
        text = decode(pieces, row)
        expected = oracle(text, **options)
        hit = matcher.find(row)
        if expected is None:
            assert hit is None, (text, hit)
        else:
            s, e, p = expected
            assert hit == Hit(token_of(pieces, row, s), s, e, p, text[s:e]), text


# ----------------------------------------------------------------- phrases across tokens
SLOP = "The old sailor felt shivers down her spine, a testament to the storm, barely above a whisper."
SLOP_PHRASES = ["shivers down her spine", "a testament to", "barely above a whisper"]


def test_a_phrase_is_found_at_the_token_holding_its_first_character_whatever_the_tokenization(tokenizer):
    pieces = pieces_of(tokenizer)
    rng = random.Random(0)
    spellings_of_text = [encode(tokenizer, SLOP)] + [respell(tokenizer, SLOP, rng) for _ in range(6)]
    for ids in spellings_of_text:
        # every hit is rewound in a real loop; here the phrases come one after the other, each one's first match
        for phrase in SLOP_PHRASES:
            matcher = PhraseMatcher([phrase], pieces)
            assert_stream_matches(matcher, pieces, ids, phrase_oracle, phrases=[phrase])
            hit = matcher.find(ids)
            assert hit is not None and hit.text == phrase
            assert hit.token == token_of(pieces, ids, SLOP.index(phrase))


def test_one_token_or_seven_the_phrase_is_the_same_hit(smollm2):
    pieces = pieces_of(smollm2)
    text = "She felt shivers down her spine."
    one_by_one = [
        t
        for word in ("She", " felt", " sh", "iv", "ers", " down", " her", " sp", "ine", ".")
        for t in encode(smollm2, word)
    ]
    for ids in (encode(smollm2, text), one_by_one):
        hit = PhraseMatcher(["shivers down her spine"], pieces).find(ids)
        assert (hit.start_char, hit.end_char, hit.token) == (9, 31, token_of(pieces, ids, 9))


def test_a_match_beginning_inside_a_token_names_that_token(smollm2):
    pieces = pieces_of(smollm2)
    ids = encode(smollm2, "It was a testament")
    inside = next(i for i, t in enumerate(ids) if pieces[t] == b" testament")
    hit = PhraseMatcher(["estament"], pieces).find(ids)
    assert hit == Hit(inside, len("It was a t"), len("It was a testament"), "estament", "estament")


def test_at_one_start_the_shortest_phrase_is_the_match_and_the_earliest_start_wins(smollm2):
    pieces = pieces_of(smollm2)
    ids = encode(smollm2, "in the realm of dreams, the realm of the gods")
    matcher = PhraseMatcher(["the realm of the gods", "realm of", "in the realm of"], pieces)
    assert matcher.find(ids).pattern == "in the realm of"
    matcher = PhraseMatcher(["the realm of dreams", "the realm"], pieces)
    assert (matcher.find(ids).pattern, matcher.find(ids).start_char) == ("the realm", 3)


# ----------------------------------------------------------------- case and words
@pytest.mark.parametrize("form", ["A Testament To", "a testament to", "A TESTAMENT TO", "a TeStAmEnT tO"])
def test_ignore_case_catches_every_case_form(smollm2, form):
    pieces = pieces_of(smollm2)
    ids = encode(smollm2, f"It was {form} them.")
    hit = PhraseMatcher(["a testament to"], pieces, ignore_case=True).find(ids)
    assert (hit.start_char, hit.text) == (7, form)
    exact = PhraseMatcher(["a testament to"], pieces).find(ids)
    assert (exact is not None) == (form == "a testament to")


def test_ignore_case_folds_fully_and_keeps_the_character_positions(smollm2):
    pieces = pieces_of(smollm2)
    cases = [
        ("Die Straße ist lang.", "STRASSE", "Straße"),
        ("DIE STRASSE IST LANG.", "straße", "STRASSE"),
        ("ßß ﬁne A TESTAMENT", "a testament", "A TESTAMENT"),
        ("a ﬁne day", "fine", "ﬁne"),
    ]
    rng = random.Random(1)
    for text, phrase, matched in cases:
        for ids in (encode(smollm2, text), respell(smollm2, text, rng)):
            matcher = PhraseMatcher([phrase], pieces, ignore_case=True)
            assert_stream_matches(matcher, pieces, ids, phrase_oracle, phrases=[phrase], ignore_case=True)
            hit = matcher.find(ids)
            assert (hit.start_char, hit.text, hit.token) == (
                text.index(matched),
                matched,
                token_of(pieces, ids, text.index(matched)),
            )


def test_whole_words_bans_the_word_not_the_words_it_begins_or_ends(smollm2):
    pieces = pieces_of(smollm2)
    matcher = PhraseMatcher(["testament"], pieces, whole_words=True)
    assert matcher.find(encode(smollm2, "a testamentary trust")) is None
    assert matcher.find(encode(smollm2, "attestament")) is None
    assert matcher.find(encode(smollm2, "a testament, then")).start_char == 2
    assert matcher.find(encode(smollm2, "(testament)")).start_char == 1
    assert PhraseMatcher(["testament"], pieces).find(encode(smollm2, "a testamentary trust")).start_char == 2


def test_a_whole_word_at_the_end_waits_for_the_next_character_or_the_end_of_the_row(smollm2):
    pieces = pieces_of(smollm2)
    matcher = PhraseMatcher(["A Testament"], pieces, whole_words=True, ignore_case=True)
    ids = encode(smollm2, "It was a testament")
    assert matcher.find(ids) is None
    assert matcher.holdback(ids) == len(" a testament")  # from the token " a", space included
    assert matcher.find(ids, final=True) == Hit(2, 7, 18, "A Testament", "a testament")
    assert matcher.find(ids + encode(smollm2, "!")) == Hit(2, 7, 18, "A Testament", "a testament")
    longer = ids + encode(smollm2, "ary")
    assert (matcher.find(longer), matcher.find(longer, final=True), matcher.holdback(longer)) == (None, None, 0)


@PROPERTY
@given(
    text=st.text(alphabet="ab AB_é.ßs", max_size=24),
    phrases=st.lists(st.text(alphabet="ab Aé.ßs", min_size=1, max_size=4), min_size=1, max_size=3),
    ignore_case=st.booleans(),
    whole_words=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_phrases_against_brute_force_on_random_texts_and_spellings(
    smollm2, text, phrases, ignore_case, whole_words, seed
):
    pieces = pieces_of(smollm2)
    ids = respell(smollm2, text, random.Random(seed)) if text else []
    matcher = PhraseMatcher(phrases, pieces, ignore_case=ignore_case, whole_words=whole_words)
    options = dict(phrases=phrases, ignore_case=ignore_case, whole_words=whole_words)
    assert_stream_matches(matcher, pieces, ids, phrase_oracle, **options)
    last = phrase_oracle(text, **options, final=True)
    hit = matcher.find(ids, final=True)
    assert (None if hit is None else (hit.start_char, hit.end_char, hit.pattern)) == last


# ----------------------------------------------------------------- multi-byte characters
@pytest.mark.parametrize("phrase", ["🎉 party", "日本語", "é"])
def test_a_character_split_over_byte_tokens_belongs_to_the_token_of_its_first_byte(tokenizer, phrase):
    pieces = pieces_of(tokenizer)
    text = "Let us 🎉 party in 日本語 café"
    rng = random.Random(2)
    for ids in [encode(tokenizer, text)] + [respell(tokenizer, text, rng) for _ in range(4)]:
        matcher = PhraseMatcher([phrase], pieces)
        assert_stream_matches(matcher, pieces, ids, phrase_oracle, phrases=[phrase])
        hit = matcher.find(ids)
        assert hit.text == phrase and hit.token == token_of(pieces, ids, text.index(phrase))
        assert phrase.encode()[:1] in pieces[ids[hit.token]]


def test_an_incomplete_character_is_no_text_yet_and_holds_its_token_back(smollm2):
    pieces = pieces_of(smollm2)
    ids = encode(smollm2, "a 🎉")
    assert [pieces[t] for t in ids] == [b"a", b" \xf0\x9f", b"\x8e", b"\x89"]
    matcher = PhraseMatcher(["zzz"], pieces)
    for k, back in [(1, 0), (2, 1), (3, 1), (4, 0)]:
        assert matcher.find(ids[:k]) is None
        assert matcher.holdback(ids[:k]) == back  # the space: a rewind to " \xf0\x9f" would take it back
    hit = PhraseMatcher(["🎉"], pieces).find(ids)
    assert (hit.token, hit.start_char, hit.end_char) == (1, 2, 3)


# ----------------------------------------------------------------- regular expressions
REGEXES = [
    r"(?:shivers|chills) down (?:her|his) spine",
    r"a testament to \w+",
    r"\d{3,}",
    r"ab|abcd",
    r"barely\s+above",
]
REGEX_TEXT = "Chills down his spine at 12345, abcd ab! a testament to courage, barely  above 99."


def test_regular_expressions_against_the_rule_at_every_prefix(tokenizer):
    pieces = pieces_of(tokenizer)
    rng = random.Random(3)
    for ids in [encode(tokenizer, REGEX_TEXT)] + [respell(tokenizer, REGEX_TEXT, rng) for _ in range(3)]:
        for pattern in REGEXES:
            for ignore_case in (False, True):
                matcher = PhraseMatcher([pattern], pieces, regex=True, ignore_case=ignore_case)
                assert_stream_matches(matcher, pieces, ids, regex_oracle, patterns=[pattern], ignore_case=ignore_case)


def test_a_regex_match_that_could_still_grow_or_change_waits(smollm2):
    pieces = pieces_of(smollm2)
    digits = PhraseMatcher([r"\d{3,}"], pieces, regex=True)
    assert digits.find(encode(smollm2, "call 5551234")) is None
    assert digits.find(encode(smollm2, "call 5551234"), final=True).text == "5551234"
    assert digits.find(encode(smollm2, "call 5551234 now")).text == "5551234"
    longer_first = PhraseMatcher([r"abcd|ab"], pieces, regex=True)
    assert longer_first.find(encode(smollm2, "xabc")) is None  # "abcd" is still possible and preferred
    assert longer_first.find(encode(smollm2, "xabcd!")).text == "abcd"
    assert longer_first.find(encode(smollm2, "xabx")).text == "ab"
    shorter_first = PhraseMatcher([r"ab|abcd"], pieces, regex=True)
    assert shorter_first.find(encode(smollm2, "xabc")) is None  # a path still reaches the end: it waits too
    assert shorter_first.find(encode(smollm2, "xabcd!")).text == "ab"


def test_several_regexes_report_the_earliest_decided_match(smollm2):
    pieces = pieces_of(smollm2)
    patterns = [r"\bspine\b", r"shivers? down", r"(?i)DOWN her", r"(a)\1", r"(?x) t e a r s"]
    matcher = PhraseMatcher(patterns, pieces, regex=True)
    for text, expected in [
        ("a shiver down her spine", (2, 13, r"shivers? down")),
        ("it went down her back", (8, 16, r"(?i)DOWN her")),
        ("baaa tears", (1, 3, r"(a)\1")),
        ("no tears.", (3, 8, r"(?x) t e a r s")),
    ]:
        hit = matcher.find(encode(smollm2, text))
        assert (hit.start_char, hit.end_char, hit.pattern) == expected
        assert expected == regex_oracle(text, patterns)


def test_anchors_are_the_start_and_the_end_of_the_generated_text(smollm2):
    pieces = pieces_of(smollm2)
    opening = PhraseMatcher([r"^Sure\b"], pieces, regex=True)
    assert opening.find(encode(smollm2, "Sure, here it is")) == Hit(0, 0, 4, r"^Sure\b", "Sure")
    assert opening.find(encode(smollm2, "x" * 300 + " I am Sure, yes")) is None
    ending = PhraseMatcher([r"The end\.$"], pieces, regex=True)
    ids = encode(smollm2, "That was it. The end.")
    assert (ending.find(ids), ending.find(ids, final=True).start_char) == (None, 13)


def test_regex_matches_are_searched_within_the_window(smollm2):
    pieces = pieces_of(smollm2)
    ids = encode(smollm2, "x" + "a" * 20 + "b.")
    assert PhraseMatcher([r"a+b"], pieces, regex=True).find(ids).text == "a" * 20 + "b"
    # decided when "." arrives: the run began 22 characters back, the match is taken from within the last 8
    hit = PhraseMatcher([r"a+b"], pieces, regex=True, window=8).find(ids)
    assert (hit.start_char, hit.text) == (len(ids and "x" + "a" * 20 + "b.") - 8, "a" * 6 + "b")


# ----------------------------------------------------------------- rewinds
@pytest.mark.parametrize("mode", ["phrases", "regex"])
def test_a_shorter_list_gives_the_answers_of_a_fresh_matcher(smollm2, mode):
    pieces = pieces_of(smollm2)
    options = {"regex": True} if mode == "regex" else {"whole_words": True, "ignore_case": True}
    patterns = REGEXES if mode == "regex" else SLOP_PHRASES + ["the storm", "whisper"]
    rng = random.Random(4)
    ids = respell(smollm2, SLOP + " " + REGEX_TEXT, rng)
    matcher = PhraseMatcher(patterns, pieces, **options)
    row: list[int] = []
    for step in range(300):
        if row and rng.random() < 0.2:
            del row[rng.randrange(len(row)) :]  # a rewind, then generation goes on from there
        if len(row) >= len(ids):
            del row[len(ids) // 2 :]
        row.append(ids[len(row)] if rng.random() < 0.7 else rng.randrange(len(pieces)))
        fresh = PhraseMatcher(patterns, pieces, **options)
        for final in (False, True):
            assert matcher.find(row, final=final) == fresh.find(row, final=final), step
        assert matcher.holdback(row) == fresh.holdback(row)
        assert matcher.find(tuple(row)) == fresh.find(row)


def test_letting_a_hit_stand_looks_past_it(smollm2):
    pieces = pieces_of(smollm2)
    ids = encode(smollm2, "a testament to x, a testament to y, a test")
    matcher = PhraseMatcher(["a testament to"], pieces)
    first = matcher.find(ids)
    second = matcher.find(ids, from_char=first.start_char + 1)
    assert (first.start_char, second.start_char) == (0, 18)
    assert matcher.find(ids, from_char=second.start_char + 1) is None
    assert matcher.holdback(ids) == len(decode(pieces, ids))  # the hit not acted on holds everything from it
    assert matcher.holdback(ids, from_char=second.start_char + 1) == len(" a test")


# ----------------------------------------------------------------- holdback: released text is never taken back
SMALL = [b"a", b"b", b" ", b"A", b"ab", b"ba", b"a b", b" a", b"b ", b"aa", "é".encode(), b"\xc3", b"\xa9", b"s"]
SMALL += ["ß".encode(), b"", b"\xff", b"x"]


def stream_with_rewinds(matcher, pieces, plan, *, final_check=True):
    """A generation loop: append the planned tokens one by one; on a hit rewind to its token (the banned token
    is not drawn again: the plan goes on); release the text but the held-back characters. The released text is
    never taken back, and every hit begins in a token at or after its end."""
    row: list[int] = []
    released = ""
    for token in plan:
        row.append(token)
        hit = matcher.find(row)
        if hit is not None:
            assert len(decode(pieces, row[: hit.token])) >= len(released), (decode(pieces, row), hit, released)
            del row[hit.token :]
        text = decode(pieces, row)
        assert text.startswith(released), (text, released)
        release = len(text) - matcher.holdback(row)
        if release > len(released):
            released = text[:release]
    if final_check and (hit := matcher.find(row, final=True)) is not None:
        assert len(decode(pieces, row[: hit.token])) >= len(released)


@PROPERTY
@given(
    plan=st.lists(st.integers(0, len(SMALL) - 1), max_size=40),
    phrases=st.lists(st.text(alphabet="ab éßs", min_size=1, max_size=4), min_size=1, max_size=3),
    ignore_case=st.booleans(),
    whole_words=st.booleans(),
)
def test_released_text_is_never_taken_back_by_a_rewind_for_phrases(plan, phrases, ignore_case, whole_words):
    matcher = PhraseMatcher(phrases, SMALL, ignore_case=ignore_case, whole_words=whole_words)
    stream_with_rewinds(matcher, SMALL, plan)


PATTERN_PARTS = ["a", "b", " ", "ab", "a+", "b?a", "(?:ab|ba)", "[ab]", "\\w", "\\s", "(?:a b|b)", "é", "x*", "\\b"]


@PROPERTY
@given(
    plan=st.lists(st.integers(0, len(SMALL) - 1), max_size=40),
    parts=st.lists(st.lists(st.sampled_from(PATTERN_PARTS), min_size=1, max_size=4), min_size=1, max_size=3),
    ignore_case=st.booleans(),
    whole_words=st.booleans(),
)
def test_released_text_is_never_taken_back_by_a_rewind_for_regexes(plan, parts, ignore_case, whole_words):
    """Patterns without assertions that fail at the end and succeed once text follows (\\b, where it is used,
    only ends a word the pattern itself reads or begins the pattern)."""
    patterns = ["".join(p) for p in parts]
    patterns = [p for p in patterns if "\\b" not in p[2:]] or ["ab"]
    try:
        matcher = PhraseMatcher(patterns, SMALL, regex=True, ignore_case=ignore_case, whole_words=whole_words)
    except ValueError:  # a pattern that can match the empty text
        return
    stream_with_rewinds(matcher, SMALL, plan)


@PROPERTY
@given(
    plan=st.lists(st.integers(0, len(SMALL) - 1), max_size=30),
    parts=st.lists(st.lists(st.sampled_from(PATTERN_PARTS), min_size=1, max_size=4), min_size=1, max_size=3),
    ignore_case=st.booleans(),
    whole_words=st.booleans(),
)
def test_regexes_against_the_rule_on_random_streams(plan, parts, ignore_case, whole_words):
    patterns = ["".join(p) for p in parts]
    try:
        matcher = PhraseMatcher(patterns, SMALL, regex=True, ignore_case=ignore_case, whole_words=whole_words)
    except ValueError:  # a pattern that can match the empty text
        return
    options = dict(patterns=patterns, ignore_case=ignore_case, whole_words=whole_words)
    row: list[int] = []
    for token in plan:
        row.append(token)
        text = decode(SMALL, row)
        for final in (False, True):
            expected = regex_oracle(text, **options, final=final)
            hit = matcher.find(row, final=final)
            assert (None if hit is None else (hit.start_char, hit.end_char, hit.pattern)) == expected, (text, final)


def test_an_assertion_failing_at_the_end_is_the_exception_to_holdback(smollm2):
    pieces = pieces_of(smollm2)
    matcher = PhraseMatcher([r"a\B"], pieces, regex=True)
    xa = encode(smollm2, "xa")
    assert (matcher.find(xa), matcher.holdback(xa)) == (None, 0)  # released: "xa"
    assert matcher.find(encode(smollm2, "xab")).start_char == 1  # ... and a match begins inside it


def test_holdback_counts_from_the_token_a_rewind_may_go_back_to(smollm2):
    pieces = pieces_of(smollm2)
    matcher = PhraseMatcher(["a testament to", "barely above"], pieces)
    ids = encode(smollm2, "It was a testament")
    assert matcher.holdback(ids) == len(" a testament")
    assert matcher.holdback(encode(smollm2, "It was fine")) == 0
    # a rewind to " a" would bring back "It was", whose "s" may begin "shivers down": " was" is held back too
    assert PhraseMatcher(["a testament to", "shivers down"], pieces).holdback(ids) == len(" was a testament")
    # after "abx" nothing of "abcd" is open, but a rewind at "xy" brings "ab" back, and "abcd" with it
    small = PhraseMatcher(["abcd", "xy"], SMALL)
    a, b, x = SMALL.index(b"a"), SMALL.index(b"b"), SMALL.index(b"x")
    assert small.holdback([a, b, x]) == 3
    assert small.holdback([a, b, x, a]) == 4  # a hit at the last "a" brings back "abx", then "ab"
    assert small.holdback([a, b, x, b]) == 0  # nothing open: no rewind can reach back


# ----------------------------------------------------------------- errors
@pytest.mark.parametrize(
    ("patterns", "options", "message"),
    [
        (["ok", ""], {}, r"banned phrase 1 \(''\) is empty"),
        (["", "x"], {"regex": True}, r"banned pattern 0 \(''\) is empty"),
        (["(unclosed"], {"regex": True}, r"pattern 0 \('\(unclosed'\) is not a valid regular expression: missing \)"),
        (["ok", "a*"], {"regex": True}, r"pattern 1 \('a\*'\) can match the empty text"),
        ([r"\b"], {"regex": True}, r"pattern 0 \('\\\\b'\) can match the empty text"),
        (["(?=x)"], {"regex": True}, r"can match the empty text"),
        (["x|"], {"regex": True}, r"can match the empty text"),
        ([], {}, r"at least one banned phrase"),
        (["ok"], {"window": 0}, r"window=0"),
    ],
    ids=["empty", "empty-regex", "not-a-regex", "star", "word-boundary", "lookahead", "empty-branch", "none", "window"],
)
def test_invalid_patterns_are_named(patterns, options, message):
    with pytest.raises(ValueError, match=message):
        PhraseMatcher(patterns, SMALL, **options)


def test_one_string_instead_of_a_list_is_refused():
    with pytest.raises(TypeError, match="not one string"):
        PhraseMatcher("testament", SMALL)
