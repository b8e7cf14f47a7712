"""Incremental detokenisation: text deltas that concatenate to the decoded text and never split a character.

The method vLLM and text-generation-inference use: decode a short window of tokens twice, with and without the
newest ones, and emit the difference once it no longer ends in U+FFFD (an incomplete UTF-8 sequence: byte-level
tokenizers split multi-byte characters across tokens). The window keeps the previously emitted tokens as left
context so that tokenizers which drop a leading space (SentencePiece) decode the delta as they decode the whole
text; its cost per token does not grow with the length of the text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["IncrementalDecoder"]


class IncrementalDecoder:
    """Feed token ids one at a time; `push` returns the new text that became final ("" while a character is
    incomplete); `flush` returns whatever is left at the end (a dangling partial character decodes as U+FFFD,
    exactly as decoding the whole sequence does)."""

    def __init__(self, tokenizer: Any, *, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip = skip_special_tokens
        self.ids: list[int] = []
        self.prefix = 0  # start of the context window
        self.read = 0  # tokens whose text has been emitted
        self.emitted = ""

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=self.skip, clean_up_tokenization_spaces=False)

    def push(self, token_id: int) -> str:
        self.ids.append(int(token_id))
        before = self._decode(self.ids[self.prefix : self.read])
        after = self._decode(self.ids[self.prefix :])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            delta = after[len(before) :]
            self.prefix, self.read = self.read, len(self.ids)
            self.emitted += delta
            return delta
        return ""

    def flush(self) -> str:
        """The rest, so that everything emitted equals decoding all the tokens at once."""
        full = self._decode(self.ids)
        rest = full[len(self.emitted) :] if full.startswith(self.emitted) else ""
        self.emitted += rest
        self.read = len(self.ids)
        return rest
