"""`samplechain chat`: a conversation with a chat model in the terminal.

Each line typed is the user's message; the model's answer streams token by token, rendered from the whole
conversation with the model's chat template, and both join the history. Lines starting with `/` are commands
(`/help` lists them). `ChatSession` holds the conversation and runs the commands without a terminal; `cmd_chat` is
the read-answer loop around it.
"""

from __future__ import annotations

import argparse
import difflib
import shlex
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from ..errors import ConfigError, SamplechainError
from .generate import (
    _chain,
    add_ban_arguments,
    add_draft_argument,
    add_guidance_arguments,
    add_run_arguments,
    add_system_argument,
    check_run_arguments,
    guided,
    load_cli_model,
    parse_bans,
    parse_draft,
    parse_sets,
    print_warnings,
    require_chat_template,
    speculation_stats,
    unescape,
)

__all__ = ["QUIT", "ChatSession", "add_parser", "cmd_chat"]

DEFAULT_NEW_TOKENS = 256
QUIT = "quit"  # what ChatSession.command returns for /quit
_COMMANDS = ("/set", "/unset", "/chain", "/history", "/reset", "/help", "/quit", "/exit")

HELP = """commands:
  /set KEY=VALUE ...  per-request parameters, as --set: /set temperature=0.2, /set top_k.k=20 (alone: list them)
  /unset KEY ...      drop parameters given with /set (the chain's own values apply again)
  /chain FILE         decode with the chain of a TOML file; /chain preset:NAME for a preset
  /history            the conversation so far
  /reset              start a new conversation (the chain and the parameters stay)
  /help               this list
  /quit               end the chat (Ctrl-D too)"""


class ChatSession:
    """A conversation with a model: the history (user and assistant messages, after an optional system message)
    and the decoding settings the commands change.

    `reply(text)` streams the answer to a user message; the exchange joins the history once the answer is whole, so
    an answer cut short (an error, Ctrl-C) leaves the history as it was. With a seed, answer i of the session is
    drawn with seed + i: a session replays exactly, and the same question asked twice may be answered differently.
    `draft` is generate()'s draft= (a drafter speculates: the same answers in fewer model calls), `guards` its
    guards= (--ban: phrases taken back and drawn again), `negative_prompt` its negative_prompt= (classifier-free
    guidance); `cfg_scale` puts guidance into a chain /chain loads, as --cfg-scale did into the first."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        chain: Any,
        *,
        params: dict[str, Any] | None = None,
        seed: int | None = None,
        max_new_tokens: int | None = None,
        system: str | None = None,
        stop_strings: list[str] | None = None,
        backend: str | None = None,
        draft: Any = None,
        guards: Any = None,
        cfg_scale: float | None = None,
        negative_prompt: str | None = None,
    ) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.draft, self.guards = draft, guards
        self.cfg_scale, self.negative_prompt = cfg_scale, negative_prompt
        self.chain = chain
        self.params: dict[str, Any] = {}
        self.seed, self.max_new_tokens, self.system = seed, max_new_tokens, system
        self.stop_strings, self.backend = stop_strings, backend
        self.history: list[dict[str, str]] = []
        self.answers = 0  # answers given in this session: the seed offset of the next
        self.last_output: Any = None  # the GenerationOutput of the last whole answer
        self._check_params(chain, dict(params or {}))
        self.params = dict(params or {})

    # ----------------------------------------------------------------- the conversation
    def messages(self, user: str | None = None) -> list[dict[str, str]]:
        """The conversation as the model sees it: the system message, the history, then `user` when given."""
        head = [{"role": "system", "content": self.system}] if self.system else []
        tail = [{"role": "user", "content": user}] if user is not None else []
        return [*head, *self.history, *tail]

    def prompt_text(self, user: str) -> str:
        """The text the model continues when `user` is sent: the chat template over the conversation and `user`,
        the assistant's turn opened."""
        from ..generation.inputs import render_chat

        return render_chat(self.messages(user), self.tokenizer, "the conversation")

    def reply(self, text: str) -> Iterator[str]:
        """The answer to the user message `text`, streamed as text pieces; then both join the history."""
        from ..generation import stream

        result: list[Any] = []
        seed = None if self.seed is None else self.seed + self.answers
        kwargs: dict[str, Any] = dict(
            chain=self.chain, params=self.params, seed=seed, max_new_tokens=self._max_new_tokens()
        )
        if self.stop_strings:
            kwargs["stop_strings"] = self.stop_strings
        if self.draft is not None:
            kwargs["draft"] = self.draft
        if self.guards:
            kwargs["guards"] = self.guards
        if self.negative_prompt is not None:
            kwargs["negative_prompt"] = self.negative_prompt
        for event in stream(self.model, self.tokenizer, [self.messages(text)], result=result, **kwargs):
            if event.text:
                yield event.text
        self.last_output = result[0]
        answer = (self.last_output.texts or [""])[0]
        self.history += [{"role": "user", "content": text}, {"role": "assistant", "content": answer}]
        self.answers += 1

    def _max_new_tokens(self) -> int | None:
        """--max-new-tokens, else the chain's own length limit, else DEFAULT_NEW_TOKENS."""
        if self.max_new_tokens is not None:
            return self.max_new_tokens
        has_limit = any(spec.cls.is_length_limit for spec in self.chain.config.stop)
        return None if has_limit else DEFAULT_NEW_TOKENS

    # ----------------------------------------------------------------- commands
    def command(self, line: str) -> str:
        """Run a `/command` line: the text to show ("" for none), or QUIT. A bad command raises a ConfigError and
        changes nothing."""
        name, _, rest = line.strip().partition(" ")
        rest = rest.strip()
        if name in ("/quit", "/exit"):
            return QUIT
        if name == "/help":
            return HELP
        if name == "/reset":
            self.history.clear()
            return "a new conversation"
        if name == "/history":
            return self._show_history()
        if name == "/set":
            return self._set(rest)
        if name == "/unset":
            return self._unset(rest)
        if name == "/chain":
            return self._load_chain(rest)
        close = difflib.get_close_matches(name, _COMMANDS, n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        raise ConfigError(f"unknown command {name!r}: {hint}/help lists the commands")

    def _show_history(self) -> str:
        if not self.messages():
            return "(no messages yet)"
        return "\n".join(f"{m['role']}: {m['content']}" for m in self.messages())

    def _set(self, rest: str) -> str:
        if not rest:
            return _show_params(self.params)
        changed = {**self.params, **parse_sets(_words(rest, "/set"), flag="/set")}
        self._check_params(self.chain, changed)
        self.params = changed
        return _show_params(self.params)

    def _unset(self, rest: str) -> str:
        keys = _words(rest, "/unset")
        unknown = [k for k in keys if k not in self.params]
        if not keys or unknown:
            raise ConfigError(
                f"/unset {rest}: give keys set with /set ({', '.join(self.params) or 'none is set'}), e.g. "
                "/unset temperature"
            )
        self.params = {k: v for k, v in self.params.items() if k not in keys}
        return _show_params(self.params)

    def _load_chain(self, rest: str) -> str:
        from ..engine.chain import Chain

        if not rest:
            return f"chain: {self.chain!r}"
        source: str | Path = rest if rest.startswith("preset:") else Path(rest).expanduser()
        if isinstance(source, Path) and not source.is_file():
            raise ConfigError(f"/chain {rest}: no such file; give a chain TOML file or preset:NAME")
        chain = guided(Chain.load(source, backend=self.backend), self.cfg_scale, self.negative_prompt)
        self._check_params(chain, self.params)
        self.chain = chain
        return f"chain: {chain!r}"

    @staticmethod
    def _check_params(chain: Any, params: dict[str, Any]) -> None:
        """Per-request parameters checked against the chain now, not at the next answer."""
        layout = getattr(chain, "layout", None)
        if layout is None or not params:
            return
        try:
            layout.resolve("chat", params, draw_seeds=False)
        except SamplechainError as exc:
            raise ConfigError(f"{exc} (/unset drops a parameter, /set alone lists them)") from None


def _words(rest: str, command: str) -> list[str]:
    try:
        return shlex.split(rest)
    except ValueError as exc:
        raise ConfigError(f"{command} {rest}: {exc}") from None


def _show_params(params: dict[str, Any]) -> str:
    if not params:
        return "parameters: the chain's own"
    return "parameters: " + ", ".join(f"{k}={v!r}" for k, v in params.items())


def add_parser(sub: Any) -> None:
    """Register `samplechain chat` on the `samplechain` parser."""
    p = sub.add_parser(
        "chat",
        help="chat with a model in the terminal (its chat template, answers streamed)",
        description="A conversation in the terminal with a chat model (default: SmolLM2-135M-Instruct): each line "
        "is a user message, the answer streams through the chain. Commands: /set KEY=VALUE, /unset KEY, "
        "/chain FILE or preset:NAME, /history, /reset, /help, /quit (or Ctrl-D).",
    )
    add_run_arguments(p, new_tokens=DEFAULT_NEW_TOKENS)
    add_draft_argument(p)
    add_ban_arguments(p)
    add_guidance_arguments(p)
    add_system_argument(p)
    p.set_defaults(func=cmd_chat)


def cmd_chat(args: argparse.Namespace, console: Console) -> int:
    err = Console(stderr=True)
    chain = _chain(args)
    check_run_arguments(args)  # these, as the draft and the bans, are checked before the model loads
    draft = parse_draft(args.draft)
    guards = parse_bans(args)
    model, tokenizer, name = load_cli_model(args.model, args.engine)
    require_chat_template(tokenizer, name, "samplechain chat")
    session = ChatSession(
        model,
        tokenizer,
        chain,
        params=parse_sets(args.sets),
        seed=args.seed,
        max_new_tokens=args.max_new_tokens,
        system=args.system,
        stop_strings=[unescape(s) for s in args.stop] if args.stop else None,
        backend=args.backend,
        draft=draft,
        guards=guards,
        cfg_scale=args.cfg_scale,
        negative_prompt=None if args.negative_prompt is None else unescape(args.negative_prompt),
    )
    if sys.stdin.isatty():
        try:  # line editing and history for input()
            import readline  # noqa: F401
        except ImportError:  # pragma: no cover - Windows
            pass
    err.print(
        f"[dim]{escape(name)}, chain {escape(repr(chain))}: /help lists the commands, /quit ends[/dim]",
        highlight=False,
        soft_wrap=True,
    )
    while True:
        try:
            line = input("> ")
        except (EOFError, KeyboardInterrupt):  # Ctrl-D, Ctrl-C at the prompt: the end
            sys.stdout.write("\n")
            return 0
        try:
            if line.startswith("/"):
                shown = session.command(line)
                if shown == QUIT:
                    return 0
                if shown:
                    console.print(shown, markup=False, highlight=False, soft_wrap=True)
            elif line.strip():
                _answer(session, line, err)
        except SamplechainError as exc:  # one line, and the chat goes on
            err.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False, soft_wrap=True)


def _answer(session: ChatSession, line: str, err: Console) -> None:
    """Stream the answer to stdout; Ctrl-C stops it (the exchange is then not kept)."""
    from ..generation import GenerationWarning

    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", GenerationWarning)
        try:
            for piece in session.reply(line):
                sys.stdout.write(piece)
                sys.stdout.flush()
        except KeyboardInterrupt:
            sys.stdout.write("\n")
            err.print("[dim][stopped: the exchange is not kept][/dim]", highlight=False)
            return
    sys.stdout.write("\n")
    sys.stdout.flush()
    print_warnings(caught, err)
    out = session.last_output
    reason = out.finish_reasons[0] if out is not None and out.finish_reasons else None
    drafted = speculation_stats(out, 0)
    if reason != "eos" or drafted:  # the answer was cut (it may look unfinished), or what speculation saved
        n = int(out.num_generated[0]) if out is not None else 0
        elapsed = time.perf_counter() - start
        err.print(
            f"[dim][{n} tokens in {elapsed:.2f} s, finish: {escape(str(reason))}{drafted}][/dim]", highlight=False
        )
