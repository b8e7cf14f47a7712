"""samplechain.strings, the core's tokenizer-aware string service, on real tokenizers of every kind it reads
(byte-level BPE, SentencePiece Metaspace, Llama-style byte fallback, WordPiece), trained in-process.

Oracles: brute force over the whole vocabulary (spellings), the tokenizer's own encode and decode, llama.cpp's
WordPiece converter (`phantom`: continuations lose "##", the rest gain a space), and the decode-based resolution
of DRY's breakers that the service replaced (the same sequences for every ASCII breaker)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

import samplechain
from samplechain import strings
from samplechain.tools.testing import TOKENIZER_TEXT as TEXT
from samplechain.tools.testing import byte_bpe_tokenizer
from samplechain.tools.testing import byte_fallback_tokenizer as byte_fallback
from samplechain.tools.testing import metaspace_tokenizer as metaspace
from samplechain.tools.testing import wordpiece_tokenizer as wordpiece

tokenizers = pytest.importorskip("tokenizers")
transformers = pytest.importorskip("transformers")
from transformers import PreTrainedTokenizerFast  # noqa: E402

EMBEDDED = Path(samplechain.__file__).parent / "models" / "docs-gpt2"


def embedded():
    if not (EMBEDDED / "tokenizer.json").exists():
        pytest.skip("the embedded docs-gpt2 model is not trained in this checkout")
    return transformers.AutoTokenizer.from_pretrained(str(EMBEDDED))


BUILDERS = {
    "byte_level": lambda: byte_bpe_tokenizer(420, TEXT),
    "metaspace": metaspace,
    "byte_fallback": byte_fallback,
    "wordpiece": wordpiece,
}
_BUILT: dict[str, PreTrainedTokenizerFast] = {}


def tokenizer(kind: str) -> PreTrainedTokenizerFast:
    if kind not in _BUILT:
        _BUILT[kind] = embedded() if kind == "embedded_gpt2" else BUILDERS[kind]()
    return _BUILT[kind]


def brute_force(pieces, data: bytes) -> set[tuple[int, ...]]:
    """Every sequence of tokens whose pieces join to data, by trying every token at every step."""
    if not data:
        return {()}
    out = set()
    for i, piece in enumerate(pieces):
        if piece and data.startswith(piece):
            out |= {(i, *rest) for rest in brute_force(pieces, data[len(piece) :])}
    return out


def running_text(tok, ids) -> bytes:
    """What ids add to decoded text after other text: the service's reading of a token sequence."""
    pieces = strings.byte_table(tok).pieces
    return b"".join(pieces[i] for i in ids)


# ----------------------------------------------------------------- spellings
@pytest.mark.parametrize("kind", list(BUILDERS))
@pytest.mark.parametrize("text", ["stop", " the", ": ends", "é", " café", "日", "🎉"])
def test_spellings_are_every_sequence_that_spells_the_text(kind, text):
    tok = tokenizer(kind)
    table = strings.byte_table(tok)
    data = text.encode()
    got = strings.spellings(tok, text, limit=10**6)
    assert set(got) == brute_force(table.pieces, data)
    assert list(got) == sorted(got, key=lambda s: (len(s), s))  # fewest tokens first, then by ids
    for seq in got:
        assert running_text(tok, seq) == data
        if kind in ("byte_level", "metaspace", "byte_fallback"):  # decode drops a leading space (SentencePiece)
            decoded = tok.decode(list(seq), clean_up_tokenization_spaces=False)
            assert decoded == (text if kind == "byte_level" else text.removeprefix(" "))


@pytest.mark.parametrize("kind", list(BUILDERS))
def test_the_tokenizers_own_encoding_is_a_spelling_of_its_running_text(kind):
    tok = tokenizer(kind)
    for text in ["Stop here", "The stopped stopwatch", "Naïve café", "日本語", "🎉 emoji", "Sentence two: ends"]:
        ids = tuple(tok.encode(text, add_special_tokens=False))
        spelt = running_text(tok, ids)
        assert ids in strings.spellings(tok, spelt, limit=10**4, truncate=True), (kind, text)


def test_a_multi_byte_character_split_over_byte_tokens_is_spelt_by_its_bytes():
    tok = tokenizer("byte_level")
    table = strings.byte_table(tok)
    first, second = ("é".encode()[:1], "é".encode()[1:])
    ids = (table.pieces.index(first), table.pieces.index(second))
    assert ids in strings.spellings(tok, "é")
    assert strings.spellings(tok, first + second) == strings.spellings(tok, "é")  # bytes or str
    assert tok.decode(list(ids)) == "é"
    fallback = tokenizer("byte_fallback")
    byte_ids = tuple(fallback.convert_tokens_to_ids([f"<0x{b:02X}>" for b in "日".encode()]))
    assert strings.spellings(fallback, "日") == (byte_ids,)  # nothing merged it: its three <0xNN> tokens


def test_leading_space_belongs_to_the_word_start_token():
    """In running text "▁the" (SentencePiece) and "the" (WordPiece) spell " the"; they never spell "the"."""
    for kind, piece in (("metaspace", "▁the"), ("wordpiece", "the")):
        tok = tokenizer(kind)
        the = tok.convert_tokens_to_ids(piece)
        assert (the,) in strings.spellings(tok, " the")
        assert all(the not in seq for seq in strings.spellings(tok, "the"))


def test_more_spellings_than_the_limit_is_an_error_or_the_first_ones():
    tok = tokenizer("byte_level")
    every = strings.spellings(tok, "stopped", limit=10**6)
    assert len(every) > 5
    with pytest.raises(strings.TooManySpellings, match=rf"'stopped' has {len(every)} spellings, more than limit=5"):
        strings.spellings(tok, "stopped", limit=5)
    assert strings.spellings(tok, "stopped", limit=5, truncate=True) == every[:5]
    assert strings.spellings(tok, "") == ((),)
    assert strings.spellings(tokenizer("wordpiece"), "\x00") == ()  # no token spells it


def test_index_and_table_are_built_once_per_vocabulary(monkeypatch):
    tok = byte_bpe_tokenizer(400, TEXT + " cached")
    calls = []
    real = strings.token_bytes
    monkeypatch.setattr(strings, "token_bytes", lambda t: calls.append(t) or real(t))
    strings.spellings(tok, "cached")
    index = strings.byte_table(tok).derived["index"]
    strings.spellings(byte_bpe_tokenizer(400, TEXT + " cached"), "stop")  # an equal tokenizer, another object
    assert strings.byte_table(tok).derived["index"] is index
    assert len(calls) == 1


# ----------------------------------------------------------------- token texts
def test_wordpiece_tokens_read_as_llama_cpp_s_converter_writes_them():
    """convert_hf_to_gguf's BERT vocabulary: "##x" -> "x", every other token -> "▁" + token (a space); then the
    tokenizer's decoder cleans up as it does in decoded text (no space before . , ! ? and contractions)."""
    tok = tokenizer("wordpiece")
    pieces = strings.token_bytes(tok)
    special = set(tok.all_special_ids)
    for i, token in enumerate(tok.convert_ids_to_tokens(list(range(len(tok))))):
        phantom = token[2:] if token.startswith("##") else " " + token
        want = b"" if i in special else tok.clean_up_tokenization(phantom).encode()
        assert pieces[i] == want, token


def test_a_bare_sentencepiece_vocabulary_reads_spaces_and_byte_tokens():
    class Vocabulary:  # a slow SentencePiece tokenizer's surface: no decoder, no convert_tokens_to_string
        all_special_ids = [0, 1]
        vocab = ["<s>", "</s>", "▁the", "▁t", "<0x0A>", "ab", "▁"]

        def __len__(self):
            return len(self.vocab)

        def convert_ids_to_tokens(self, ids):
            return [self.vocab[i] for i in ids]

    assert strings.token_bytes(Vocabulary()) == [b"", b"", b" the", b" t", b"\n", b"ab", b" "]


# ----------------------------------------------------------------- overlapping sequences (DRY's breakers)
def decode_based(tok, text: str, max_tail: int) -> set[tuple[int, ...]]:
    """How DRY resolved a breaker before the service: llama.cpp's loop over `tokenizer.decode([id])` strings."""
    out = set()
    for token_id in range(len(tok)):
        word = tok.decode([token_id])
        if text in word:
            out.add((token_id,))
            continue
        pos = word.find(text[0])
        while pos != -1:
            i = 1
            while i < len(text) and pos + i < len(word) and word[pos + i] == text[i]:
                i += 1
            if i == len(text) or pos + i == len(word):
                out.add((token_id, *tok.encode(text[i:], add_special_tokens=False)[:max_tail]))
            pos = word.find(text[0], pos + 1)
    return out


@pytest.mark.parametrize("kind", [*BUILDERS, "embedded_gpt2"])
def test_overlapping_sequences_equal_the_decode_based_resolution_for_ascii_breakers(kind):
    tok = tokenizer(kind)
    for text in ["\n", ":", '"', "*", "a:b", "\n\n", "stop", "Sentence two"]:
        assert set(strings.overlapping_sequences(tok, text, max_tail=20)) == decode_based(tok, text, 20), text


def test_overlapping_sequences_are_bytes_as_llama_cpp():
    """A token that holds the first byte of "é" overhangs it (decode() shows it as U+FFFD and missed it); the rest,
    one loose byte, is spelt by its byte token."""
    tok = tokenizer("byte_level")
    pieces = strings.byte_table(tok).pieces
    head, tail = pieces.index("é".encode()[:1]), pieces.index("é".encode()[1:])
    found = strings.overlapping_sequences(tok, "é")
    assert (head, tail) in found
    assert set(found) >= decode_based(tok, "é", 10**6)
    assert strings.overlapping_sequences(tok, "é") is found  # cached per string
    assert all(len(s) <= 2 for s in strings.overlapping_sequences(tok, "日本語", max_tail=1))
    with pytest.raises(ValueError, match="non-empty"):
        strings.overlapping_sequences(tok, "")


# ----------------------------------------------------------------- words
def test_word_token_ids_are_vllm_s_with_and_without_a_leading_space():
    tok = tokenizer("byte_level")
    plain, spaced = tuple(tok.encode("stop")), tuple(tok.encode(" stop"))
    assert plain != spaced and len(plain) == len(spaced)  # the precondition for keeping the second
    assert strings.word_token_ids(tok, ["  stop"]) == [plain, spaced]


# ----------------------------------------------------------------- decoded tails
@pytest.mark.parametrize("kind", list(BUILDERS))
def test_tail_bytes_are_each_rows_decoded_tail(kind):
    tok = tokenizer(kind)
    table = strings.byte_table(tok)
    rng = random.Random(kind)
    B, n = 6, 7
    ids = torch.tensor([[rng.randrange(-1, len(tok) + 3) for _ in range(n)] for _ in range(B)])
    valid = torch.rand(B, n, generator=torch.Generator().manual_seed(1)) > 0.2
    for width in (1, 5, 40):
        got = strings.tail_bytes(table, ids, width, valid=valid)
        assert got.shape == (B, width) and got.dtype == torch.int16
        for b in range(B):
            row = [int(i) if v else -1 for i, v in zip(ids[b], valid[b])]
            want = strings.decoded_tail(tok, row, width)
            assert want == b"".join(table.pieces[i] for i in row if 0 <= i < len(tok))[-width:]
            assert got[b].tolist() == [-1] * (width - len(want)) + list(want)
    lengths = strings.token_lengths(table, ids, valid=valid)
    assert lengths.tolist() == [
        [len(table.pieces[i]) if v and 0 <= i < len(tok) else 0 for i, v in zip(r.tolist(), m.tolist())]
        for r, m in zip(ids, valid)
    ]
    assert strings.tail_bytes(table, ids[:, :0], 3).tolist() == [[-1] * 3] * B
