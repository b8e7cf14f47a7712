"""`score()`: given continuations of prompts scored through a chain, token by token (teacher forcing).

What RL trainers need to recompute a sampler's processed logprobs for tokens it produced, and what speculative
decoding's `match` verification decides for drafted ones. For row i (prompt i, continuation i) and each
continuation token t:

- `logprobs[i][t]`: the logprob of the given token under the stage `logprobs_at` names (as `Chain.sample` takes
  it: "processed", "raw", "processed_logits", a chain entry's id; one value, or one per prompt), -inf where the
  chain removed the token before that stage;
- `kept[i][t]`: whether the chain would have drawn that very token there: its own draw (`drawn[i][t]`, with the
  request's seed at that position; greedy chains: the argmax of the processed logits) equals it.

How, per batch of rows (left-padded prompts as `Generation` pads them, ragged continuations right-padded; rows that
fit the model's positions only apart run in consecutive groups that do, one after another):
1. the model runs each prompt (`prefill`: the logits before the first continuation token) then the continuations in
   one pass (`extend`: the logits after each token; `chunk_size` splits it);
2. position by position, the rows whose continuation reaches it are sampled by the chain with
   `Chain.sample(..., accept=given tokens)`: the stages and the draw run as in generate(), the history the
   samplers see (penalties, DRY, no_repeat_ngram, grammars) is the prompt and the *given* tokens before t, and the
   request store advances with the given tokens (RNG position, mirostat's mu, reasoning_budget; adaptive_p moves
   its EMA only on the token it drew, as llama.cpp's accept);
3. the stopping criteria see each position as in generate(): `stop_index[i]` is where they would have ended row i
   (its last token), None if they would not have; the whole continuation is scored either way.

A generation's own tokens score with kept=True everywhere and its logprobs, up to the numerics of a multi-token
forward pass against one-token steps (docs/speculative.md, "Numerics"; `chunk_size=1` runs one-token steps, the
generation's own forward passes).
"""

from __future__ import annotations

import numbers
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import attrs
import torch

from ..contracts import StopContext, max_positions
from ..engine.chain import Chain
from ..engine.discovery import PluginHost
from ..engine.mixed import MixedChains
from ..engine.stopping import CallableCriterion
from ..errors import ConfigError
from ..runners import running
from ..tokens import left_pad
from .drafting import keeps_state
from .guided import guided, unconditional_of
from .inputs import Prompts, checked_stop
from .model import runner_for
from .session import Generation

__all__ = ["ScoreOutput", "score"]


@attrs.frozen
class ScoreOutput:
    """What `score()` returns, one entry per row (prompt i with continuation i), each tensor (L_i,) on the CPU for
    the row's L_i continuation tokens:

    token_ids: int64, the continuation as scored (text tokenized without special tokens);
    logprobs: float32, each given token's logprob under the stage `logprobs_at` named (a logit for its
        ":logits" forms), -inf where the chain removed the token before that stage;
    kept: bool, the chain's own draw at that position is the given token (what speculative decoding keeps);
    drawn: int64, the chain's own draw at that position (with the request's seed and RNG position);
    ranks: int64, each given token's rank under the same stage (1: the most likely; tokens tied with it count,
        so a token the chain removed ranks V);
    stop_index: the position of the token at which the stopping criteria would have ended the row (eos, stop
        strings, the chain's [stop] entries...), None where they would not have within the continuation;
    finish_reasons: that criterion's reason ("eos", "stop_strings", ...), None likewise.

    `padded(name)` gives one of the tensor fields as a (B, max L_i) tensor and `lengths` the L_i."""

    token_ids: list[torch.Tensor]
    logprobs: list[torch.Tensor]
    kept: list[torch.Tensor]
    drawn: list[torch.Tensor]
    ranks: list[torch.Tensor]
    stop_index: list[int | None]
    finish_reasons: list[str | None]

    @property
    def lengths(self) -> torch.Tensor:
        """(B,) int64 the number of tokens scored in each row."""
        return torch.tensor([len(t) for t in self.token_ids], dtype=torch.int64)

    def padded(self, name: str, fill: Any = 0) -> torch.Tensor:
        """Field `name` ("logprobs", "kept", ...) as one (B, max length) tensor, `fill` after each row's end."""
        rows = getattr(self, name)
        out = torch.full((len(rows), int(self.lengths.max())), fill, dtype=rows[0].dtype)
        for i, row in enumerate(rows):
            out[i, : len(row)] = row
        return out


def score(
    model: Any,
    tokenizer: Any = None,
    prompts: Prompts | Sequence[Any] | torch.Tensor | None = None,
    continuations: Any = None,
    *,
    attention_mask: torch.Tensor | None = None,
    chain: Chain | MixedChains | str | Path | Mapping[str, Any] | Sequence[Any] | None = None,
    params: Mapping[str, Any] | Sequence[Mapping[str, Any] | None] | None = None,
    seed: int | None = None,
    logprobs_at: str | Sequence[str] = "processed",
    chunk_size: int | None = None,
    num_return_sequences: int = 1,
    logits_processor: Any = None,
    eos_token_id: int | Sequence[int] | None = None,
    pad_token_id: int | None = None,
    stop: Sequence[Any] = (),
    stop_strings: str | Sequence[str] | None = None,
    stop_regex: str | Sequence[str] | None = None,
    max_new_tokens: int | None = None,
    max_length: int | None = None,
    ignore_eos: bool = False,
    negative_prompt: str | Sequence[str] | None = None,
    negative_prompt_ids: torch.Tensor | None = None,
    negative_prompt_attention_mask: torch.Tensor | None = None,
    generation_config: Any = None,
    host: PluginHost | None = None,
) -> ScoreOutput:
    """Score `continuations[i]` after `prompts[i]` through `chain`: each token's logprob at `logprobs_at` and whether
    the chain would have drawn it (see the module docstring and docs/scoring.md).

    prompts: as generate() takes them (text, a conversation, a list of them), or token ids (one list of ints or
    1-D tensor, or a list of them; a left-padded (B, width) tensor with its `attention_mask`, as generate()'s
    input_ids: without one, padding is inferred from the pad token as generate() infers it).
    continuations: text (tokenized alone, without special tokens: pass a generation's token ids to score exactly its
    tokens) or token ids, one per prompt, or `num_return_sequences` per prompt (prompt i's j-th at i * n + j, the
    rows of generate(..., num_return_sequences=n): return sequence j draws with seed + j, as there). chain, params,
    seed: as generate() (the same seed gives the same draws as the generation with it). logprobs_at: one stage or
    one per prompt. chunk_size: continuation tokens per forward pass (None: all of them in one pass; 1: one-token
    steps as generate() runs them); a pass holds (B, chunk_size, V) float32 logits. logits_processor: as
    generate()'s, called at each position on the whole batch's tokens so far (a row whose continuation ended shows
    pad ids, as a finished row of generate() does). eos_token_id, pad_token_id, stop, stop_strings, stop_regex,
    max_new_tokens, max_length, ignore_eos: the stopping criteria `stop_index` reports, as generate() takes them
    (none of them cuts a continuation: every given token is scored). negative_prompt, negative_prompt_ids,
    negative_prompt_attention_mask: a chain with classifier-free guidance (cfg) reads the unconditional context they
    give, as generate() does; it continues with the given tokens.

    Bad input (prompts and continuations of different counts, an empty continuation, a token id outside the
    vocabulary, an unknown logprobs_at stage) is one ConfigError naming it."""
    rows = _continuation_rows(continuations, tokenizer)
    n = num_return_sequences
    _check_args(model, prompts, rows, n, chunk_size, logprobs_at)
    gen = Generation(
        model,
        tokenizer,
        **_prompt_args(prompts, attention_mask),
        chain=cast(Any, chain),  # Generation takes one chain per prompt too
        params=params,
        seed=seed,
        logprobs_mode=logprobs_at,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        stop=[*checked_stop(stop), _Continuations(max(len(r) for r in rows))],
        stop_strings=stop_strings,
        stop_regex=stop_regex,
        max_new_tokens=max_new_tokens,
        max_length=max_length,
        ignore_eos=ignore_eos,
        num_return_sequences=n,
        logits_processor=logits_processor,
        negative_prompt=negative_prompt,
        negative_prompt_ids=negative_prompt_ids,
        negative_prompt_attention_mask=negative_prompt_attention_mask,
        generation_config=generation_config,
        host=host,
        draft=False,  # scoring checks given tokens: the chain's [draft] table and guards have nothing to do
        guards=False,
    )
    _check_rows(gen, rows)
    return _Scoring(gen, rows).run(chunk_size)


def _check_args(
    model: Any, prompts: Any, rows: list[list[int]], n: Any, chunk_size: Any, logprobs_at: str | Sequence[str]
) -> None:
    """What score() can check before reading the prompts: counts, chunk size, token ids."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"num_return_sequences = {n!r}: must be an integer >= 1 (continuations per prompt)")
    count = _prompt_count(prompts)
    if count is not None and count * n != len(rows):
        raise ConfigError(_count_error(count, len(rows), n))
    if chunk_size is not None and (isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1):
        raise ConfigError(f"chunk_size = {chunk_size!r}: give a number of tokens >= 1, or None for one pass")
    _check_tokens(rows, getattr(model.config, "vocab_size", None))
    if not isinstance(logprobs_at, (str, list, tuple)):
        raise ConfigError(
            f"logprobs_at = {logprobs_at!r}: one stage (for example 'raw', 'processed' or a chain entry's id) or a list "
            "of one per prompt"
        )
    if not isinstance(logprobs_at, str) and len(logprobs_at) * n != len(rows):
        raise ConfigError(
            f"logprobs_at lists {len(logprobs_at)} stages for {len(rows) // n} prompts: give one string, or one per "
            "prompt"
        )


def _count_error(prompts: int, rows: int, n: int) -> str:
    if n == 1:
        return f"{prompts} prompts but {rows} continuations: give one continuation per prompt, in order"
    return (
        f"{prompts} prompts with num_return_sequences = {n} but {rows} continuations: give {n} continuations per "
        f"prompt ({prompts * n}), prompt i's j-th at i * {n} + j"
    )


class _Continuations(CallableCriterion):
    """score()'s length limit: the longest continuation. It ends no row (every given token is scored; the chain's
    own limits report where they would have ended it) and keeps generate()'s defaults (20 new tokens, the
    generation config's) from applying."""

    is_length_limit = True

    def __init__(self, n: int) -> None:
        super().__init__(lambda ctx: torch.zeros(ctx.input_ids.shape[0], dtype=torch.bool), reason="continuations")
        self.n = n

    def max_new_tokens(self, setup: Any) -> int:
        return self.n


def _groups(gen: Generation, rows: list[list[int]]) -> list[list[int]]:
    """Runs of consecutive rows that fit the model's positions together: a pass feeds every row of a run the run's
    longest continuation after its prompt (one run: the whole batch)."""
    limit = max_positions(gen.model.config)
    prompts = [int(n) for n in gen.prompt_lengths]
    if limit is None or max(prompts) + max(len(r) for r in rows) <= limit:
        return [list(range(len(rows)))]
    groups: list[list[int]] = [[]]
    for i in range(len(rows)):
        trial = [*groups[-1], i]
        if len(trial) > 1 and max(prompts[j] for j in trial) + max(len(rows[j]) for j in trial) > limit:
            groups.append([i])
        else:
            groups[-1] = trial
    return groups


def _continuation_rows(continuations: Any, tokenizer: Any) -> list[list[int]]:
    """Each continuation as a list of token ids: text through the tokenizer, ids as given."""
    if continuations is None or (isinstance(continuations, (list, tuple)) and not continuations):
        raise ConfigError("continuations is missing: give one continuation (text or token ids) per prompt")
    items = [continuations] if isinstance(continuations, str) or _is_ids(continuations) else continuations
    if isinstance(items, torch.Tensor) and items.ndim == 2:
        items = list(items)
    if not isinstance(items, Sequence) or isinstance(items, (bytes, bytearray)):
        raise ConfigError(
            f"continuations is a {type(continuations).__name__}: give text or token ids, or a list of them (one per "
            "prompt)"
        )
    rows = []
    for i, item in enumerate(items):
        if isinstance(item, str):
            if tokenizer is None:
                raise ConfigError(
                    f"continuations[{i}] is text but no tokenizer was given: pass the tokenizer, or token ids"
                )
            item = tokenizer(item, add_special_tokens=False)["input_ids"]
        elif not _is_ids(item):
            raise ConfigError(
                f"continuations[{i}] is a {type(item).__name__}: give text or token ids (a list of ints or a 1-D "
                "tensor)"
            )
        ids = [int(t) for t in (item.tolist() if isinstance(item, torch.Tensor) else item)]
        if not ids:
            raise ConfigError(
                f"continuations[{i}] is empty: give at least one token to score (or leave the row out of the batch)"
            )
        rows.append(ids)
    return rows


def _is_ids(value: Any) -> bool:
    """One row of token ids: a 1-D integer tensor, or a non-empty sequence of ints (an empty list counts too)."""
    if isinstance(value, torch.Tensor):
        return value.ndim == 1 and not (
            value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool
        )
    if isinstance(value, (str, bytes, bytearray, Mapping)) or not isinstance(value, Sequence):
        return False
    return all(isinstance(t, numbers.Integral) and not isinstance(t, bool) for t in value)


def _check_tokens(rows: list[list[int]], vocab: int | None) -> None:
    if vocab is None:
        return
    for i, row in enumerate(rows):
        for j, token in enumerate(row):
            if not 0 <= token < vocab:
                raise ConfigError(
                    f"continuations[{i}][{j}] = {token}: not a token id of the model (its vocabulary is "
                    f"[0, {vocab})): pass ids from the model's own tokenizer"
                )


def _prompt_count(prompts: Any) -> int | None:
    """How many prompts `prompts` holds, where that is plain before they are read (None: Generation counts)."""
    if isinstance(prompts, torch.Tensor):
        return prompts.shape[0] if prompts.ndim == 2 else 1
    if isinstance(prompts, str) or _is_ids(prompts):
        return 1
    if isinstance(prompts, Sequence) and prompts and all(isinstance(p, Mapping) for p in prompts):
        return 1  # one conversation
    return len(prompts) if isinstance(prompts, Sequence) and prompts else None


def _prompt_args(prompts: Any, attention_mask: torch.Tensor | None = None) -> dict[str, Any]:
    """Generation's prompts=, or input_ids= / attention_mask= for prompts given as token ids."""
    if prompts is None:
        raise ConfigError("prompts is missing: give one prompt (text, a conversation or token ids) per continuation")
    if isinstance(prompts, torch.Tensor) and prompts.ndim == 2:
        return {"input_ids": prompts, "attention_mask": attention_mask}  # padded as generate() reads it
    if attention_mask is not None:
        raise ConfigError(
            "attention_mask is for prompts given as one (B, width) tensor of left-padded token ids; give other "
            "prompts without it"
        )
    if _is_ids(prompts):
        prompts = [prompts]
    elif not (isinstance(prompts, Sequence) and prompts and all(_is_ids(p) for p in prompts)):
        return {"prompts": prompts}  # text and conversations: Generation reads them
    ids = [p.tolist() if isinstance(p, torch.Tensor) else [int(t) for t in p] for p in prompts]
    for i, row in enumerate(ids):
        if not row:
            raise ConfigError(f"prompts[{i}] is empty: give at least one token (the model's bos token, say)")
    return {"input_ids": left_pad(ids, 0), "attention_mask": left_pad([[1] * len(r) for r in ids], 0)}


def _check_rows(gen: Generation, rows: list[list[int]]) -> None:
    """The rows match the prompts and fit the model's positions."""
    if gen.num_prompts * gen.n != len(rows):
        raise ConfigError(_count_error(gen.num_prompts, len(rows), gen.n))
    limit = max_positions(gen.model.config)
    for i, row in enumerate(rows):
        total = int(gen.prompt_lengths[i]) + len(row)
        if limit is not None and total > limit:
            raise ConfigError(
                f"row {i}: the prompt ({int(gen.prompt_lengths[i])} tokens) and continuation ({len(row)}) exceed the "
                f"model's {limit} positions: shorten the continuation to {limit - int(gen.prompt_lengths[i])} tokens"
            )


class _Scoring:
    """One score() run over a prepared Generation (its rows, chain, store, stopping criteria)."""

    def __init__(self, gen: Generation, rows: list[list[int]]) -> None:
        self.gen, self.rows = gen, rows
        self.logprobs_at = gen._logprobs_at  # one stage, or one per row
        self.lengths = torch.tensor([len(r) for r in rows], dtype=torch.int64)
        device = gen.input_ids.device
        self.cont = torch.tensor(  # (B, L) right-padded with the pad token
            [r + [gen.pad_id] * (int(self.lengths.max()) - len(r)) for r in rows], dtype=torch.int64, device=device
        )
        shape = tuple(self.cont.shape)
        self.logprobs = torch.zeros(shape, dtype=torch.float32)
        self.drawn = torch.zeros(shape, dtype=torch.int64)
        self.ranks = torch.zeros(shape, dtype=torch.int64)
        self.stop_index: list[int | None] = [None] * len(rows)
        self.reasons: list[str | None] = [None] * len(rows)

    def run(self, chunk_size: int | None) -> ScoreOutput:
        gen = self.gen
        runner_cls = runner_for(gen.model, gen.host)
        gen.setup.start_time = time.monotonic()  # max_time, as generate() starts its clock
        gen.stopping.prepare(gen.setup)
        groups = _groups(gen, self.rows)
        if len(groups) > 1 and keeps_state(gen.logits_processor):
            raise ConfigError(
                f"logits_processor={type(gen.logits_processor).__name__} keeps its own state from call to call, and "
                f"these rows are scored in {len(groups)} groups (together they exceed the model's positions), which "
                "would call it on each group's positions again: score the groups apart, or pass its chain as chain="
            )
        with running(runner_cls):
            for group in groups:  # the request store keeps each row's state apart
                index = torch.tensor(group, dtype=torch.int64)
                on = index.to(gen.input_ids.device)
                runner = runner_cls(gen.model, gen.input_ids[on], gen.attention_mask[on])
                if gen.uncond_ids is not None:  # classifier-free guidance: its context takes the same tokens
                    assert gen.uncond_mask is not None  # set with uncond_ids
                    uncond = runner_cls(gen.model, gen.uncond_ids[on], gen.uncond_mask[on])
                    runner = guided(runner, uncond, gen.uncond_ids[on], gen.input_ids.shape[1])
                for t, (logits, unconditional) in enumerate(self._columns(runner, index, chunk_size)):
                    self._position(t, logits, index, unconditional)
            for t in range(self.cont.shape[1]):  # the criteria see the whole batch, position by position
                self._stops(t)
        cut = [int(n) for n in self.lengths]
        rows = range(len(cut))
        return ScoreOutput(
            token_ids=[self.cont[i, : cut[i]].cpu() for i in rows],
            logprobs=[self.logprobs[i, : cut[i]].clone() for i in rows],
            kept=[self.drawn[i, : cut[i]] == self.cont[i, : cut[i]].cpu() for i in rows],
            drawn=[self.drawn[i, : cut[i]].clone() for i in rows],
            ranks=[self.ranks[i, : cut[i]].clone() for i in rows],
            stop_index=self.stop_index,
            finish_reasons=self.reasons,
        )

    def _columns(
        self, runner: Any, index: torch.Tensor, chunk_size: int | None
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor | None]]:
        """(n, V) logits of the rows `index` before each continuation position: the prefill's, then those of
        `extend` over their continuations but the last token, `chunk_size` tokens a pass; with each, the
        unconditional logits of the same position (classifier-free guidance: a GuidedRunner), else None."""
        logits = runner.prefill()
        yield logits, unconditional_of(runner)
        cont = self.cont[index.to(self.cont.device)]
        width = int(self.lengths[index].max()) - 1
        step = chunk_size or max(width, 1)
        for start in range(0, width, step):
            block = runner.extend(cont[:, start : min(start + step, width)])
            for j in range(block.shape[1]):
                uncond = unconditional_of(runner)
                yield block[:, j].contiguous(), None if uncond is None else uncond[:, j].contiguous()

    def _position(self, t: int, logits: torch.Tensor, index: torch.Tensor, uncond: torch.Tensor | None) -> None:
        """Position t of the rows `index` (logits (n, V), and their unconditional logits under classifier-free
        guidance): the chain samples those that reach it, accepting the given tokens."""
        gen = self.gen
        if gen.vocab_limit is not None:
            logits[:, gen.vocab_limit :] = float("-inf")
            if uncond is not None:
                uncond[:, gen.vocab_limit :] = float("-inf")
        reach = (self.lengths[index] > t).nonzero().flatten()
        active = index[reach]
        tokens = torch.cat([gen.input_ids, self.cont[:, :t]], dim=1)
        if gen.logits_processor is not None:
            logits = _processed(gen.logits_processor, tokens, logits, index)
        if len(reach) < len(index):
            logits = logits.index_select(0, reach.to(logits.device))
            uncond = None if uncond is None else uncond.index_select(0, reach.to(uncond.device))
        history = gen.history_args(tokens)
        if len(active) < len(self.rows):
            history = {k: v.index_select(0, active.to(v.device)) for k, v in history.items()}
        ids = [gen.request_ids[i] for i in active.tolist()]
        at = self.logprobs_at if isinstance(self.logprobs_at, str) else [self.logprobs_at[i] for i in active.tolist()]
        given = self.cont[active.to(self.cont.device), t]
        drawn, logprobs, ranks = _sample(gen.chain, logits, gen.store, ids, given, at, history, uncond)
        self.drawn[active, t] = drawn.cpu()
        self.logprobs[active, t] = logprobs.cpu()
        self.ranks[active, t] = ranks.cpu()

    def _stops(self, t: int) -> None:
        """The stopping criteria on position t, as generate() asks them: the first that ends a row is its stop."""
        gen = self.gen
        tokens = self.cont[:, t]
        ctx = StopContext(
            torch.cat([gen.input_ids, self.cont[:, : t + 1]], dim=1),
            t + 1,
            tokens,
            gen.setup,
            self.logprobs[:, t].to(tokens.device),
        )
        result = gen.stopping.check(ctx)
        if not result.any:
            return
        for b in result.done.nonzero().flatten().tolist():
            if self.stop_index[b] is None and t < len(self.rows[b]):
                self.stop_index[b], self.reasons[b] = t, result.reasons[b]


def _processed(processor: Any, tokens: torch.Tensor, logits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """`logits_processor=` on the logits (n, V) of the rows `index`, called as generate() calls it: on the whole
    batch's tokens so far (B, width + t) and logits (B, V), the rows of other groups zeros."""
    on = index.to(logits.device)
    full = logits.new_zeros((tokens.shape[0], logits.shape[1]))
    full[on] = logits
    return processor(tokens, full)[on]


def _sample(
    chain: Chain | MixedChains,
    logits: torch.Tensor,
    store: Any,
    ids: list[str],
    given: torch.Tensor,
    logprobs_at: str | list[str],
    history: dict[str, torch.Tensor],
    uncond: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(draws, the given tokens' logprobs, their ranks) of one teacher-forced step."""
    out = chain.sample(
        logits,
        store,
        ids,
        accept=given,
        unconditional_logits=uncond,
        logprobs_at=logprobs_at,
        history=history.get("history"),
        prompt_lengths=history.get("prompt_lengths"),
    ).check()
    assert out.ranks is not None  # accept=token_ids reports ranks
    return out.token_ids, out.logprobs, out.ranks
