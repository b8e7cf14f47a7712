"""The string service: which text each token of a tokenizer spells, as bytes, cached per tokenizer, and what
plugins build on it (stop strings, regex stops, bad words, DRY's sequence breakers, infill, reasoning markers).

What a token "decodes to" is the bytes it adds to decoded text after other text, decided as transformers decides
it (`StopStringCriteria.clean_tokenizer_vocab`): byte-level tokenizers (GPT-2 style) map each token through the
byte-to-unicode table to its bytes, so a multi-byte character split over several tokens is two partial byte
strings; byte-fallback tokenizers (Llama style) read `<0xNN>` as that byte; every other token is
`convert_tokens_to_string` after a fixed prefix, minus the prefix (so a SentencePiece "▁" is the space it stands
for, a WordPiece word-start token has a leading space and a "##" continuation has none). This is also llama.cpp's
`token_to_piece(id, special=false)` (its converter rewrites WordPiece vocabularies to that "phantom space" form),
except where the tokenizer's decoder cleans up (WordPiece: no space before . , ! ? and contractions).
Special tokens (`all_special_ids`) and ids the tokenizer does not know spell no text. A bare vocabulary object
without `convert_tokens_to_string` (only `convert_ids_to_tokens`) is read as SentencePiece when its tokens use "▁"
(<0xNN> a byte), else token by token through `decode`.

Leading spaces: a Metaspace or WordPiece tokenizer writes "▁the" / "the" for " the" in running text and drops
that space at the very start of a decoded text. Everything here reads tokens in running text, so `spellings(tok,
" the")` has [▁the] and `spellings(tok, "the")` does not.

Sections: the byte table (`token_bytes`, `byte_table`), spellings (`spellings`), overlapping sequences (DRY's
breakers, `overlapping_sequences`), words (vLLM's bad words, `word_token_ids`), decoded tails (`token_lengths`,
`tail_bytes` batched on the device, `decoded_tail` per row on the host).

Everything per tokenizer is built once per distinct vocabulary and hangs off its ByteTable: a WeakKeyDictionary on
the tokenizer object, then a small LRU keyed by the vocabulary's fingerprint, so equal tokenizers loaded twice
share it.
"""

from __future__ import annotations

import bisect
import itertools
import json
import weakref
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

import torch

__all__ = [
    "ByteTable",
    "TooManySpellings",
    "byte_table",
    "decoded_tail",
    "gpt2_byte_decoder",
    "matching_mode",
    "overlapping_sequences",
    "spellings",
    "tail_bytes",
    "token_bytes",
    "token_lengths",
    "word_token_ids",
]

_PREFIX = "abcdef"  # transformers' static prefix for tokens it cannot map to bytes directly
_BY_VOCAB: OrderedDict[tuple, ByteTable] = OrderedDict()
_BY_OBJECT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_CACHE_SIZE = 8


# ----------------------------------------------------------------- the byte table
class ByteTable:
    """The per-tokenizer precompute. bytes: (V, L) uint8, token id -> its bytes left-aligned; lengths: (V,) int64;
    pieces: the same as a list of bytes objects (host side). Copies on other devices are made once and kept
    (`on(device)`); what the other sections derive from the table is cached on it (`derived`)."""

    def __init__(self, data: torch.Tensor, lengths: torch.Tensor, pieces: Sequence[bytes] | None = None) -> None:
        self.bytes = data
        self.lengths = lengths
        self._pieces = None if pieces is None else tuple(pieces)
        self.derived: dict[Any, Any] = {}
        self._on: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {data.device: (data, lengths)}

    @property
    def pieces(self) -> tuple[bytes, ...]:
        if self._pieces is None:
            rows, lengths = self.bytes.tolist(), self.lengths.tolist()
            self._pieces = tuple(bytes(r[:n]) for r, n in zip(rows, lengths))
        return self._pieces

    @property
    def vocab_size(self) -> int:
        return self.lengths.shape[0]

    @property
    def width(self) -> int:
        return self.bytes.shape[1]

    def on(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        device = torch.device(device)
        if device not in self._on:
            self._on[device] = (self.bytes.to(device), self.lengths.to(device))
        return self._on[device]


def gpt2_byte_decoder() -> dict[str, int]:
    """GPT-2's bytes_to_unicode, inverted: the printable character each byte is written as -> the byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def _has_type(config: Any, name: str) -> bool:
    if isinstance(config, dict):
        return config.get("type") == name or any(_has_type(v, name) for v in config.values())
    if isinstance(config, list):
        return any(_has_type(v, name) for v in config)
    return False


def matching_mode(tokenizer: Any) -> str | None:
    """ "byte_level", "byte_fallback" or None, from the tokenizer's decoder, as transformers decides it."""
    decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
    if decoder is None:
        return None
    if type(decoder).__name__ == "ByteLevel":
        return "byte_level"
    try:
        state = decoder.__getstate__()
        config = json.loads(state.decode() if isinstance(state, bytes) else state)
    except Exception:  # a decoder without a JSON state
        return None
    if _has_type(config, "ByteFallback"):
        return "byte_fallback"
    if _has_type(config, "ByteLevel"):
        return "byte_level"
    return None


def _byte_token(piece: str) -> bool:
    return (
        len(piece) == 6
        and piece.startswith("<0x")
        and piece.endswith(">")
        and all(ch in "0123456789abcdefABCDEF" for ch in piece[3:5])
    )


def token_bytes(tokenizer: Any) -> list[bytes]:
    """Each token id's bytes as the token adds them to decoded text (special tokens and gaps: b"")."""
    n = len(tokenizer)
    pieces = tokenizer.convert_ids_to_tokens(list(range(n)))
    special = set(getattr(tokenizer, "all_special_ids", None) or [])
    mode = matching_mode(tokenizer)
    byte_decoder = gpt2_byte_decoder() if mode == "byte_level" else None
    if byte_decoder is not None:  # str.translate runs the per-character work in C: a piece's bytes as latin-1 text
        to_bytes = str.maketrans({ch: chr(b) for ch, b in byte_decoder.items()})
        unknown = str.maketrans(dict.fromkeys(byte_decoder))  # what is left of a piece past its byte characters
    # a bare vocabulary (no convert_tokens_to_string): SentencePiece when it writes spaces as "▁"
    bare = mode is None and not hasattr(tokenizer, "convert_tokens_to_string")
    sentencepiece = bare and any(isinstance(p, str) and p.startswith("▁") for p in pieces)
    base: list[str] | None = None
    out: list[bytes] = []
    for i, piece in enumerate(pieces):
        if i in special or piece is None:
            out.append(b"")
        elif byte_decoder is not None and not piece.translate(unknown):
            out.append(piece.translate(to_bytes).encode("latin-1"))
        elif (mode == "byte_fallback" or sentencepiece) and _byte_token(piece):
            out.append(bytes([int(piece[3:5], 16)]))
        elif sentencepiece:
            out.append(piece.replace("▁", " ").encode("utf-8"))
        elif bare:
            out.append(
                tokenizer.decode([i], skip_special_tokens=True, clean_up_tokenization_spaces=False).encode("utf-8")
            )
        else:
            if base is None:
                base = tokenizer.convert_ids_to_tokens(tokenizer(_PREFIX, add_special_tokens=False)["input_ids"])
            text = tokenizer.convert_tokens_to_string(base + [piece])
            at = text.find(_PREFIX)
            if at < 0:  # the prefix did not survive (an unusual decoder): the token decoded alone
                text = tokenizer.decode([i], clean_up_tokenization_spaces=False)
            else:
                text = text[at + len(_PREFIX) :]
            out.append(text.encode("utf-8"))
    return out


def _fingerprint(tokenizer: Any) -> tuple:
    """The vocabulary's identity: class, name, size, decoding mode, special ids and a spread of its entries."""
    n = len(tokenizer)
    sample = sorted(set(range(0, n, max(n // 256, 1))) | set(range(max(n - 64, 0), n)))
    special = tuple(sorted(getattr(tokenizer, "all_special_ids", None) or []))
    return (
        type(tokenizer).__name__,
        getattr(tokenizer, "name_or_path", ""),
        n,
        matching_mode(tokenizer),
        special,
        hash(tuple(tokenizer.convert_ids_to_tokens(sample))),
    )


def _build(pieces: list[bytes]) -> ByteTable:
    lengths = torch.tensor([len(p) for p in pieces], dtype=torch.int64)
    width = max(int(lengths.max()) if len(pieces) else 1, 1)
    if not pieces:
        return ByteTable(torch.zeros((0, width), dtype=torch.uint8), lengths, pieces)
    # every piece padded with zero bytes to the table's width, joined and read as (V, width) in one go
    padded = bytearray(b"".join(p.ljust(width, b"\0") for p in pieces))
    data = torch.frombuffer(padded, dtype=torch.uint8).reshape(len(pieces), width)
    return ByteTable(data, lengths, pieces)


def byte_table(tokenizer: Any) -> ByteTable:
    """The cached per-tokenizer precompute (built once per distinct vocabulary)."""
    try:
        size, table = _BY_OBJECT.get(tokenizer, (None, None))
    except TypeError:  # not weakly referenceable / hashable
        size, table = None, None
    if table is not None and size == len(tokenizer):  # added tokens change the size: look again
        return table
    key = _fingerprint(tokenizer)
    table = _BY_VOCAB.get(key)
    if table is None:
        table = _build(token_bytes(tokenizer))
        _BY_VOCAB[key] = table
        while len(_BY_VOCAB) > _CACHE_SIZE:
            _BY_VOCAB.popitem(last=False)
    else:
        _BY_VOCAB.move_to_end(key)
    try:
        _BY_OBJECT[tokenizer] = (len(tokenizer), table)
    except TypeError:
        pass
    return table


def _table(source: Any) -> ByteTable:
    return source if isinstance(source, ByteTable) else byte_table(source)


# ----------------------------------------------------------------- spellings
class TooManySpellings(ValueError):
    """A text has more spellings than the caller's limit."""


def _index(table: ByteTable) -> tuple[dict[bytes, tuple[int, ...]], int]:
    """bytes -> the ids that spell exactly them (ascending), and the longest piece; cached on the table."""
    found = table.derived.get("index")
    if found is None:
        by_bytes: dict[bytes, list[int]] = {}
        for i, piece in enumerate(table.pieces):
            if piece:  # tokens without text never spell anything (they would spell everything infinitely often)
                by_bytes.setdefault(piece, []).append(i)
        found = ({k: tuple(v) for k, v in by_bytes.items()}, max(map(len, by_bytes), default=0))
        table.derived["index"] = found
    return found


def spellings(
    tokenizer: Any, text: str | bytes, *, limit: int = 256, truncate: bool = False
) -> tuple[tuple[int, ...], ...]:
    """Every token-id sequence whose tokens' bytes (`token_bytes`) join to exactly `text`'s UTF-8 bytes, fewest
    tokens first, then by ids. `tokenizer` may be a ByteTable. The text is read as running text (see the module
    docstring: with SentencePiece or WordPiece, " the" is [▁the], "the" is not).

    A text has exponentially many spellings in its length on a byte-level vocabulary (every byte is a token). With
    more than `limit`: `TooManySpellings` (naming the count), or with `truncate=True` the first `limit` in the
    order above. The count comes from a dynamic programme over byte offsets (no enumeration); the sequences from a
    second one that keeps the best `limit` suffix spellings per offset, so the cost is bounded by the limit."""
    table = _table(tokenizer)
    data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
    index, longest = _index(table)
    n = len(data)
    steps: list[list[tuple[int, int]]] = [[] for _ in range(n)]  # steps[i]: (end, id) with id spelling data[i:end]
    count = [0] * (n + 1)  # count[i]: the number of spellings of data[i:]
    count[n] = 1
    for i in range(n - 1, -1, -1):
        for end in range(i + 1, min(n, i + longest) + 1):
            if count[end]:
                for token in index.get(data[i:end], ()):
                    steps[i].append((end, token))
                    count[i] += count[end]
    if count[0] > limit and not truncate:
        raise TooManySpellings(
            f"{text!r} has {count[0]} spellings, more than limit={limit}: raise the limit, or "
            "pass truncate=True for the fewest-token ones"
        )
    # best[i]: the first `limit` spellings of data[i:]; those starting with token t are t + the first of best[end]
    # (one more token and a fixed first id keep their order), so keeping `limit` per offset loses none
    best: list[list[tuple[int, ...]]] = [[] for _ in range(n + 1)]
    best[n] = [()]
    for i in range(n - 1, -1, -1):
        if count[i]:
            found = [(token, *rest) for end, token in steps[i] for rest in best[end]]
            found.sort(key=lambda seq: (len(seq), seq))
            best[i] = found[:limit]
    return tuple(best[0])


# ----------------------------------------------------------------- overlapping sequences (DRY's breakers)
def overlapping_sequences(tokenizer: Any, text: str, *, max_tail: int | None = None) -> tuple[tuple[int, ...], ...]:
    """llama.cpp's `get_overlapping_token_sequences` (src/llama-sampling.cpp, DRY's sequence breakers): every token
    whose text contains `text` is (id,); a token whose text ends in a proper prefix of `text` is (id, *tail), tail
    = the tokenizer's encoding of the rest of `text` (at most `max_tail` ids). Token texts are bytes as llama.cpp's
    `detokenize({id}, special=true)`: the byte table, special tokens as their literal text. A rest that is not
    whole UTF-8 (the prefix split a character) is spelt by its fewest-token spelling (`spellings`), as a tokenizer
    would spell loose bytes. Computed from the cached table (no per-token decode) and cached per string."""
    if not text:
        raise ValueError("overlapping_sequences needs a non-empty string")
    table = byte_table(tokenizer)
    key = ("overlapping", text, max_tail)
    found = table.derived.get(key)
    if found is not None:
        return found
    words, flat, starts = _detokenized(tokenizer, table)
    target = text.encode("utf-8")
    tails: dict[int, tuple[int, ...]] = {}  # i (bytes of text inside the head) -> the tail's ids

    def tail(i: int) -> tuple[int, ...]:
        if i not in tails:
            rest = target[i:]
            try:
                ids = tuple(tokenizer.encode(rest.decode("utf-8"), add_special_tokens=False))
            except UnicodeDecodeError:
                ids = next(iter(spellings(table, rest, limit=1, truncate=True)), ())
            tails[i] = ids if max_tail is None else ids[:max_tail]
        return tails[i]

    out: dict[tuple[int, ...], None] = {}
    first = target[:1]
    # every token the text can touch holds its first byte: found in the words joined, not word by word (the
    # vocabulary's tens of thousands of words in a Python loop, per string)
    at, token = flat.find(first), 0
    while at != -1:
        token = bisect.bisect_right(starts, at, lo=token) - 1
        word = words[token]
        if target in word:
            out[(token,)] = None
        else:
            pos = word.find(first)
            while pos != -1:  # the text starts at pos and runs past the word's end: it overhangs by the rest
                if target.startswith(word[pos:]):
                    found_at = (token, *tail(len(word) - pos))
                    out[found_at] = None
                pos = word.find(first, pos + 1)
        at = flat.find(first, starts[token + 1])  # the next word that holds it
    found = tuple(out)
    table.derived[key] = found
    return found


def _detokenized(tokenizer: Any, table: ByteTable) -> tuple[list[bytes], bytes, list[int]]:
    """Each token's text as llama.cpp's `detokenize({id}, special=true)` (the table's bytes, special tokens as their
    literal text), those texts joined, and where each starts in the join (one past the last: the end); cached on the
    table per set of special tokens, which every breaker string of a generation shares."""
    specials = tuple(i for i in getattr(tokenizer, "all_special_ids", None) or [] if 0 <= i < len(table.pieces))
    key = ("detokenized", specials)
    found = table.derived.get(key)
    if found is None:
        words = list(table.pieces)
        for i in specials:
            words[i] = str(tokenizer.convert_ids_to_tokens(i)).encode("utf-8")
        found = words, b"".join(words), list(itertools.accumulate(map(len, words), initial=0))
        table.derived[key] = found
    return found


# ----------------------------------------------------------------- words (vLLM's bad words)
def word_token_ids(tokenizer: Any, words: Iterable[str]) -> list[tuple[int, ...]]:
    """vLLM's `SamplingParams.update_from_tokenizer` for bad words: each word as `word.lstrip()` without special
    tokens, and again as `" " + word.lstrip()`, the second kept only when it has as many tokens as the first and
    starts with another token (a distinct word-start token). A spelling that encodes to nothing is skipped."""
    out: list[tuple[int, ...]] = []
    for word in words:
        for space in (False, True):
            ids = tuple(tokenizer.encode((" " if space else "") + word.lstrip(), add_special_tokens=False))
            if not ids:
                continue
            if not space or (ids[0] != out[-1][0] and len(ids) == len(out[-1])):
                out.append(ids)
    return out


# ----------------------------------------------------------------- decoded tails
def token_lengths(table: ByteTable, ids: torch.Tensor, *, valid: torch.Tensor | None = None) -> torch.Tensor:
    """(B, n) int64: the number of bytes each token of ids (B, n) spells; 0 where `valid` (B, n) is False (left
    padding) and for ids outside the table."""
    _, lengths = table.on(ids.device)
    ok = (ids >= 0) & (ids < lengths.shape[0])
    if valid is not None:
        ok &= valid
    return lengths.index_select(0, torch.where(ok, ids, 0).reshape(-1)).view(ids.shape) * ok


def tail_bytes(table: ByteTable, ids: torch.Tensor, width: int, *, valid: torch.Tensor | None = None) -> torch.Tensor:
    """(B, width) int16: the last `width` bytes the tokens ids (B, n) spell, per row in reading order, left-filled
    with -1 where a row's tokens spell fewer. Tokens where `valid` (B, n) is False and ids outside the table spell
    nothing. One vectorised expression over the batch: its cost depends on B, n, width and the longest token,
    never on the vocabulary size; no host read."""
    data, _ = table.on(ids.device)
    span = data.shape[1]
    batch, n = ids.shape
    if n == 0 or width <= 0:
        return torch.full((batch, max(width, 0)), -1, dtype=torch.int16, device=ids.device)
    ids = ids.flip(1)  # the last token first
    lengths = token_lengths(table, ids, valid=None if valid is None else valid.flip(1))  # (B, n)
    flat = torch.where(lengths > 0, ids, 0).reshape(-1)
    chunk = data.index_select(0, flat).view(batch, n * span)  # (B, n * L); not data[ids]: slow
    k = torch.arange(width, device=ids.device).repeat(batch, 1)  # bytes counted from the end: 0 is the last one
    after = lengths.cumsum(1)  # (B, n) bytes in tokens 0..j
    token = torch.searchsorted(after, k, right=True)  # (B, W) the token byte k belongs to; n: before the window
    inside = token < n
    token = token.clamp(max=n - 1)
    offset = after.gather(1, token) - 1 - k  # from the start of its token
    text = chunk.gather(1, token * span + offset.clamp(min=0)).to(torch.int16)
    return torch.where(inside, text, torch.full_like(text, -1)).flip(1)


def decoded_tail(tokenizer: Any, ids: Sequence[int], max_bytes: int) -> bytes:
    """The last `max_bytes` bytes that the token ids of one row spell (host side; `tokenizer` may be a ByteTable).
    Reads back from the end only as far as it needs; ids outside the table spell nothing."""
    pieces = _table(tokenizer).pieces
    out: list[bytes] = []
    size = 0
    for token in reversed(ids):
        if size >= max_bytes:
            break
        token = int(token)
        if 0 <= token < len(pieces) and pieces[token]:
            out.append(pieces[token])
            size += len(pieces[token])
    return b"".join(reversed(out))[-max_bytes:] if max_bytes > 0 else b""
