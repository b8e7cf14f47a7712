"""transformers adapters inside transformers' own loop: a chain as a LogitsProcessorList, criteria as a
StoppingCriteriaList (`custom_generate` runs samplechain's loop instead).

    model.generate(**enc, logits_processor=as_logits_processor(chain, seed=7), do_sample=False,
                   stopping_criteria=as_stopping_criteria(["eos", {"use": "stop_strings", "strings": ["\\n"]}],
                                                          tokenizer=tok))
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import torch
from transformers import LogitsProcessor, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList

from ..contracts import StopContext, StoppingCriterion, StopSetup
from ..engine.chain import Chain
from ..engine.discovery import PluginHost
from ..engine.stopping import Stopping
from ..engine.store import RequestStore
from ..errors import ConfigError
from ..generation.inputs import checked_flags, checked_host, checked_params
from ..params import params_label, sequence_seed

__all__ = [
    "ChainLogitsProcessor",
    "ChainStoppingCriteria",
    "as_logits_processor",
    "as_stopping_criteria",
]


def _chain(chain: Any, host: PluginHost | None) -> Chain:
    checked_host(host)
    if isinstance(chain, Chain):
        return chain
    if isinstance(chain, (str, Path, Mapping)):
        return Chain.load(chain, host=host)
    raise ConfigError(f"chain={chain!r}: pass a Chain, a TOML file path, a dict, or 'preset:NAME'")


def _per_prompt(params: Any, prompts: int) -> list[dict[str, Any]]:
    if params is None or isinstance(params, Mapping):
        return [dict(params or {}) for _ in range(prompts)]
    rows = [dict(p or {}) for p in params]
    if len(rows) != prompts:
        raise ConfigError(
            f"params has {len(rows)} entries for {prompts} prompts: give one per prompt, or one mapping for all"
        )
    return rows


_SPECULATE_HERE = (
    "speculative decoding with a samplechain chain runs in samplechain.generation.generate(model, tokenizer, "
    'prompts, chain=..., draft="prompt_lookup"), which gives the tokens the chain gives without a drafter '
    "(docs/speculative.md)"
)


def _assisted_caller() -> str | None:
    """Who calls, where transformers' assisted generation does (model.generate with assistant_model=,
    prompt_lookup_num_tokens=, assistant_early_exit=, ...): "candidates" for a candidate generator
    (generation/candidate_generator.py, which runs the processors on its drafts), "loop" for the
    `_assisted_decoding` loop (generation/utils.py) itself; None otherwise."""
    frame: Any = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_filename.replace("\\", "/").endswith("/generation/candidate_generator.py"):
            return "candidates"
        if code.co_name == "_assisted_decoding":
            return "loop"
        frame = frame.f_back
    return None


class ChainLogitsProcessor(LogitsProcessor):
    """A chain inside transformers' generation loop.

    It keeps state from call to call (`keeps_state`: requests, RNG positions, the last shape), so samplechain's
    speculative decoding refuses it as a `logits_processor=` (`draft=` takes the chain as chain=).

    Row b of the batch is a request of the processor's own store, created at the first call, with the
    parameters of `params` (one mapping for all rows, or one per prompt) and seed `seed` unless it sets its own.
    With `num_return_sequences=n` (give the same n to model.generate) rows b*n .. b*n+n-1 are the copies of
    prompt b and copy j gets seed + j, as in samplechain's own loop. A call with another batch size or an input
    no longer than the last one starts a new generation (fresh requests); `reset()` does it explicitly.

    select=True (the default for chains ending in a sampling selector): the whole chain runs, the chosen tokens
    are accepted (RNG positions and stateful samplers advance), and the returned scores keep only the chosen
    token (at its log-probability under the chain; every other token -inf), so transformers' argmax
    (do_sample=False) or multinomial (do_sample=True: its warpers keep the one finite token) picks exactly the
    chain's token. `model.generate` then gives the same tokens as samplechain's own loop with the same seed.
    The price: `output_scores` shows that one-hot mask, not a distribution (`output_logits` is unaffected).

    select=False: only the transforms and filters run (`Chain.process`), and transformers chooses from the
    processed scores with its own RNG (pass do_sample=True to sample). The token transformers chose is
    accepted into the store at the next call, so stateful samplers (penalty windows, RNG positions) follow
    the sequence.

    Refused with a ConfigError at its first call: transformers' assisted generation (`assistant_model=`,
    `prompt_lookup_num_tokens=`), which calls processors once per drafted position, drafts included, and on its
    drafter's guesses too: the chain's RNG positions and stateful samplers would follow tokens that are thrown
    away. `samplechain.generation.generate(..., draft=...)` speculates with the chain's own tokens.
    """

    keeps_state = True

    def __init__(
        self,
        chain: Any,
        *,
        params: Any = None,
        seed: int | None = None,
        select: bool | None = None,
        num_return_sequences: int = 1,
        host: PluginHost | None = None,
    ) -> None:
        self.chain = _chain(chain, host)
        if self.chain.config.guards:
            raise ConfigError(
                f"chain {self.chain.config.name or ''}: its guards ({', '.join(g['use'] for g in self.chain.config.guards)}) "
                "take text back, which a logits processor inside model.generate cannot; generate with "
                "samplechain.generation.generate(model, tokenizer, prompts, chain=...), which runs them"
            )
        listed = checked_params(params)  # one mapping per prompt, or None for one mapping for all
        for i, row in enumerate(listed if listed is not None else [dict(params or {})]):
            # the parameters' own check, here rather than inside model.generate
            self.chain.layout.resolve("params" if listed is None else f"params[{i}]", row, draw_seeds=False)
        checked_flags(select=select)
        self.params = params
        self.seed = seed if seed is None else sequence_seed(seed, 0, "seed")
        if not isinstance(num_return_sequences, int) or num_return_sequences < 1:
            raise ConfigError(f"num_return_sequences = {num_return_sequences!r}: must be an integer >= 1")
        self.num_return_sequences = num_return_sequences
        self.select = select if select is not None else self.chain.samplers[-1].name != "greedy"
        self.reset()

    def reset(self) -> None:
        """Forget the current generation: the next call creates fresh requests."""
        self.store: RequestStore | None = None
        self.request_ids: list[str] = []
        self._shape: tuple[int, int] | None = None
        self._refusing = False  # assisted generation's candidates passed: its loop's next call refuses

    def _start(self, batch: int, device: torch.device) -> None:
        n = self.num_return_sequences
        if batch % n:
            raise ConfigError(
                f"batch of {batch} rows with num_return_sequences = {n}: give as_logits_processor "
                "the same num_return_sequences as model.generate"
            )
        self.store = self.chain.new_store(device=device.type, capacity=batch)
        self.request_ids = [str(b) if n == 1 else f"{b // n}.{b % n}" for b in range(batch)]
        seeded = "seed" in self.store.layout.aliases
        for i, p in enumerate(_per_prompt(self.params, batch // n)):
            for j in range(n):
                q = dict(p)
                base = q.get("seed", self.seed)
                if seeded and base is not None:
                    # copy j of a prompt: its own stream, as in samplechain's loop
                    q["seed"] = sequence_seed(
                        base, j, "seed" if "seed" not in p else params_label(self.params, i, "seed")
                    )
                self.store.add(self.request_ids[i * n + j], q)

    def _history(self, input_ids: torch.Tensor) -> dict[str, Any]:
        """Chains with history-reading samplers see input_ids (transformers does not pass the attention mask to
        processors: left padding, if any, reads as tokens, as for transformers' own penalty processors)."""
        return {"history": input_ids} if self.chain.needs_history else {}

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        if not isinstance(input_ids, torch.Tensor) or input_ids.ndim != 2:
            raise ConfigError(
                f"ChainLogitsProcessor: input_ids = {input_ids!r:.60}: a (batch, length) tensor, as model.generate "
                "passes it"
            )
        batch, length = input_ids.shape
        fresh = self.store is None or self._shape is None or batch != self._shape[0] or length <= self._shape[1]
        if fresh or self._refusing:
            caller = _assisted_caller()  # every assisted run starts fresh here, or steps back to a kept draft
            if caller == "candidates":
                # not raised in a candidate generator, which would skip its own clean-up (assistant_early_exit
                # leaves the model cut to its first layers): the scores pass untouched, the loop's call refuses
                self._refusing = True
                return scores
            if caller == "loop":
                self.reset()
                raise ConfigError(
                    "samplechain's logits processor inside transformers' assisted generation (model.generate "
                    "with assistant_model=, prompt_lookup_num_tokens= or assistant_early_exit=): transformers "
                    "calls it on every drafted position and on its drafter's guesses, so the chain's random draws "
                    "and stateful samplers would follow tokens it then throws away. Drop assistant_model / "
                    f"prompt_lookup_num_tokens / assistant_early_exit: {_SPECULATE_HERE}"
                )
            self._start(batch, scores.device)
        self._shape = (batch, length)
        if not self.select:
            if not fresh:  # the token transformers chose from the previous call's scores
                assert self.store is not None  # made by _start() at the generation's first call
                self.chain.accept(self.store, self.request_ids, input_ids[:, -1])
            return self.chain.process(scores, self.store, self.request_ids, **self._history(input_ids))
        out = self.chain.sample(scores, self.store, self.request_ids, **self._history(input_ids)).check()
        # scores: (B, V) all -inf but the chosen token, so any argmax / multinomial downstream takes it
        masked = torch.full(scores.shape, float("-inf"), dtype=torch.float32, device=scores.device)
        return masked.scatter_(1, out.token_ids[:, None], out.logprobs[:, None])


def as_logits_processor(
    chain: Any,
    *,
    params: Any = None,
    seed: int | None = None,
    select: bool | None = None,
    num_return_sequences: int = 1,
    host: PluginHost | None = None,
) -> LogitsProcessorList:
    """A LogitsProcessorList holding a ChainLogitsProcessor (see there for select=True / False)."""
    return LogitsProcessorList(
        [
            ChainLogitsProcessor(
                chain, params=params, seed=seed, select=select, num_return_sequences=num_return_sequences, host=host
            )
        ]
    )


def _criteria(spec: Any, host: PluginHost | None) -> Stopping:
    if isinstance(spec, Stopping):
        return spec
    checked_host(host)
    if isinstance(spec, (str, Mapping, StoppingCriterion)) or callable(spec):
        items = [spec]
    elif isinstance(spec, (list, tuple)):
        items = list(spec)
    else:
        raise ConfigError(
            f"criteria = {spec!r}: a Stopping, a criterion's name ('eos'), a table ({{'use': 'stop_strings', "
            "'strings': ['\\n']}), a StoppingCriterion, a callable fn(ctx) -> (B,) bool, or a list of them"
        )
    out = Stopping(require_length_limit=False)
    for item in items:
        if isinstance(item, str):
            out.add(Stopping.criterion(item, host=host))
        elif isinstance(item, Mapping):
            if "use" not in item:
                raise ConfigError(
                    f"stopping criterion {dict(item)!r}: needs use = NAME, e.g. "
                    "{'use': 'stop_strings', 'strings': ['\\n']}"
                )
            params = {k: v for k, v in item.items() if k != "use"}
            out.add(Stopping.criterion(item["use"], params, host=host))
        else:
            out.add(item)
    return out


class ChainStoppingCriteria(StoppingCriteria):
    """samplechain criteria inside transformers' loop: one bool per row; `finish_reasons[b]` is the reason of
    the first criterion that stopped row b (None: still running, or stopped by one of transformers' own
    criteria). The setup is taken at the first call, which comes after the first new token: prompt length =
    input length - 1, each row's own prompt length found by skipping its leading pad tokens (left padding;
    pad id from `pad_token_id`, the tokenizer or the model's generation config). A call with another batch size
    or an input no longer than the last one starts a new generation."""

    def __init__(
        self, stopping: Stopping, *, tokenizer: Any = None, model: Any = None, pad_token_id: int | None = None
    ) -> None:
        self.stopping = stopping
        self.tokenizer = tokenizer
        self.model = model
        self.pad_token_id = pad_token_id
        self.setup: StopSetup | None = None
        self.finish_reasons: list[str | None] = []
        self._last = 0

    def _pad_id(self) -> int | None:
        if self.pad_token_id is not None:
            return self.pad_token_id
        for src in (
            getattr(self.tokenizer, "pad_token_id", None),
            getattr(getattr(self.model, "generation_config", None), "pad_token_id", None),
        ):
            if src is not None:
                return int(src)
        return None

    def _start(self, input_ids: torch.Tensor) -> None:
        batch, length = input_ids.shape
        prompt = input_ids[:, : length - 1]
        pad = self._pad_id()
        if pad is not None and prompt.shape[1] > 0:
            is_pad = (prompt == pad).to(torch.int64)
            leading = is_pad.cumprod(dim=1).sum(dim=1)  # left padding: the run of pad tokens at the start
            lengths = (length - 1) - leading
        else:
            lengths = torch.full((batch,), length - 1, dtype=torch.int64)
        self.setup = StopSetup(
            batch_size=batch,
            prompt_length=length - 1,
            prompt_lengths=lengths.cpu(),
            device=input_ids.device,
            tokenizer=self.tokenizer,
            model_config=getattr(self.model, "config", None),
            generation_config=getattr(self.model, "generation_config", None),
            start_time=time.monotonic(),
        )
        self.stopping.prepare(self.setup)
        self.finish_reasons = [None] * batch

    def __call__(self, input_ids: torch.LongTensor, scores: Any = None, **kwargs: Any) -> torch.BoolTensor:
        batch, length = input_ids.shape
        if self.setup is None or batch != self.setup.batch_size or length <= self._last:
            caller = _assisted_caller()
            if caller == "candidates":  # a drafter's own loop: its guesses are checked by the model's
                return cast(torch.BoolTensor, torch.zeros(batch, dtype=torch.bool, device=input_ids.device))
            if caller == "loop":
                raise ConfigError(
                    "samplechain's stopping criteria inside transformers' assisted generation (model.generate with "
                    "assistant_model=, prompt_lookup_num_tokens= or assistant_early_exit=): it adds several tokens "
                    "a call, first called past the prompt, so the criteria would count from the wrong prompt "
                    "length and miss stops between the tokens. Drop assistant_model / prompt_lookup_num_tokens / "
                    f"assistant_early_exit: {_SPECULATE_HERE}"
                )
            self._start(input_ids)
        self._last = length
        assert self.setup is not None  # _start() sets it
        last_scores = (
            scores[-1]
            if isinstance(scores, (tuple, list)) and scores
            else (scores if isinstance(scores, torch.Tensor) else None)
        )
        token_ids = input_ids[:, -1]
        logprobs = None
        if last_scores is not None and last_scores.dim() == 2:
            logprobs = torch.log_softmax(last_scores.float(), dim=-1).gather(1, token_ids[:, None]).squeeze(1)
        else:
            last_scores = None
        ctx = StopContext(input_ids, length - self.setup.prompt_length, token_ids, self.setup, logprobs, last_scores)
        result = self.stopping.check(ctx)
        for b, reason in enumerate(result.reasons):
            if reason is not None and self.finish_reasons[b] is None:
                self.finish_reasons[b] = reason
        return cast(torch.BoolTensor, result.done)  # transformers types the answer BoolTensor, torch returns Tensor


def as_stopping_criteria(
    criteria: Any,
    *,
    tokenizer: Any = None,
    model: Any = None,
    pad_token_id: int | None = None,
    host: PluginHost | None = None,
) -> StoppingCriteriaList:
    """A StoppingCriteriaList from a Stopping, or a list of names ("eos"), dicts ({"use": "stop_strings",
    "strings": [...]}), StoppingCriterion instances or callables. transformers keeps its own length limit."""
    return StoppingCriteriaList(
        [ChainStoppingCriteria(_criteria(criteria, host), tokenizer=tokenizer, model=model, pad_token_id=pad_token_id)]
    )
