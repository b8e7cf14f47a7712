"""The string service: what each token of a tokenizer adds to the decoded text, as bytes, cached per tokenizer.

Stop strings, regex stops, bad words, DRY's sequence breakers and reasoning markers all need to know which text a
token spells. What a token "decodes to" is decided as transformers decides it (`StopStringCriteria
.clean_tokenizer_vocab`): byte-level tokenizers (GPT-2 style) map each token through the byte-to-unicode table to
its bytes, so a multi-byte character split over several tokens is two partial byte strings; byte-fallback
tokenizers (Llama style) read `<0xNN>` as that byte; every other token is `convert_tokens_to_string` after a fixed
prefix, minus the prefix (so a SentencePiece "▁" is the space it stands for and a WordPiece "##" continuation has
none). Special tokens (`all_special_ids`) and ids the tokenizer does not know spell no text.

The table is built once per distinct vocabulary: a WeakKeyDictionary on the tokenizer object, then a small LRU keyed
by the vocabulary's fingerprint, so equal tokenizers loaded twice share it.
"""

from __future__ import annotations

import json
import weakref
from collections import OrderedDict
from typing import Any

import torch

__all__ = ["ByteTable", "byte_table", "gpt2_byte_decoder", "matching_mode", "token_bytes"]

_PREFIX = "abcdef"  # transformers' static prefix for tokens it cannot map to bytes directly
_BY_VOCAB: OrderedDict[tuple, ByteTable] = OrderedDict()
_BY_OBJECT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_CACHE_SIZE = 8


class ByteTable:
    """The per-tokenizer precompute. bytes: (V, L) uint8, token id -> its bytes left-aligned; lengths: (V,) int64.
    Copies on other devices are made once and kept (`on(device)`)."""

    def __init__(self, data: torch.Tensor, lengths: torch.Tensor) -> None:
        self.bytes = data
        self.lengths = lengths
        self._on: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {data.device: (data, lengths)}

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
    """"byte_level", "byte_fallback" or None, from the tokenizer's decoder, as transformers decides it."""
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


def token_bytes(tokenizer: Any) -> list[bytes]:
    """Each token id's bytes as the token adds them to decoded text (special tokens and gaps: b"")."""
    n = len(tokenizer)
    pieces = tokenizer.convert_ids_to_tokens(list(range(n)))
    special = set(getattr(tokenizer, "all_special_ids", None) or [])
    mode = matching_mode(tokenizer)
    byte_decoder = gpt2_byte_decoder() if mode == "byte_level" else None
    base: list[str] | None = None
    out: list[bytes] = []
    for i, piece in enumerate(pieces):
        if i in special or piece is None:
            out.append(b"")
        elif byte_decoder is not None and all(ch in byte_decoder for ch in piece):
            out.append(bytes(byte_decoder[ch] for ch in piece))
        elif (mode == "byte_fallback" and len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">")
              and all(ch in "0123456789abcdefABCDEF" for ch in piece[3:5])):
            out.append(bytes([int(piece[3:5], 16)]))
        else:
            if base is None:
                base = tokenizer.convert_ids_to_tokens(tokenizer(_PREFIX, add_special_tokens=False)["input_ids"])
            text = tokenizer.convert_tokens_to_string(base + [piece])
            at = text.find(_PREFIX)
            if at < 0:  # the prefix did not survive (an unusual decoder): the token decoded alone
                text = tokenizer.decode([i], clean_up_tokenization_spaces=False)
            else:
                text = text[at + len(_PREFIX):]
            out.append(text.encode("utf-8"))
    return out


def _fingerprint(tokenizer: Any) -> tuple:
    """The vocabulary's identity: class, name, size, decoding mode, special ids and a spread of its entries."""
    n = len(tokenizer)
    sample = sorted(set(range(0, n, max(n // 256, 1))) | set(range(max(n - 64, 0), n)))
    special = tuple(sorted(getattr(tokenizer, "all_special_ids", None) or []))
    return (type(tokenizer).__name__, getattr(tokenizer, "name_or_path", ""), n, matching_mode(tokenizer), special,
            hash(tuple(tokenizer.convert_ids_to_tokens(sample))))


def _build(pieces: list[bytes]) -> ByteTable:
    lengths = torch.tensor([len(p) for p in pieces], dtype=torch.int64)
    width = max(int(lengths.max()) if len(pieces) else 1, 1)
    data = torch.zeros((len(pieces), width), dtype=torch.uint8)
    flat = b"".join(pieces)
    if flat:  # scatter every byte to (its token, its offset) in one go
        values = torch.frombuffer(bytearray(flat), dtype=torch.uint8)
        rows = torch.repeat_interleave(torch.arange(len(pieces)), lengths)
        starts = torch.repeat_interleave(lengths.cumsum(0) - lengths, lengths)
        data[rows, torch.arange(values.numel()) - starts] = values
    return ByteTable(data, lengths)


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
