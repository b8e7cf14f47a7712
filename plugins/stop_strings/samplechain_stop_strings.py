"""`stop_strings`: stop a row when the text it decodes to contains a stop string that ends in its last token.

Tokenizer-aware, as transformers' StopStringCriteria: the match runs on the bytes the tokens decode to, so a stop
string spanning several tokens is caught, and so is one that ends inside the last token (the token "overhangs"
it: stop string "stop", tokens ["las", "topper"]). Only the last token decides: a stop string that ended in an
earlier token was caught at that step.

Precompute, once per tokenizer and cached: every token id's bytes in a (V, L) table (GPT-2 byte-level tokens
through the byte-to-unicode map, SentencePiece "▁" as a space and <0xNN> byte tokens as their byte, anything
else by decoding it after a fixed prefix). Special tokens decode to nothing, as decode(skip_special_tokens=True)
shows them. Per step: gather the bytes of each row's last N tokens (N = longest stop string in bytes + 1),
right-align them in a (B, N * L) buffer, and compare every stop string at every end position inside the last
token, all rows at once. The cost depends on N, L and the batch, never on the vocabulary size.

One difference from transformers (it catches more, never less): transformers requires the stop string to
overlap the *start* of the last token (stop_string[-i:] == token[:i]), so a stop string lying inside the last
token after other text ("xstop" as one token, stop string "stop") is never caught. Here any end position inside
the last token counts. Multi-byte characters split over byte-level tokens match in both. Left padding is not
text: positions before a row's prompt are ignored (transformers reads the padding tokens as text).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import attrs
import torch

from samplechain import ConfigError, StopContext, StoppingCriterion, StopSetup, hookimpl

_CACHE: OrderedDict[tuple, "ByteTable"] = OrderedDict()
_CACHE_SIZE = 8


def _valid(_inst, _attr, value) -> None:
    if not value:
        raise ValueError('give at least one stop string, e.g. ["\\n\\n"]')
    for i, s in enumerate(value):
        if s == "":
            raise ValueError(f"stop string {i} is empty; an empty string would stop at once: remove it")


@attrs.frozen
class StopStringsParams:
    strings: tuple[str, ...] = attrs.field(validator=_valid)


@attrs.frozen
class ByteTable:
    """bytes: (V, L) uint8, token id -> its bytes left-aligned; lengths: (V,) int64."""

    bytes: torch.Tensor
    lengths: torch.Tensor

    @property
    def vocab_size(self) -> int:
        return self.lengths.shape[0]


def _gpt2_byte_decoder() -> dict[str, int]:
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def _decoder_kind(tokenizer: Any) -> str:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    text = repr(getattr(backend, "decoder", None)) if backend is not None else ""
    if "ByteLevel" in text:
        return "bytelevel"
    if "Metaspace" in text or "▁" in text or getattr(tokenizer, "sp_model", None) is not None:
        return "metaspace"
    return "generic"


def token_bytes(tokenizer: Any) -> list[bytes]:
    """Each token id's bytes as they appear in decoded text (special tokens: b"")."""
    n = len(tokenizer)
    pieces = tokenizer.convert_ids_to_tokens(list(range(n)))
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    kind = _decoder_kind(tokenizer)
    out: list[bytes] = []
    byte_decoder = _gpt2_byte_decoder() if kind == "bytelevel" else None
    prefix = tokenizer.encode("a", add_special_tokens=False) if kind == "generic" else []
    prefix_text = tokenizer.decode(prefix) if prefix else ""
    for i, piece in enumerate(pieces):
        if i in special or piece is None:
            out.append(b"")
        elif byte_decoder is not None and all(ch in byte_decoder for ch in piece):
            out.append(bytes(byte_decoder[ch] for ch in piece))
        elif kind == "metaspace" and len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            out.append(bytes([int(piece[3:5], 16)]))
        elif kind == "metaspace":
            out.append(piece.replace("▁", " ").encode("utf-8"))
        else:
            text = tokenizer.decode(prefix + [i], clean_up_tokenization_spaces=False)
            out.append(text[len(prefix_text):].encode("utf-8") if text.startswith(prefix_text) else text.encode())
    return out


def _fingerprint(tokenizer: Any) -> tuple:
    n = len(tokenizer)
    sample = list(range(min(n, 64))) + list(range(max(n - 64, 0), n))
    return (type(tokenizer).__name__, getattr(tokenizer, "name_or_path", ""), n,
            tuple(tokenizer.convert_ids_to_tokens(sample)))


def byte_table(tokenizer: Any) -> ByteTable:
    """The cached per-tokenizer precompute (built once per distinct tokenizer)."""
    key = _fingerprint(tokenizer)
    table = _CACHE.get(key)
    if table is not None:
        _CACHE.move_to_end(key)
        return table
    pieces = token_bytes(tokenizer)
    width = max(max((len(p) for p in pieces), default=1), 1)
    data = torch.zeros((len(pieces), width), dtype=torch.uint8)
    for i, p in enumerate(pieces):
        if p:
            data[i, : len(p)] = torch.frombuffer(bytearray(p), dtype=torch.uint8)
    table = ByteTable(data, torch.tensor([len(p) for p in pieces], dtype=torch.int64))
    _CACHE[key] = table
    while len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return table


class StopStrings(StoppingCriterion):
    name = "stop_strings"
    Params = StopStringsParams
    summary = "stop at text, matched across token boundaries"

    def __init__(self, params: StopStringsParams) -> None:
        super().__init__(params)
        self._table: ByteTable | None = None
        self._targets = [s.encode("utf-8") for s in params.strings]
        self.window = max(len(t) for t in self._targets) + 1

    def prepare(self, setup: StopSetup) -> None:
        if setup.tokenizer is None:
            raise ConfigError("stop_strings needs the tokenizer to read text: pass tokenizer= to generate() (or to "
                              "as_stopping_criteria)")
        table = byte_table(setup.tokenizer)
        self._table = ByteTable(table.bytes.to(setup.device), table.lengths.to(setup.device))
        self._strings = [torch.tensor(list(t), dtype=torch.int16, device=setup.device) for t in self._targets]

    def check(self, ctx: StopContext) -> torch.Tensor:
        if self._table is None:
            self.prepare(ctx.setup)
        table = self._table
        ids = ctx.input_ids[:, -self.window:]
        batch, n = ids.shape
        total = ctx.input_ids.shape[1]
        # left padding is not text: position p of row b is real when p >= total - (its prompt + generated)
        first_real = ctx.setup.prompt_length - ctx.setup.prompt_lengths.to(ids.device)  # (B,)
        pos = torch.arange(total - n, total, device=ids.device)
        real = (pos[None, :] >= first_real[:, None]) & (ids < table.vocab_size) & (ids >= 0)
        safe = torch.where(real, ids, torch.zeros_like(ids))
        lengths = torch.where(real, table.lengths[safe], torch.zeros_like(safe))  # (B, n)
        chunk = table.bytes[safe].to(torch.int16)  # (B, n, L)
        width = n * chunk.shape[2]
        suffix = lengths.flip(1).cumsum(1).flip(1)  # bytes from token j to the end, j included
        start = width - suffix  # (B, n) where token j's bytes begin in the right-aligned buffer
        offs = torch.arange(chunk.shape[2], device=ids.device)
        where = start[:, :, None] + offs  # (B, n, L)
        inside = offs[None, None, :] < lengths[:, :, None]
        where = torch.where(inside, where, torch.full_like(where, width))  # padding bytes go to a spare column
        buf = torch.full((batch, width + 1), -1, dtype=torch.int16, device=ids.device)
        buf.scatter_(1, where.reshape(batch, -1), chunk.reshape(batch, -1))
        buf = buf[:, :width]
        last = lengths[:, -1]  # (B,) the last token's bytes occupy [width - last, width)
        hit = torch.zeros(batch, dtype=torch.bool, device=ids.device)
        for target in self._strings:
            m = target.shape[0]
            if m > width:
                continue
            match = (buf.unfold(1, m, 1) == target).all(dim=-1)  # (B, width - m + 1): start k, end k + m
            ends = torch.arange(m, width + 1, device=ids.device)
            hit |= (match & (ends[None, :] > (width - last)[:, None])).any(dim=1)
        return hit


@hookimpl
def register_stopping_criteria(register):
    register(StopStrings)
