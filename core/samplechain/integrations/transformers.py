"""transformers adapters: a chain as a LogitsProcessorList, criteria as a StoppingCriteriaList, and a chain plus
criteria as a `custom_generate` callable for `model.generate(custom_generate=...)`.

    model.generate(**enc, logits_processor=as_logits_processor(chain, seed=7), do_sample=False,
                   stopping_criteria=as_stopping_criteria(["eos", {"use": "stop_strings", "strings": ["\\n"]}],
                                                          tokenizer=tok))
    model.generate(**enc, custom_generate=as_custom_generate(chain), max_new_tokens=40)
"""

from __future__ import annotations

import difflib
import inspect
import sys
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import attrs
import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList
from transformers.generation import logits_process as _lp
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria, MaxTimeCriteria

from ..contracts import StopContext, StoppingCriterion, StopSetup
from ..engine.chain import Chain
from ..engine.config import load_config
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
    "as_custom_generate",
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


# what transformers adds to the processors for do_sample=True: the chain decides sampling, so these are dropped
_WARPERS = tuple(
    getattr(_lp, name)
    for name in (
        "TemperatureLogitsWarper",
        "TopKLogitsWarper",
        "TopPLogitsWarper",
        "MinPLogitsWarper",
        "TopHLogitsWarper",
        "TypicalLogitsWarper",
        "EpsilonLogitsWarper",
        "EtaLogitsWarper",
    )
    if hasattr(_lp, name)
)
# model inputs transformers prepares for its own loop; samplechain's loop makes its own from input_ids + mask
# what model.generate prepares itself; transformers >= 5.24 names the cache `cache` (past_key_values deprecated)
_PREPARED = {
    "attention_mask",
    "position_ids",
    "logits_to_keep",
    "past_key_values",
    "cache",
    "use_cache",
    "cache_position",
}


def _implicit_top_k(warper: Any) -> bool:
    try:
        default = GenerationConfig._get_default_generation_params()["top_k"]
    except (AttributeError, KeyError):
        default = 50
    return isinstance(warper, _lp.TopKLogitsWarper) and warper.top_k == default


def _fresh_cache(cache: Any) -> bool:
    if cache is None:
        return True
    try:
        return int(cache.get_seq_length()) == 0
    except Exception:  # an unknown cache type: we cannot tell, so we refuse it
        return False


def _check_model_inputs(model_kwargs: Mapping[str, Any]) -> None:
    """Refuse what samplechain's loop cannot feed the model: inputs beyond input_ids / attention_mask, and a cache
    that already holds tokens."""
    unknown = sorted(k for k, v in model_kwargs.items() if k not in _PREPARED and v is not None)
    if unknown:
        raise ConfigError(
            f"model.generate(custom_generate=as_custom_generate(...)) got model inputs {unknown}: "
            "samplechain's loop feeds the model input_ids and attention_mask only; call "
            "model.generate without custom_generate for these inputs"
        )
    if not (_fresh_cache(model_kwargs.get("past_key_values")) and _fresh_cache(model_kwargs.get("cache"))):
        raise ConfigError(
            "past_key_values already holds tokens: samplechain's loop builds its own cache from "
            "the prompt; pass the whole prompt as input_ids and no past_key_values"
        )


def _processors_without_warpers(logits_processor: Any, gc: Any) -> list[Any]:
    """transformers' logits processors less the sampling warpers do_sample=True added (the chain samples)."""
    processors = list(logits_processor or [])
    warpers = [p for p in processors if isinstance(p, _WARPERS)] if gc.do_sample else []
    processors = [p for p in processors if p not in warpers]
    # transformers adds top_k=50 to every do_sample=True call unless told otherwise: not the user's choice
    dropped = [type(p).__name__ for p in warpers if not _implicit_top_k(p)]
    if dropped:
        warnings.warn(
            f"do_sample=True made transformers add {', '.join(dropped)}; the chain decides sampling, so "
            "they are not applied (put temperature / top_k / top_p in the chain, and pass "
            "do_sample=False to model.generate to silence this)",
            UserWarning,
            stacklevel=4,  # past this helper, custom_generate and model.generate
        )
    return processors


def _guidance(processors: list[Any], chain: Chain) -> tuple[list[Any], Chain, dict[str, Any]]:
    """transformers' classifier-free guidance (guidance_scale, negative_prompt_ids), which model.generate adds as a
    processor that runs the model on the unconditional context with a cache of its own, as samplechain's cfg first
    in the chain and the negative prompt for the loop's second context: the loop feeds and cuts that context with
    the model's (speculation takes tokens back, rows of a batch draw ahead), which the processor's cache cannot follow.
    -> (the other processors, the chain, the loop's negative-prompt keywords)."""
    guiding = [p for p in processors if isinstance(p, _lp.UnbatchedClassifierFreeGuidanceLogitsProcessor)]
    if not guiding:
        return processors, chain, {}
    if chain.needs_unconditional_logits:
        raise ConfigError(
            f"model.generate(guidance_scale={guiding[0].guidance_scale}) with a chain that has cfg: guidance would "
            "run twice; drop guidance_scale, or cfg from the chain"
        )
    context = guiding[0].unconditional_context
    scale = float(guiding[0].guidance_scale)
    # the cfg entry as a chain of its own resolves it (load_config checks a whole chain: it needs a selector)
    cfg = load_config({"samplers": [{"use": "cfg", "scale": scale}, {"use": "greedy"}]}, host=chain.host).samplers[0]
    config = attrs.evolve(chain.config, samplers=(cfg, *chain.config.samplers))
    negative = {
        "negative_prompt_ids": context["input_ids"],
        "negative_prompt_attention_mask": context["attention_mask"],
    }
    others = [p for p in processors if p not in guiding]
    return others, Chain(config, host=chain.host, backend=chain.backend_name), negative


def _extra_criteria(stop: Sequence[Any], stopping_criteria: Any) -> list[Any]:
    """`stop` and transformers' stopping criteria, less its length, time and eos criteria (the loop has its own)."""
    extra: list[Any] = list(stop)
    for crit in stopping_criteria or []:
        if not isinstance(crit, (MaxLengthCriteria, EosTokenCriteria, MaxTimeCriteria)):
            extra.append(crit)
    return extra


def _fold_repeats(input_ids: torch.Tensor, mask: torch.Tensor | None, expand: int) -> tuple[Any, Any]:
    """transformers repeated each prompt `expand` times (num_return_sequences / beams): our loop does it itself."""
    if expand > 1:
        input_ids = input_ids[::expand]
        mask = mask[::expand] if mask is not None else None
    return input_ids, mask


def _eos_and_pad(gc: Any) -> tuple[Any, Any]:
    """The eos ids (None where there are none) and the pad id transformers prepared in the generation config."""
    eos = getattr(gc, "_eos_token_tensor", None)
    if eos is None:
        eos = gc.eos_token_id
    pad = getattr(gc, "_pad_token_tensor", None)
    pad = int(pad) if isinstance(pad, torch.Tensor) and pad.numel() == 1 else gc.pad_token_id
    return eos, pad


def _own_keywords(
    defaults: Mapping[str, Any], seed: Any, params: Any, stop_strings: Any, stop_regex: Any, include: Any
) -> dict[str, Any]:
    """samplechain's generate() keywords that model.generate hands the callable, else as `defaults` gives them."""
    return {
        "seed": seed if seed is not None else defaults.get("seed"),
        "params": params if params is not None else defaults.get("params"),
        "stop_strings": stop_strings or defaults.get("stop_strings"),
        "stop_regex": stop_regex or defaults.get("stop_regex"),
        "include_stop_str_in_output": (
            include if include is not None else defaults.get("include_stop_str_in_output", False)
        ),
    }


def _assistant_model() -> Any:
    """The assistant_model given to the model.generate that calls the custom_generate callable, or None
    (transformers keeps it from a callable, so its frame is read)."""
    frame: Any = sys._getframe(1)
    for _ in range(6):  # custom_generate, then transformers' generate (a wrapper or two in between at most)
        if frame is None:
            return None
        if frame.f_code.co_name == "generate" and frame.f_locals.get("assistant_model") is not None:
            return frame.f_locals["assistant_model"]
        frame = frame.f_back
    return None


def _confidence_threshold(config: Any) -> float:
    """transformers' assistant_confidence_threshold of a generation config (its default 0.4 where unset): the
    assistant's draft ends after a token it gives less than that probability, as the model drafters' p_min."""
    value = getattr(config, "assistant_confidence_threshold", None)
    return 0.4 if value is None else float(value)


def _draft_of(gc: Any, defaults: Mapping[str, Any]) -> Any:
    """The loop's draft= from transformers' assisted-generation settings, each with the drafter that keeps the
    chain's tokens: prompt_lookup_num_tokens (max_matching_ngram_size) -> prompt_lookup, assistant_model ->
    draft_model, assistant_early_exit -> early_exit (assistant_confidence_threshold -> p_min). A draft= given to
    as_custom_generate wins; beam search drafts nothing, as in transformers; use_mtp (no such drafter) is
    refused."""
    if getattr(gc, "use_mtp", False):
        raise ConfigError(
            "model.generate(custom_generate=as_custom_generate(...), use_mtp=True): samplechain has no "
            "multi-token-prediction drafter; drop use_mtp, or speculate with prompt_lookup_num_tokens=N, "
            f"assistant_model= or assistant_early_exit= ({_SPECULATE_HERE})"
        )
    assistant, early_exit = _assistant_model(), getattr(gc, "assistant_early_exit", None)
    n = getattr(gc, "prompt_lookup_num_tokens", None)
    if "draft" in defaults or int(gc.num_beams or 1) > 1:
        return defaults.get("draft")
    if assistant is not None:
        config = getattr(assistant, "generation_config", None)  # transformers reads the assistant's own
        return {"use": "draft_model", "model": assistant, "p_min": _confidence_threshold(config)}
    if early_exit is not None:
        return {"use": "early_exit", "layers": int(early_exit), "p_min": _confidence_threshold(gc)}
    if n is not None:
        ngram = getattr(gc, "max_matching_ngram_size", None) or 2  # transformers' default
        return {"use": "prompt_lookup", "num_tokens": int(n), "max_ngram": int(ngram)}
    return None


def as_custom_generate(chain: Any, *, stop: Sequence[Any] = (), host: PluginHost | None = None, **defaults: Any) -> Any:
    """A callable for `model.generate(custom_generate=...)` that runs samplechain's own loop with `chain`.

    transformers prepares the inputs and the generation config, then calls it; it takes from them:
    - input_ids and attention_mask (rows that transformers repeated for num_return_sequences / num_beams are
      folded back, and num_return_sequences / num_beams / length_penalty / early_stopping passed to the loop, so
      copies get their own seeds as in samplechain's loop, and num_beams > 1 runs samplechain's beam search);
    - the length limit (generation_config.max_length, which transformers derives from max_new_tokens),
      max_time, eos and pad ids, return_dict_in_generate / output_scores / output_logits;
    - transformers' logits processors (repetition_penalty, no_repeat_ngram_size, bad_words_ids, min_new_tokens,
      a user's logits_processor=...) run before the chain. The sampling warpers transformers adds for
      do_sample=True (temperature, top_k, top_p, min_p, typical_p, ...) are dropped with a warning: the chain
      decides how to sample (pass do_sample=False to silence it);
    - transformers' stopping criteria run next to ours; its length, time and eos criteria are replaced by ours;
    - assisted generation (prompt_lookup_num_tokens, assistant_model, assistant_early_exit) speculates with
      prompt_lookup, draft_model, early_exit: the chain's tokens in fewer model calls (`draft=` in `defaults` wins).
    Refused with a ConfigError: use_mtp, model inputs other than input_ids / attention_mask (inputs_embeds,
    pixel_values, ...) and a past_key_values that already holds tokens. Not seen at all: `streamer` (transformers
    does not hand it to a callable; use samplechain.generation.stream).
    Extra keywords of model.generate (transformers hands a callable the keywords its signature declares, and keeps
    them out of the generation config): `seed`, `params` (per-prompt chain parameters), `stop_strings`, `stop_regex`
    and `include_stop_str_in_output` (one bool or one per prompt), as samplechain's generate() takes them; with
    return_dict_in_generate=True the texts are cut at the stop match and `stop_texts` names it.
    `defaults` go to the loop (checked here); `tokenizer=` belongs there (transformers does not hand model.generate's
    tokenizer to a callable). Returns the sequences (B, L), or GenerationOutput with return_dict_in_generate=True.
    """
    from ..generation import generate as sc_generate

    resolved = _chain(chain, host)
    _check_defaults(defaults)

    def custom_generate(
        model: Any,
        input_ids: torch.LongTensor,
        logits_processor: Any = None,
        stopping_criteria: Any = None,
        generation_config: Any = None,
        tokenizer: Any = None,
        seed: int | None = None,
        params: Any = None,
        stop_strings: Any = None,
        stop_regex: Any = None,
        include_stop_str_in_output: Any = None,
        **model_kwargs: Any,
    ) -> Any:
        gc = generation_config or model.generation_config
        _check_model_inputs(model_kwargs)
        processors, extra = _processors_without_warpers(logits_processor, gc), _extra_criteria(stop, stopping_criteria)
        processors, chain_of_call, negative = _guidance(processors, resolved)
        beams = int(gc.num_beams or 1)
        copies = int(gc.num_return_sequences or 1)
        prompts, mask = _fold_repeats(input_ids, model_kwargs.get("attention_mask"), max(beams, copies))
        eos, pad = _eos_and_pad(gc)
        kwargs: dict[str, Any] = dict(defaults)
        # transformers drops `tokenizer` before calling a custom_generate callable: take it from the defaults
        tokenizer = tokenizer if tokenizer is not None else kwargs.get("tokenizer")
        kwargs.pop("tokenizer", None)
        kwargs.update(
            input_ids=prompts,
            attention_mask=mask,
            chain=chain_of_call,
            **negative,
            stop=extra,
            max_length=int(gc.max_length) if gc.max_length else None,
            max_time=gc.max_time,
            eos_token_id=eos if eos is not None and (not isinstance(eos, torch.Tensor) or eos.numel()) else None,
            pad_token_id=pad,
            **_own_keywords(kwargs, seed, params, stop_strings, stop_regex, include_stop_str_in_output),
            output_scores=bool(gc.output_scores),
            output_logits=bool(gc.output_logits),
            logits_processor=LogitsProcessorList(processors) if processors else None,
            generation_config=gc,
            num_return_sequences=copies,
        )
        if beams > 1:
            penalty = 1.0 if gc.length_penalty is None else float(gc.length_penalty)
            kwargs.update(num_beams=beams, length_penalty=penalty, early_stopping=gc.early_stopping)
        kwargs.update(ignore_eos=eos is None, draft=_draft_of(gc, defaults))
        out = sc_generate(model, tokenizer, None, **kwargs)
        return out if gc.return_dict_in_generate else out.sequences

    return custom_generate


# what model.generate's inputs and generation config give custom_generate, so a default for them would be overridden
_SET_BY_MODEL_GENERATE = {
    *("input_ids", "attention_mask", "generation_config", "logits_processor", "eos_token_id", "pad_token_id"),
    *("max_length", "max_time", "output_scores", "output_logits", "num_return_sequences", "ignore_eos"),
    *("num_beams", "length_penalty", "early_stopping", "prompts", "settings", "model"),
}


def _check_defaults(defaults: Mapping[str, Any]) -> None:
    """as_custom_generate's defaults, checked when it is made: each must be an argument of samplechain's generate()
    that model.generate does not set itself."""
    from ..generation.session import Generation

    known = {*inspect.signature(Generation).parameters, "progress"} - _SET_BY_MODEL_GENERATE
    for key in defaults:
        given = f"as_custom_generate(..., {key}=...)"
        if key in _SET_BY_MODEL_GENERATE:
            raise ConfigError(f"{given}: model.generate sets it from its own arguments; give it to model.generate")
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known))
            hint = (
                f"did you mean {close[0]}=?"
                if close
                else "decoding settings belong in the chain (docs/transformers.md)"
            )
            raise ConfigError(f"{given}: not an argument of samplechain's generate(); {hint}")
