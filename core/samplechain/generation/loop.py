"""`generate()` and `stream()`: decode a batch of prompts with a Hugging Face causal LM through a chain.

The strategies: greedy and sampling run `Generation.steps()` (session.py: the per-step loop, checkpoints), beam
search (`num_beams > 1`) runs beam.py over the same prepared `Generation`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import attrs
import torch

from ..engine.stopping import cut_text
from ..errors import ConfigError
from .beam import beam_generate
from .inputs import Prompts
from .outputs import GenerationOutput
from .session import Generation
from .streaming import IncrementalDecoder

__all__ = ["StreamEvent", "generate", "stream"]


@attrs.frozen
class StreamEvent:
    """One generated token of request `index` (`token_id`) and the new text it makes visible: "" while the token
    holds part of a character, or text a stop could still cut (vLLM streams such tokens with an empty delta too).
    `finish_reason` is set on the request's last event; a request that ends without a token of its own (a guard
    out of rewinds) gets a last event with `token_id` None."""

    index: int
    text: str
    token_id: int | None
    finish_reason: str | None = None


ProgressCallback = Callable[[int, int | None], None]  # (step, max_new_tokens or None)


def _steps(gen: Generation, progress: ProgressCallback | None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """gen.steps(), reporting each finished step to `progress` (a progress bar, outside the decoding itself)."""
    if progress is None:
        yield from gen.steps()
        return
    gen.end_at_positions()
    total = gen.stopping.max_new_tokens(gen.setup)
    for step, item in enumerate(gen.steps(), start=1):
        yield item
        progress(step, total)


def generate(
    model: Any,
    tokenizer: Any = None,
    prompts: Prompts | None = None,
    *,
    num_beams: int = 1,
    length_penalty: float = 1.0,
    early_stopping: bool | str = False,
    progress: ProgressCallback | None = None,
    **kwargs: Any,
) -> GenerationOutput:
    """Generate from a causal LM through a chain. See `Generation` for the arguments; `num_beams > 1` runs beam
    search (`length_penalty`, `early_stopping`, `num_return_sequences` as transformers).

    prompts: text, a conversation, or a list of texts and conversations (a batch). A conversation is a list of
    messages `{"role": "system" | "user" | "assistant", "content": str}`, rendered with the tokenizer's chat template
    with the assistant's turn opened (`add_generation_prompt=True`) and tokenized without adding special tokens
    again; a list whose items are all messages is one conversation. The model's stop tokens are its eos ids
    (tokenizer, generation config), so an answer ends at the end of the assistant's turn::

        generate(model, tok, [{"role": "user", "content": "Hi!"}])  # one conversation
        generate(model, tok, [[{"role": "user", "content": "Hi!"}], [{"role": "user", "content": "2+2?"}]])

    progress: called as progress(step, max_new_tokens) once after every step (step counts from 1), so a caller
    can draw a progress bar; max_new_tokens is the tightest bound the length limits set (None when none states
    one), the run may end earlier (eos, stop strings). It sees the loop, never changes it. Not with beam search.

    resume: a `Generation.checkpoint()` (or the path of its JSON file): continue that generation, with the same
    chain, criteria and model, instead of starting from prompts.

    draft: speculative decoding that never changes the tokens (docs/speculative.md): a drafter's name
    ("prompt_lookup"), a table {"use": "prompt_lookup", "num_tokens": 10} or a samplechain.drafters.Drafter object,
    or a list with one of these (or None) per prompt; None (the default) takes the chain's `[draft]` table, False
    turns speculation off. The output's drafted / kept / model_calls count its work per row. Beam search does not
    draft (a chain's table is left unused there).

    guards: rules that read the decoded text and take it back (docs/guards.md): a list of guards for every prompt,
    each a name, a table {"use": "banned_strings", "phrases": [...], "ignore_case": True} or a
    samplechain.guards.Guard object, or a list with one such list (or None) per prompt. A guard's rewind bans the
    token where the refused text began, at that position, and draws again; the output's rewinds count them. Beam
    search drops the continuations a guard refuses instead (docs/guards.md)."""
    if not isinstance(num_beams, int) or num_beams < 1:
        raise ConfigError(f"num_beams = {num_beams!r}: must be an integer >= 1")
    _check_progress(progress)
    if num_beams > 1:
        if kwargs.get("resume") is not None:
            raise ConfigError(
                "resume= continues a greedy or sampling generation; beam search (num_beams > 1) has "
                "no checkpoints: drop resume=, or use num_beams=1"
            )
        if progress is not None:
            raise ConfigError(
                "progress= is not available with beam search (num_beams > 1): drop progress=, or use num_beams=1"
            )
        if kwargs.get("draft") not in (None, False):
            raise ConfigError(
                "draft= (speculative decoding) runs greedy and sampling generation; beam search (num_beams > 1) "
                "does not draft: drop draft=, or use num_beams=1"
            )
        return beam_generate(
            model,
            tokenizer,
            prompts,
            num_beams=num_beams,
            length_penalty=length_penalty,
            early_stopping=early_stopping,
            **kwargs,
        )
    gen = Generation(model, tokenizer, prompts, **kwargs)
    for _ in _steps(gen, progress):
        pass
    return gen.output()


def _check_progress(progress: Any) -> None:
    if progress is not None and not callable(progress):
        raise ConfigError(f"progress = {progress!r}: a callable progress(step, max_new_tokens), or None")


def stream(
    model: Any,
    tokenizer: Any,
    prompts: Prompts | None = None,
    *,
    result: list[GenerationOutput] | None = None,
    progress: ProgressCallback | None = None,
    **kwargs: Any,
) -> Iterator[StreamEvent]:
    """Yield one event per generated token of each request as tokens are chosen; a request's text deltas
    concatenate to its output text (`GenerationOutput.texts`) and never split a multi-byte character. Pass
    `result=[]` to receive the final GenerationOutput; `progress` as in `generate()`, called after a step's events
    are yielded. With `resume=`, events carry the text after the checkpoint.

    Never emitted: text a stop later removes. While stop strings / stop_regex are active, the last
    `Stopping.hold_back()` characters of each request whose include_stop_str_in_output is False wait (vLLM's
    stop_buffer_length: the longest stop string less one; stop_regex's look-back); its last event carries the rest,
    cut before the match. A request that includes the stop string holds nothing back: its match ends in the newest
    token, whose text goes out only after the criteria have seen it.

    The arguments are checked by the call itself, before the first event is asked for (a bad one raises there,
    before anything was shown); the model runs as the events are taken."""
    if tokenizer is None:
        raise ConfigError("streaming text needs a tokenizer: stream(model, tokenizer, prompts)")
    if result is not None and not isinstance(result, list):
        raise ConfigError(f"result = {result!r}: a list the final GenerationOutput is appended to (result=[])")
    if kwargs.get("num_beams", 1) != 1:
        raise ConfigError(
            f"num_beams = {kwargs['num_beams']!r}: stream() yields each token as it is drawn, which beam search "
            "cannot (a beam's tokens are final only at its end): use generate(..., num_beams=N)"
        )
    kwargs.pop("num_beams", None)
    _check_progress(progress)
    gen = Generation(model, tokenizer, prompts, **kwargs)
    return _events(gen, tokenizer, result, progress)


def _events(
    gen: Generation, tokenizer: Any, result: list[GenerationOutput] | None, progress: ProgressCallback | None
) -> Iterator[StreamEvent]:
    """stream()'s events of a checked generation."""
    decoders = [IncrementalDecoder(tokenizer) for _ in gen.request_ids]
    most = gen.stopping.hold_back()
    holds = [0 if include else most for include in gen.include_stop_str_in_output]  # per request (vLLM too)
    held = [""] * len(decoders)  # decoded text not yet emitted: it may still end up cut off
    if gen._steps:  # resumed: the decoders start from the tokens so far, so the next delta is what it would have been
        width = gen.setup.prompt_length
        for b, row in enumerate(gen.input_ids[:, width:].tolist()):
            n = int(gen.num_generated[b]) if bool(gen.finished[b]) else len(row)
            for token in row[:n]:
                held[b] += decoders[b].push(token)
            held[b] = held[b][max(len(held[b]) - holds[b], 0) :]  # the rest went out before the checkpoint
    ended = [bool(f) for f in gen.finished.tolist()]  # rows whose last event went out (before a checkpoint too)
    for tokens, active in _steps(gen, progress):
        for b in active.nonzero().flatten().tolist():
            token = int(tokens[b])
            pending = held[b] + decoders[b].push(token)
            reason = gen.finish_reasons[b]
            if reason is not None:  # the rest, cut at a stop match as the output text is
                pending += decoders[b].flush()
                text, held[b], ended[b] = _cut_pending(decoders[b].emitted, pending, gen, b), "", True
            else:
                cut = max(len(pending) - holds[b], 0)
                text, held[b] = pending[:cut], pending[cut:]
            yield StreamEvent(b, text, token, reason)
        yield from _ended_between_steps(gen, decoders, held, ended)
    yield from _ended_between_steps(gen, decoders, held, ended)
    if result is not None:
        result.append(gen.output())


def _ended_between_steps(
    gen: Generation, decoders: list[IncrementalDecoder], held: list[str], ended: list[bool]
) -> Iterator[StreamEvent]:
    """The last events of rows that ended without a token of a step (a guard out of rewinds ends a row between
    steps): the text they held back, cut as the output text is."""
    for b, reason in enumerate(gen.finish_reasons):
        if reason is not None and not ended[b]:
            pending = held[b] + decoders[b].flush()
            held[b], ended[b] = "", True
            yield StreamEvent(b, _cut_pending(decoders[b].emitted, pending, gen, b), None, reason)


def _cut_pending(full: str, pending: str, gen: Generation, b: int) -> str:
    """What a finished row still emits: its held text up to where its output text ends (stop match cut)."""
    sent = len(full) - len(pending)
    final = cut_text(full, gen.stop_matches[b], gen.include_stop_str_in_output[b])
    return final[sent:]
