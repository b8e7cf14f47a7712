"""transformers GenerationConfig <-> chain: `from_transformers`, `to_transformers`. See docs/convert.md for the mapping table."""

from __future__ import annotations

import copy
import os
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ...errors import ConfigError
from .common import (
    ConvertWarning,
    _checked,
    _commute,
    _Entry,
    _exported,
    _off,
    _only,
    _order,
    _plain,
    _temperature,
    chain_to_dict,
    read_json_object,
)

# ------------------------------------------------------------------------------------------ transformers
_TF_ORDER = [
    "cfg",
    "sequence_bias",
    "penalties",
    "no_repeat_ngram",
    "bad_words",
    "min_new_tokens",
    "forced_bos",
    "forced_eos",
    "inf_nan_remove",
    "length_decay",
    "suppress_tokens",
    "begin_suppress_tokens",
    "temperature",
    "top_h",
    "top_k",
    "top_p",
    "min_p",
    "typical",
    "epsilon",
    "eta",
    "watermark",
    "renormalize",
]
_TF_WARPERS = {"temperature", "top_h", "top_k", "top_p", "min_p", "typical", "epsilon", "eta"}


def _load_generation_config(source: Any) -> tuple[Any, str]:
    from transformers import GenerationConfig

    if isinstance(source, GenerationConfig):
        return copy.deepcopy(source), "<GenerationConfig>"
    if isinstance(source, Mapping):
        raw, label = dict(source), "<dict>"
    else:
        path = Path(source) if isinstance(source, (str, os.PathLike)) and str(source).strip() else source
        if isinstance(path, Path) and path.is_dir():
            path = path / "generation_config.json"
        label = str(path)
        raw = read_json_object(path, "generation settings (a generation_config.json or its folder)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            config = GenerationConfig.from_dict(raw)
    except Exception as exc:  # noqa: BLE001 - transformers raises ValueError / TypeError on bad settings
        raise ConfigError(f"{label}: not a valid GenerationConfig: {_wrong_kinds(raw)}{exc}") from None
    return config, label


def _wrong_kinds(settings: Mapping[str, Any]) -> str:
    """'top_k = 'many' (expected int, e.g. 50): ' for settings whose JSON kind differs from generate()'s default:
    transformers' own message ("invalid literal for int() ...") names no key."""
    from transformers import GenerationConfig

    defaults: dict[str, Any] = getattr(GenerationConfig(), "_get_default_generation_params", dict)()

    def same(value: Any, default: Any) -> bool:  # a bool is no number here; an int is a valid float
        if isinstance(default, bool) or isinstance(value, bool):
            return isinstance(value, bool) and isinstance(default, bool)
        if isinstance(default, (int, float)):
            return isinstance(value, int) or (isinstance(value, float) and isinstance(default, float))
        return isinstance(value, type(default))

    culprits = [
        f"{k} = {v!r} (expected {type(defaults[k]).__name__}, e.g. {defaults[k]!r})"
        for k, v in settings.items()
        if defaults.get(k) is not None and v is not None and not same(v, defaults[k])
    ]
    return f"{'; '.join(culprits)}: " if culprits else ""


def from_transformers(source: Any) -> dict[str, Any]:
    """The chain `model.generate()` runs for a GenerationConfig, a generation_config.json (file or folder) or a dict.

    Unset settings take generate()'s global defaults (`GenerationConfig._get_default_generation_params`: top_k 50,
    ...); the samplers come from `samplechain.generation.from_config.chain_from_generation_config`. max_new_tokens,
    max_length (when set), max_time and stop_strings become stop criteria.
    """
    from ...generation.from_config import chain_from_generation_config

    config, label = _load_generation_config(source)
    diff = config.to_diff_dict()
    defaults: dict[str, Any] = getattr(config, "_get_default_generation_params", dict)()
    for key, value in defaults.items():
        if getattr(config, key, None) is None and value is not None:
            setattr(config, key, value)
    wrong = _wrong_kinds(diff)
    if wrong:  # named by the settings' own keys, before the chain would name its entries
        raise ConfigError(f"{label}: not a valid GenerationConfig: {wrong[:-2]}")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            chain = chain_from_generation_config(config)
        except ConfigError as exc:
            raise ConfigError(f"{label}: the generation settings make an invalid chain: {exc}") from None
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{label}: not a valid GenerationConfig: {_wrong_kinds(diff)}{exc}") from None
    for w in caught:
        warnings.warn(f"{label}: {w.message}", ConvertWarning, stacklevel=2)
    out = chain_to_dict(chain)
    out["name"] = f"transformers ({Path(label).name})" if label[0] != "<" else "transformers"
    stop: list[dict[str, Any]] = []
    # the values as they are: the chain's check names one of the wrong kind (max_new_tokens = inf, ...)
    if config.max_new_tokens is not None:
        stop.append({"use": "max_new_tokens", "n": config.max_new_tokens})
    elif "max_length" in diff and config.max_length is not None:
        stop.append({"use": "max_length", "n": config.max_length})
    if getattr(config, "max_time", None) is not None:
        stop.append({"use": "max_time", "seconds": config.max_time})
    strings = getattr(config, "stop_strings", None)
    if strings:
        if not isinstance(strings, (str, list, tuple)):
            raise ConfigError(f"{label}: stop_strings = {strings!r}: expected a string or a list of strings")
        stop.append({"use": "stop_strings", "strings": [strings] if isinstance(strings, str) else list(strings)})
    if stop:
        out["stop"] = stop
    return _checked(out, label)


# Each processor's GenerationConfig keywords from its entry (after checking the entry fits them).
_TfKwargs = Callable[[_Entry, str], dict[str, Any]]


def _tf_fixed(allowed: tuple[str, ...], kwargs: Callable[[dict[str, Any]], dict[str, Any]], **fixed: Any) -> _TfKwargs:
    """Keywords of a processor that has only the parameters `allowed` (the others at their defaults or `fixed`)."""

    def build(e: _Entry, target: str) -> dict[str, Any]:
        _only(e, target, allowed, **fixed)
        return kwargs(e.p)

    return build


def _tf_penalties(e: _Entry, target: str) -> dict[str, Any]:
    p = e.p
    if p["scope"] != "transformers" or p["frequency"] != 0 or p["presence"] != 0:
        raise ConfigError(
            f"{e.label()}: transformers has only repetition_penalty over the whole sequence "
            f'(scope = "transformers", frequency = presence = 0); this entry has scope = '
            f"{p['scope']!r}, frequency = {p['frequency']!r}, presence = {p['presence']!r}"
        )
    return {"repetition_penalty": float(p["repeat"])}


def _tf_forced_eos(e: _Entry, target: str) -> dict[str, Any]:
    ids = list(e.p["eos_ids"])
    return {"forced_eos_token_id": ids[0] if len(ids) == 1 else ids, "max_length": int(e.p["max_length"])}


def _tf_temperature(e: _Entry, target: str) -> dict[str, Any]:
    t = _temperature(e, target)
    if t <= 0:
        raise ConfigError(f"{e.label()}: t = {t!r}: transformers' temperature must be > 0 (use greedy)")
    return {"temperature": t}


_TF_KWARGS: dict[str, _TfKwargs] = {
    "cfg": _tf_fixed(("scale",), lambda p: {"guidance_scale": float(p["scale"])}),
    "sequence_bias": lambda e, t: {"sequence_bias": [[list(seq), float(b)] for seq, b in _plain(e.p["bias"])]},
    "penalties": _tf_penalties,
    "no_repeat_ngram": lambda e, t: {"no_repeat_ngram_size": int(e.p["n"])},
    "bad_words": _tf_fixed(("ids", "eos_ids"), lambda p: {"bad_words_ids": _plain(p["ids"])}),
    "min_new_tokens": lambda e, t: {"min_new_tokens": int(e.p["n"])},
    "forced_bos": lambda e, t: {"forced_bos_token_id": int(e.p["bos_id"])},
    "forced_eos": _tf_forced_eos,
    "inf_nan_remove": lambda e, t: {"remove_invalid_values": True},
    "length_decay": lambda e, t: {"exponential_decay_length_penalty": [int(e.p["start"]), float(e.p["factor"])]},
    "suppress_tokens": lambda e, t: {"suppress_tokens": list(e.p["ids"])},
    "begin_suppress_tokens": _tf_fixed(("ids",), lambda p: {"begin_suppress_tokens": list(p["ids"])}),
    "temperature": _tf_temperature,
    "temp_ext": _tf_temperature,
    "top_h": _tf_fixed(("top_h",), lambda p: {"top_h": float(p["top_h"])}),
    "top_k": _tf_fixed(("k",), lambda p: {"top_k": int(p["k"])}),
    "top_p": _tf_fixed(("p",), lambda p: {"top_p": float(p["p"])}),
    "min_p": _tf_fixed(("p",), lambda p: {"min_p": float(p["p"])}),
    "typical": _tf_fixed(("p",), lambda p: {"typical_p": float(p["p"])}, semantics="transformers"),
    "epsilon": _tf_fixed(("epsilon",), lambda p: {"epsilon_cutoff": float(p["epsilon"])}),
    "eta": _tf_fixed(("epsilon",), lambda p: {"eta_cutoff": float(p["epsilon"])}),
    "watermark": lambda e, t: {"watermarking_config": {k: _plain(v) for k, v in e.p.items()}},
    "renormalize": lambda e, t: {"renormalize_logits": True},
}
_TF_EOS_CARRIERS = {"bad_words", "min_new_tokens", "length_decay"}  # their eos_ids must agree with the eos criterion


def _tf_processors(body: list[_Entry], target: str) -> list[_Entry]:
    """The entries that do something, each one a transformers processor, in an order transformers can run."""
    active = [e for e in body if not _off(e)]
    ranked = []
    for e in active:
        name = "temperature" if e.name == "temp_ext" else e.name
        if name not in _TF_ORDER:
            raise ConfigError(f"{e.label()}: transformers has no {e.name} processor (it has: {', '.join(_TF_ORDER)})")
        ranked.append((e, _TF_ORDER.index(name)))
    _order(
        ranked,
        target,
        f"transformers applies its processors in the fixed order of _get_logits_processor ({' -> '.join(_TF_ORDER)})",
        _commute,
    )
    return active


def _tf_selector(selector: _Entry, active: list[_Entry], kw: dict[str, Any]) -> None:
    """do_sample from the selector: dist samples (with no seed of its own), greedy carries no warpers."""
    if selector.name == "dist":
        if selector.p["seed"] is not None:
            raise ConfigError(
                f"{selector.label()}: seed = {selector.p['seed']!r} cannot be expressed in a "
                "GenerationConfig (call transformers.set_seed before generate)"
            )
        kw["do_sample"] = True
        kw.setdefault("top_k", 0)  # generate() would otherwise apply its default top_k = 50
    elif selector.name == "greedy":
        kw["do_sample"] = False
        warpers = [e for e in active if (("temperature" if e.name == "temp_ext" else e.name) in _TF_WARPERS)]
        if warpers:
            raise ConfigError(
                f"{warpers[0].label()}: transformers skips the warpers (temperature, top_k, top_p ...)"
                " when do_sample=False, so a greedy chain cannot carry them"
            )
    else:
        raise ConfigError(
            f"{selector.label()}: transformers selects with sampling (dist) or greedy only, not {selector.name}"
        )


def _tf_stop(stop: list[_Entry], kw: dict[str, Any], eos_sets: list[tuple[_Entry, list[int]]]) -> None:
    """The stop criteria as GenerationConfig keywords; the eos criterion's ids join `eos_sets`."""
    for e in stop:
        if e.name == "max_new_tokens":
            kw["max_new_tokens"] = int(e.p["n"])
        elif e.name == "max_length":
            if "max_length" in kw and kw["max_length"] != int(e.p["n"]):
                raise ConfigError(
                    f"{e.label()}: n = {e.p['n']} conflicts with forced_eos' max_length = "
                    f"{kw['max_length']} (a GenerationConfig has one max_length)"
                )
            kw["max_length"] = int(e.p["n"])
        elif e.name == "max_time":
            kw["max_time"] = float(e.p["seconds"])
        elif e.name == "stop_strings":
            kw["stop_strings"] = list(e.p["strings"])
        elif e.name == "eos":
            if e.p["ids"]:
                eos_sets.append((e, list(e.p["ids"])))
        else:
            raise ConfigError(f"{e.label()}: transformers' GenerationConfig has no {e.name} stopping criterion")


def _tf_eos(eos_sets: list[tuple[_Entry, list[int]]], kw: dict[str, Any]) -> None:
    """The one eos_token_id of a GenerationConfig: every entry naming eos ids must name the same set."""
    if not eos_sets:
        return
    first = eos_sets[0]
    for e, ids in eos_sets[1:]:
        if sorted(set(ids)) != sorted(set(first[1])):
            raise ConfigError(
                f"{e.label()}: eos ids {ids} differ from {first[0].label()}'s {first[1]}: a "
                "GenerationConfig has one eos_token_id"
            )
    ids = first[1]
    kw["eos_token_id"] = ids[0] if len(ids) == 1 else ids


def to_transformers(chain: Any) -> dict[str, Any]:
    """GenerationConfig keyword arguments that make `generate()` run this chain; ConfigError where it cannot."""
    target = "transformers (GenerationConfig)"
    samplers, stop = _exported(chain, "transformers")
    active = _tf_processors(samplers[:-1], target)
    kw: dict[str, Any] = {}
    eos_sets: list[tuple[_Entry, list[int]]] = []
    for e in active:
        kw.update(_TF_KWARGS[e.name](e, target))
        if e.name in _TF_EOS_CARRIERS and e.p["eos_ids"]:
            eos_sets.append((e, list(e.p["eos_ids"])))
    _tf_selector(samplers[-1], active, kw)
    _tf_stop(stop, kw, eos_sets)
    _tf_eos(eos_sets, kw)
    return kw
