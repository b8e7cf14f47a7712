"""stop_strings against transformers' StopStringCriteria (the oracle) and against the decoded text itself.

Semantics: a row stops when the bytes its tokens decode to contain a stop string whose end falls inside the last
token. transformers' StopStringCriteria agrees exactly on every tokenizer kind it distinguishes (byte-level BPE,
SentencePiece-style Metaspace, Llama-style byte fallback, WordPiece), tested on random token sequences with stop
strings cut from the rows' own text (so they span tokens, overhang the last token, split multi-byte characters)
in batches whose rows differ. The documented differences are tested on their own at the end: special tokens and
left padding are no text here, text in transformers.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from transformers import StopStringCriteria

import samplechain
import samplechain_stop_strings as plugin
from samplechain import ConfigError, StopContext, StopSetup, strings
from samplechain.tools.testing import TOKENIZER_TEXT as TEXT
from samplechain.tools.testing import byte_bpe_tokenizer
from samplechain.tools.testing import byte_fallback_tokenizer as byte_fallback_bpe
from samplechain.tools.testing import metaspace_tokenizer as metaspace_bpe
from samplechain.tools.testing import pieces_tokenizer as hand_made
from samplechain.tools.testing import wordpiece_tokenizer as wordpiece

EMBEDDED = Path(samplechain.__file__).parent / "models" / "docs-gpt2"


# ----------------------------------------------------------------- real tokenizers, trained in-process
def embedded():
    if not (EMBEDDED / "tokenizer.json").exists():
        pytest.skip("the embedded docs-gpt2 model is not trained in this checkout")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(EMBEDDED))


TOKENIZERS = {
    "byte_level": lambda: byte_bpe_tokenizer(420, TEXT),
    "metaspace": metaspace_bpe,
    "byte_fallback": byte_fallback_bpe,
    "wordpiece": wordpiece,
    "embedded_gpt2": embedded,
}


@pytest.fixture(scope="module")
def tok():
    return byte_bpe_tokenizer(420, TEXT)


# ----------------------------------------------------------------- helpers
def criterion(strings):
    return samplechain.Stopping.criterion("stop_strings", {"strings": list(strings)})


def left_pad(rows, pad=0):
    width = max(map(len, rows))
    return torch.tensor([[pad] * (width - len(r)) + list(r) for r in rows])


def run(crit, tok, rows, prompt_lengths=None):
    """One check over rows (left-padded with id 0); prompt_lengths (default: whole rows) marks the real tokens."""
    ids = left_pad(rows)
    lengths = torch.tensor(prompt_lengths or [len(r) for r in rows])
    setup = StopSetup(
        batch_size=len(rows), prompt_length=ids.shape[1], prompt_lengths=lengths, device=ids.device, tokenizer=tok
    )
    crit.prepare(setup)
    return crit.check(StopContext(ids, 1, ids[:, -1], setup)).tolist()


def transformers_says(tok, stops, rows):
    return StopStringCriteria(tok, list(stops))(left_pad(rows), None).tolist()


def ends_in_last_token(pieces: list[bytes], s: bytes) -> bool:
    """Plain-Python reference on bytes: s occurs in the joined pieces with its end inside the last piece."""
    data, before = b"".join(pieces), sum(map(len, pieces[:-1]))
    at = data.find(s)
    while at != -1:
        if at + len(s) > before:
            return True
        at = data.find(s, at + 1)
    return False


# ----------------------------------------------------------------- agreement with transformers
@pytest.mark.parametrize("kind", list(TOKENIZERS))
def test_agrees_with_transformers_on_random_sequences(kind):
    tok = TOKENIZERS[kind]()
    table = strings.token_bytes(tok)
    special = set(tok.all_special_ids)
    ordinary = [i for i in range(len(tok)) if i not in special and table[i]]
    # the tokens of multi-byte words, spliced into rows: split into byte tokens by byte-level and byte-fallback
    # vocabularies, whole characters in the others (words a vocabulary cannot spell are left out)
    words = [tok(w, add_special_tokens=False)["input_ids"] for w in ("é", "café", "🎉", "日本語", "テキスト", "ü")]
    words = [w for w in words if w and all(i in ordinary for i in w)]
    rng = random.Random(kind)

    def draw():
        row: list[int] = []
        while len(row) < rng.randint(1, 7):
            row += rng.choice(words) if words and rng.random() < 0.3 else [rng.choice(ordinary)]
        return row

    seen = {"hits": 0, "misses": 0, "spans_tokens": 0, "overhang": 0, "multibyte": 0, "rows_differ": 0}
    for _ in range(25 if kind == "embedded_gpt2" else 50):  # its 4096-token precompute in transformers: 40 ms
        rows = [draw() for _ in range(8)]
        stops = []
        for row in rows[:3]:  # cut stop strings from the rows' own bytes, ending near the end of the row
            data = b"".join(table[i] for i in row)
            end = rng.randint(max(len(data) - 6, 1), len(data))
            piece = data[max(end - rng.randint(1, 8), 0) : end]
            try:
                stops.append(piece.decode("utf-8"))
            except UnicodeDecodeError:  # a cut through a character: not a string
                pass
        stops = [s for s in stops if s] + [rng.choice(["stop", "e", "é", ". ", "テキ"])]
        ours = run(criterion(stops), tok, rows)
        assert ours == transformers_says(tok, stops, rows), (stops, [[table[i] for i in r] for r in rows])
        for row, hit in zip(rows, ours):
            pieces = [table[i] for i in row]
            expected = [ends_in_last_token(pieces, s.encode()) for s in stops]
            assert hit == any(expected)
            seen["hits" if hit else "misses"] += 1
            for s, e in zip(stops, expected):
                if e:
                    b = s.encode()
                    seen["spans_tokens"] += len(b) > len(pieces[-1]) or not pieces[-1].startswith(b[-1:])
                    seen["overhang"] += not b.endswith(pieces[-1])
                    seen["multibyte"] += not s.isascii()
        seen["rows_differ"] += len(set(ours)) > 1
    # the comparison covers every case it is meant to cover (a vocabulary without non-ASCII text has no multi-byte
    # case to cover)
    if not words:
        del seen["multibyte"]
    assert min(seen.values()) >= 5, seen


def test_transformers_docstring_examples():
    """The positive and negative examples StopStringCriteria's docstring lists for the stop string "stop"."""
    words = [
        "st",
        "op",
        "stop",
        "opera",
        "sto",
        "pper",
        "las",
        "topper",
        "s",
        "to",
        "pped",
        "at",
        "tion",
        "xstop",
        "xsto",
    ]
    tok = hand_made(words)
    ids = {w: tok.convert_tokens_to_ids(w) for w in words + ["x", "p", "o", "t", "s"]}  # ASCII: piece == text
    assert len(set(ids.values())) == len(ids)
    stops = [
        ["st", "op"],
        ["stop"],
        ["st", "opera"],
        ["sto", "pper"],
        ["las", "topper"],
        ["s", "to", "pped"],
        ["xstop"],
        ["x", "s", "t", "op"],
        ["xsto", "p"],
    ]
    goes_on = [["stop", "at"], ["st", "op", "at"], ["st", "opera", "tion"], ["sto"], ["xsto"], ["p", "o", "t", "s"]]
    rows = [[ids[w] for w in seq] for seq in stops + goes_on]
    expected = [True] * len(stops) + [False] * len(goes_on)
    assert run(criterion(["stop"]), tok, rows) == expected
    assert transformers_says(tok, ["stop"], rows) == expected


def test_multi_byte_characters_split_over_byte_tokens():
    tok = hand_made(["caf", "!"])
    b = tok.convert_tokens_to_ids
    byte_id = {x: b(ch) for ch, x in strings.gpt2_byte_decoder().items()}  # the 256 one-byte tokens
    cafe = [b("caf")] + [byte_id[x] for x in "é".encode()]  # "caf" 0xC3 0xA9
    party = [byte_id[x] for x in "🎉".encode()]  # four byte tokens
    rows = [cafe, cafe[:-1], party, party[:-1], party[:2], [b("caf")]]
    for stops, expected in (
        (["é"], [True, False, False, False, False, False]),
        (["🎉"], [False, False, True, False, False, False]),
        (["café"], [True, False, False, False, False, False]),
        (["f"], [False, False, False, False, False, True]),
    ):
        assert run(criterion(stops), tok, rows) == expected, stops
        assert transformers_says(tok, stops, rows) == expected, stops


def test_every_prefix_of_real_text_stops_exactly_when_the_decoded_text_shows_the_string():
    """The reference is the text itself: decode(prefix) holds the string ending past decode(prefix[:-1])."""
    tok = byte_bpe_tokenizer(420, TEXT)
    strings = ["stop", "\n\n", "here.", "mutable seq", "s. S", "café", "🎉"]
    ids = tok(TEXT)["input_ids"][:160]
    crit = criterion(strings)
    for n in range(1, len(ids) + 1):
        full, before = tok.decode(ids[:n]), tok.decode(ids[: n - 1])
        # a prefix that ends inside a character decodes with U+FFFD: compare where the text is whole
        if "\ufffd" in full[-2:] or "\ufffd" in before[-2:]:
            continue
        expected = any(s in full and full.rfind(s) + len(s) > len(before) for s in strings)
        assert run(crit, tok, [ids[:n]]) == [expected], (n, full[-30:])


def test_rows_stop_independently(tok):
    a, b, c = (tok(t)["input_ids"] for t in ("the lastopper", "no match at all", "Sentence one.\n\n"))
    assert run(criterion(["stop", "\n\n"]), tok, [a, b, c]) == [True, False, True]
    assert run(criterion(["stop", "\n\n"]), tok, [b, c, a, b]) == [False, True, True, False]


# ----------------------------------------------------------------- where transformers differs, on purpose
def test_special_tokens_are_no_text_where_transformers_reads_their_literal():
    tok = hand_made(["sto", "p", "x"])
    eos, sto, p, x = (tok.convert_tokens_to_ids(t) for t in ("<|endoftext|>", "sto", "p", "x"))
    # the eos token's literal "<|endoftext|>" holds "end": transformers stops, the decoded text has no "end"
    assert transformers_says(tok, ["end"], [[x, eos]]) == [True]
    assert run(criterion(["end"]), tok, [[x, eos]]) == [False]
    # "sto" <eos> "p" decodes (skip_special_tokens) to "stop": caught here, not by transformers
    assert transformers_says(tok, ["stop"], [[sto, eos, p]]) == [False]
    assert run(criterion(["stop"]), tok, [[sto, eos, p]]) == [True]


def test_left_padding_is_no_text_where_transformers_reads_it(tok):
    sto, p = tok("sto")["input_ids"], tok("p")["input_ids"]
    rows = [sto + p, sto + p]
    # row 1's prompt is only "p": its "sto" is left padding (which a pad id of 0 would never spell; here it does)
    assert run(criterion(["stop"]), tok, rows, prompt_lengths=[len(sto + p), len(p)]) == [True, False]
    assert StopStringCriteria(tok, ["stop"])(torch.tensor(rows), None).tolist() == [True, True]


def test_ids_past_the_tokenizer_are_no_text(tok):
    """A model's vocabulary may be padded past its tokenizer's: those ids spell nothing (transformers: they match
    nothing, so one inside a stop string breaks it)."""
    sto, p, beyond = tok("sto")["input_ids"], tok("p")["input_ids"], len(tok) + 5
    rows = [[5] + sto + p, sto + p + [beyond], sto + [beyond] + p]
    assert run(criterion(["stop"]), tok, rows) == [True, False, True]
    assert transformers_says(tok, ["stop"], rows) == [True, False, False]


# ----------------------------------------------------------------- precompute and per-step cost
def test_precompute_runs_once_per_vocabulary(monkeypatch):
    tok = byte_bpe_tokenizer(400, TEXT + " once")
    calls = []
    real = strings.token_bytes
    monkeypatch.setattr(strings, "token_bytes", lambda t: calls.append(t) or real(t))
    first = plugin.byte_table(tok)
    for _ in range(3):
        run(criterion(["once"]), tok, [tok("once")["input_ids"]])
    assert plugin.byte_table(tok) is first
    assert plugin.byte_table(byte_bpe_tokenizer(400, TEXT + " once")) is first  # an equal tokenizer, another object
    assert len(calls) == 1
    assert first.bytes.shape[0] == len(tok) and first.bytes.dtype == torch.uint8
    tok.add_tokens(["<new>"])  # the vocabulary changed: a new table
    assert plugin.byte_table(tok) is not first and len(calls) == 2
    assert plugin.byte_table(tok).vocab_size == len(tok)


def test_per_step_cost_does_not_depend_on_the_vocabulary_size(tok):
    """A billion-token table (a stride-0 view: every id spells "p", no memory) checks as fast as a small one: a
    step gathers the bytes of the last few tokens only; anything touching the whole table would not finish."""
    p = tok.convert_tokens_to_ids("p")
    small = plugin.byte_table(tok)
    huge = plugin.ByteTable(small.bytes[p : p + 1].expand(10**9, -1), small.lengths[p : p + 1].expand(10**9))
    crit = criterion(["pp", "ppp"])
    run(crit, tok, [[p]])
    crit._table = huge
    ids = torch.tensor([[7, 10**9 - 1, 10**9 - 2], [10**9 - 1, 10**9 - 1, 10**9 - 1], [7, 7, 10**9 - 3]])
    setup = StopSetup(
        batch_size=3, prompt_length=3, prompt_lengths=torch.tensor([3, 3, 1]), device=ids.device, tokenizer=tok
    )
    assert crit.check(StopContext(ids, 1, ids[:, -1], setup)).tolist() == [True, True, False]


# ----------------------------------------------------------------- configuration
@pytest.mark.parametrize(
    "strings, message",
    [
        ([], r"strings = \[\]: give at least one stop string"),
        (["ok", ""], r"strings = \['ok', ''\]: stop string 1 is empty \(''\)"),
        ("abc", "strings = 'abc': expected an array"),
        ([1], r"strings\[0\] = 1: expected a string"),
        (None, "strings = None"),
    ],
)
def test_bad_stop_strings(strings, message):
    stop = {"use": "stop_strings"} | ({} if strings is None else {"strings": strings})
    if strings is None:
        message = "strings: required key missing"
    with pytest.raises(ConfigError, match=message):
        samplechain.load_config({"samplers": [{"use": "greedy"}], "stop": [stop]})


def test_from_toml():
    config = samplechain.load_config(
        'samplers = [{ use = "greedy" }]\n'
        'stop = [{ use = "max_new_tokens", n = 8 }, '
        '{ use = "stop_strings", strings = ["\\n\\n", "User:"] }]\n'
    )
    assert [e.params for e in config.stop][1].strings == ("\n\n", "User:")


def test_needs_a_tokenizer():
    setup = StopSetup(batch_size=1, prompt_length=1, prompt_lengths=torch.tensor([1]), device=torch.device("cpu"))
    with pytest.raises(ConfigError, match="stop_strings needs the tokenizer"):
        criterion(["x"]).prepare(setup)
