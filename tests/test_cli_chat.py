"""`samplechain chat` and `samplechain generate --chat`: the conversation logic (ChatSession) without a terminal, the
commands, and the whole program under a pseudo-terminal as a user types into it."""

from __future__ import annotations

import os
import re
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from samplechain import Chain, ConfigError
from samplechain.cli import main
from samplechain.cli.chat import HELP, QUIT, ChatSession
from samplechain.generation import generate
from samplechain.models import TINY_MODEL

TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SAMPLECHAIN = Path(sys.executable).parent / "samplechain"


@pytest.fixture(scope="module")
def chat_folder(tmp_path_factory):
    """The tiny model with a chat template in its tokenizer: a chat model for fast tests."""
    folder = tmp_path_factory.mktemp("tiny-chat")
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        (folder / name).symlink_to(TINY_MODEL / name)
    tok = AutoTokenizer.from_pretrained(TINY_MODEL)
    tok.chat_template = TEMPLATE
    tok.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def lm(chat_folder):
    return AutoModelForCausalLM.from_pretrained(chat_folder).eval(), AutoTokenizer.from_pretrained(chat_folder)


def session(lm, **kw: Any) -> ChatSession:
    model, tok = lm
    kw.setdefault("seed", 7)
    kw.setdefault("max_new_tokens", 8)
    return ChatSession(model, tok, Chain.load("preset:llama.cpp"), **kw)


# ----------------------------------------------------------------- the conversation
def test_each_answer_joins_the_history_and_the_next_prompt(lm):
    chat = session(lm, system="Be brief.")
    first = "".join(chat.reply("In Python, a list is"))
    assert first and first == chat.last_output.texts[0]
    assert chat.history == [
        {"role": "user", "content": "In Python, a list is"},
        {"role": "assistant", "content": first},
    ]
    prompt = chat.prompt_text("And a tuple?")
    assert (
        prompt
        == f"<|system|>Be brief.\n<|user|>In Python, a list is\n<|assistant|>{first}\n<|user|>And a tuple?\n<|assistant|>"
    )
    "".join(chat.reply("And a tuple?"))
    _model, tok = lm
    sent = chat.last_output.sequences[0, : chat.last_output.prompt_length].tolist()
    assert sent == tok(prompt, add_special_tokens=False)["input_ids"]  # the model saw the whole conversation
    assert len(chat.history) == 4


def test_answer_i_is_drawn_with_seed_plus_i(lm):
    model, tok = lm
    chat = session(lm)
    answers = ["".join(chat.reply("The module")) for _ in range(2)]
    for i, answer in enumerate(answers):
        conversation = chat.history[: 2 * i] + [{"role": "user", "content": "The module"}]
        expected = generate(model, tok, [conversation], chain="preset:llama.cpp", seed=7 + i, max_new_tokens=8)
        assert answer == expected.texts[0]


def test_an_answer_cut_short_leaves_the_history_as_it_was(lm):
    chat = session(lm)
    pieces = chat.reply("The function")
    next(pieces)
    pieces.close()  # Ctrl-C in the terminal
    assert chat.history == [] and chat.answers == 0


# ----------------------------------------------------------------- commands
def test_set_unset_and_their_errors(lm):
    chat = session(lm)
    assert chat.command("/set temperature=0.2 top_k.k=20") == "parameters: temperature=0.2, top_k.k=20"
    assert chat.command("/set") == "parameters: temperature=0.2, top_k.k=20"
    with pytest.raises(ConfigError, match="unknown parameter 'top_q'.*did you mean"):
        chat.command("/set top_q=0.5")
    with pytest.raises(ConfigError, match="/set 'oops': expected KEY=VALUE, e.g. /set temperature=0.7"):
        chat.command("/set oops")
    assert chat.params == {"temperature": 0.2, "top_k.k": 20}  # a bad /set changes nothing
    assert chat.command("/unset top_k.k") == "parameters: temperature=0.2"
    with pytest.raises(ConfigError, match="/unset min_p: give keys set with /set"):
        chat.command("/unset min_p")


def test_set_temperature_zero_answers_greedily(lm):
    model, tok = lm
    chat = session(lm)
    chat.command("/set temperature=0")
    answer = "".join(chat.reply("A list is"))
    greedy = generate(model, tok, [[{"role": "user", "content": "A list is"}]], chain="preset:greedy", max_new_tokens=8)
    assert answer == greedy.texts[0]


def test_chain_loads_a_file_or_a_preset(lm, tmp_path):
    chat = session(lm)
    (tmp_path / "chain.toml").write_text('[chain]\nsamplers = [{ use = "top_k", k = 1 }, { use = "dist" }]\n')
    assert "top_k" in chat.command(f"/chain {tmp_path / 'chain.toml'}")
    assert chat.command("/chain preset:greedy").startswith("chain: Chain(")
    with pytest.raises(ConfigError, match="/chain nope.toml: no such file"):
        chat.command("/chain nope.toml")
    with pytest.raises(ConfigError, match="no such preset"):
        chat.command("/chain preset:nope")
    chat.command("/chain preset:llama.cpp")
    chat.command("/set temperature=0.5")
    with pytest.raises(ConfigError, match="unknown parameter 'temperature'"):
        chat.command("/chain preset:greedy")  # the parameters set would not fit: the chain stays
    assert "dist" in repr(chat.chain)


def test_cfg_scale_guides_every_chain_the_session_loads(lm):
    model, tok = lm
    chat = session(lm, cfg_scale=2.5, negative_prompt="A list")
    assert "cfg" not in repr(chat.chain)  # the first chain is guided where the command line loads it
    assert "cfg.v1 -> greedy" in chat.command("/chain preset:greedy")
    answer = "".join(chat.reply("The module"))
    conversation = [[{"role": "user", "content": "The module"}]]
    guided = [{"use": "cfg", "scale": 2.5}, {"use": "greedy"}]
    want = generate(model, tok, conversation, chain={"samplers": guided}, negative_prompt="A list", max_new_tokens=8)
    assert answer == want.texts[0]


def test_reset_history_help_quit_and_unknown_commands(lm):
    chat = session(lm)
    assert chat.command("/history") == "(no messages yet)"
    "".join(chat.reply("The function"))
    assert chat.command("/history").startswith("user: The function\nassistant: ")
    assert chat.command("/reset") == "a new conversation" and chat.history == []
    assert chat.command("/help") == HELP and "/chain FILE" in HELP
    assert chat.command("/quit") == QUIT
    with pytest.raises(ConfigError, match="unknown command '/sett': did you mean /set\\? /help lists the commands"):
        chat.command("/sett temperature=0")
    with pytest.raises(ConfigError, match="unknown command '/xyzzy': /help lists the commands"):
        chat.command("/xyzzy")


# ----------------------------------------------------------------- samplechain generate --chat
def test_generate_chat_streams_the_answer_alone(chat_folder, lm, capsys):
    model, tok = lm
    argv = ["generate", "--chat", "In Python,", "--model", str(chat_folder), "--seed", "5", "--max-new-tokens", "8"]
    assert main([*argv, "--system", "Be brief."]) == 0
    out = capsys.readouterr().out
    conversation = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "In Python,"}]
    expected = generate(model, tok, [conversation], chain="preset:llama.cpp", seed=5, max_new_tokens=8)
    assert out == expected.texts[0] + "\n"


def test_chat_needs_a_chat_template(capsys):
    assert main(["generate", "--chat", "hi", "--model", str(TINY_MODEL), "--max-new-tokens", "2"]) == 1
    assert "--chat renders a conversation with the model's chat template" in capsys.readouterr().err
    assert main(["chat", "--model", str(TINY_MODEL)]) == 1
    assert "samplechain chat renders a conversation" in capsys.readouterr().err


# ----------------------------------------------------------------- under a pseudo-terminal
ANSI = re.compile(r"\x1b(\[[0-9;?]*[ -/]*[@-~]|\][^\x07]*\x07|[()][0-9A-B]|[=>])")


class Terminal:
    """`samplechain ARGS` on a pseudo-terminal (stdin, stdout and stderr), read as a user sees it."""

    def __init__(self, *args: str) -> None:
        self.master, slave = os.openpty()
        env = {**os.environ, "TERM": "dumb", "NO_COLOR": "1", "COLUMNS": "200"}
        self.proc = subprocess.Popen([str(SAMPLECHAIN), *args], stdin=slave, stdout=slave, stderr=slave, env=env)
        os.close(slave)
        self.seen = ""

    def until(self, pattern: str, timeout: float = 180) -> str:
        """What the terminal shows from now until `pattern` (a regex, `.` matching newlines too) matches; the rest
        stays for the next call."""
        deadline = time.monotonic() + timeout
        while True:
            match = re.search(pattern, self.seen, re.S)
            if match:
                shown, self.seen = self.seen[: match.end()], self.seen[match.end() :]
                return shown
            left = deadline - time.monotonic()
            assert left > 0 and self.proc.poll() is None, f"no {pattern!r} on the terminal; it shows:\n{self.seen}"
            if select.select([self.master], [], [], min(left, 1.0))[0]:
                try:
                    data = os.read(self.master, 4096)
                except OSError:  # the program ended
                    data = b""
                self.seen += ANSI.sub("", data.decode("utf-8", "replace")).replace("\r\n", "\n")

    def type(self, line: str) -> None:
        os.write(self.master, line.encode() + b"\n")

    def close(self) -> int:
        try:
            return self.proc.wait(timeout=60)
        finally:
            os.close(self.master)


def answer_to(term: Terminal, question: str) -> str:
    """Type a question; the answer the terminal shows before the next prompt (the echoed question and the dim
    statistics line left out)."""
    term.type(question)
    shown = term.until(r"\n> $")
    text = shown.split(question, 1)[1]
    return "\n".join(line for line in text.splitlines() if not line.startswith("[") and line != "> ").strip()


@pytest.mark.slow
def test_a_conversation_in_the_terminal(chat_folder):
    term = Terminal("chat", "--model", str(chat_folder), "--seed", "7", "--max-new-tokens", "12")
    try:
        term.until(r"/help lists the commands.*\n> $")
        first = answer_to(term, "In Python, a list is")
        assert first
        term.type("/set temperature=0")
        term.until(r"parameters: temperature=0\n> $")
        second = answer_to(term, "And a tuple?")
        assert second
        term.type("/history")
        history = term.until(r"\n> $")
        assert "user: In Python, a list is\nassistant: " in history and "user: And a tuple?\nassistant: " in history
        term.type("/nope")
        term.until(r"error: unknown command '/nope'.*\n> $")  # one line, and the chat goes on
        term.type("/reset")
        term.until(r"a new conversation\n> $")
        term.type("/history")
        term.until(r"\(no messages yet\)\n> $")
        term.type("/quit")
        assert term.close() == 0
    finally:
        term.proc.kill()


@pytest.mark.slow
def test_the_default_model_in_the_terminal_and_ctrl_d():
    term = Terminal("chat", "--seed", "7", "--max-new-tokens", "12")  # SmolLM2-135M-Instruct
    try:
        term.until(r"SmolLM2-135M-Instruct.*/help lists the commands.*\n> $")
        assert answer_to(term, "Hello! Who are you?")
        term.type("/set temperature=0")
        term.until(r"parameters: temperature=0\n> $")
        assert "Paris" in answer_to(term, "What is the capital of France?")
        os.write(term.master, b"\x04")  # Ctrl-D
        assert term.close() == 0
    finally:
        term.proc.kill()


@pytest.mark.slow
def test_the_default_model_remembers_the_conversation():
    from samplechain.models import load_model

    model, tok = load_model()
    chat = ChatSession(model, tok, Chain.load("preset:llama.cpp"), seed=7, max_new_tokens=24)
    chat.command("/set temperature=0")
    first = "".join(chat.reply("What is the capital of France?"))
    assert "Paris" in first
    prompt = chat.prompt_text("And of Italy?")
    assert (
        f"<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n{first}<|im_end|>\n"
        "<|im_start|>user\nAnd of Italy?<|im_end|>\n<|im_start|>assistant\n"
    ) in prompt
    second = "".join(chat.reply("And of Italy?"))
    assert "Rome" in second and chat.last_output.finish_reasons == ["eos"]
