"""Chat messages as prompts of generate() / stream(): rendered with the tokenizer's chat template, tokenized without
special tokens added twice, and bad input refused with one ConfigError naming the argument and the culprit."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from samplechain import ConfigError
from samplechain.generation import generate, stream
from samplechain.models import TINY_MODEL

# a minimal template of the ChatML kind: each message on a line of its own, the assistant's turn opened at the end
TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
USER = {"role": "user", "content": "In Python, a list is"}


@pytest.fixture(scope="module")
def model():
    return AutoModelForCausalLM.from_pretrained(TINY_MODEL).eval()


@pytest.fixture(scope="module")
def tok():
    tokenizer = AutoTokenizer.from_pretrained(TINY_MODEL)
    tokenizer.chat_template = TEMPLATE
    return tokenizer


def run(model, tok, prompts, max_new_tokens=6, **kw):
    return generate(model, tok, prompts, chain="preset:greedy", max_new_tokens=max_new_tokens, **kw)


def test_a_conversation_is_rendered_with_the_chat_template(model, tok):
    rendered = tok.apply_chat_template([USER], add_generation_prompt=True, tokenize=False)
    assert rendered == "<|user|>In Python, a list is\n<|assistant|>"
    ids = torch.tensor([tok(rendered, add_special_tokens=False)["input_ids"]])
    assert run(model, tok, [USER]).texts == run(model, tok, None, input_ids=ids).texts


def test_a_batch_mixes_texts_and_conversations(model, tok):
    system = {"role": "system", "content": "Answer briefly."}
    batch: list[Any] = ["The function", [USER], [system, USER]]
    out = run(model, tok, batch, pad_token_id=tok.eos_token_id)
    assert out.texts == [run(model, tok, p).texts[0] for p in ("The function", [USER], [system, USER])]
    assert out.texts[1] != out.texts[2]  # the system message is part of the prompt


def test_stream_takes_a_conversation(model, tok):
    conversation = ({"role": "user", "content": "A tuple"},)  # a tuple of messages is a conversation too
    result: list[Any] = []
    events = stream(model, tok, conversation, chain="preset:greedy", max_new_tokens=8, result=result)
    text = "".join(e.text for e in events)
    assert text and text == result[0].texts[0] == run(model, tok, list(conversation), max_new_tokens=8).texts[0]


class BosAddingTokenizer:
    """The tiny tokenizer as a Llama tokenizer behaves: a bos before the text unless add_special_tokens=False, and
    a chat template that writes the bos itself."""

    def __init__(self, tok: Any) -> None:
        self.tok = tok
        self.chat_template = "{{ bos_token }}" + TEMPLATE

    def __getattr__(self, name: str) -> Any:
        return getattr(self.tok, name)

    def __len__(self) -> int:
        return len(self.tok)

    def __call__(self, text: str, add_special_tokens: bool = True, **kw: Any) -> dict[str, list[int]]:
        ids = self.tok(text, **kw)["input_ids"]
        return {"input_ids": ([self.tok.bos_token_id] if add_special_tokens else []) + list(ids)}

    def apply_chat_template(self, messages: Any, **kw: Any) -> Any:
        return self.tok.apply_chat_template(messages, chat_template=self.chat_template, **kw)


def test_the_templates_bos_is_not_doubled(model, tok):
    bos = tok.bos_token_id
    out = run(model, BosAddingTokenizer(tok), [USER], max_new_tokens=1)
    prompt = out.sequences[0, : out.prompt_length].tolist()
    assert prompt[0] == bos and prompt[1] != bos
    text_prompt = run(model, BosAddingTokenizer(tok), "x", max_new_tokens=1).sequences[0].tolist()
    assert text_prompt[0] == bos  # text prompts keep the tokenizer's own special tokens


@pytest.mark.parametrize(
    ("prompts", "message"),
    [
        (USER, "prompts is a single message: a conversation is a list of messages"),
        ([{"role": "user"}], "prompts[0] has no 'content': a message is"),
        ([{"content": "x"}], "prompts[0] has no 'role': a message is"),
        ([{"role": 1, "content": "x"}], "prompts[0]['role'] is a int: the role of a message is text"),
        ([{"role": "user", "content": None}], "prompts[0]['content'] is a NoneType: the content of a message is text"),
        ([[]], "prompts[0] is an empty conversation: give at least one message"),
        (["text", [USER, "oops"]], "prompts[1][1] is a str, not a message"),
        ([USER, "text"], "prompts[0] is a message but other items of prompts are not"),
        ([[USER], 5], "prompts[1] is a int: each prompt is text or a conversation"),
        (7, "prompts is a int: give text"),
        ([], "prompts is an empty list"),
    ],
)
def test_bad_messages_are_one_config_error_naming_the_culprit(model, tok, prompts, message):
    with pytest.raises(ConfigError) as err:
        run(model, tok, prompts)
    assert message in str(err.value)


def test_a_tokenizer_without_a_chat_template_is_named(model):
    plain = AutoTokenizer.from_pretrained(TINY_MODEL)
    with pytest.raises(ConfigError, match=r"prompts\[1\]: the tokenizer has no chat template to render a conversation"):
        run(model, plain, ["text", [USER]])


def test_a_template_that_refuses_the_conversation_is_a_config_error(model):
    strict = AutoTokenizer.from_pretrained(TINY_MODEL)
    strict.chat_template = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}x"
    with pytest.raises(
        ConfigError, match=r"prompts: the tokenizer's chat template refused the conversation.*user first"
    ):
        run(model, strict, [{"role": "assistant", "content": "hi"}])


@pytest.mark.slow
def test_the_default_model_answers_and_stops_at_the_end_of_its_turn():
    from samplechain.models import load_model

    model, tokenizer = load_model()
    question = [{"role": "user", "content": "What is the capital of France?"}]
    out = generate(model, tokenizer, question, chain="preset:greedy", max_new_tokens=40)
    assert out.finish_reasons == ["eos"]  # <|im_end|>, the eos of the generation config
    assert "Paris" in out.texts[0]
    rendered = tokenizer.apply_chat_template(question, add_generation_prompt=True, tokenize=False)
    assert rendered.endswith("<|im_start|>assistant\n")
    prompt = out.sequences[0, : out.prompt_length].tolist()
    assert prompt == tokenizer(rendered, add_special_tokens=False)["input_ids"]
