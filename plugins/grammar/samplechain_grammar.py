"""`grammar`: grammar-constrained sampling (GBNF, JSON schema, regex), with llama.cpp's lazy triggers.

The grammar engine is llguidance (https://github.com/guidance-ai/llguidance): GBNF goes through its GBNF-to-Lark
converter, JSON schemas and regexes through its own compilers; masks are computed per row on the CPU against the
Hugging Face tokenizer given to `chain.prepare(tokenizer=...)` (which `generate()` calls).

Each row's matcher is derived from the row's token history (`needs_history`): a row seen for the first time, or
whose generated tokens no longer extend what its matcher consumed (a new request reusing an id, a store restored
from a snapshot, a rolled-back step), is replayed from its generated tokens into a fresh matcher. The sampler
therefore keeps no state in the request store and `accept` does nothing: the next step's history carries the
chosen token. `sample(accept=False)` twice gives the same mask.

Lazy mode (`triggers` / `trigger_tokens`, as llama.cpp's `llama_sampler_init_grammar_lazy`): a row is
unconstrained until a trigger word occurs in its generated text (or a trigger token is generated); then the text
from the trigger on is fed to the grammar, which constrains every later token.
"""

from __future__ import annotations

import functools
import json as _json
import weakref
from typing import Any

import attrs
import torch

from samplechain import (
    Candidates,
    ConfigError,
    EosIds,
    Sampler,
    SamplerSetup,
    Stage,
    StepContext,
    hookimpl,
    one_of,
    token_ids_field,
)

_SOURCES = ("gbnf", "json_schema", "json", "regex")
_ANY_JSON_OBJECT = '{"type": "object"}'
# JSON whitespace between tokens: llama.cpp's json-schema-to-grammar `space` rule, none, or any (llguidance's default)
WHITESPACE = {
    "llama.cpp": {"whitespace_pattern": r"( |\n{1,2}[ \t]{0,20})?"},
    "compact": {"whitespace_flexible": False},
    "flexible": {"whitespace_flexible": True},
}


def _llg():
    import llguidance  # imported on first use: the plugin loads without paying for it

    return llguidance


@functools.lru_cache(maxsize=256)
def compile_source(kind: str, text: str, whitespace: str = "llama.cpp") -> tuple[str, str]:
    """(llguidance grammar, error message): the grammar of a source, checked without a tokenizer. Cached, since
    every request that joins a store re-validates the chain's parameters."""
    llg = _llg()
    try:
        if kind == "gbnf":
            grammar = llg.grammar_from("gbnf", text)
        elif kind == "regex":
            grammar = llg.LLMatcher.grammar_from_regex(text)
        else:
            try:
                schema = _json.loads(text)
            except ValueError as exc:
                return "", f"not valid JSON: {exc}"
            if not isinstance(schema, (dict, bool)):
                return "", "a JSON schema must be a JSON object (or true / false)"
            # defaults: a schema's own "x-guidance" options still win
            options = WHITESPACE.get(whitespace, WHITESPACE["llama.cpp"])
            grammar = llg.LLMatcher.grammar_from_json_schema(text, defaults=options)
    except Exception as exc:  # noqa: BLE001 - the engine's message, reported against the parameter
        return "", str(exc)
    error = llg.LLMatcher.validate_grammar(grammar, None)
    return (grammar, "") if not error else ("", error)


def _short(message: str) -> str:
    """The engine's message without the grammar dump it appends."""
    text = message.split("<state>")[0].split("<grammar>")[0].strip()
    return text if len(text) <= 400 else text[:400] + " ..."


def _source_ok(kind: str):
    def check(inst: Any, _attr: attrs.Attribute, value: Any) -> None:
        chosen = [k for k in _SOURCES if getattr(inst, k)]
        if kind == "gbnf" and not chosen:
            raise ValueError("the grammar sampler needs exactly one of gbnf, json_schema, json = true or regex")
        if not value:
            return
        earlier = [k for k in chosen if _SOURCES.index(k) < _SOURCES.index(kind)]
        if earlier:
            raise ValueError(f"{earlier[0]} is set too: give exactly one of gbnf, json_schema, json = true, regex")
        if kind == "json":
            return
        if not value.strip():
            raise ValueError("empty grammar")
        _grammar, error = compile_source(kind, value, inst.json_whitespace)
        if error:
            what = {"gbnf": "invalid GBNF grammar", "regex": "invalid regex", "json_schema": "invalid JSON schema"}
            raise ValueError(f"{what[kind]}: {_short(error)}")

    return check


def _triggers_ok(_inst: Any, _attr: attrs.Attribute, value: tuple[str, ...]) -> None:
    if any(not isinstance(w, str) or not w for w in value):
        raise ValueError(f"must be a list of non-empty strings, got {list(value)}")


@attrs.frozen
class GrammarParams:
    gbnf: str = attrs.field(default="", validator=_source_ok("gbnf"))  # llama.cpp GBNF (or llguidance Lark)
    json_schema: str = attrs.field(default="", validator=_source_ok("json_schema"))  # a JSON schema, as a string
    json: bool = attrs.field(default=False, validator=_source_ok("json"))  # any JSON object
    regex: str = attrs.field(default="", validator=_source_ok("regex"))
    triggers: tuple[str, ...] = attrs.field(default=(), validator=_triggers_ok)  # lazy: words that start it
    trigger_tokens: tuple[int, ...] = token_ids_field()  # lazy: tokens that start it
    eos_ids: tuple[int, ...] = token_ids_field()  # empty: the generation's eos ids
    json_whitespace: str = attrs.field(default="llama.cpp", validator=one_of(*WHITESPACE))
    enabled: bool = True  # per request: false leaves the row unconstrained

    @property
    def source(self) -> tuple[str, str]:
        """(kind, text) of the grammar; `json = true` is the schema of any JSON object."""
        for kind in ("gbnf", "json_schema", "regex"):
            if getattr(self, kind):
                return kind, getattr(self, kind)
        return "json_schema", _ANY_JSON_OBJECT


# tokenizer -> {(n_vocab, eos ids, grammar): (LLTokenizer, template matcher, mask words)}: compiled once per
# (tokenizer, grammar) and shared by every sampler instance; rows start from deep copies of the template
_COMPILED: weakref.WeakKeyDictionary[Any, dict[tuple, tuple[Any, Any, int]]] = weakref.WeakKeyDictionary()
_LL_TOKENIZERS: weakref.WeakKeyDictionary[Any, dict[tuple, Any]] = weakref.WeakKeyDictionary()


def _ll_tokenizer(tokenizer: Any, n_vocab: int | None, eos: tuple[int, ...]) -> Any:
    per = _LL_TOKENIZERS.setdefault(tokenizer, {})
    key = (n_vocab, eos)
    if key not in per:
        from llguidance.hf import from_tokenizer

        try:
            per[key] = from_tokenizer(tokenizer, n_vocab=n_vocab, eos_token=list(eos) or None)
        except ValueError as exc:
            raise ConfigError(
                f"grammar: the tokenizer {type(tokenizer).__name__} cannot be used: {exc} (load it "
                f"with AutoTokenizer.from_pretrained(..., use_fast=True))"
            ) from None
    return per[key]


def compile_for(tokenizer: Any, grammar: str, n_vocab: int | None, eos: tuple[int, ...]) -> tuple[Any, Any, int]:
    """(LLTokenizer, a fresh matcher to copy, mask width in 32-bit words) for a tokenizer and grammar, cached."""
    per = _COMPILED.setdefault(tokenizer, {})
    key = (n_vocab, eos, grammar)
    if key not in per:
        llg = _llg()
        lltok = _ll_tokenizer(tokenizer, n_vocab, eos)
        error = llg.LLMatcher.validate_grammar(grammar, lltok)
        if error:
            raise ConfigError(f"grammar: does not compile for this tokenizer: {_short(error)}")
        template = llg.LLMatcher(lltok, grammar, log_level=0)
        if template.is_error():
            raise ConfigError(f"grammar: does not compile for this tokenizer: {_short(template.get_error())}")
        words = (lltok.vocab_size + 31) // 32  # as llguidance.torch.get_bitmask_shape
        per[key] = (lltok, template, words)
    return per[key]


@attrs.define(slots=True)
class _Row:
    """One request's grammar state: the generated tokens accounted for and what they did to the matcher."""

    matcher: Any
    tokens: list[int] = attrs.field(factory=list)
    active: bool = True  # the grammar applies (False while a lazy grammar awaits its trigger)
    buffer: bytes = b""  # generated text while awaiting a trigger (llama.cpp's trigger_buffer)
    failed: str = ""  # the engine's error once the row's tokens violated the grammar


class Grammar(EosIds, Sampler):
    name = "grammar"
    stage = Stage.FILTER
    role = "mask"
    Params = GrammarParams
    summary = "constrain sampling to a GBNF grammar, JSON schema or regex (llguidance); lazy triggers"

    def __init__(self, params: GrammarParams) -> None:
        super().__init__(params)
        self._compiled: tuple[Any, Any, int] | None = None
        self._rows: dict[str, _Row] = {}
        self._eos: tuple[int, ...] = ()
        self._pieces: dict[int, bytes] = {}

    def needs_history(self) -> bool:
        return True

    def supported_devices(self) -> frozenset[str]:
        return frozenset({"cpu", "cuda", "mps"})  # masks are built on the host and moved to the logits' device

    # ----------------------------------------------------------------- preparation
    def prepare(self, setup: SamplerSetup) -> None:
        super().prepare(setup)  # EosIds: the generation's eos ids
        self._rows.clear()
        self._pieces.clear()
        self._compiled = None
        if setup.tokenizer is None:
            return
        tokenizer = setup.tokenizer
        eos = tuple(self.params.eos_ids) or tuple(setup.eos_token_ids)
        if not eos and getattr(tokenizer, "eos_token_id", None) is not None:
            eos = (int(tokenizer.eos_token_id),)
        n_vocab = setup.vocab_size if setup.vocab_size and setup.vocab_size > len(tokenizer) else None
        _kind, text = self.params.source
        grammar, error = compile_source(*self.params.source, self.params.json_whitespace)
        if error:  # validated at load time; kept for a Params built by hand
            raise ConfigError(f"grammar: {_short(error)} in {text!r}")
        self._compiled = compile_for(tokenizer, grammar, n_vocab, eos)
        self._eos = eos

    # ----------------------------------------------------------------- per-row state
    def _piece(self, token: int) -> bytes:
        piece = self._pieces.get(token)
        if piece is None:
            assert self._compiled is not None  # apply() compiles before any row is read
            piece = self._compiled[0].decode_bytes([token])
            self._pieces[token] = piece
        return piece

    def _fresh(self) -> _Row:
        lazy = bool(self.params.triggers or self.params.trigger_tokens)
        assert self._compiled is not None  # apply() compiles before any row is read
        return _Row(self._compiled[1].deep_copy(), active=not lazy)

    def _feed_text(self, row: _Row, text: bytes) -> None:
        """llama.cpp's llama_grammar_accept_str: text (from the trigger on) enters the grammar."""
        assert self._compiled is not None  # apply() compiles before any row is read
        if text and not row.matcher.consume_tokens(self._compiled[0].tokenize_bytes(text)):
            row.failed = row.matcher.get_error() or "the text after the trigger does not match the grammar"

    def _advance(self, row: _Row, token: int) -> None:
        row.tokens.append(token)
        if row.failed:
            return
        if not row.active:  # llama.cpp's llama_grammar_accept_impl while awaiting_trigger
            piece = self._piece(token)
            if token in self.params.trigger_tokens:
                row.active, row.buffer = True, b""
                self._feed_text(row, piece)
                return
            row.buffer += piece
            for word in self.params.triggers:  # the first word of the list found, as llama.cpp
                pos = row.buffer.find(word.encode("utf-8"))
                if pos >= 0:
                    text, row.active, row.buffer = row.buffer[pos:], True, b""
                    self._feed_text(row, text)
                    return
            return
        if row.matcher.is_stopped():  # complete (eos accepted, or nothing may follow): later tokens are padding
            return
        if not row.matcher.consume_token(token):
            row.failed = row.matcher.get_error() or f"token {token} does not match the grammar"

    def row_state(self, request_id: str) -> _Row | None:
        """The grammar state of a request as of the last step (for inspection and tests)."""
        return self._rows.get(request_id)

    def _sync(self, request_id: str, generated: list[int]) -> _Row:
        row = self._rows.get(request_id)
        n = len(row.tokens) if row is not None else 0
        if row is None or n > len(generated) or row.tokens != generated[:n]:
            row, n = self._fresh(), 0  # new request, restored store or rolled back: replay from history
            self._rows[request_id] = row
        for token in generated[n:]:
            self._advance(row, token)
        return row

    def _eos_only(self, words: int) -> torch.Tensor:
        """A bitmask row allowing only the eos ids."""
        out = [0] * words
        for e in self._eos or tuple(self.eos_tensor().tolist()):
            if 0 <= e < words * 32:
                out[e // 32] |= 1 << (e % 32)
        return torch.tensor([v - (1 << 32) if v >= 1 << 31 else v for v in out], dtype=torch.int32)

    # ----------------------------------------------------------------- step
    def apply(self, cand: Candidates, ctx: StepContext) -> Candidates:
        if ctx.scalar("enabled") is False:
            return cand
        if self._compiled is None:
            raise ConfigError(
                "grammar needs the tokenizer to compile its grammar: call chain.prepare(tokenizer=...) before "
                "chain.sample(), or generate through samplechain.generation.generate(model, tokenizer, ...)"
            )
        enabled = ctx.param("enabled").tolist()
        history_t, lengths_t = ctx.history, ctx.prompt_lengths
        assert history_t is not None and lengths_t is not None  # needs_history() is declared: the chain passes both
        history = history_t.tolist()
        prompt_lengths = lengths_t.tolist()
        words = self._compiled[2]
        batch = cand.batch_size
        bitmask = torch.full((batch, words), -1, dtype=torch.int32)
        constrained = [False] * batch
        for b, request_id in enumerate(ctx.request_ids):
            if not enabled[b]:
                continue
            tokens = [t for t in history[b] if t >= 0]  # -1 is left padding
            row = self._sync(request_id, tokens[prompt_lengths[b] :])
            if not row.active:
                continue
            constrained[b] = True
            if row.failed:  # the row's tokens left the grammar: it can only end
                bitmask[b] = self._eos_only(words)
            else:
                row.matcher.unsafe_compute_mask_ptr(bitmask[b].data_ptr(), words * 4)
        live = set(ctx.request_ids)
        if len(self._rows) > max(64, 4 * batch):  # requests that left: rebuilt from history should they return
            self._rows = {k: v for k, v in self._rows.items() if k in live}
        if not any(constrained):
            return cand
        shifts = torch.arange(32, dtype=torch.int32)
        allowed = ((bitmask[:, :, None] >> shifts) & 1).to(torch.bool).reshape(batch, words * 32)
        vocab = cand.vocab_size
        if allowed.shape[1] < vocab:  # logits wider than the tokenizer: padding tokens are never allowed
            allowed = torch.cat([allowed, allowed.new_zeros(batch, vocab - allowed.shape[1])], dim=1)
        allowed = allowed[:, :vocab]
        allowed |= ~torch.tensor(constrained)[:, None]
        allowed = allowed.to(cand.logits.device, non_blocking=True)
        keep = allowed if cand.ids is None else allowed.gather(1, cand.ids)
        return cand.masked(keep)


@hookimpl
def register_samplers(register):
    register(Grammar)
