"""`samplechain generate`: stream text from a causal LM (SmolLM2-135M-Instruct by default) through a chain; with
`--chat` the prompt is a user message, rendered with the model's chat template."""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape

from ..errors import ConfigError
from ..tools.progress import LONG_RUN_TOKENS, progress_bar

if TYPE_CHECKING:  # annotations only: the commands import generation (torch, transformers) when they run
    from ..generation import GenerationOutput

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = ["add_parser", "cmd_generate", "guided", "load_cli_model", "parse_bans", "parse_draft", "parse_sets"]

DEFAULT_PROMPT = "The"


def parse_sets(items: list[str] | None, flag: str = "--set") -> dict[str, Any]:
    """--set KEY=VALUE ...: VALUE is read as a TOML value (0.7, 40, true, "x"); a bare word stays a string. `flag`
    names the option (or chat command) in errors."""
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"{flag} {item!r}: expected KEY=VALUE, e.g. {flag} temperature=0.7 or {flag} top_k.k=20")
        try:
            value = tomllib.loads(f"v = {raw.strip()}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw.strip()
        out[key] = value
    return out


_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\"}


def unescape(text: str) -> str:
    """`\\n`, `\\t`, `\\r` and `\\\\` typed on a command line become the characters (as llama.cpp's --escape)."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "\\" and i + 1 < len(text) and text[i + 1] in _ESCAPES:
            out.append(_ESCAPES[text[i + 1]])
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "generate",
        help="generate text from a causal LM through a chain (streams to the terminal)",
        description="Generate text with a causal LM (default: SmolLM2-135M-Instruct) through a chain read from "
        "TOML or a preset. One prompt streams; several prompts run as one batch. With --chat each prompt is a user "
        "message, rendered with the model's chat template, and the answer streams.",
    )
    p.add_argument("prompt", nargs="*", help=f"prompt text (words are joined; default: stdin, or {DEFAULT_PROMPT!r})")
    p.add_argument(
        "-p",
        "--prompt",
        action="append",
        dest="prompts",
        metavar="TEXT",
        help="a prompt of a batch (repeatable; several prompts run as one batch)",
    )
    add_run_arguments(p, new_tokens=96)
    add_draft_argument(p)
    add_ban_arguments(p)
    add_guidance_arguments(p)
    p.add_argument(
        "--chat",
        action="store_true",
        help="send each prompt as a user message through the model's chat template; print the answer",
    )
    add_system_argument(p)
    p.add_argument(
        "--stop-regex",
        action="append",
        default=None,
        metavar="PATTERN",
        help="stop when this regular expression matches the end of the generated text (repeatable)",
    )
    p.add_argument(
        "--include-stop-str",
        action="store_true",
        help="keep the matched stop string / regex text in the output (default: cut before it, as vLLM)",
    )
    p.add_argument("--num-beams", type=int, default=1, help="beam search with N beams (no streaming)")
    p.add_argument("--top-logprobs", type=int, default=0, help="with --json: the N most likely tokens per step")
    p.add_argument(
        "--logprobs-mode",
        default="processed",
        metavar="STAGE",
        help="with --json: the distribution of the logprobs: processed (default), raw, a chain entry's "
        "id, STAGE:logits for logit values, or vLLM's raw_logprobs / raw_logits / processed_logits",
    )
    p.add_argument("--json", action="store_true", help="print the structured output as JSON instead of streaming")
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="a progress bar over the steps on stderr (default: on when stderr is a terminal and the run "
        f"is long: several prompts, or more than {LONG_RUN_TOKENS} new tokens without streaming to a "
        "terminal; never with beam search)",
    )
    p.set_defaults(func=cmd_generate)


def add_run_arguments(p: Any, *, new_tokens: int) -> None:
    """The arguments `generate`, `chat` and `trace` share: the model and its engine, the chain (file or preset),
    per-request parameters, the length, stop strings, the seed and the backend."""
    p.add_argument(
        "--model",
        default=None,
        metavar="PATH",
        help="a transformers model folder (save_pretrained) or a FILE.gguf (default: SmolLM2-135M-Instruct)",
    )
    p.add_argument(
        "--engine",
        choices=("transformers", "llama.cpp"),
        default=None,
        help="what runs the model (default: transformers; llama.cpp for a .gguf file)",
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument("--chain", default=None, help="chain TOML file")
    src.add_argument("--preset", default=None, help="a preset from registry.toml (default: llama.cpp)")
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        dest="sets",
        help="per-request parameter, e.g. --set temperature=0.7 --set top_k.k=20 (repeatable)",
    )
    p.add_argument(
        "--max-new-tokens",
        type=int,
        default=None,
        help=f"default {new_tokens} (unless the chain's stop list has a length limit)",
    )
    p.add_argument(
        "--stop",
        action="append",
        default=None,
        metavar="TEXT",
        help="stop string (repeatable; \\n and \\t are read as newline and tab)",
    )
    p.add_argument("--seed", type=int, default=None, help="seed for sampling (default: a fresh seed)")
    p.add_argument("--backend", default=None, help="override the chain's backend (e.g. cpu)")


def add_draft_argument(p: Any) -> None:
    """--draft NAME | JSON and --no-draft (speculative decoding: the same tokens in fewer model calls)."""
    group = p.add_mutually_exclusive_group()
    group.add_argument(
        "--draft",
        default=None,
        metavar="DRAFTER",
        help="speculative decoding with a drafter (the text is the same, in fewer model calls): a name "
        '(prompt_lookup) or a JSON table, e.g. \'{"use": "prompt_lookup", "num_tokens": 8}\' (default: the '
        "chain's [draft] table, if any)",
    )
    group.add_argument(
        "--no-draft",
        dest="draft",
        action="store_const",
        const=False,
        help="no speculative decoding, even when the chain has a [draft] table",
    )


def add_ban_arguments(p: Any) -> None:
    """--ban PHRASE, --ban-regex PATTERN (guards: text taken back where it begins and drawn again)."""
    p.add_argument(
        "--ban",
        action="append",
        default=None,
        metavar="PHRASE",
        help="a phrase that must not appear (repeatable; guard banned_strings): the text is taken back where the "
        "phrase begins and drawn again, without that token there",
    )
    p.add_argument(
        "--ban-regex",
        action="append",
        default=None,
        metavar="PATTERN",
        help="a regular expression the text must not match (repeatable; guard banned_regex)",
    )
    p.add_argument("--ban-ignore-case", action="store_true", help="--ban / --ban-regex in every case form")
    p.add_argument("--ban-whole-words", action="store_true", help="--ban / --ban-regex only as whole words")


def add_guidance_arguments(p: Any) -> None:
    """--cfg-scale SCALE, --negative-prompt TEXT (classifier-free guidance)."""
    p.add_argument(
        "--cfg-scale",
        type=float,
        default=None,
        metavar="SCALE",
        help="classifier-free guidance: cfg first in the chain at this scale (transformers' guidance_scale; 1: off, "
        "> 1: away from the negative prompt)",
    )
    p.add_argument(
        "--negative-prompt",
        default=None,
        metavar="TEXT",
        help="the text guidance steers away from (with --cfg-scale or a chain with cfg; default: the chain's "
        "cfg.negative_prompt, else each prompt's last token)",
    )


def guided(chain: Any, scale: float | None, negative_prompt: str | None) -> Any:
    """The chain with --cfg-scale's guidance first, checked with --negative-prompt before any model loads."""
    from ..generation.guided import with_guidance

    if scale is not None:
        if chain.needs_unconditional_logits:
            raise ConfigError(
                f"--cfg-scale {scale:g}: the chain already has a guidance sampler; set its scale with --set "
                f"cfg.scale={scale:g}, or drop --cfg-scale"
            )
        try:
            chain = with_guidance(chain, scale)
        except ConfigError as exc:
            raise type(exc)(f"--cfg-scale {scale:g}: {exc}") from None
    if negative_prompt is not None and not chain.needs_unconditional_logits:
        raise ConfigError(
            "--negative-prompt: the chain has no guidance sampler to use it; add --cfg-scale 1.5 (cfg first in the "
            "chain), or load a chain with cfg"
        )
    return chain


def parse_bans(args: argparse.Namespace) -> list[dict[str, Any]] | None:
    """The guards= of --ban / --ban-regex, checked now (before any model loads): a bad pattern is one error."""
    from ..engine.discovery import get_host
    from ..generation.guarding import load_guard

    options = {"ignore_case": args.ban_ignore_case, "whole_words": args.ban_whole_words}
    guards = []
    if args.ban:
        guards.append({"use": "banned_strings", "phrases": [unescape(b) for b in args.ban], **options})
    if args.ban_regex:
        guards.append({"use": "banned_regex", "patterns": list(args.ban_regex), **options})
    for spec, flag in zip(guards, ("--ban", "--ban-regex") if args.ban else ("--ban-regex",)):
        try:
            load_guard(spec, get_host())
        except ConfigError as exc:
            raise type(exc)(f"{flag}: {exc}") from None
    return guards or None


def parse_draft(text: str | bool | None) -> Any:
    """The draft= of --draft: None (not given), False (--no-draft), a drafter's name, or the table a JSON object
    holds; the drafter is checked now, before any model loads, so a typo is one error naming it."""
    if text is None or text is False:
        return text
    assert isinstance(text, str)  # argparse gives the option's text
    from ..drafters import draft_settings
    from ..engine.discovery import get_host
    from ..generation.speculative import load_drafter

    spec: Any = text.strip()
    if spec.startswith("{"):
        try:
            spec = json.loads(spec)
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"--draft {text}: not valid JSON ({exc}); give a drafter's name (--draft prompt_lookup) or a table "
                """like --draft '{"use": "prompt_lookup", "num_tokens": 8}'"""
            ) from None
    try:
        draft_settings(spec)  # the loop's settings (mode, adaptive, cost), which the drafter does not take
        load_drafter(spec, get_host())
    except ConfigError as exc:  # each line names its key path (draft[prompt_lookup].num_tokens): --draft says "draft"
        lines = (line.removeprefix("draft: ") for line in str(exc).splitlines())
        raise type(exc)(f"--draft {text}: " + "\n".join(lines)) from None
    return spec


def add_system_argument(p: Any) -> None:
    p.add_argument(
        "--system",
        default=None,
        metavar="TEXT",
        help="a system message before the conversation (with generate: implies --chat)",
    )


def load_cli_model(model: str | None, engine: str | None = None) -> tuple[Any, Any, str]:
    """(model, tokenizer, name) through samplechain.models.load_model, without transformers' progress bars."""
    from transformers.utils import logging as hf_logging

    from ..models import DEFAULT_MODEL, load_model

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    loaded, tokenizer = load_model(model, engine=engine)
    return loaded, tokenizer, str(model or DEFAULT_MODEL)


def require_chat_template(tokenizer: Any, name: str, what: str) -> None:
    """A ConfigError, before any generation, when the model cannot render a conversation."""
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError(
            f"{what} renders a conversation with the model's chat template, and the tokenizer of {name} has none: "
            "use a chat (instruct) model, e.g. the default SmolLM2-135M-Instruct"
        )


def _chain(args: argparse.Namespace) -> Any:
    """The chain of --chain or --preset, with --cfg-scale's guidance."""
    from ..engine.chain import Chain

    if args.chain:
        chain = Chain.load(Path(args.chain), backend=args.backend)
    else:
        chain = Chain.load(f"preset:{args.preset or 'llama.cpp'}", backend=args.backend)
    return guided(chain, getattr(args, "cfg_scale", None), getattr(args, "negative_prompt", None))


def _prompts(args: argparse.Namespace) -> list[str]:
    prompts = ([" ".join(args.prompt)] if args.prompt else []) + list(args.prompts or [])
    if prompts:
        return prompts
    if not sys.stdin.isatty():
        text = sys.stdin.read()
        if text.strip():
            return [text.rstrip("\n")]
    return [DEFAULT_PROMPT]


def check_run_arguments(args: argparse.Namespace) -> None:
    """--max-new-tokens and --seed, refused before the model loads (and before a streamed prompt is echoed)."""
    from ..params import sequence_seed

    if args.max_new_tokens is not None and args.max_new_tokens < 1:
        raise ConfigError(f"--max-new-tokens {args.max_new_tokens}: must be an integer >= 1")
    if args.seed is not None:
        sequence_seed(args.seed, 0, "--seed")


def run_kwargs(args: argparse.Namespace, chain: Any, params: dict[str, Any], default_new: int) -> dict[str, Any]:
    """generate()'s keyword arguments from the run arguments (checked): a chain whose stop list has a length limit
    gets no default max_new_tokens."""
    check_run_arguments(args)
    has_limit = any(spec.cls.is_length_limit for spec in chain.config.stop)
    max_new = args.max_new_tokens if args.max_new_tokens is not None else (None if has_limit else default_new)
    kwargs = dict(
        chain=chain,
        params=params,
        seed=args.seed,
        max_new_tokens=max_new,
        stop_strings=[unescape(s) for s in args.stop] if args.stop else None,
    )
    draft = parse_draft(getattr(args, "draft", None))
    if draft is not None:
        kwargs["draft"] = draft
    guards = parse_bans(args) if hasattr(args, "ban") else None
    if guards:
        kwargs["guards"] = guards
    if getattr(args, "negative_prompt", None) is not None:
        kwargs["negative_prompt"] = unescape(args.negative_prompt)
    return kwargs


def speculation_stats(out: Any, row: int) -> str:
    """The counts of a row that speculated, as "; drafted D, kept K, M model calls", and its guards' rewinds ("; R
    rewinds"); "" for a run without either."""
    rewinds = "" if getattr(out, "rewinds", None) is None else f"; {int(out.rewinds[row])} rewinds"
    if getattr(out, "drafted", None) is None or not int(out.drafted[row]) and getattr(out, "rewinds", None) is not None:
        return rewinds
    return (
        f"; drafted {int(out.drafted[row])}, kept {int(out.kept[row])}, {int(out.model_calls[row])} model calls"
        + rewinds
    )


def chat_messages(prompts: list[str], system: str | None) -> list[list[dict[str, str]]]:
    """One conversation per prompt: the system message (when given), then the prompt as the user's message."""
    head = [{"role": "system", "content": system}] if system else []
    return [[*head, {"role": "user", "content": p}] for p in prompts]


def cmd_generate(args: argparse.Namespace, console: Console) -> int:
    from ..generation import GenerationWarning

    err = Console(stderr=True)
    chain = _chain(args)
    params = parse_sets(args.sets)
    prompts = _prompts(args)
    chat = bool(args.chat or args.system)
    kwargs = run_kwargs(args, chain, params, 96)  # the drafter is checked here, before the model loads
    if args.num_beams < 1:  # generate() refuses it too, but a streamed run never passes it on
        raise ConfigError(f"--num-beams {args.num_beams}: must be an integer >= 1 (1: no beam search)")
    if args.top_logprobs < 0:  # as --num-beams: only a batch (--json) passes it on
        raise ConfigError(f"--top-logprobs {args.top_logprobs}: must be an integer >= 0 (with --json)")
    if args.num_beams > 1 and kwargs.get("draft"):
        raise ConfigError(f"--draft with --num-beams {args.num_beams}: beam search does not draft; drop one of them")
    model, tokenizer, name = load_cli_model(args.model, args.engine)
    if chat:
        require_chat_template(tokenizer, name, "--chat")
    inputs: list[Any] = chat_messages(prompts, args.system) if chat else list(prompts)
    max_new = kwargs["max_new_tokens"]
    if args.stop_regex:
        kwargs["stop_regex"] = list(args.stop_regex)
    if args.include_stop_str:
        kwargs["include_stop_str_in_output"] = True
    if args.logprobs_mode != "processed":
        kwargs["logprobs_mode"] = args.logprobs_mode
    streaming = not (args.json or args.num_beams > 1 or len(prompts) > 1)
    bar = progress_bar(max_new, "generating", _show_progress(args, prompts, max_new, streaming), console=err)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", GenerationWarning)
        if streaming:
            shown = "" if chat else prompts[0]  # a chat answer stands alone: the prompt went through the template
            _stream_one(model, tokenizer, inputs, shown, kwargs, bar, err)
        else:
            start = time.perf_counter()
            with bar as b:  # closed before anything is printed
                if b.enabled:
                    kwargs["progress"] = lambda step, total: b.update(completed=step, total=total)
                out = generate_batch(model, tokenizer, inputs, args, kwargs)
            elapsed = time.perf_counter() - start
            if args.json:
                data = _as_json(out, prompts, tokenizer, chain, name, args, elapsed)
                print(json.dumps(data, indent=2, ensure_ascii=False))
            else:
                _print_texts(out, prompts, console, err, sep="\n" if chat else "")
    print_warnings(caught, err)
    return 0


def generate_batch(model: Any, tokenizer: Any, inputs: list[Any], args: argparse.Namespace, kwargs: dict) -> Any:
    from ..generation import generate

    return generate(model, tokenizer, inputs, num_beams=args.num_beams, top_logprobs=args.top_logprobs, **kwargs)


def _stream_one(
    model: Any, tokenizer: Any, inputs: list[Any], shown: str, kwargs: dict, bar: Any, err: Console
) -> None:
    """Stream one request's text to stdout after `shown` (the prompt in bold on a terminal), then its statistics."""
    from ..generation import stream

    result: list[Any] = []
    start = time.perf_counter()
    with bar as b:
        if b.enabled:
            kwargs["progress"] = lambda step, total: b.update(completed=step, total=total)
        events = stream(model, tokenizer, inputs, result=result, **kwargs)  # checks the arguments, runs nothing
        sys.stdout.write(f"\033[1m{shown}\033[0m" if shown and sys.stdout.isatty() else shown)
        sys.stdout.flush()
        try:
            for event in events:
                if event.text:
                    sys.stdout.write(event.text)
                    sys.stdout.flush()
        finally:  # an error while the answer streams gets a line of its own
            sys.stdout.write("\n")
            sys.stdout.flush()
    elapsed = time.perf_counter() - start
    out = result[0]
    n = int(out.num_generated[0])
    err.print(
        f"[dim][{n} tokens in {elapsed:.2f} s, {n / max(elapsed, 1e-9):.1f} tokens/s, "
        f"finish: {escape(str(out.finish_reasons[0]))}{speculation_stats(out, 0)}; "
        f"chain: {escape(repr(kwargs['chain']))}][/dim]",
        highlight=False,
    )


def print_warnings(caught: list[warnings.WarningMessage], err: Console) -> None:
    """The GenerationWarnings a run recorded, one yellow line each."""
    from ..generation import GenerationWarning

    for w in caught:
        if issubclass(w.category, GenerationWarning):
            err.print(f"[yellow]warning:[/yellow] {escape(str(w.message))}", highlight=False)


def _print_texts(out: GenerationOutput, prompts: list[str], console: Console, err: Console, sep: str = "") -> None:
    """Each row's prompt and new text (after `sep`) on stdout, its token count and finish reason on stderr."""
    texts = out.texts or []
    for i, text in enumerate(texts):
        assert out.num_generated is not None and out.finish_reasons is not None  # generate() sets them
        console.print(
            f"[bold]{escape(prompts[i // max(len(texts) // len(prompts), 1)])}[/bold]{sep}{escape(text)}",
            highlight=False,
            soft_wrap=True,
        )
        err.print(
            f"[dim][{int(out.num_generated[i])} tokens, finish: {escape(str(out.finish_reasons[i]))}"
            f"{speculation_stats(out, i)}][/dim]",
            highlight=False,
        )


def _show_progress(args: argparse.Namespace, prompts: list[str], max_new: int | None, streaming: bool) -> bool | None:
    """--progress/--no-progress decide; by default (None: when stderr is a terminal) only long runs get a bar, and
    not a single prompt streaming its text to the terminal (the text is the progress there). Beam search has no
    per-step hook: no bar."""
    if args.num_beams > 1:
        return False
    if args.progress is not None:
        return args.progress
    long_run = len(prompts) > 1 or (max_new or 0) > LONG_RUN_TOKENS
    return None if long_run and not (streaming and sys.stdout.isatty()) else False


def _as_json(
    out: Any, prompts: list[str], tokenizer: Any, chain: Any, folder: str, args: argparse.Namespace, elapsed: float
) -> dict[str, Any]:
    rows = []
    per_prompt = max(len(out.sequences) // len(prompts), 1)
    start = out.prompt_length
    for i in range(len(out.sequences)):
        n = int(out.num_generated[i])
        ids = out.sequences[i, start : start + n].tolist()
        row: dict[str, Any] = {
            "prompt": prompts[i // per_prompt],
            "text": out.texts[i] if out.texts else None,
            "token_ids": ids,
            "tokens": tokenizer.convert_ids_to_tokens(ids),
            "finish_reason": out.finish_reasons[i],
        }
        if out.logprobs is not None:
            row["logprobs"] = [round(float(v), 6) for v in out.logprobs[i, :n]]
        if out.sequences_scores is not None:
            row["sequence_score"] = float(out.sequences_scores[i])
        if getattr(out, "drafted", None) is not None:
            row.update(drafted=int(out.drafted[i]), kept=int(out.kept[i]), model_calls=int(out.model_calls[i]))
        if getattr(out, "rewinds", None) is not None:
            row.update(rewinds=int(out.rewinds[i]))
        if out.top_logprobs:
            row["top_logprobs"] = [
                {tokenizer.convert_ids_to_tokens(int(t)): round(float(v), 6) for v, t in zip(vals[i], ids_[i])}
                for vals, ids_ in out.top_logprobs[:n]
            ]
        rows.append(row)
    return {
        "model": folder,
        "chain": chain.describe(),
        "seed": args.seed,
        "num_beams": args.num_beams,
        "elapsed_s": round(elapsed, 4),
        "outputs": rows,
    }
