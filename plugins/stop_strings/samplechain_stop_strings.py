"""`stop_strings`: stop a row when its text contains a stop string whose end falls inside the row's last token.

Tokenizer-aware, with transformers' StopStringCriteria semantics: the match runs on what the tokens decode to, so
a stop string spanning several tokens is caught (stop string "stop", tokens ["s", "to", "p"]), and so is one that
ends inside the last token, which overhangs it (["las", "topper"]) or holds it whole after other text
(["xstop"]). A stop string needs at least one byte of the last token: one that ended in an earlier token was caught
at that step, so text already in the prompt never stops a generation by itself; one that starts in the prompt and
ends in a generated token does (as in transformers; vLLM looks at the generated text only).

What a token "decodes to" is decided as transformers decides it (`StopStringCriteria.clean_tokenizer_vocab`):
byte-level tokenizers (GPT-2 style) map each token through the byte-to-unicode table to its bytes, so a multi-byte
character split over several tokens matches; byte-fallback tokenizers (Llama style) read `<0xNN>` as that byte;
every other token is `convert_tokens_to_string` after a fixed prefix, minus the prefix (so a SentencePiece "▁"
is the space it stands for and a WordPiece "##" continuation has none). Matching is on UTF-8 bytes throughout.

Where it differs from transformers (everything else agrees, tested on random token sequences):
- special tokens (`tokenizer.all_special_ids`: eos, bos, pad, unk ...) are no text, as in the decoded output
  (`skip_special_tokens=True`); transformers matches their literal text ("<|endoftext|>" contains "end"), so a
  stop string never fires on a special token here, and text on both sides of one joins up;
- left padding is no text: positions before a row's prompt are ignored; transformers reads the pad tokens as text;
- ids outside the tokenizer (a model whose vocabulary is padded past it) are no text either; transformers maps them
  to an entry that matches nothing, so one also breaks a stop string it sits inside.

Precompute, once per tokenizer and cached by the core's string service (`samplechain.strings`: per tokenizer
object, then per vocabulary fingerprint, so equal tokenizers share it; the stop strings are not part of the key,
so requests with other stop strings reuse it): every token id's bytes in a (V, L) uint8 table, and their lengths.
Per step: gather the table rows of each row's last M + 1 tokens (M = the longest stop string in bytes), read the
last L' + M - 1 bytes of each row out of them (L' = the longest last token in the batch; the string service's
`tail_bytes`), and compare every stop string at every end position inside the last token, all rows and all stop
strings in one tensor expression. The cost depends on M, L', the number of stop strings and the batch, never on
the vocabulary size; there is no Python loop over rows, and one host read (L').

The window of M + 1 tokens holds any match whose tokens all have text; a stop string whose text is interrupted by
more than one special token (text on both sides joins up, see above) can fall outside it.

For a stopped row (once, on the host) `matches` names the stop string: the first in the given order that ends
inside the last token (vLLM's order), so the output text is cut before it (or after it with
include_stop_str_in_output); the finish reason stays "stop_strings". Streams hold back the longest stop string
less one character (vLLM's stop_buffer_length). min_new_tokens holds it back as vLLM's detokenizer does: a stop
string counts only when it ends in a token after the first min_new_tokens.
"""

from __future__ import annotations

import attrs
import torch

from samplechain import ConfigError, StopContext, StopMatch, StoppingCriterion, StopSetup, hookimpl
from samplechain.strings import ByteTable, byte_table, tail_bytes, token_lengths


def _valid(_inst, _attr, value) -> None:
    if not value:
        raise ValueError('give at least one stop string, e.g. ["\\n\\n"]')
    for i, s in enumerate(value):
        if s == "":
            raise ValueError(f"stop string {i} is empty ({s!r}); an empty string would stop at once: remove it")


@attrs.frozen
class StopStringsParams:
    strings: tuple[str, ...] = attrs.field(validator=_valid)


class StopStrings(StoppingCriterion):
    name = "stop_strings"
    Params = StopStringsParams
    summary = "stop at text, matched across token boundaries"
    min_new_tokens_gate = "text"

    def __init__(self, params: StopStringsParams) -> None:
        super().__init__(params)
        self._table: ByteTable | None = None
        self._match: tuple[torch.Tensor, torch.Tensor] | None = None
        self._targets = [s.encode("utf-8") for s in params.strings]
        self.longest = max(len(t) for t in self._targets)
        self.window = self.longest + 1  # tokens: each non-empty token holds at least one byte of a match

    def prepare(self, setup: StopSetup) -> None:
        if setup.tokenizer is None:
            raise ConfigError(
                "stop_strings needs the tokenizer to read text: pass tokenizer= to generate() (or to "
                "as_stopping_criteria)"
            )
        self._table = byte_table(setup.tokenizer)
        # the stop strings right-aligned in an (S, M) table; `care` marks their bytes (the rest is left fill)
        targets = torch.zeros((len(self._targets), self.longest), dtype=torch.int16)
        care = torch.zeros((len(self._targets), self.longest), dtype=torch.bool)
        for i, t in enumerate(self._targets):
            targets[i, self.longest - len(t) :] = torch.tensor(list(t), dtype=torch.int16)
            care[i, self.longest - len(t) :] = True
        self._match = (targets.to(setup.device), care.to(setup.device))

    def check(self, ctx: StopContext) -> torch.Tensor:
        if self._table is None:
            self.prepare(ctx.setup)
        table, stops = self._table, self._match
        assert table is not None and stops is not None  # prepare() sets both or raises
        device = ctx.input_ids.device
        ids = ctx.input_ids[:, -self.window :]  # (B, n) in reading order
        batch, n = ids.shape
        total = ctx.input_ids.shape[1]
        # left padding is not text: row b's tokens start at prompt_length - prompt_lengths[b]
        first_real = ctx.setup.prompt_length - ctx.setup.prompt_lengths.to(device)
        real = torch.arange(total - n, total, device=device)[None, :] >= first_real[:, None]  # (B, n)
        # the last L' + M - 1 bytes of each row: a match ends inside the last token (L' = the longest last token of
        # the batch) and is at most M bytes long
        last_lengths = token_lengths(table, ids[:, -1:], valid=real[:, -1:])  # (B, 1)
        last = int(last_lengths.max()) if batch else 0  # one host read (the combiner reads the answer anyway)
        if last == 0:
            return torch.zeros(batch, dtype=torch.bool, device=device)
        width = last + self.longest - 1
        text = tail_bytes(table, ids, width, valid=real)  # (B, W) in reading order, -1: none
        # every stop string at every end position inside the last token, all rows and strings at once
        targets, care = stops
        windows = text.unfold(1, self.longest, 1)  # (B, L', M): window j ends at j + M
        match = ((windows[:, :, None, :] == targets) | ~care).all(dim=-1).any(dim=-1)  # (B, L')
        ends_inside_last = torch.arange(self.longest, width + 1, device=device)[None, :] > (width - last_lengths)
        return (match & ends_inside_last).any(dim=1)

    def hold_back(self) -> int:
        return max(len(s) for s in self.params.strings) - 1

    def matches(self, ctx: StopContext, rows: list[int]) -> list[StopMatch | None]:
        assert self._table is not None  # check() prepared it
        table = self._table.pieces  # on the host: a few rows, once each
        total = ctx.input_ids.shape[1]
        out: list[StopMatch | None] = []
        for b in rows:
            first = max(ctx.setup.prompt_length - int(ctx.setup.prompt_lengths[b]), total - self.window)
            pieces = [table[i] if 0 <= i < len(table) else b"" for i in ctx.input_ids[b, first:].tolist()]
            data = b"".join(pieces)
            before = len(data) - len(pieces[-1])  # bytes before the last token
            found = None
            for text, target in zip(self.params.strings, self._targets):
                at = data.find(target, max(before - len(target) + 1, 0))
                if at >= 0:
                    trailing = len(data[at + len(target) :].decode("utf-8", errors="replace"))
                    found = StopMatch(self.reason, text, trailing)
                    break
            out.append(found)
        return out


@hookimpl
def register_stopping_criteria(register):
    register(StopStrings)
