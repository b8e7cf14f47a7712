"""stop_regex against its reference (SGLang's stop_regex, restated in `reference` below on the decoded text after
each token): random token sequences and patterns, matches across token boundaries, the finish reason naming the
pattern, the look-back, the prompt not counting, the parameter checks, and a chain file."""

from __future__ import annotations

import random
import re

import pytest
import torch

import samplechain
import samplechain_stop_regex as plugin
from samplechain import Chain, ConfigError, StopContext, StopSetup
from samplechain.generation import generate
from samplechain.tools.testing import ScriptedLM, piece_ids, pieces_tokenizer

PIECES = ["ab", "ba", "a b", "\n", "\n\n", "EN", "D", "END", " the", " end", "é", "x1", "23"]
PATTERNS = ["E.D", r"\n\n+", "b a", r"(?i)the end", r"\d{3}", "é b", r"a\nb", "ba ?ab", r"\bend\b"]


@pytest.fixture(scope="module")
def tok():
    return pieces_tokenizer(PIECES)


def criterion(patterns, **params):
    return samplechain.Stopping.criterion("stop_regex", {"patterns": list(patterns), **params})


def reference(pieces: list[str], patterns: list[str], lookback: int) -> tuple[int | None, str | None, str | None]:
    """After each token: the first pattern (in order) with a match that ends in the new token's text and starts at
    most `lookback` characters before it. Returns (step, reason, matched text), or Nones when nothing matches."""
    text = ""
    for step, piece in enumerate(pieces, start=1):
        before, text = len(text), text + piece
        for p in patterns:
            for start in range(max(before - lookback, 0), len(text)):
                m = re.compile(p).match(text, start)
                if m is not None and m.end() > before:
                    return step, f"stop_regex:{p}", m.group()
    return None, None, None


def run_steps(crit, tok, rows: list[list[int]], prompt: list[int]):
    """Feed the rows to the criterion one step at a time (as generate does); the first step each row stops at."""
    batch = len(rows)
    ids = torch.tensor([prompt] * batch)
    setup = StopSetup(
        batch_size=batch,
        prompt_length=len(prompt),
        prompt_lengths=torch.full((batch,), len(prompt)),
        device=ids.device,
        tokenizer=tok,
    )
    crit.prepare(setup)
    stopped: dict[int, tuple[int, str, str]] = {}
    for step in range(1, len(rows[0]) + 1):
        ids = torch.cat([ids, torch.tensor([[r[step - 1]] for r in rows])], dim=1)
        ctx = StopContext(ids, step, ids[:, -1], setup)
        hit = crit.check(ctx).tolist()
        rows_hit = [b for b, h in enumerate(hit) if h and b not in stopped]
        for b, match in zip(rows_hit, crit.matches(ctx, rows_hit)):
            stopped[b] = (step, match.reason, match.text)
    return stopped


def test_agrees_with_the_reference_on_random_sequences(tok):
    rng = random.Random(0)
    for trial in range(40):
        rows = [[rng.choice(PIECES) for _ in range(12)] for _ in range(4)]
        patterns = rng.sample(PATTERNS, 2)
        crit = criterion(patterns)
        got = run_steps(crit, tok, [piece_ids(tok, r) for r in rows], piece_ids(tok, ["ab"]))
        for b, row in enumerate(rows):
            step, reason, text = reference(row, patterns, crit.lookback)
            assert got.get(b, (None, None, None)) == (step, reason, text), (trial, row, patterns)


def test_a_match_across_token_boundaries_fires_when_it_completes(tok):
    rows = [piece_ids(tok, ["ab", "EN", "D", "ab"]), piece_ids(tok, ["E", "N", "D", "D"])]
    assert run_steps(criterion(["END"]), tok, rows, [1]) == {
        0: (3, "stop_regex:END", "END"),
        1: (3, "stop_regex:END", "END"),
    }


def test_the_first_pattern_in_order_names_the_reason(tok):
    rows = [piece_ids(tok, ["ab", "END"])]
    assert run_steps(criterion(["N", "E.D"]), tok, rows, [1]) == {0: (2, "stop_regex:N", "N")}
    assert run_steps(criterion(["E.D", "N"]), tok, rows, [1]) == {0: (2, "stop_regex:E.D", "END")}


def test_the_prompt_does_not_count(tok):
    rows = [piece_ids(tok, ["D", "ab"])]
    assert run_steps(criterion(["END"]), tok, rows, piece_ids(tok, ["EN"])) == {}
    assert run_steps(criterion(["^ab"]), tok, rows, piece_ids(tok, ["ab"])) == {}  # ^: the generated text's start
    assert run_steps(criterion(["^Dab"]), tok, rows, piece_ids(tok, ["ab"])) == {0: (2, "stop_regex:^Dab", "Dab")}


def test_look_back_bounds_how_far_a_match_starts(tok):
    rows = [piece_ids(tok, ["a", "b", "c", "d", "e", "f", "g"])]
    assert run_steps(criterion(["a[a-z]+g"]), tok, rows, [1]) == {0: (7, "stop_regex:a[a-z]+g", "abcdefg")}
    assert run_steps(criterion(["a[a-z]+g"], max_lookback=5), tok, rows, [1]) == {}
    assert run_steps(criterion(["a[a-z]+g"], max_lookback=6), tok, rows, [1]) == {
        0: (7, "stop_regex:a[a-z]+g", "abcdefg")
    }


def test_the_derived_look_back_is_the_longest_match_less_one():
    assert criterion(["END"]).lookback == 2
    assert criterion(["ab|c{5}"]).lookback == 4
    assert criterion([r"\d+"]).lookback == plugin.LOOKBACK_CAP
    assert criterion(["END"], max_lookback=9).lookback == 9
    assert criterion(["END"]).hold_back() == 2


def test_a_character_split_over_tokens_matches_once_whole(tok):
    split = [tok.convert_tokens_to_ids(c) for c in ("Ã", "©")]  # "é" as its two bytes, one token each
    rows = [piece_ids(tok, ["ab", "é", "a b", "ab"]), piece_ids(tok, ["ab"]) + split + piece_ids(tok, ["a b"])]
    got = run_steps(criterion(["éa b"]), tok, rows, [1])
    assert got == {0: (3, "stop_regex:éa b", "éa b"), 1: (4, "stop_regex:éa b", "éa b")}
    assert run_steps(criterion(["\\ufffd"]), tok, rows, [1]) == {}  # half a character is not yet text


def test_a_fresh_criterion_mid_generation_reads_the_text_so_far(tok):
    """A resumed generation: the first check sees many tokens at once."""
    row = piece_ids(tok, ["ab", "EN", "ab", "EN", "D"])
    ids = torch.tensor([[1] + row])
    setup = StopSetup(batch_size=1, prompt_length=1, prompt_lengths=torch.tensor([1]), device=ids.device, tokenizer=tok)
    crit = criterion(["ENabEND", "NabEN"])
    crit.prepare(setup)
    ctx = StopContext(ids, 5, ids[:, -1], setup)
    assert crit.check(ctx).tolist() == [True]
    assert crit.matches(ctx, [0])[0].text == "ENabEND"


@pytest.mark.parametrize(
    "patterns, message",
    [
        ([], "at least one pattern"),
        (["ok", "(unclosed"], "pattern 1 ('(unclosed') is not a valid regular expression: missing ), unterminated"),
        (["a*"], "pattern 0 ('a*') can match the empty text"),
        ([r"\b"], "can match the empty text"),
        (["(?=x)"], "can match the empty text"),
    ],
)
def test_bad_patterns(patterns, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        criterion(patterns)


def test_needs_a_tokenizer():
    crit = criterion(["x"])
    setup = StopSetup(batch_size=1, prompt_length=1, prompt_lengths=torch.tensor([1]), device=torch.device("cpu"))
    with pytest.raises(ConfigError, match="needs the tokenizer"):
        crit.prepare(setup)


def test_from_a_chain_file_in_generate(tok, tmp_path):
    path = tmp_path / "chain.toml"
    path.write_text(
        '[chain]\nsamplers = [{ use = "greedy" }]\n'
        'stop = [{ use = "max_new_tokens", n = 16 }, { use = "stop_regex", patterns = ["\\\\n\\\\n+"] }]\n'
    )
    model = ScriptedLM([piece_ids(tok, ["ab", "\n", "\n", "ba"])], len(tok))
    out = generate(model, tok, ["x"], chain=Chain.load(path), pad_token_id=0)
    assert out.finish_reasons == ["stop_regex:\\n\\n+"] and out.texts == ["ab"] and out.stop_texts == ["\n\n"]


def test_listed_by_samplechain_plugins():
    host = samplechain.get_host()
    assert host.get("stopping_criterion", "stop_regex") is plugin.StopRegex


@pytest.mark.parametrize("num_beams", [1, 3])
def test_an_escaped_string_stops_where_stop_strings_stops(num_beams):
    """stop_regex with a literal pattern agrees with stop_strings on generated text (beam search reorders rows
    every step: the per-row text follows them)."""
    from samplechain.tools.testing import byte_bpe_tokenizer, tiny_gpt2

    tok = byte_bpe_tokenizer(300)
    model = tiny_gpt2(len(tok), seed=3)
    prompts = ["the quick", "a b"]
    kw = dict(
        max_new_tokens=20,
        ignore_eos=True,
        num_beams=num_beams,
        pad_token_id=0,
        chain={"chain": {"samplers": [{"use": "greedy"}]}},
    )
    free = generate(model, tok, prompts, **kw)
    text = free.texts[0]
    stop = next(text[i : i + 3] for i in range(2, len(text)) if text[i : i + 3].isascii() and len(text[i : i + 3]) == 3)
    by_string = generate(model, tok, prompts, stop_strings=[stop], **kw)
    by_regex = generate(model, tok, prompts, stop_regex=[re.escape(stop)], **kw)
    assert torch.equal(by_string.sequences, by_regex.sequences)
    assert [r and r.split(":")[0] for r in by_regex.finish_reasons] == [
        r and r.replace("stop_strings", "stop_regex") for r in by_string.finish_reasons
    ]
    assert "stop_strings" in by_string.finish_reasons
