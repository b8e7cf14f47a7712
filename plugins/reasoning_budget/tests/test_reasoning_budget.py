"""reasoning_budget.v1 against llama.cpp's reasoning-budget state machine (common/reasoning-budget.cpp), restated
below in plain Python, step by step, on the embedded model's byte-level tokenizer and on a Llama-style
byte-fallback tokenizer.

The model "wants" a scripted token at every step (its logits favour it); the sampler may force instead; the reference
gets the same tokens and must force the same ones at the same steps. Our documented differences from llama.cpp are
the reference's knobs: UTF-8 completeness of the text so far (not of the last piece alone), a partly emitted end
marker continued (not restarted), one budget per request unless re-armed. With the knobs at llama.cpp's values the two
agree exactly wherever the knobs cannot matter (whole-character tokens, one-token markers); where they matter the
difference is tested on its own.
"""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

import samplechain_reasoning_budget as plugin
from samplechain import Chain, ConfigError, RequestError, SamplechainError
from samplechain.generation import Generation, generate
from samplechain.models import tiny_model_path
from samplechain.tools import testing

IDLE, COUNTING, WAITING, FORCING, DONE = range(5)


# ----------------------------------------------------------------- the reference: llama.cpp, restated
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
        self.tokens, self.pos = tokens, 0

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


class LlamaCppBudget:
    """common_reasoning_budget_{accept,apply} as llama.cpp has them, with our differences as knobs (llama.cpp's
    values by default): utf8 "piece" (common_utf8_is_complete of the token's piece) or "text" (of the text so far);
    continue_end (force the rest of a partly emitted end marker); rearm (DONE re-arms on a start marker). budget -1:
    llama.cpp builds no sampler at all, so nothing is ever forced."""

    def __init__(
        self,
        start,
        end,
        forced,
        budget,
        pieces,
        *,
        utf8="piece",
        continue_end=False,
        rearm=True,
        state=IDLE,
        message_len=0,
    ):
        self.start, self.end = Matcher(start), Matcher(end)
        self.forced_tokens, self.budget, self.remaining = forced, budget, budget
        self.pieces, self.utf8, self.continue_end, self.rearm = pieces, utf8, continue_end, rearm
        self.message_len = message_len
        if state == COUNTING and budget <= 0:
            state = FORCING
        self.state, self.force_pos, self.text = state, 0, b""

    def _force(self) -> None:
        self.state = FORCING
        pos = self.end.pos
        self.force_pos = self.message_len + pos if self.continue_end and pos > 0 else 0
        self.end.pos = 0

    def accept(self, token: int) -> None:
        if self.budget < 0:
            return
        piece = self.pieces[token]
        self.text += piece
        if self.state == IDLE or (self.state == DONE and self.rearm):
            was_done = self.state == DONE
            if self.start.advance(token):
                self.state, self.remaining = COUNTING, self.budget
                if was_done:
                    self.end.pos = 0
                if self.remaining <= 0:
                    self.state, self.force_pos = FORCING, 0
        elif self.state in (COUNTING, WAITING):
            if self.end.advance(token):
                self.state = DONE
                return
            complete = utf8_is_complete(piece if self.utf8 == "piece" else self.text)
            if self.state == WAITING:
                if complete:
                    self._force()
            else:
                self.remaining -= 1
                if self.remaining <= 0:
                    if complete:
                        self._force()
                    else:
                        self.state = WAITING
                        self.end.pos = 0
        elif self.state == FORCING:
            self.force_pos += 1
            if self.force_pos >= len(self.forced_tokens):
                self.state = DONE

    def forced(self) -> int | None:
        if self.budget < 0 or self.state != FORCING or self.force_pos >= len(self.forced_tokens):
            return None
        return self.forced_tokens[self.force_pos]


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


def pieces_of(tok) -> list[bytes]:
    """What each token adds to the text, written independently of the plugin: <0xNN> is that byte (byte
    fallback), byte-level tokens map through GPT-2's table, special tokens add nothing (llama.cpp's
    token_to_piece(special=false))."""
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


def enc(tok, *parts: str) -> list[int]:
    """Each part encoded alone (a model emits a marker's own tokens, whatever the text around it)."""
    return [t for p in parts for t in tok.encode(p, add_special_tokens=False)]


# ----------------------------------------------------------------- driving the plugin
def budget_chain(tok, **params) -> Chain:
    chain = Chain.load({"samplers": [{"use": "reasoning_budget", **params}, {"use": "greedy"}]})
    chain.prepare(tokenizer=tok, vocab_size=len(tok))
    return chain


def drive(chain, vocab, scripts, budgets, prompts=None, rearm=False, store=None, steps=None):
    """One batch, row b wanting scripts[b][step] at each step (its logit 5, every other 0). Returns per row the
    emitted tokens and the steps at which exactly one token was left (forced)."""
    rows = len(scripts)
    prompts = prompts or [[1]] * rows
    ids = [f"r{b}" for b in range(rows)]
    if store is None:
        store = chain.new_store()
        for b in range(rows):
            store.add(ids[b], {"reasoning_budget": budgets[b], "reasoning_budget_rearm": rearm})
    out: list[list[int]] = [[] for _ in range(rows)]
    forced: list[list[int]] = [[] for _ in range(rows)]
    for step in range(steps or min(len(s) for s in scripts)):
        logits = torch.zeros(rows, vocab)
        for b in range(rows):
            logits[b, scripts[b][step]] = 5.0
        seqs = [prompts[b] + out[b] for b in range(rows)]
        width = max(map(len, seqs))
        hist = torch.tensor([[-1] * (width - len(s)) + s for s in seqs])
        res = chain.sample(
            logits, store, ids, history=hist, prompt_lengths=torch.tensor([len(p) for p in prompts]), return_scores=True
        )
        for b in range(rows):
            out[b].append(int(res.token_ids[b]))
            if int(torch.isfinite(res.scores[b]).sum()) == 1:
                forced[b].append(step)
    return out, forced


def reference_run(script, ref, steps=None):
    out, forced = [], []
    for step in range(steps or len(script)):
        f = ref.forced()
        if f is not None:
            forced.append(step)
        tok = f if f is not None else script[step]
        out.append(tok)
        ref.accept(tok)
    return out, forced


def ids_of(tok, chain):
    sampler = chain.samplers[0]
    return sampler._start, sampler._end, sampler._message


def ours_as_reference(tok, chain, budget, rearm, **kw):
    """The reference with our documented semantics switched on."""
    start, end, message = ids_of(tok, chain)
    return LlamaCppBudget(
        start,
        end,
        message + end,
        budget,
        pieces_of(tok),
        utf8="text",
        continue_end=True,
        rearm=rearm,
        message_len=len(message),
        **kw,
    )


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
        want = reference_run(script, ours_as_reference(tok, chain, budget, rearm), steps=len(script) - 10)
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
        ref = LlamaCppBudget(start, end, message + end, budget, pieces_of(tok))
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
    ref = LlamaCppBudget(start, end, end, 1, pieces_of(tok))
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
    ref = LlamaCppBudget(start, end, message + end, budget, pieces_of(tok))  # llama.cpp: all of it again
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
        ref = LlamaCppBudget(start, end, end, 6 - used, pieces_of(tok), state=COUNTING)
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


@pytest.mark.parametrize(
    "params, words",
    [
        ({"start": ""}, ["start"]),
        ({"end": "", "end_ids": []}, ["end"]),
        ({"budget": -3}, ["budget", "-1"]),
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


@pytest.mark.parametrize("chain", [CHAIN, {"samplers": [{"use": "reasoning_budget"}, {"use": "greedy"}]}])
def test_model_generate_through_the_adapter_equals_generate(lm, embedded, chain):
    """select=True (a sampling chain) and select=False (greedy: transformers picks from the processed scores and
    the token is accepted at the next call, without history)."""
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
    message = chain.samplers[0].params.message
    forced = (enc(tok, message) if message else []) + enc(tok, "</think>")
    new = theirs[0, enc_["input_ids"].shape[1] :].tolist()
    assert new[3 : 3 + len(forced)] == forced
