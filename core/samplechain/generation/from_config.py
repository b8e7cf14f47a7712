"""The chain transformers would run for a GenerationConfig, in the order of `GenerationMixin._get_logits_processor`.

Processors (always): cfg (guidance_scale), sequence_bias, penalties (repetition_penalty, transformers scope),
no_repeat_ngram, bad_words, min_new_tokens, forced_bos, forced_eos, inf_nan_remove (remove_invalid_values),
length_decay (exponential_decay_length_penalty), suppress_tokens, begin_suppress_tokens; then, with do_sample,
the warpers temperature, top_h, top_k, top_p, min_p, typical, epsilon, eta; then watermark and renormalize; then
dist (do_sample) or greedy. Settings no sampler carries (min_length, encoder_repetition_penalty, diversity_penalty,
penalty_alpha ...) are named in a GenerationWarning. generate()'s keywords that are GenerationConfig fields
(`temperature=0.7, do_sample=True`) update a copy of the config first, as model.generate does (`with_settings`).
Inside generate(), `fit_to_generation` sets per request what transformers takes from the generation itself:
forced_eos at the last token the length limit allows, forced_bos only for a one-token input.
"""

from __future__ import annotations

import copy
import difflib
import inspect
import math
import numbers
import reprlib
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ..contracts import token_id_list
from ..engine.chain import Chain
from ..engine.config import load_config
from ..engine.discovery import PluginHost
from ..engine.mixed import MixedChains
from ..errors import ConfigError, GenerationWarning

__all__ = [
    "asked_settings",
    "chain_from_generation_config",
    "fit_to_generation",
    "resolve_chain",
    "unmapped_settings",
    "with_settings",
]

# GenerationConfig fields that change decoding and that no sampler carries (with their defaults)
_UNMAPPED = {
    "encoder_repetition_penalty": 1.0,
    "min_length": 0,
    "diversity_penalty": 0.0,
    "penalty_alpha": None,
    "encoder_no_repeat_ngram_size": 0,
    "num_beam_groups": 1,
    "dola_layers": None,
}
# fields the mapping reads (with their defaults): a chain passed explicitly replaces what they ask for
_MAPPED = {
    "repetition_penalty": 1.0,
    "typical_p": 1.0,
    "epsilon_cutoff": 0.0,
    "eta_cutoff": 0.0,
    "no_repeat_ngram_size": 0,
    "bad_words_ids": None,
    "suppress_tokens": None,
    "begin_suppress_tokens": None,
    "sequence_bias": None,
    "min_new_tokens": None,
    "top_h": None,
    "guidance_scale": None,
    "forced_bos_token_id": None,
    "forced_eos_token_id": None,
    "remove_invalid_values": False,
    "exponential_decay_length_penalty": None,
    "watermarking_config": None,
    "renormalize_logits": False,
}


def _non_default(config: Any, table: dict[str, Any]) -> list[str]:
    out = []
    for key, default in table.items():
        value = getattr(config, key, default)
        if value is not None and value != default and value != []:
            out.append(f"{key}={value!r}")
    return out


def unmapped_settings(config: Any) -> list[str]:
    return _non_default(config, _UNMAPPED)


def asked_settings(config: Any) -> list[str]:
    """Every non-default decoding setting of the config (what a chain given explicitly replaces)."""
    return _non_default(config, _MAPPED) + _non_default(config, _UNMAPPED)


def _sequence_bias(value: Any) -> list[list[Any]]:
    items = value.items() if isinstance(value, dict) else value
    return [[list(seq), float(b)] for seq, b in items]


def _getter(config: Any):
    """config.key, or transformers' global default when the config leaves it None (transformers 5 fills those in
    generate(): an unset top_k samples with top_k 50)."""
    defaults_of = getattr(config, "_get_default_generation_params", None)
    defaults = defaults_of() if callable(defaults_of) else {}

    def get(key: str, default: Any = None) -> Any:
        value = getattr(config, key, None)
        return value if value is not None else defaults.get(key, default)

    return get


def _processors(config: Any) -> list[dict[str, Any]]:
    g = _getter(config)
    eos = token_id_list(g("eos_token_id")) if g("eos_token_id") is not None else []
    out: list[dict[str, Any]] = []
    if g("guidance_scale") is not None and g("guidance_scale") != 1:
        out.append({"use": "cfg", "scale": _real(g("guidance_scale"))})
    if g("sequence_bias"):
        out.append({"use": "sequence_bias", "bias": _sequence_bias(g("sequence_bias"))})
    if g("repetition_penalty") is not None and g("repetition_penalty") != 1.0:
        out.append({"use": "penalties", "repeat": _real(g("repetition_penalty")), "scope": "transformers"})
    if g("no_repeat_ngram_size"):
        out.append({"use": "no_repeat_ngram", "n": _whole(g("no_repeat_ngram_size"))})
    if g("bad_words_ids"):
        out.append({"use": "bad_words", "ids": [list(s) for s in g("bad_words_ids")], "eos_ids": eos})
    if g("min_new_tokens"):
        out.append({"use": "min_new_tokens", "n": _whole(g("min_new_tokens")), "eos_ids": eos})
    if g("forced_bos_token_id") is not None:
        out.append({"use": "forced_bos", "bos_id": _whole(g("forced_bos_token_id"))})
    if g("forced_eos_token_id") is not None and g("max_length"):
        out.append(
            {
                "use": "forced_eos",
                "eos_ids": token_id_list(g("forced_eos_token_id")),
                "max_length": _whole(g("max_length")),
            }
        )
    if g("remove_invalid_values"):
        out.append({"use": "inf_nan_remove"})
    if g("exponential_decay_length_penalty") is not None:
        start, factor = g("exponential_decay_length_penalty")
        out.append({"use": "length_decay", "start": _whole(start), "factor": _real(factor), "eos_ids": eos})
    if g("suppress_tokens"):
        out.append({"use": "suppress_tokens", "ids": [_whole(t) for t in g("suppress_tokens")]})
    if g("begin_suppress_tokens"):
        out.append({"use": "begin_suppress_tokens", "ids": [_whole(t) for t in g("begin_suppress_tokens")]})
    return out


def _warpers(config: Any) -> list[dict[str, Any]]:
    g = _getter(config)
    out: list[dict[str, Any]] = []
    if g("temperature") is not None and g("temperature") != 1.0:
        out.append({"use": "temperature", "t": _real(g("temperature"))})
    if g("top_h") is not None:
        out.append({"use": "top_h", "top_h": _real(g("top_h"))})
    if g("top_k"):
        out.append({"use": "top_k", "k": _whole(g("top_k"))})
    if g("top_p") is not None and g("top_p") < 1.0:
        out.append({"use": "top_p", "p": _real(g("top_p"))})
    if g("min_p") is not None:
        out.append({"use": "min_p", "p": _real(g("min_p"))})
    if g("typical_p") is not None and g("typical_p") < 1.0:
        out.append({"use": "typical", "p": _real(g("typical_p")), "semantics": "transformers"})
    if g("epsilon_cutoff") is not None and 0.0 < g("epsilon_cutoff") < 1.0:
        out.append({"use": "epsilon", "epsilon": _real(g("epsilon_cutoff"))})
    if g("eta_cutoff") is not None and 0.0 < g("eta_cutoff") < 1.0:
        out.append({"use": "eta", "epsilon": _real(g("eta_cutoff"))})
    return out


def _finishers(config: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    wm = getattr(config, "watermarking_config", None)
    if wm is not None:
        entry: dict[str, Any] = {"use": "watermark"}
        for key in ("greenlist_ratio", "bias", "hashing_key", "seeding_scheme", "context_width"):
            value = wm.get(key) if isinstance(wm, dict) else getattr(wm, key, None)
            if value is not None:
                entry[key] = value
        out.append(entry)
    if getattr(config, "renormalize_logits", False):
        out.append({"use": "renormalize"})
    return out


def _whole(value: Any) -> Any:
    """An integer setting as an int (50.0 too); anything else as it is, for the chain's check to name."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value):
        return int(float(value)) if float(value).is_integer() else value
    return value


def _real(value: Any) -> Any:
    """A number setting as a float; anything else as it is, for the chain's check to name."""
    return float(value) if isinstance(value, numbers.Real) and not isinstance(value, bool) else value


def _check_kinds(config: Any) -> None:
    """A sampling setting whose value is not the kind transformers' processors take is one ConfigError naming the
    setting (an integer setting may be a whole float: top_k = 50.0)."""
    for key, kind in _KINDS.items():
        value = getattr(config, key, None)
        if value is None:
            continue
        whole = isinstance(_whole(value), int) and not isinstance(value, bool)
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or (kind is int and not whole):
            expected = "an integer" if kind is int else "a number"
            raise ConfigError(f"generation_config.{key} = {value!r}: expected {expected}, as transformers takes it")


def _check_lists(config: Any) -> None:
    """A list setting that is not of the shape transformers' processors take is one ConfigError naming the setting
    (a string would otherwise be read as a list of its characters, a float id cut to an int)."""
    for key, (fits, expected) in _SHAPES.items():
        value = getattr(config, key, None)
        if isinstance(value, torch.Tensor):
            value = value.tolist()
        if value is not None and not fits(value):
            raise ConfigError(
                f"generation_config.{key} = {reprlib.repr(value)}: expected {expected}, as transformers takes it"
            )


def _is_id(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and int(value) >= 0


def _are_ids(value: Any, at_least: int = 0) -> bool:
    return isinstance(value, (list, tuple)) and len(value) >= at_least and all(_is_id(t) for t in value)


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _fits_bias(value: Any) -> bool:
    pairs = list(value.items()) if isinstance(value, dict) else value
    return isinstance(pairs, (list, tuple)) and all(
        isinstance(pair, (list, tuple)) and len(pair) == 2 and _are_ids(pair[0], 1) and _is_real(pair[1])
        for pair in pairs
    )


_IDS = "a list of token ids (non-negative integers)"
_SHAPES = {  # the list settings, each with a test of its shape
    "bad_words_ids": (
        lambda v: isinstance(v, (list, tuple)) and all(_are_ids(words, 1) for words in v),
        "a list of token-id lists, each of at least one id",
    ),
    "suppress_tokens": (_are_ids, _IDS),
    "begin_suppress_tokens": (_are_ids, _IDS),
    "sequence_bias": (_fits_bias, "{(token ids): bias} or [[token ids, bias], ...], each bias a number"),
    "exponential_decay_length_penalty": (
        lambda v: isinstance(v, (list, tuple)) and len(v) == 2 and _is_id(v[0]) and _is_real(v[1]),
        "(start, factor): a token count and a number",
    ),
    "forced_eos_token_id": (lambda v: _is_id(v) or _are_ids(v, 1), "a token id or " + _IDS),
    "eos_token_id": (lambda v: _is_id(v) or _are_ids(v), "a token id or " + _IDS),
}


_KINDS: dict[str, type] = {  # the sampling settings of one number each
    "temperature": float,
    "top_k": int,
    "top_p": float,
    "min_p": float,
    "typical_p": float,
    "epsilon_cutoff": float,
    "eta_cutoff": float,
    "top_h": float,
    "repetition_penalty": float,
    "no_repeat_ngram_size": int,
    "min_new_tokens": int,
    "guidance_scale": float,
}


def chain_from_generation_config(config: Any, *, host: PluginHost | None = None) -> Chain:
    """The chain transformers would run for a GenerationConfig (see the module docstring for the order)."""
    unmapped = unmapped_settings(config) if config is not None else []
    if unmapped:
        warnings.warn(
            f"the generation config asks for {', '.join(unmapped)}, which no samplechain sampler carries: "
            "they are not applied (run the chain inside model.generate with the adapters to keep them)",
            GenerationWarning,
            stacklevel=3,
        )
    if config is None:
        return Chain.load({"name": "greedy (generation config)", "samplers": [{"use": "greedy"}]}, host=host)
    sampling = bool(getattr(config, "do_sample", False))
    _check_kinds(config)
    _check_lists(config)
    try:
        samplers = _processors(config) + (_warpers(config) if sampling else []) + _finishers(config)
    except (TypeError, ValueError, OverflowError) as exc:  # a list setting of the wrong kind
        raise ConfigError(
            "the generation config's list settings (bad_words_ids, suppress_tokens, sequence_bias, "
            f"exponential_decay_length_penalty, ...) are not of the kinds transformers takes: {exc}"
        ) from None
    samplers.append({"use": "dist" if sampling else "greedy"})
    name = "sampling (generation config)" if sampling else "greedy (generation config)"
    # errors name the config as their source (a bad value given as a generate() keyword lands there)
    config = load_config({"name": name, "samplers": samplers}, host=host, name="the generation config's chain")
    return Chain(config, host=host)


def fit_to_generation(
    chain: Chain, store: Any, request_ids: list[str], prompt_lengths: Any, width: int, bound: int | None
) -> None:
    """Per request, what transformers' processors take from the generation rather than from the config: forced_eos
    forces the last token the length limit allows (transformers' max_length is the padded prompt `width` plus
    max_new_tokens; here each row's own prompt length plus the `bound` on new tokens, the same step), and
    forced_bos forces only where the padded prompt is one token (an encoder-decoder's decoder start: never a
    decoder-only prompt of more tokens)."""
    names = {s.name for s in chain.samplers}
    for request_id, length in zip(request_ids, prompt_lengths.tolist()):
        params: dict[str, int] = {}
        if "forced_eos" in names and bound is not None:
            params["forced_eos_max_length"] = length + bound
        if "forced_bos" in names and width != 1:
            params["forced_bos_token_id"] = -1
        if params:
            store.update(request_id, params)


def resolve_chain(chain: Any, generation_config: Any, host: PluginHost, *, check: bool = True) -> Chain | MixedChains:
    """generate()'s chain=: the generation config's chain where it is None (a warning where the config asks for
    settings a given chain replaces, with `check`), a Chain, a TOML file, a dict, "preset:NAME", or one per prompt
    (a MixedChains)."""
    if chain is None:
        return chain_from_generation_config(generation_config, host=host)
    if (
        check
        and generation_config is not None
        and (getattr(generation_config, "do_sample", False) or asked_settings(generation_config))
    ):
        asked = ["do_sample=True"] if getattr(generation_config, "do_sample", False) else []
        warnings.warn(
            f"the model's generation config asks for {', '.join(asked + asked_settings(generation_config))}; "
            "the chain given replaces it (the chain alone decides the decoding)",
            GenerationWarning,
            stacklevel=6,
        )
    if isinstance(chain, (Chain, MixedChains)):
        return chain
    if isinstance(chain, (str, Path, Mapping)):
        return Chain.load(chain, host=host)
    if isinstance(chain, (list, tuple)) and chain:  # one chain per prompt: a mixed batch
        loaded = [resolve_chain(c, None, host, check=False) for c in chain]
        chains = [c for c in loaded if not isinstance(c, MixedChains)]
        if len(chains) != len(loaded):
            raise ConfigError("chain=[...]: each entry is one prompt's chain, not a list of chains")
        keys: dict[int, str] = {}
        for c in chains:
            keys.setdefault(id(c), str(len(keys)))
        mixed = MixedChains({keys[id(c)]: c for c in chains})
        mixed.row_chains = [keys[id(c)] for c in chains]  # prompt i -> its chain's key
        return mixed
    raise ConfigError(
        f"chain={chain!r}: pass a Chain, a TOML file path, a dict, 'preset:NAME', or one of these per prompt in a list"
    )


# model.generate's keywords that are not decoding settings: where generate() has them
_ELSEWHERE = {
    "streamer": "stream(model, tokenizer, prompts, ...) yields each token's text as it is chosen",
    "assistant_model": "speculative decoding is draft=: {'use': 'draft_model', 'model': MODEL} (docs/speculative.md)",
    "prompt_lookup_num_tokens": "speculative decoding is draft=: {'use': 'prompt_lookup', 'num_tokens': N}",
    "assistant_early_exit": "speculative decoding is draft=: {'use': 'early_exit', 'layers': N}",
    "use_cache": "generation always runs on the model's cache",
    "return_dict_in_generate": "generate() always returns a GenerationOutput: take its .sequences",
}
_ALWAYS = {"use_cache": True, "return_dict_in_generate": True}  # what generate() does anyway: accepted as given
# the GenerationConfig fields chain_from_generation_config reads: the keywords generate() takes as model.generate does
_DECODING = {*_MAPPED, "do_sample", "temperature", "top_k", "top_p", "min_p"}


def with_settings(model: Any, generation_config: Any, chain: Any, settings: Mapping[str, Any], known: Any) -> Any:
    """generate()'s keywords that are GenerationConfig fields, as model.generate takes them: a copy of the generation
    config (`generation_config`, else the model's) with them set, whose chain the generation runs. A keyword that
    is no field (`known`: the callable whose own arguments are offered as suggestions), a setting no sampler
    carries, and settings beside a chain= are one ConfigError each."""
    if not settings:
        return generation_config
    from transformers import GenerationConfig

    fields = GenerationConfig().to_dict()
    decoding: dict[str, Any] = {}
    for key, value in settings.items():
        if key in _ALWAYS and value == _ALWAYS[key]:
            continue
        given = f"generate(..., {key}={_shown(value)})"
        if key in _ELSEWHERE:
            raise ConfigError(f"{given}: {_ELSEWHERE[key]}")
        if key in _UNMAPPED:
            raise ConfigError(
                f"{given}: a transformers setting no samplechain sampler carries; drop it, or run a chain inside "
                "model.generate with the adapters (docs/transformers.md) to keep it"
            )
        if key in fields and key not in _DECODING:
            raise ConfigError(
                f"{given}: a GenerationConfig field that generate() does not use (it takes the decoding settings: "
                f"{', '.join(sorted(_DECODING))}); drop it"
            )
        if key not in fields:
            close = difflib.get_close_matches(key, [*inspect.signature(known).parameters, *_DECODING])
            hint = f"did you mean {close[0]}=?" if close else "see docs/generation.md for generate()'s arguments"
            raise ConfigError(f"{given}: not an argument of generate(); {hint}")
        decoding[key] = value
    asked = ", ".join(f"{k}={_shown(v)}" for k, v in decoding.items())
    if decoding and chain is not None:
        raise ConfigError(
            f"generate(..., {asked}) with chain=: the chain alone decides the decoding; put the settings in the "
            "chain (e.g. {'use': 'temperature', 't': 0.7}) or drop chain= to have them mapped as transformers does"
        )
    if not decoding:
        return generation_config
    base = generation_config if generation_config is not None else getattr(model, "generation_config", None)
    config = copy.deepcopy(base) if base is not None else GenerationConfig()
    config.update(**decoding)
    try:
        config.validate()
    except ValueError as exc:
        raise ConfigError(f"generate(..., {asked}): {exc}") from None
    return config


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"<{type(value).__name__}>"
