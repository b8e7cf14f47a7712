"""stop_strings against transformers' StopStringCriteria and against the decoded text itself."""

from __future__ import annotations

import random
import time

import pytest
import torch
from transformers import StopStringCriteria

import samplechain
from samplechain import ConfigError, StopContext, StopSetup
from samplechain.testing import byte_bpe_tokenizer

TEXT = ("Stop the lastopper! The stopped stopwatch stops. Sentence one.\n\nSentence two: ends here. "
        "A list is a mutable sequence; tuples are immutable. 日本語のテキスト and 🎉 emoji. ") * 3


@pytest.fixture(scope="module")
def tok():
    return byte_bpe_tokenizer(420, TEXT)


def criterion(strings):
    return samplechain.Stopping.criterion("stop_strings", {"strings": list(strings)})


def run(crit, tok, rows, prompt_lengths=None):
    width = max(map(len, rows))
    ids = torch.zeros((len(rows), width), dtype=torch.int64)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.tensor(r)
    lengths = torch.tensor(prompt_lengths or [len(r) for r in rows])
    setup = StopSetup(batch_size=len(rows), prompt_length=width, prompt_lengths=lengths, device=ids.device,
                      tokenizer=tok)
    crit.prepare(setup)
    return crit.check(StopContext(ids, 1, ids[:, -1], setup)).tolist()


def appears_in_last_token(tok, ids, s):
    """The reference from the text itself: s occurs in decode(ids) ending after decode(ids[:-1])'s end."""
    full, before = tok.decode(ids), tok.decode(ids[:-1])
    start = full.find(s)
    while start != -1:
        if start + len(s) > len(before):
            return True
        start = full.find(s, start + 1)
    return False


def test_every_prefix_of_real_text_stops_exactly_when_the_string_first_appears(tok):
    strings = ["stop", "\n\n", "here.", "mutable seq", "s. S"]
    ids = tok(TEXT)["input_ids"][:120]
    crit = criterion(strings)
    for n in range(1, len(ids) + 1):
        expected = any(appears_in_last_token(tok, ids[:n], s) for s in strings)
        assert run(crit, tok, [ids[:n]]) == [expected], (n, tok.decode(ids[:n])[-30:])


def test_agrees_with_transformers_on_random_ascii_sequences(tok):
    rng = random.Random(0)
    ascii_ids = [i for i in range(len(tok)) if tok.decode([i]).isascii() and tok.decode([i])
                 and i not in tok.all_special_ids]
    ours_only = 0
    for trial in range(150):
        rows = [[rng.choice(ascii_ids) for _ in range(rng.randint(1, 8))] for _ in range(4)]
        text = tok.decode(rows[0])
        a = rng.randrange(len(text))
        stops = [text[a:a + rng.randint(1, 5)]] + [rng.choice(["stop", "the", "e", ". "])]
        stops = [s for s in stops if s]
        theirs = StopStringCriteria(tok, stops)(torch.tensor(rows) if len({*map(len, rows)}) == 1 else
                                                 _pad(rows), None).tolist()
        ours = run(criterion(stops), tok, rows)
        for r, (o, t) in enumerate(zip(ours, theirs)):
            reference = any(appears_in_last_token(tok, rows[r], s) for s in stops)
            assert o == reference, (trial, r, stops, [tok.decode([i]) for i in rows[r]])
            if t:
                assert o, "transformers stops, we do not"
            elif o:  # the documented difference: the stop string lies inside the last token after other text
                last = tok.decode(rows[r][-1:])
                assert not any(last.startswith(s[-i:]) for s in stops for i in range(1, len(s) + 1)
                               if appears_in_last_token(tok, rows[r], s)) or _inside(last, stops)
                ours_only += 1
    assert ours_only < 40


def _inside(last, stops):
    return any(s in last[1:] for s in stops)


def _pad(rows):  # transformers reads whole rows: pad on the left with a token that decodes to nothing special
    width = max(map(len, rows))
    return torch.tensor([[0] * (width - len(r)) + r for r in rows])


def test_multi_byte_stop_strings_split_across_byte_tokens(tok):
    ids = tok("テキスト and 🎉 emoji")["input_ids"]
    assert any("\ufffd" in tok.decode([i]) for i in ids)
    crit = criterion(["🎉", "テキ"])
    hits = [run(crit, tok, [ids[:n]])[0] for n in range(1, len(ids) + 1)]
    # the step at which each string first shows in the decoded text (decoding a prefix that ends inside a
    # character gives U+FFFD, so the text-position reference of the other tests does not apply here)
    firsts = sorted(next(n for n in range(1, len(ids) + 1) if s in tok.decode(ids[:n])) for s in ["🎉", "テキ"])
    assert [n + 1 for n, h in enumerate(hits) if h] == firsts
    theirs = [StopStringCriteria(tok, ["🎉", "テキ"])(torch.tensor([ids[:n]]), None).item()
              for n in range(1, len(ids) + 1)]
    assert theirs == hits


def test_rows_stop_independently_and_left_padding_is_not_text(tok):
    a, b = tok("the lastopper")["input_ids"], tok("no match at all")["input_ids"]
    assert run(criterion(["stop"]), tok, [a, b]) == [True, False]
    # row 1's left padding (token ids that would read "stop") must not count
    pad = tok("sto")["input_ids"]
    p = tok("p")["input_ids"]
    assert run(criterion(["stop"]), tok, [pad + p, pad + p], prompt_lengths=[len(pad + p), len(p)]) == [True, False]


def test_precompute_is_cached_per_tokenizer(tok):
    from samplechain_stop_strings import byte_table

    t0 = time.perf_counter()
    first = byte_table(tok)
    assert byte_table(tok) is first
    assert byte_table(byte_bpe_tokenizer(420, TEXT)) is first  # an equal tokenizer, another object
    assert first.bytes.shape[0] == len(tok)
    assert time.perf_counter() - t0 < 60


@pytest.mark.parametrize("strings, message", [
    ([], "give at least one stop string"),
    (["ok", ""], "stop string 1 is empty"),
    ("abc", "expected an array"),
])
def test_bad_stop_strings(strings, message):
    with pytest.raises(ConfigError, match=message):
        samplechain.load_config({"samplers": [{"use": "greedy"}], "stop": [{"use": "stop_strings", "strings": strings}]})


def test_needs_a_tokenizer():
    crit = criterion(["x"])
    setup = StopSetup(batch_size=1, prompt_length=1, prompt_lengths=torch.tensor([1]), device=torch.device("cpu"))
    with pytest.raises(ConfigError, match="stop_strings needs the tokenizer"):
        crit.prepare(setup)
