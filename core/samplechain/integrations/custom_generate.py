"""`model.generate(custom_generate=as_custom_generate(chain))`: transformers prepares the inputs and the generation
config, and samplechain's own loop decodes with the chain (its processors before the chain, its criteria beside
ours, assisted generation as speculation, guidance as cfg).

    model.generate(**enc, custom_generate=as_custom_generate(chain, tokenizer=tok), max_new_tokens=40)
"""

from __future__ import annotations

import difflib
import inspect
import sys
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from transformers import GenerationConfig, LogitsProcessorList
from transformers.generation import logits_process as _lp
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria, MaxTimeCriteria

from ..engine.chain import Chain
from ..engine.discovery import PluginHost
from ..errors import ConfigError
from ..generation.drafting import keeps_state
from ..generation.guided import with_guidance
from .transformers import _SPECULATE_HERE, _chain

__all__ = ["as_custom_generate"]


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
    negative = {
        "negative_prompt_ids": context["input_ids"],
        "negative_prompt_attention_mask": context["attention_mask"],
    }
    others = [p for p in processors if p not in guiding]
    return others, with_guidance(chain, float(guiding[0].guidance_scale)), negative


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


def _draft_length(config: Any, whose: str) -> dict[str, Any]:
    """transformers' num_assistant_tokens and num_assistant_tokens_schedule of a generation config, where set, as a
    draft table's keys: the longest draft (num_tokens), and "constant" as a fixed draft length (adaptive = False;
    transformers drafts 20 where the number is unset). Unset, the drafter's own longest draft and the loop's
    adaptive lengths (the "heuristic" schedules' counterpart) stand."""
    n = getattr(config, "num_assistant_tokens", None)
    constant = getattr(config, "num_assistant_tokens_schedule", None) == "constant"
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise ConfigError(
            f"{whose}.generation_config.num_assistant_tokens = {n!r}: the number of tokens the assistant drafts must "
            "be a whole number >= 1"
        )
    n = 20 if n is None and constant else n
    return ({} if n is None else {"num_tokens": n}) | ({"adaptive": False} if constant else {})


def _draft_of(gc: Any, defaults: Mapping[str, Any], model: Any = None) -> Any:
    """The loop's draft= from transformers' assisted-generation settings, each with the drafter that keeps the
    chain's tokens: prompt_lookup_num_tokens (max_matching_ngram_size) -> prompt_lookup, assistant_model ->
    draft_model, assistant_early_exit -> early_exit (assistant_confidence_threshold -> p_min,
    num_assistant_tokens and its schedule -> the draft length, read where transformers reads them: the assistant's
    generation config, for assistant_early_exit `model`'s own). A draft= given to as_custom_generate wins; beam
    search drafts nothing, as in transformers; use_mtp (no such drafter) is refused."""
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
        drafter = {"use": "draft_model", "model": assistant, "p_min": _confidence_threshold(config)}
        return drafter | _draft_length(config, "assistant_model")
    if early_exit is not None:
        drafter = {"use": "early_exit", "layers": int(early_exit), "p_min": _confidence_threshold(gc)}
        return drafter | _draft_length(getattr(model, "generation_config", None), "model")
    if n is not None:
        ngram = getattr(gc, "max_matching_ngram_size", None) or 2  # transformers' default
        return {"use": "prompt_lookup", "num_tokens": int(n), "max_ngram": int(ngram)}
    return None


def _check_stateful(processors: Sequence[Any], draft: Any) -> None:
    """Assisted generation with one of transformers' processors that keep state from call to call (SynthID's
    watermark): one error in model.generate's terms, where the loop's would speak of draft=."""
    stateful = [p for p in processors if keeps_state(p)]
    if draft is None or not stateful:
        return
    name = type(stateful[0]).__name__
    given = " (watermarking_config=)" if "SynthID" in name else ""
    raise ConfigError(
        f"model.generate(custom_generate=as_custom_generate(...)) with assisted generation and transformers' "
        f"{name}{given}: it keeps its own state from call to call, and speculation calls it at drafted positions it "
        "then takes back; drop prompt_lookup_num_tokens / assistant_model / assistant_early_exit (or draft=), or "
        "the processor"
    )


def _config_keywords(gc: Any, defaults: Mapping[str, Any], model: Any = None) -> dict[str, Any]:
    """The loop's keywords that transformers' prepared generation config gives: length and time limits, eos and
    pad ids, the outputs asked for, copies and beams, and the draft of its assisted-generation settings."""
    eos, pad = _eos_and_pad(gc)
    beams = int(gc.num_beams or 1)
    kwargs: dict[str, Any] = {
        "max_length": int(gc.max_length) if gc.max_length else None,
        "max_time": gc.max_time,
        "eos_token_id": eos if eos is not None and (not isinstance(eos, torch.Tensor) or eos.numel()) else None,
        "pad_token_id": pad,
        "ignore_eos": eos is None,
        "output_scores": bool(gc.output_scores),
        "output_logits": bool(gc.output_logits),
        "generation_config": gc,
        "num_return_sequences": int(gc.num_return_sequences or 1),
        "draft": _draft_of(gc, defaults, model),
    }
    if beams > 1:
        penalty = 1.0 if gc.length_penalty is None else float(gc.length_penalty)
        kwargs.update(num_beams=beams, length_penalty=penalty, early_stopping=gc.early_stopping)
    return kwargs


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
        copies = max(int(gc.num_beams or 1), int(gc.num_return_sequences or 1))
        prompts, mask = _fold_repeats(input_ids, model_kwargs.get("attention_mask"), copies)
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
            **_own_keywords(kwargs, seed, params, stop_strings, stop_regex, include_stop_str_in_output),
            logits_processor=LogitsProcessorList(processors) if processors else None,
            **_config_keywords(gc, defaults, model),
        )
        _check_stateful(processors, kwargs["draft"])
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
