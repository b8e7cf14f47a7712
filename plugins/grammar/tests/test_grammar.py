"""grammar: masks from llguidance for GBNF / JSON schema / regex, lazy triggers, per-row state from history."""

from __future__ import annotations

import json
import re

import pytest
import torch

from samplechain import Chain, ConfigError, SamplechainError
from samplechain.generation.loop import generate
from samplechain.models import tiny_model_path

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_path())


@pytest.fixture(scope="module")
def model():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_path()).eval()


def grammar_chain(selector: str = "greedy", **params) -> Chain:
    return Chain.load({"samplers": [{"use": "grammar", **params}, {"use": selector}]})


def prepared(tokenizer, **params) -> Chain:
    chain = grammar_chain(**params)
    chain.prepare(tokenizer=tokenizer)
    return chain


def history_of(tokenizer, prompt: str, generated: str | list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    p = tokenizer.encode(prompt)
    g = tokenizer.encode(generated) if isinstance(generated, str) else list(generated)
    return torch.tensor([p + g]), torch.tensor([len(p)])


def allowed_ids(chain: Chain, tokenizer, prompt: str, generated, seed: int = 0) -> set[int]:
    history, lengths = history_of(tokenizer, prompt, generated)
    logits = torch.randn(1, len(tokenizer), generator=torch.Generator().manual_seed(seed))
    scores = chain.process(logits, history=history, prompt_lengths=lengths)
    return set(torch.isfinite(scores[0]).nonzero().flatten().tolist())


def matches_schema(obj) -> bool:
    return (
        isinstance(obj, dict)
        and set(obj) == {"name", "age"}
        and isinstance(obj["name"], str)
        and len(obj["name"]) <= 24
        and isinstance(obj["age"], int)
        and not isinstance(obj["age"], bool)
        and 0 <= obj["age"] <= 150
    )


PROMPTS = [
    "The list",
    "A function",
    "Return the value",
    "In Python,",
    "The module",
    "An exception is raised",
    "For example:",
    "The default",
    "This method",
    "Strings are",
    "Use the",
    "If the file",
    "The result of",
    "Numbers",
    "When a",
    "The class",
    "Each item",
    "The socket",
    "Data is",
    "Note that",
]


# ----------------------------------------------------------------------------- generation through the model
@pytest.mark.slow
def test_json_schema_twenty_prompts_all_parse_and_match(model, tokenizer):
    chain = Chain.load({"samplers": [{"use": "grammar", "json_schema": json.dumps(SCHEMA)}, {"use": "dist"}]})
    out = generate(model, tokenizer, PROMPTS, chain=chain, max_new_tokens=80, seed=3, pad_token_id=0)
    assert len(out.texts) == 20
    for text, reason in zip(out.texts, out.finish_reasons):
        assert reason == "eos", text
        assert matches_schema(json.loads(text)), text


def test_json_schema_compact_greedy(model, tokenizer):
    chain = grammar_chain(json_schema=json.dumps(SCHEMA), json_whitespace="compact")
    out = generate(model, tokenizer, PROMPTS[:4], chain=chain, max_new_tokens=60, pad_token_id=0)
    for text, reason in zip(out.texts, out.finish_reasons):
        assert reason == "eos"
        assert matches_schema(json.loads(text))
        assert not re.search(r"\s(?=(?:[^\"]*\"[^\"]*\")*[^\"]*$)", text)  # no whitespace outside strings


def test_any_json_object(model, tokenizer):
    out = generate(
        model, tokenizer, PROMPTS[:3], chain=grammar_chain("dist", json=True), max_new_tokens=80, seed=5, pad_token_id=0
    )
    for text, reason in zip(out.texts, out.finish_reasons):
        if reason == "eos":
            assert isinstance(json.loads(text), dict)
        else:  # cut off by the length limit: still a prefix of an object
            assert text.lstrip().startswith("{")


def test_gbnf_yes_no(model, tokenizer):
    out = generate(
        model,
        tokenizer,
        PROMPTS[:6],
        chain=grammar_chain("dist", gbnf='root ::= "yes" | "no"'),
        max_new_tokens=10,
        seed=1,
        pad_token_id=0,
    )
    assert all(t in ("yes", "no") for t in out.texts), out.texts
    assert out.finish_reasons == ["eos"] * 6


def test_regex(model, tokenizer):
    out = generate(
        model,
        tokenizer,
        PROMPTS[:6],
        chain=grammar_chain("dist", regex=r"[0-9]{3}-[a-z]{2,4}"),
        max_new_tokens=20,
        seed=2,
        pad_token_id=0,
    )
    assert all(re.fullmatch(r"[0-9]{3}-[a-z]{2,4}", t) for t in out.texts), out.texts


def test_per_row_grammars_in_one_batch(model, tokenizer):
    chain = Chain.load(
        {
            "samplers": [
                {"use": "grammar", "id": "yn", "gbnf": 'root ::= "yes" | "no"', "enabled": False},
                {"use": "grammar", "id": "num", "regex": r"[0-9]{1,3}", "enabled": False},
                {"use": "dist"},
            ]
        }
    )
    params = [{"yn.enabled": True}, {"num.enabled": True}, {"yn.enabled": True}, None]
    out = generate(model, tokenizer, PROMPTS[:4], chain=chain, params=params, max_new_tokens=8, seed=4, pad_token_id=0)
    assert out.texts[0] in ("yes", "no") and out.texts[2] in ("yes", "no")
    assert re.fullmatch(r"[0-9]{1,3}", out.texts[1])
    assert not re.fullmatch(r"yes|no|[0-9]{1,3}", out.texts[3])  # unconstrained row: the model's own prose


def test_per_row_scores_equal_each_row_alone(tokenizer):
    chain = Chain.load(
        {
            "samplers": [
                {"use": "grammar", "id": "yn", "gbnf": 'root ::= "yes" | "no"'},
                {"use": "grammar", "id": "num", "regex": r"[0-9]+"},
                {"use": "greedy"},
            ]
        }
    )
    chain.prepare(tokenizer=tokenizer)
    rows = [{"num.enabled": False}, {"yn.enabled": False}, {"yn.enabled": False, "num.enabled": False}]
    logits = torch.randn(3, len(tokenizer), generator=torch.Generator().manual_seed(0))
    one, length = history_of(tokenizer, "Is it", "y")
    history, lengths = one.repeat(3, 1), length.repeat(3)
    store = chain.new_store()
    for i, p in enumerate(rows):
        store.add(f"r{i}", p)
    batch = chain.process(logits, store, ["r0", "r1", "r2"], history=history, prompt_lengths=lengths)
    for i in range(3):
        alone = chain.process(
            logits[i : i + 1], store, [f"r{i}"], history=history[i : i + 1], prompt_lengths=lengths[i : i + 1]
        )
        assert torch.equal(alone[0], batch[i])
    assert torch.equal(batch[2], logits[2])  # both grammars disabled: bitwise unchanged
    assert {tokenizer.decode([t]) for t in torch.isfinite(batch[0]).nonzero().flatten().tolist()} <= {"e", "es"}
    assert not torch.isfinite(batch[1]).all()


# ----------------------------------------------------------------------------- masks on bare logits
def test_mask_allows_exactly_the_grammar_continuations(tokenizer):
    chain = prepared(tokenizer, gbnf='root ::= "yes" | "no"')
    first = allowed_ids(chain, tokenizer, "Answer:", [])
    assert {tokenizer.decode([t]) for t in first} <= {"y", "ye", "yes", "n", "no"}
    assert tokenizer.encode("no")[0] in first or tokenizer.encode("n")[0] in first
    yes = tokenizer.encode("yes")
    assert allowed_ids(chain, tokenizer, "Answer:", yes) == {tokenizer.eos_token_id}  # complete: only eos
    # after eos (a finished row padded with eos) still only eos, never an error
    assert allowed_ids(chain, tokenizer, "Answer:", yes + [tokenizer.eos_token_id] * 2) == {tokenizer.eos_token_id}


def test_history_outside_the_grammar_allows_only_eos(tokenizer):
    chain = prepared(tokenizer, gbnf='root ::= "yes" | "no"')
    assert allowed_ids(chain, tokenizer, "Answer:", "maybe") == {tokenizer.eos_token_id}
    row = chain.samplers[0].row_state("row0")
    assert row.failed


def test_compacted_candidates_honour_ids(tokenizer):
    full = Chain.load({"samplers": [{"use": "grammar", "regex": "[a-z]+"}, {"use": "greedy"}]})
    after = Chain.load(
        {"samplers": [{"use": "top_k", "k": 300}, {"use": "grammar", "regex": "[a-z]+"}, {"use": "greedy"}]}
    )
    for c in (full, after):
        c.prepare(tokenizer=tokenizer)
    logits = torch.randn(2, len(tokenizer), generator=torch.Generator().manual_seed(1))
    history = torch.tensor([tokenizer.encode("The word") + tokenizer.encode("ab")] * 2)
    lengths = torch.tensor([2, 2])
    a = full.process(logits, history=history, prompt_lengths=lengths)
    b = after.process(logits, history=history, prompt_lengths=lengths)
    top = torch.zeros_like(logits, dtype=torch.bool).scatter_(1, logits.topk(300, dim=1).indices, True)
    assert torch.equal(torch.isfinite(b), torch.isfinite(a) & top)
    assert torch.equal(b[torch.isfinite(b)], logits[torch.isfinite(b)])
    assert torch.isfinite(b).sum(dim=1).min() > 0


def test_no_tokenizer_gives_a_clear_error():
    chain = grammar_chain(gbnf='root ::= "yes"')
    with pytest.raises(SamplechainError, match=r"chain\.prepare\(tokenizer=\.\.\.\)"):
        chain.sample(torch.zeros(1, 10), history=torch.tensor([[1, 2]]), prompt_lengths=torch.tensor([2]))


def test_needs_history(tokenizer):
    chain = prepared(tokenizer, gbnf='root ::= "yes"')
    with pytest.raises(SamplechainError, match="history"):
        chain.sample(torch.zeros(1, len(tokenizer)))


# ----------------------------------------------------------------------------- lazy triggers
def test_lazy_trigger_word(tokenizer):
    gbnf = 'root ::= "<call>" [0-9]+ "</call>"'
    chain = prepared(tokenizer, gbnf=gbnf, triggers=["<call>"])
    logits = torch.randn(1, len(tokenizer), generator=torch.Generator().manual_seed(2))
    history, lengths = history_of(tokenizer, "Run it:", "we will run")
    before = chain.process(logits, history=history, prompt_lengths=lengths)
    assert torch.equal(before, logits)  # awaiting the trigger: bitwise unchanged
    assert not chain.samplers[0].row_state("row0").active
    allowed = allowed_ids(chain, tokenizer, "Run it:", "we will run <call>")
    assert chain.samplers[0].row_state("row0").active
    assert allowed and all(tokenizer.decode([t]).isdigit() for t in allowed)
    # text after the trigger inside the same token stream is fed to the grammar too
    allowed = allowed_ids(chain, tokenizer, "Run it:", "we will run <call>12")
    assert all(
        re.fullmatch(r"[0-9]*(</?|</c|</ca|</cal|</call|</call>)?|[0-9]+", tokenizer.decode([t])) for t in allowed
    )
    done = tokenizer.encode("go <call>7</call>")
    assert allowed_ids(chain, tokenizer, "Run it:", done) == {tokenizer.eos_token_id}


def test_lazy_trigger_fires_at_the_first_occurrence_in_time(tokenizer):
    chain = prepared(tokenizer, regex=r"(<a>|<b>)x+", triggers=["<b>", "<a>"])
    text = tokenizer.encode("one <a>")  # token by token, "<a>" is found first although "<b>" is listed first
    allowed = allowed_ids(chain, tokenizer, "P", text)
    assert allowed and all(set(tokenizer.decode([t])) <= {"x"} for t in allowed)
    # replayed token by token (the trigger completed by a later token) reaches the same state
    for n in range(1, len(text) + 1):
        allowed_ids(chain, tokenizer, "P", text[:n])
    row = chain.samplers[0].row_state("row0")
    assert row.active and not row.failed
    # text after the trigger that the grammar refuses leaves only eos (llama.cpp aborts there)
    assert allowed_ids(chain, tokenizer, "P", "one <a> two") == {tokenizer.eos_token_id}


def test_lazy_trigger_tokens(tokenizer):
    trigger = tokenizer.encode("{")[0]
    chain = prepared(tokenizer, json=True, trigger_tokens=[trigger])
    logits = torch.randn(1, len(tokenizer))
    history, lengths = history_of(tokenizer, "Data", "is here")
    assert torch.equal(chain.process(logits, history=history, prompt_lengths=lengths), logits)
    allowed = allowed_ids(chain, tokenizer, "Data", tokenizer.encode("is here") + [trigger])
    assert tokenizer.encode('"')[0] in allowed and tokenizer.encode("x")[0] not in allowed


@pytest.mark.slow
def test_lazy_generation_is_free_until_the_trigger_token(model, tokenizer):
    (the,) = tokenizer.encode(" the")  # a frequent token of the model's prose starts the grammar
    chain = grammar_chain("dist", regex=r" the [0-9]{2}\.", trigger_tokens=[the])
    out = generate(model, tokenizer, PROMPTS[:8], chain=chain, max_new_tokens=40, seed=7, pad_token_id=0)
    triggered = 0
    for b, text in enumerate(out.texts):
        start = out.prompt_length
        new = out.sequences[b, start : start + int(out.num_generated[b])].tolist()
        if the in new:
            tail = tokenizer.decode(new[new.index(the) :], skip_special_tokens=True)
            assert re.fullmatch(r" the( [0-9]{0,2}\.?)?", tail), text
            triggered += 1
            if out.finish_reasons[b] == "eos":
                assert re.fullmatch(r" the [0-9]{2}\.", tail)
    assert triggered >= 2


# ----------------------------------------------------------------------------- state
def _run(chain, store, rid, tokenizer, prompt, steps, generated=None):
    p = tokenizer.encode(prompt)
    generated = list(generated or [])
    for _ in range(steps):
        logits = torch.randn(1, len(tokenizer), generator=torch.Generator().manual_seed(len(generated)))
        out = chain.sample(
            logits, store, [rid], history=torch.tensor([p + generated]), prompt_lengths=torch.tensor([len(p)])
        )
        generated.append(int(out.token_ids[0]))
    return generated


def test_sample_without_accept_is_repeatable(tokenizer):
    chain = prepared(tokenizer, selector="dist", json_schema=json.dumps(SCHEMA))
    store = chain.new_store()
    store.add("a", {"seed": 11})
    gen = _run(chain, store, "a", tokenizer, "Hi", 5)
    history, lengths = history_of(tokenizer, "Hi", gen)
    logits = torch.randn(1, len(tokenizer))
    one = chain.sample(logits, store, ["a"], accept=False, history=history, prompt_lengths=lengths, return_scores=True)
    two = chain.sample(logits, store, ["a"], accept=False, history=history, prompt_lengths=lengths, return_scores=True)
    assert torch.equal(one.token_ids, two.token_ids) and torch.equal(one.scores, two.scores)
    chain.accept(store, ["a"], one.token_ids)


def test_state_survives_snapshot_restore(tokenizer):
    params = dict(selector="dist", gbnf='root ::= "[" [a-z]+ ("," [a-z]+)* "]"')
    chain = prepared(tokenizer, **params)
    store = chain.new_store()
    store.add("a", {"seed": 5})
    straight = _run(chain, store, "a", tokenizer, "List:", 12)

    first = prepared(tokenizer, **params)
    s1 = first.new_store()
    s1.add("a", {"seed": 5})
    head = _run(first, s1, "a", tokenizer, "List:", 5)
    snap = json.loads(json.dumps(s1.snapshot()))  # plain data through JSON
    second = prepared(tokenizer, **params)  # a fresh process: no matcher in memory
    s2 = second.new_store()
    s2.restore(snap)
    rest = _run(second, s2, "a", tokenizer, "List:", 7, generated=head)
    assert rest == straight
    assert second.samplers[0].row_state("a").tokens == straight[:-1]
    text = tokenizer.decode(straight)
    assert re.fullmatch(r"\[[a-z]*(,[a-z]*)*\]?", text.split(tokenizer.eos_token)[0]), text


def test_reused_request_id_is_replayed(tokenizer):
    chain = prepared(tokenizer, gbnf='root ::= "yes" | "no"')
    assert allowed_ids(chain, tokenizer, "Q", "yes") == {tokenizer.eos_token_id}
    again = allowed_ids(chain, tokenizer, "Q", [])  # same id "row0", a new request: fresh matcher
    assert tokenizer.encode("y")[0] in again or tokenizer.encode("yes")[0] in again


# ----------------------------------------------------------------------------- configuration errors
@pytest.mark.parametrize(
    "params, key",
    [
        ({"gbnf": 'root ::= ( "yes"'}, "gbnf"),
        ({"gbnf": "root ::= undefined_rule"}, "gbnf"),
        ({"regex": "[a-"}, "regex"),
        ({"json_schema": "{not json"}, "json_schema"),
        ({"json_schema": '{"type": "objectx"}'}, "json_schema"),
        ({}, "gbnf"),
        ({"gbnf": 'root ::= "a"', "regex": "a"}, "regex"),
        ({"json": True, "regex": "a"}, "regex"),
        ({"regex": "a", "json_whitespace": "some"}, "json_whitespace"),
        ({"regex": "a", "triggers": "<call>"}, "triggers"),
        ({"regex": "a", "triggers": [""]}, "triggers"),
        ({"regex": "a", "trigger_tokens": [-1]}, "trigger_tokens"),
    ],
)
def test_bad_config_names_the_parameter(params, key):
    with pytest.raises(ConfigError, match=rf"samplers\[0\]\.{key}"):
        grammar_chain(**params)


def test_bad_per_request_value_is_refused(tokenizer):
    chain = prepared(tokenizer, regex="a+")
    store = chain.new_store()
    with pytest.raises(SamplechainError, match="enabled"):
        store.add("x", {"grammar.enabled": "yes"})
