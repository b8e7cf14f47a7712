"""transformers GenerationConfig <-> chain: `from_transformers`, `to_transformers`. See docs/convert.md for the mapping table."""

from __future__ import annotations

import copy
import json
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...errors import ConfigError
from .common import (
    _TEMPS,
    ConvertWarning,
    _checked,
    _commute,
    _entries,
    _Entry,
    _off,
    _only,
    _order,
    _plain,
    _temperature,
    chain_to_dict,
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
        path = Path(source)
        if path.is_dir():
            path = path / "generation_config.json"
        label = str(path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ConfigError(f"{label}: file not found (expected a generation_config.json or its folder)") from None
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{label}: not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{label}: expected a JSON object of generation settings, got {type(raw).__name__}")
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

    defaults = getattr(GenerationConfig(), "_get_default_generation_params", dict)()

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
    defaults = getattr(config, "_get_default_generation_params", dict)()
    for key, value in defaults.items():
        if getattr(config, key, None) is None and value is not None:
            setattr(config, key, value)
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
    if config.max_new_tokens is not None:
        stop.append({"use": "max_new_tokens", "n": int(config.max_new_tokens)})
    elif "max_length" in diff and config.max_length is not None:
        stop.append({"use": "max_length", "n": int(config.max_length)})
    if getattr(config, "max_time", None) is not None:
        stop.append({"use": "max_time", "seconds": float(config.max_time)})
    strings = getattr(config, "stop_strings", None)
    if strings:
        stop.append({"use": "stop_strings", "strings": [strings] if isinstance(strings, str) else list(strings)})
    if stop:
        out["stop"] = stop
    return _checked(out, label)


def to_transformers(chain: Any) -> dict[str, Any]:
    """GenerationConfig keyword arguments that make `generate()` run this chain; ConfigError where it cannot."""
    target = "transformers (GenerationConfig)"
    samplers, stop, _ = _entries(chain)
    selector = samplers[-1]
    kw: dict[str, Any] = {}
    eos_sets: list[tuple[_Entry, list[int]]] = []

    def eos_of(e: _Entry) -> None:
        if e.p["eos_ids"]:
            eos_sets.append((e, list(e.p["eos_ids"])))

    active = [e for e in samplers[:-1] if not _off(e)]
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
    for e in active:
        n, p = e.name, e.p
        if n == "cfg":
            _only(e, target, ("scale",))
            kw["guidance_scale"] = float(p["scale"])
        elif n == "sequence_bias":
            kw["sequence_bias"] = [[list(seq), float(b)] for seq, b in _plain(p["bias"])]
        elif n == "penalties":
            if p["scope"] != "transformers" or p["frequency"] != 0 or p["presence"] != 0:
                raise ConfigError(
                    f"{e.label()}: transformers has only repetition_penalty over the whole sequence "
                    f'(scope = "transformers", frequency = presence = 0); this entry has scope = '
                    f"{p['scope']!r}, frequency = {p['frequency']!r}, presence = {p['presence']!r}"
                )
            kw["repetition_penalty"] = float(p["repeat"])
        elif n == "no_repeat_ngram":
            kw["no_repeat_ngram_size"] = int(p["n"])
        elif n == "bad_words":
            _only(e, target, ("ids", "eos_ids"))
            kw["bad_words_ids"] = _plain(p["ids"])
            eos_of(e)
        elif n == "min_new_tokens":
            kw["min_new_tokens"] = int(p["n"])
            eos_of(e)
        elif n == "forced_bos":
            kw["forced_bos_token_id"] = int(p["bos_id"])
        elif n == "forced_eos":
            ids = list(p["eos_ids"])
            kw["forced_eos_token_id"] = ids[0] if len(ids) == 1 else ids
            kw["max_length"] = int(p["max_length"])
        elif n == "inf_nan_remove":
            kw["remove_invalid_values"] = True
        elif n == "length_decay":
            kw["exponential_decay_length_penalty"] = [int(p["start"]), float(p["factor"])]
            eos_of(e)
        elif n == "suppress_tokens":
            kw["suppress_tokens"] = list(p["ids"])
        elif n == "begin_suppress_tokens":
            _only(e, target, ("ids",))
            kw["begin_suppress_tokens"] = list(p["ids"])
        elif n in _TEMPS:
            t = _temperature(e, target)
            if t <= 0:
                raise ConfigError(f"{e.label()}: t = {t!r}: transformers' temperature must be > 0 (use greedy)")
            kw["temperature"] = t
        elif n == "top_h":
            _only(e, target, ("top_h",))
            kw["top_h"] = float(p["top_h"])
        elif n == "top_k":
            _only(e, target, ("k",))
            kw["top_k"] = int(p["k"])
        elif n in ("top_p", "min_p"):
            _only(e, target, ("p",))
            kw[n] = float(p["p"])
        elif n == "typical":
            _only(e, target, ("p",), semantics="transformers")
            kw["typical_p"] = float(p["p"])
        elif n in ("epsilon", "eta"):
            _only(e, target, ("epsilon",))
            kw[f"{n}_cutoff"] = float(p["epsilon"])
        elif n == "watermark":
            kw["watermarking_config"] = {k: _plain(v) for k, v in p.items()}
        elif n == "renormalize":
            kw["renormalize_logits"] = True
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
    if eos_sets:
        first = eos_sets[0]
        for e, ids in eos_sets[1:]:
            if sorted(set(ids)) != sorted(set(first[1])):
                raise ConfigError(
                    f"{e.label()}: eos ids {ids} differ from {first[0].label()}'s {first[1]}: a "
                    "GenerationConfig has one eos_token_id"
                )
        ids = first[1]
        kw["eos_token_id"] = ids[0] if len(ids) == 1 else ids
    return kw
