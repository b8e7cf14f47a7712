"""Importers and exporters: transformers GenerationConfig, llama.cpp sampling flags, vLLM / OpenAI sampling params.

Importers return a chain as a plain dict (`{"name": ..., "samplers": [...], "stop": [...]}`) that `Chain.load`
accepts and `to_toml` writes; exporters take a chain (a `Chain`, a `ChainConfig`, a chain dict, a TOML file or
"preset:NAME") and return the target's settings, or raise one ConfigError saying which sampler, parameter or
order the target cannot express. See docs/convert.md for the mapping tables.

    from_transformers(config_or_path)  -> chain dict      to_transformers(chain) -> GenerationConfig kwargs
    from_llama_cpp(["--top-k", "20"])  -> chain dict      to_llama_cpp(chain)    -> list of flags
    from_vllm({"temperature": 0.7})    -> chain dict      to_vllm(chain)         -> SamplingParams kwargs
    to_toml(chain)                     -> TOML text that Chain.load reads
"""

from __future__ import annotations

import copy
import difflib
import json
import math
import re
import shlex
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from .config import ChainConfig, EntrySpec, load_config
from .errors import ChainWarning, ConfigError
from .plugins import split_versioned

__all__ = [
    "ConvertWarning",
    "from_transformers",
    "from_llama_cpp",
    "from_vllm",
    "to_transformers",
    "to_llama_cpp",
    "to_vllm",
    "chain_to_dict",
    "to_toml",
    "normalized",
    "convert",
    "LLAMA_CPP_SAMPLER_NAMES",
    "LLAMA_CPP_SAMPLER_CHARS",
]


class ConvertWarning(UserWarning):
    """A setting of the source that no chain carries (request-level, or handled by generate()); it is dropped."""


def _hint(word: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.5)
    return f"; did you mean {close[0]!r}?" if close else ""


# ---------------------------------------------------------------------------------------------- chain access
class _Entry:
    """One resolved chain entry: base name, id, every parameter (defaults filled in), position label."""

    def __init__(self, spec: EntrySpec) -> None:
        self.spec = spec
        self.name = split_versioned(spec.use)[0]
        self.id = spec.id
        self.p = {f.name: getattr(spec.params, f.name) for f in attrs.fields(type(spec.params))}
        self.path = spec.path.replace("chain.", "")

    def label(self) -> str:
        return f"{self.path} ({self.name})"

    def defaults(self) -> dict[str, Any]:
        out = {}
        for f in attrs.fields(type(self.spec.params)):
            if f.default is attrs.NOTHING:
                continue
            factory = isinstance(f.default, attrs.Factory)  # type: ignore[arg-type]
            out[f.name] = f.default.factory() if factory else f.default  # type: ignore[union-attr]
        return out


def _config(chain: Any) -> ChainConfig:
    if isinstance(chain, ChainConfig):
        return chain
    if hasattr(chain, "config") and isinstance(chain.config, ChainConfig):
        return chain.config
    if isinstance(chain, str) and chain.startswith("preset:"):
        from .chain import Chain

        return Chain.from_preset(chain[len("preset:"):]).config
    return load_config(chain)


def _entries(chain: Any) -> tuple[list[_Entry], list[_Entry], ChainConfig]:
    with warnings.catch_warnings():  # pitfalls of an order were reported when the chain was made
        warnings.simplefilter("ignore", ChainWarning)
        cfg = _config(chain)
    return [_Entry(s) for s in cfg.samplers], [_Entry(s) for s in cfg.stop], cfg


def _plain(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def _entry_dict(e: _Entry, compact: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"use": e.spec.use}
    if e.id != e.spec.cls.name:
        out["id"] = e.id
    defaults = e.defaults()
    for key, value in e.p.items():
        if compact and key in defaults and _plain(defaults[key]) == _plain(value):
            continue
        out[key] = _plain(value)
    return out


def chain_to_dict(chain: Any, *, compact: bool = True) -> dict[str, Any]:
    """A chain as the dict `Chain.load` reads; `compact` leaves out parameters at their defaults."""
    samplers, stop, cfg = _entries(chain)
    out: dict[str, Any] = {}
    if cfg.name:
        out["name"] = cfg.name
    if cfg.description:
        out["description"] = cfg.description
    if cfg.backend != "auto":
        out["backend"] = cfg.backend
    out["samplers"] = [_entry_dict(e, compact) for e in samplers]
    if stop:
        out["stop"] = [_entry_dict(e, compact) for e in stop]
    return out


def normalized(chain: Any) -> dict[str, Any]:
    """Samplers and stop criteria with every parameter filled in (no name): two chains that run the same compare
    equal."""
    samplers, stop, _ = _entries(chain)
    return {"samplers": [_entry_dict(e, compact=False) for e in samplers],
            "stop": [_entry_dict(e, compact=False) for e in stop]}


def _checked(chain: dict[str, Any], source: str) -> dict[str, Any]:
    """Validate an imported chain dict (one ConfigError naming the source) and return it."""
    try:
        load_config(chain, name=source)
    except ConfigError as exc:
        raise ConfigError(f"{source}: the converted chain is invalid:\n{exc}") from None
    return chain


# ---------------------------------------------------------------------------------------------------- TOML
_BARE = re.compile(r"^[A-Za-z0-9_-]+$")


def _toml_str(s: str) -> str:
    out = ['"']
    for ch in s:
        code = ord(ch)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\u{code:04X}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _toml_key(k: Any) -> str:
    k = str(k)
    return k if _BARE.match(k) else _toml_str(k)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        text = repr(v)
        return text if any(c in text for c in ".eE") else text + ".0"
    if isinstance(v, str):
        return _toml_str(v)
    if isinstance(v, Mapping):
        if not v:
            return "{}"
        return "{ " + ", ".join(f"{_toml_key(k)} = {_toml_value(x)}" for k, x in v.items()) + " }"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise ConfigError(f"cannot write {v!r} ({type(v).__name__}) as TOML")


def to_toml(chain: Any) -> str:
    """TOML text of a chain (`[chain]` with one inline table per sampler) that `Chain.load` accepts."""
    data = chain if isinstance(chain, Mapping) and "samplers" in chain else chain_to_dict(chain)
    lines = ["[chain]"]
    for key in ("name", "description", "backend"):
        if key in data:
            lines.append(f"{key} = {_toml_value(data[key])}")
    for key in ("samplers", "stop"):
        if key in data:
            lines.append(f"{key} = [")
            lines += [f"  {_toml_value(_plain(e))}," for e in data[key]]
            lines.append("]")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------- disabled values
_OFF: dict[str, Callable[[dict[str, Any]], bool]] = {
    "penalties": lambda p: (p["repeat"] == 1 and p["frequency"] == 0 and p["presence"] == 0)
    or (p["scope"] == "llama.cpp" and p["last_n"] == 0),
    "dry": lambda p: p["multiplier"] == 0,
    "top_n_sigma": lambda p: p["n"] <= 0,
    "top_k": lambda p: p["k"] <= 0,
    "typical": lambda p: p["p"] >= 1,
    "top_p": lambda p: p["p"] >= 1,
    "min_p": lambda p: p["p"] <= 0,
    "xtc": lambda p: p["probability"] <= 0,
    "temp_ext": lambda p: p["t"] == 1 and p["delta"] <= 0,
    "temperature": lambda p: p["t"] == 1,
    "epsilon": lambda p: p["epsilon"] <= 0,
    "eta": lambda p: p["epsilon"] <= 0,
    "top_h": lambda p: p["top_h"] <= 0,
    "no_repeat_ngram": lambda p: p["n"] <= 0,
    "min_new_tokens": lambda p: p["n"] <= 0,
    "length_decay": lambda p: p["factor"] == 1,
    "allowed_tokens": lambda p: not p["ids"],
    "bad_words": lambda p: not p["ids"] and not p["words"],
    "logit_bias": lambda p: not p["bias"],
    "suppress_tokens": lambda p: not p["ids"],
    "begin_suppress_tokens": lambda p: not p["ids"],
    "sequence_bias": lambda p: not p["bias"],
    "cfg": lambda p: p["scale"] == 1,
    "quadratic": lambda p: p["factor"] == 0,
    "tfs": lambda p: p["z"] >= 1,
    "top_a": lambda p: p["a"] <= 0,
    "p_less": lambda p: not p["enabled"],
    "infill": lambda p: not p["enabled"],
    "grammar": lambda p: not p["enabled"] or not (p["gbnf"] or p["json_schema"] or p["json"] or p["regex"]),
}


def _off(e: _Entry) -> bool:
    test = _OFF.get(e.name)
    return bool(test and test(e.p))


def _only(e: _Entry, target: str, allowed: Sequence[str], **fixed: Any) -> None:
    """Every parameter not in `allowed` must be at its default (or at the value given in `fixed`)."""
    defaults = e.defaults()
    for key, value in e.p.items():
        if key in allowed:
            continue
        want = fixed.get(key, defaults.get(key, attrs.NOTHING))
        if want is attrs.NOTHING or _plain(want) != _plain(value):
            raise ConfigError(f"{e.label()}: {key} = {_plain(value)!r} cannot be expressed in {target}"
                              + (f" (it has only {key} = {_plain(want)!r})" if want is not attrs.NOTHING else ""))


def _order(active: list[tuple[_Entry, int]], target: str, why: str,
           commute: Callable[[str, str], bool] = lambda a, b: False) -> None:
    """`active` is (entry, rank in the target's fixed order): every inverted pair must commute."""
    for i, (a, ra) in enumerate(active):
        for b, rb in active[i + 1:]:
            if ra == rb:
                raise ConfigError(f"{b.label()}: {target} has one {b.name} step; {a.label()} already takes it")
            if ra > rb and not commute(a.name, b.name):
                raise ConfigError(f"{a.label()} runs before {b.label()}, which {target} cannot express: {why}")


_TEMPS = ("temperature", "temp_ext")
_MASKS = ("allowed_tokens", "bad_words", "min_new_tokens", "suppress_tokens", "logit_bias")


def _commute(a: str, b: str) -> bool:
    """Pairs whose order does not change the result: temperature and top_k (rank-based); masks and biases."""
    pair = {a, b}
    if pair <= {"temperature", "temp_ext", "top_k"} and "top_k" in pair:
        return True
    return pair <= set(_MASKS)


def _temperature(e: _Entry, target: str) -> float:
    """A temperature / temp_ext entry as a plain temperature (no dynamic range)."""
    if e.name == "temp_ext":
        if e.p["delta"] > 0:
            raise ConfigError(f"{e.label()}: delta = {e.p['delta']!r} (dynamic temperature) cannot be expressed in "
                              f"{target}, which has only a fixed temperature")
        _only(e, target, ("t", "delta", "exponent", "formula"))
    return float(e.p["t"])


def _stop_eos(stop: list[_Entry]) -> list[int] | None:
    ids: list[int] | None = None
    for e in stop:
        if e.name == "eos" and e.p["ids"]:
            ids = list(e.p["ids"])
    return ids


# ------------------------------------------------------------------------------------------ transformers
_TF_ORDER = ["cfg", "sequence_bias", "penalties", "no_repeat_ngram", "bad_words", "min_new_tokens", "forced_bos",
             "forced_eos", "inf_nan_remove", "length_decay", "suppress_tokens", "begin_suppress_tokens",
             "temperature", "top_h", "top_k", "top_p", "min_p", "typical", "epsilon", "eta", "watermark",
             "renormalize"]
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

    culprits = [f"{k} = {v!r} (expected {type(defaults[k]).__name__}, e.g. {defaults[k]!r})"
                for k, v in settings.items() if defaults.get(k) is not None and v is not None
                and not same(v, defaults[k])]
    return f"{'; '.join(culprits)}: " if culprits else ""


def from_transformers(source: Any) -> dict[str, Any]:
    """The chain `model.generate()` runs for a GenerationConfig, a generation_config.json (file or folder) or a dict.

    Unset settings take generate()'s global defaults (`GenerationConfig._get_default_generation_params`: top_k 50,
    ...); the samplers come from `samplechain.generation.from_config.chain_from_generation_config`. max_new_tokens,
    max_length (when set), max_time and stop_strings become stop criteria.
    """
    from .generation.from_config import chain_from_generation_config

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
            raise ConfigError(f"{e.label()}: transformers has no {e.name} processor (it has: "
                              f"{', '.join(_TF_ORDER)})")
        ranked.append((e, _TF_ORDER.index(name)))
    _order(ranked, target, "transformers applies its processors in the fixed order of "
           f"_get_logits_processor ({' -> '.join(_TF_ORDER)})", _commute)
    for e in active:
        n, p = e.name, e.p
        if n == "cfg":
            _only(e, target, ("scale",))
            kw["guidance_scale"] = float(p["scale"])
        elif n == "sequence_bias":
            kw["sequence_bias"] = [[list(seq), float(b)] for seq, b in _plain(p["bias"])]
        elif n == "penalties":
            if p["scope"] != "transformers" or p["frequency"] != 0 or p["presence"] != 0:
                raise ConfigError(f"{e.label()}: transformers has only repetition_penalty over the whole sequence "
                                  f"(scope = \"transformers\", frequency = presence = 0); this entry has scope = "
                                  f"{p['scope']!r}, frequency = {p['frequency']!r}, presence = {p['presence']!r}")
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
            raise ConfigError(f"{selector.label()}: seed = {selector.p['seed']!r} cannot be expressed in a "
                              "GenerationConfig (call transformers.set_seed before generate)")
        kw["do_sample"] = True
        kw.setdefault("top_k", 0)  # generate() would otherwise apply its default top_k = 50
    elif selector.name == "greedy":
        kw["do_sample"] = False
        warpers = [e for e in active if (("temperature" if e.name == "temp_ext" else e.name) in _TF_WARPERS)]
        if warpers:
            raise ConfigError(f"{warpers[0].label()}: transformers skips the warpers (temperature, top_k, top_p ...)"
                              " when do_sample=False, so a greedy chain cannot carry them")
    else:
        raise ConfigError(f"{selector.label()}: transformers selects with sampling (dist) or greedy only, "
                          f"not {selector.name}")
    for e in stop:
        if e.name == "max_new_tokens":
            kw["max_new_tokens"] = int(e.p["n"])
        elif e.name == "max_length":
            if "max_length" in kw and kw["max_length"] != int(e.p["n"]):
                raise ConfigError(f"{e.label()}: n = {e.p['n']} conflicts with forced_eos' max_length = "
                                  f"{kw['max_length']} (a GenerationConfig has one max_length)")
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
                raise ConfigError(f"{e.label()}: eos ids {ids} differ from {first[0].label()}'s {first[1]}: a "
                                  "GenerationConfig has one eos_token_id")
        ids = first[1]
        kw["eos_token_id"] = ids[0] if len(ids) == 1 else ids
    return kw


# ---------------------------------------------------------------------------------------------- llama.cpp
# common/sampling.cpp: common_sampler_types_from_names (canonical, then the alternative names) / _from_chars
_LC_CANONICAL = {"dry": "dry", "top_k": "top_k", "top_p": "top_p", "top_n_sigma": "top_n_sigma", "typ_p": "typ_p",
                 "min_p": "min_p", "temperature": "temperature", "xtc": "xtc", "infill": "infill",
                 "penalties": "penalties", "adaptive_p": "adaptive_p"}
_LC_ALT = {"top-k": "top_k", "top-p": "top_p", "top-n-sigma": "top_n_sigma", "nucleus": "top_p",
           "typical-p": "typ_p", "typical": "typ_p", "typ-p": "typ_p", "typ": "typ_p", "min-p": "min_p",
           "temp": "temperature", "adaptive-p": "adaptive_p"}
LLAMA_CPP_SAMPLER_NAMES = {**_LC_CANONICAL, **_LC_ALT}
LLAMA_CPP_SAMPLER_CHARS = {"d": "dry", "k": "top_k", "y": "typ_p", "p": "top_p", "s": "top_n_sigma", "m": "min_p",
                           "t": "temperature", "x": "xtc", "i": "infill", "e": "penalties", "a": "adaptive_p"}
_LC_DEFAULT_ORDER = ["penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature"]
_LC_DEFAULT_SEED = 0xFFFFFFFF  # LLAMA_DEFAULT_SEED: a fresh random seed

# flag -> (key of common_params_sampling, parser); aliases as common/arg.cpp
_F = float
_LC_FLAGS: dict[str, tuple[str, Callable[[str], Any]]] = {}
for _names, _key, _kind in [
    (("--samplers",), "samplers", str), (("--sampling-seq", "--sampler-seq"), "sampling_seq", str),
    (("-s", "--seed"), "seed", int), (("--top-k",), "top_k", int), (("--top-p",), "top_p", _F),
    (("--min-p",), "min_p", _F), (("--typical", "--typical-p"), "typ_p", _F), (("--temp", "--temperature"), "temp", _F),
    (("--top-nsigma", "--top-n-sigma"), "top_n_sigma", _F), (("--xtc-probability",), "xtc_probability", _F),
    (("--xtc-threshold",), "xtc_threshold", _F), (("--dynatemp-range",), "dynatemp_range", _F),
    (("--dynatemp-exp",), "dynatemp_exponent", _F), (("--repeat-last-n",), "penalty_last_n", int),
    (("--repeat-penalty",), "penalty_repeat", _F), (("--presence-penalty",), "penalty_present", _F),
    (("--frequency-penalty",), "penalty_freq", _F), (("--dry-multiplier",), "dry_multiplier", _F),
    (("--dry-base",), "dry_base", _F), (("--dry-allowed-length",), "dry_allowed_length", int),
    (("--dry-penalty-last-n",), "dry_penalty_last_n", int), (("--dry-sequence-breaker",), "dry_sequence_breaker", str),
    (("--mirostat",), "mirostat", int), (("--mirostat-lr",), "mirostat_eta", _F),
    (("--mirostat-ent",), "mirostat_tau", _F), (("--adaptive-target",), "adaptive_target", _F),
    (("--adaptive-decay",), "adaptive_decay", _F), (("--ignore-eos",), "ignore_eos", bool),
    (("-l", "--logit-bias"), "logit_bias", str), (("--grammar",), "grammar", str),
    (("-j", "--json-schema"), "json_schema", str),
]:
    for _n in _names:
        _LC_FLAGS[_n] = (_key, _kind)

# common_params_sampling's defaults (common/common.h)
_LC_DEFAULTS: dict[str, Any] = {
    "seed": _LC_DEFAULT_SEED, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "xtc_probability": 0.0,
    "xtc_threshold": 0.1, "typ_p": 1.0, "temp": 0.8, "dynatemp_range": 0.0, "dynatemp_exponent": 1.0,
    "penalty_last_n": 64, "penalty_repeat": 1.0, "penalty_freq": 0.0, "penalty_present": 0.0,
    "dry_multiplier": 0.0, "dry_base": 1.75, "dry_allowed_length": 2, "dry_penalty_last_n": -1,
    "dry_sequence_breakers": ["\n", ":", "\"", "*"], "top_n_sigma": -1.0, "mirostat": 0, "mirostat_tau": 5.0,
    "mirostat_eta": 0.1, "adaptive_target": -1.0, "adaptive_decay": 0.9, "ignore_eos": False,
    "logit_bias": [], "grammar": "", "json_schema": "", "samplers": list(_LC_DEFAULT_ORDER),
}
_IGNORE_EOS_N = 2**31 - 1  # min_new_tokens with this n bans the eos ids for the whole generation


def _lc_number(flag: str, value: str, kind: Callable[[str], Any]) -> Any:
    try:
        if kind is int:
            return int(value, 0) if value.strip().lower().startswith(("0x", "-0x")) else int(value)
        return float(value)
    except ValueError:
        expect = "an integer" if kind is int else "a number"
        raise ConfigError(f"llama.cpp flags: {flag} {value!r}: expected {expect}") from None


def _lc_sampler_names(flag: str, value: str, chars: bool) -> list[str]:
    out = []
    if chars:
        for c in value:
            if c not in LLAMA_CPP_SAMPLER_CHARS:
                valid = "".join(LLAMA_CPP_SAMPLER_CHARS)
                raise ConfigError(f"llama.cpp flags: {flag} {value!r}: unknown sampler letter {c!r} (valid: {valid}: "
                                  + ", ".join(f"{k}={v}" for k, v in LLAMA_CPP_SAMPLER_CHARS.items()) + ")")
            out.append(LLAMA_CPP_SAMPLER_CHARS[c])
        return out
    for name in value.split(";"):
        if name == "":
            continue  # string_split keeps empty pieces; llama.cpp warns and skips them
        if name not in LLAMA_CPP_SAMPLER_NAMES:
            raise ConfigError(f"llama.cpp flags: {flag} {value!r}: unknown sampler name {name!r}"
                              f"{_hint(name, list(LLAMA_CPP_SAMPLER_NAMES))} (valid: {', '.join(_LC_CANONICAL)})")
        out.append(LLAMA_CPP_SAMPLER_NAMES[name])
    return out


def _lc_logit_bias(flag: str, value: str) -> tuple[int, float]:
    m = re.fullmatch(r"\s*(\d+)\s*([+-])\s*(\S.*)", value)
    try:
        if m is None:
            raise ValueError
        bias = float(m[3])
    except ValueError:
        raise ConfigError(f"llama.cpp flags: {flag} {value!r}: expected TOKEN_ID(+/-)BIAS, e.g. 15043+1 or "
                          "15043-inf") from None
    return int(m[1]), -bias if m[2] == "-" else bias


def _lc_parse(args: Sequence[str] | str) -> dict[str, Any]:
    tokens = shlex.split(args) if isinstance(args, str) else list(args)
    s = copy.deepcopy(_LC_DEFAULTS)
    breakers: list[str] | None = None
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        flag, eq, inline = tok.partition("=") if tok.startswith("--") else (tok, "", "")
        if flag not in _LC_FLAGS:
            raise ConfigError(f"llama.cpp flags: unknown sampling flag {tok!r}{_hint(flag, list(_LC_FLAGS))} "
                              f"(supported: {', '.join(n for n in _LC_FLAGS if n.startswith('--'))})")
        key, kind = _LC_FLAGS[flag]
        if kind is bool:
            if eq:
                raise ConfigError(f"llama.cpp flags: {flag} takes no value (got {tok!r})")
            s[key] = True
            i += 1
            continue
        if eq:
            value = inline
            i += 1
        else:
            if i + 1 >= len(tokens):
                raise ConfigError(f"llama.cpp flags: {flag} needs a value")
            value = tokens[i + 1]
            i += 2
        if key == "samplers":
            s["samplers"] = _lc_sampler_names(flag, value, chars=False)
        elif key == "sampling_seq":
            s["samplers"] = _lc_sampler_names(flag, value, chars=True)
        elif key == "dry_sequence_breaker":
            breakers = [] if breakers is None else breakers  # the first one clears the defaults
            if value == "none":
                breakers = []
            else:
                breakers.append(value)
        elif key == "logit_bias":
            s["logit_bias"].append(_lc_logit_bias(flag, value))
        elif key in ("grammar", "json_schema"):
            s["grammar"], s["json_schema"] = ("", "")
            s[key] = value
        elif kind is str:
            s[key] = value
        else:
            number = _lc_number(flag, value, kind)
            if key == "seed":
                number = number & 0xFFFFFFFF  # std::stoul into a uint32_t: -1 is LLAMA_DEFAULT_SEED
            elif key == "temp":
                number = max(number, 0.0)
            elif key == "dry_base" and number < 1.0:
                continue  # llama.cpp ignores a base below 1
            elif key in ("penalty_last_n", "dry_penalty_last_n") and number < -1:
                raise ConfigError(f"llama.cpp flags: {flag} {value}: must be >= -1 (-1 = context size, 0 disables)")
            elif key == "mirostat" and number not in (0, 1, 2):
                raise ConfigError(f"llama.cpp flags: {flag} {value}: must be 0 (off), 1 (Mirostat) or 2 (Mirostat 2.0)")
            s[key] = number
    if breakers is not None:
        s["dry_sequence_breakers"] = breakers
    return s


def from_llama_cpp(args: Sequence[str] | str) -> dict[str, Any]:
    """The chain llama.cpp's `common_sampler_init` builds for these command-line sampling flags."""
    s = _lc_parse(args)
    seed = None if s["seed"] == _LC_DEFAULT_SEED else int(s["seed"])
    seeded = {} if seed is None else {"seed": seed}
    front: list[dict[str, Any]] = []
    if s["grammar"]:
        front.append({"use": "grammar", "gbnf": s["grammar"]})
    elif s["json_schema"]:
        front.append({"use": "grammar", "json_schema": s["json_schema"]})
    if s["ignore_eos"]:  # llama.cpp: a -inf logit bias on every end-of-generation token
        front.append({"use": "min_new_tokens", "id": "ignore_eos", "n": _IGNORE_EOS_N})
    if s["logit_bias"]:
        front.append({"use": "logit_bias", "bias": [[t, b] for t, b in s["logit_bias"]]})
    temp = {"use": "temp_ext", "t": s["temp"], "delta": s["dynatemp_range"], "exponent": s["dynatemp_exponent"]}
    if s["mirostat"] == 1:
        samplers = front + [{**temp, "delta": 0.0, "exponent": 1.0},
                            {"use": "mirostat", "tau": s["mirostat_tau"], "eta": s["mirostat_eta"], "m": 100,
                             **seeded}]
        return _checked({"name": "llama.cpp-mirostat", "samplers": samplers}, "llama.cpp flags")
    if s["mirostat"] == 2:
        samplers = front + [{**temp, "delta": 0.0, "exponent": 1.0},
                            {"use": "mirostat_v2", "tau": s["mirostat_tau"], "eta": s["mirostat_eta"], **seeded}]
        return _checked({"name": "llama.cpp-mirostat-v2", "samplers": samplers}, "llama.cpp flags")
    by_name = {
        "penalties": {"use": "penalties", "repeat": s["penalty_repeat"], "frequency": s["penalty_freq"],
                      "presence": s["penalty_present"], "last_n": s["penalty_last_n"], "scope": "llama.cpp"},
        "dry": {"use": "dry", "multiplier": s["dry_multiplier"], "base": s["dry_base"],
                "allowed_length": s["dry_allowed_length"], "penalty_last_n": s["dry_penalty_last_n"],
                "breakers": list(s["dry_sequence_breakers"])},
        "top_n_sigma": {"use": "top_n_sigma", "n": s["top_n_sigma"]},
        "top_k": {"use": "top_k", "k": s["top_k"]},
        "typ_p": {"use": "typical", "p": s["typ_p"]},
        "top_p": {"use": "top_p", "p": s["top_p"]},
        "min_p": {"use": "min_p", "p": s["min_p"]},
        "xtc": {"use": "xtc", "probability": s["xtc_probability"], "threshold": s["xtc_threshold"], **seeded},
        "temperature": temp,
        "infill": {"use": "infill"},
    }
    samplers = list(front)
    used: dict[str, int] = {}
    adaptive = False
    for name in s["samplers"]:
        if name == "adaptive_p":
            adaptive = True  # llama.cpp moves it to the end, in place of dist
            continue
        entry = dict(by_name[name])
        used[entry["use"]] = used.get(entry["use"], 0) + 1
        if used[entry["use"]] > 1:  # the same sampler twice: distinct ids so both can be addressed
            entry["id"] = f"{entry['use']}_{used[entry['use']]}"
        samplers.append(entry)
    if adaptive:
        samplers.append({"use": "adaptive_p", "target": s["adaptive_target"], "decay": s["adaptive_decay"], **seeded})
    else:
        samplers.append({"use": "dist", **seeded})
    return _checked({"name": "llama.cpp", "samplers": samplers}, "llama.cpp flags")


def _fmt(x: float) -> str:
    return repr(float(x)) if not float(x).is_integer() else str(int(x)) if abs(x) < 1e15 else repr(float(x))


def _lc_sampler(e: _Entry, s: dict[str, Any], names: list[str], put: Callable[..., None],
                seed_of: Callable[[_Entry], None], mirostat: bool, target: str) -> None:
    n, p = e.name, e.p
    if mirostat:
        if n in _TEMPS and not any(x in s for x in ("temp",)):
            put(e, "temp", _temperature(e, target))
            return
        if _off(e):
            return
        raise ConfigError(f"{e.label()}: with mirostat llama.cpp runs only temperature before it (it drops "
                          f"every other sampler), so {n} cannot be expressed")
    if n == "penalties":
        _only(e, target, ("repeat", "frequency", "presence", "last_n"), scope="llama.cpp")
        for k, key in (("repeat", "penalty_repeat"), ("frequency", "penalty_freq"),
                       ("presence", "penalty_present"), ("last_n", "penalty_last_n")):
            put(e, key, p[k])
        names.append("penalties")
    elif n == "dry":
        _only(e, target, ("multiplier", "base", "allowed_length", "penalty_last_n", "breakers"))
        if p["base"] < 1:
            raise ConfigError(f"{e.label()}: base = {p['base']!r}: llama.cpp ignores a --dry-base below 1")
        for k, key in (("multiplier", "dry_multiplier"), ("base", "dry_base"),
                       ("allowed_length", "dry_allowed_length"), ("penalty_last_n", "dry_penalty_last_n"),
                       ("breakers", "dry_sequence_breakers")):
            put(e, key, _plain(p[k]))
        names.append("dry")
    elif n == "top_n_sigma":
        _only(e, target, ("n",))
        put(e, "top_n_sigma", p["n"])
        names.append("top_n_sigma")
    elif n == "top_k":
        _only(e, target, ("k",))
        put(e, "top_k", p["k"])
        names.append("top_k")
    elif n == "typical":
        _only(e, target, ("p",), semantics="llama.cpp")
        put(e, "typ_p", p["p"])
        names.append("typ_p")
    elif n in ("top_p", "min_p"):
        _only(e, target, ("p",))
        put(e, n, p["p"])
        names.append(n)
    elif n == "xtc":
        _only(e, target, ("probability", "threshold", "seed"))
        put(e, "xtc_probability", p["probability"])
        put(e, "xtc_threshold", p["threshold"])
        seed_of(e)
        names.append("xtc")
    elif n in _TEMPS:
        if n == "temp_ext":
            _only(e, target, ("t", "delta", "exponent"), formula="llama.cpp")
            if p["t"] < 0:
                raise ConfigError(f"{e.label()}: t = {p['t']!r}: llama.cpp clamps --temp to >= 0")
            put(e, "temp", p["t"])
            put(e, "dynatemp_range", p["delta"])
            put(e, "dynatemp_exponent", p["exponent"])
        else:
            put(e, "temp", p["t"])
            put(e, "dynatemp_range", 0.0)
        names.append("temperature")
    elif n == "infill":
        _only(e, target, ("enabled",))
        names.append("infill")
    else:
        raise ConfigError(f"{e.label()}: llama.cpp has no {n} sampler (its samplers: "
                          f"{', '.join(_LC_CANONICAL)}; plus grammar, --logit-bias and --ignore-eos first)")


def to_llama_cpp(chain: Any) -> list[str]:
    """llama.cpp command-line flags that build this chain (`--samplers` gives the order); ConfigError where not."""
    target = "llama.cpp"
    samplers, stop, _ = _entries(chain)
    for e in stop:
        raise ConfigError(f"{e.label()}: llama.cpp's sampling flags carry no stopping criteria (use -n / "
                          f"--reverse-prompt on the llama.cpp command line)")
    flags: list[str] = []
    seeds: list[tuple[_Entry, int]] = []
    s: dict[str, Any] = {}  # common_params_sampling keys set by the chain

    def put(e: _Entry, key: str, value: Any) -> None:
        if key in s and s[key] != value:
            raise ConfigError(f"{e.label()}: llama.cpp has one {key} for every sampler; another entry set "
                              f"{s[key]!r}, this one {value!r}")
        s[key] = value

    def seed_of(e: _Entry) -> None:
        if e.p.get("seed") is not None:
            seeds.append((e, int(e.p["seed"])))

    selector = samplers[-1]
    body = samplers[:-1]
    # the front: grammar, ignore-eos, logit bias (common_sampler_init adds them before the --samplers chain)
    names: list[str] = []
    front_done = False
    mirostat = selector.name in ("mirostat", "mirostat_v2")
    for e in body:
        n, p = e.name, e.p
        is_ignore_eos = n == "min_new_tokens" and p["n"] >= _IGNORE_EOS_N and not p["eos_ids"]
        if n in ("grammar", "logit_bias") or is_ignore_eos:
            if _off(e):
                continue
            if front_done:
                raise ConfigError(f"{e.label()} runs after a sampler of the --samplers chain, which llama.cpp cannot "
                                  f"express: it applies the grammar, --ignore-eos and --logit-bias first")
            if n == "grammar":
                _only(e, target, ("gbnf", "json_schema", "eos_ids", "json_whitespace"))
                if p["gbnf"]:
                    put(e, "grammar", p["gbnf"])
                elif p["json_schema"]:
                    put(e, "json_schema", p["json_schema"])
            elif n == "logit_bias":
                from_pairs = p["bias"].items() if isinstance(p["bias"], Mapping) else p["bias"]
                for tok, b in from_pairs:
                    flags += ["--logit-bias", f"{int(tok)}{'-' if float(b) < 0 else '+'}{_fmt(abs(float(b)))}"]
            else:
                put(e, "ignore_eos", True)
            continue
        front_done = front_done or not _off(e)  # a no-op entry commutes with the front
        snapshot = (dict(s), list(names), list(seeds))
        try:
            _lc_sampler(e, s, names, put, seed_of, mirostat, target)
        except ConfigError:
            if not _off(e):
                raise
            s.clear()  # a no-op entry llama.cpp cannot name (vLLM's allowed_tokens = [] ...): left out
            s.update(snapshot[0])
            names[:] = snapshot[1]
            seeds[:] = snapshot[2]
    if selector.name == "dist":
        seed_of(selector)
    elif selector.name == "adaptive_p":
        put(selector, "adaptive_target", selector.p["target"])
        put(selector, "adaptive_decay", selector.p["decay"])
        seed_of(selector)
        names.append("adaptive_p")
    elif mirostat:
        put(selector, "mirostat", 1 if selector.name == "mirostat" else 2)
        _only(selector, target, ("tau", "eta", "seed"), m=100)
        put(selector, "mirostat_tau", selector.p["tau"])
        put(selector, "mirostat_eta", selector.p["eta"])
        seed_of(selector)
    else:
        raise ConfigError(f"{selector.label()}: llama.cpp always ends its chain with dist (or mirostat / "
                          f"adaptive_p); for {selector.name} put temp_ext with t = 0 before dist")
    for e, seed in seeds:
        if seed != seeds[0][1]:
            raise ConfigError(f"{e.label()}: seed = {seed} differs from {seeds[0][0].label()}'s {seeds[0][1]}: "
                              "llama.cpp has one --seed")
        if not 0 <= seed < _LC_DEFAULT_SEED:
            raise ConfigError(f"{e.label()}: seed = {seed}: llama.cpp seeds are in [0, 2**32 - 1)")
    if seeds:
        s["seed"] = seeds[0][1]
    if not mirostat and names != _LC_DEFAULT_ORDER:
        flags = ["--samplers", ";".join(names)] + flags
    flag_of = {key: f for f, (key, _k) in _LC_FLAGS.items() if f.startswith("--") and key not in ("samplers",)}
    flag_of.update({"typ_p": "--typical", "temp": "--temp", "seed": "--seed", "top_n_sigma": "--top-n-sigma",
                    "json_schema": "--json-schema"})
    order = [k for k in _LC_DEFAULTS if k != "seed"] + ["seed"]
    for key, value in sorted(s.items(), key=lambda kv: order.index(kv[0])):
        if key == "dry_sequence_breakers":
            if list(value) != _LC_DEFAULTS[key]:
                for b in value or ["none"]:
                    flags += ["--dry-sequence-breaker", b]
            continue
        if key == "ignore_eos":
            flags.append("--ignore-eos")
            continue
        if value == _LC_DEFAULTS.get(key):
            continue
        flags += [flag_of[key], value if isinstance(value, str) else _fmt(value)]
    return flags


# --------------------------------------------------------------------------------------------------- vLLM
_VLLM_ORDER = ["allowed_tokens", "bad_words", "min_new_tokens", "logit_bias", "penalties", "temperature",
               "min_p", "top_k", "top_p"]
_VLLM_KNOWN = {"temperature", "top_p", "top_k", "min_p", "repetition_penalty", "frequency_penalty",
               "presence_penalty", "seed", "logit_bias", "allowed_token_ids", "bad_words", "min_tokens", "stop",
               "stop_token_ids", "max_tokens", "max_completion_tokens", "ignore_eos"}
# request-level settings of SamplingParams / the OpenAI API that are no part of a chain (dropped with a warning
# when not at their default)
_VLLM_REQUEST = {"n": 1, "best_of": None, "logprobs": None, "top_logprobs": None, "prompt_logprobs": None,
                 "detokenize": True, "skip_special_tokens": True, "spaces_between_special_tokens": True,
                 "include_stop_str_in_output": False, "output_kind": None, "truncate_prompt_tokens": None,
                 "stream": False, "echo": False, "user": None, "model": None, "prompt": None, "messages": None,
                 "extra_args": None, "logits_processors": None, "stream_options": None}


def _load_json(source: Any, what: str) -> tuple[dict[str, Any], str]:
    if isinstance(source, Mapping):
        return dict(source), "<dict>"
    label = str(source)
    try:
        text = Path(source).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{label}: file not found (expected a JSON object of {what})") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{label}: not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{label}: expected a JSON object of {what}, got {type(raw).__name__}")
    return raw, label


def from_vllm(source: Any) -> dict[str, Any]:
    """The chain vLLM's sampler runs for these SamplingParams (a dict, or a JSON file of one), in vLLM's order.

    temperature 0 (below 1e-5, vLLM's _SAMPLING_EPS) is greedy; max_tokens, stop and stop_token_ids become stop
    criteria. Request-level keys (n, logprobs ...) are dropped with a ConvertWarning; unknown keys are an error.
    """
    raw, label = _load_json(source, "vLLM sampling parameters")
    where = f"{label}: vLLM params"
    for key, value in raw.items():
        if key in _VLLM_KNOWN:
            continue
        if key in _VLLM_REQUEST:
            if value != _VLLM_REQUEST[key]:
                warnings.warn(f"{where}: {key} = {value!r} is a request setting, not part of a chain: dropped",
                              ConvertWarning, stacklevel=2)
            continue
        raise ConfigError(f"{where}: unknown key {key!r}{_hint(key, sorted(_VLLM_KNOWN | set(_VLLM_REQUEST)))} "
                          f"(supported: {', '.join(sorted(_VLLM_KNOWN))})")

    def get(key: str, default: Any) -> Any:
        value = raw.get(key)
        return default if value is None else value

    def number(key: str, default: float) -> float:
        value = get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: {key} = {value!r}: expected a number")
        return float(value)

    temperature = number("temperature", 1.0)
    if temperature < 0:
        raise ConfigError(f"{where}: temperature = {temperature!r}: must be >= 0 (0 is greedy)")
    top_k = get("top_k", 0)
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < -1:
        raise ConfigError(f"{where}: top_k = {top_k!r}: expected an integer >= -1 (0 or -1 disables)")
    bias = get("logit_bias", {})
    if not isinstance(bias, Mapping):
        raise ConfigError(f"{where}: logit_bias = {bias!r}: expected an object {{token_id: bias}}")
    bad = get("bad_words", [])
    bad = [bad] if isinstance(bad, str) else list(bad)
    samplers: list[dict[str, Any]] = [
        {"use": "allowed_tokens", "ids": list(get("allowed_token_ids", []))},
        {"use": "bad_words", "words": bad} if bad else {"use": "bad_words", "ids": []},
        {"use": "min_new_tokens", "n": int(get("min_tokens", 0))},
        {"use": "logit_bias", "bias": {str(k): float(v) for k, v in bias.items()}},
        {"use": "penalties", "repeat": number("repetition_penalty", 1.0), "frequency": number("frequency_penalty", 0.0),
         "presence": number("presence_penalty", 0.0), "scope": "vllm"},
    ]
    seed = raw.get("seed")
    if temperature < 1e-5:
        samplers.append({"use": "greedy"})
        name = "vllm (greedy)"
    else:
        samplers += [{"use": "temperature", "t": temperature}, {"use": "min_p", "p": number("min_p", 0.0)},
                     {"use": "top_k", "k": max(top_k, 0)}, {"use": "top_p", "p": number("top_p", 1.0)},
                     {"use": "dist"} if seed is None else {"use": "dist", "seed": seed}]
        name = "vllm"
    stop: list[dict[str, Any]] = []
    max_tokens = raw.get("max_tokens", raw.get("max_completion_tokens"))
    if max_tokens is not None:
        stop.append({"use": "max_new_tokens", "n": max_tokens})
    strings = get("stop", [])
    strings = [strings] if isinstance(strings, str) else list(strings)
    if strings:
        stop.append({"use": "stop_strings", "strings": strings})
    if get("stop_token_ids", []):
        stop.append({"use": "stop_sequences", "sequences": [[t] for t in raw["stop_token_ids"]]})
    if raw.get("ignore_eos"):
        warnings.warn(f"{where}: ignore_eos = true is a generate() setting (generate(..., ignore_eos=True)), not "
                      "part of a chain: dropped", ConvertWarning, stacklevel=2)
    out: dict[str, Any] = {"name": name, "samplers": samplers}
    if stop:
        out["stop"] = stop
    return _checked(out, where)


def to_vllm(chain: Any) -> dict[str, Any]:
    """vLLM SamplingParams keyword arguments for this chain; ConfigError where vLLM's fixed pipeline cannot run it."""
    target = "vLLM"
    samplers, stop, _ = _entries(chain)
    selector = samplers[-1]
    active = [e for e in samplers[:-1] if not _off(e)]
    ranked = []
    for e in active:
        name = "temperature" if e.name == "temp_ext" else e.name
        if name not in _VLLM_ORDER:
            raise ConfigError(f"{e.label()}: vLLM's sampler has no {e.name} step (it has: {', '.join(_VLLM_ORDER)})")
        ranked.append((e, _VLLM_ORDER.index(name)))
    _order(ranked, target, f"vLLM's sampler runs {' -> '.join(_VLLM_ORDER)} in that order", _commute)
    kw: dict[str, Any] = {}
    for e in active:
        n, p = e.name, e.p
        if n == "allowed_tokens":
            kw["allowed_token_ids"] = list(p["ids"])
        elif n == "bad_words":
            if p["ids"] or p["eos_ids"]:
                raise ConfigError(f"{e.label()}: vLLM's bad_words are strings (words = [...]); token-id sequences "
                                  f"(ids = {_plain(p['ids'])}) cannot be expressed")
            kw["bad_words"] = list(p["words"])
        elif n == "min_new_tokens":
            if p["eos_ids"]:
                raise ConfigError(f"{e.label()}: eos_ids = {list(p['eos_ids'])}: vLLM's min_tokens masks the "
                                  "model's eos and the stop_token_ids, not a chosen list")
            kw["min_tokens"] = int(p["n"])
        elif n == "logit_bias":
            pairs = p["bias"].items() if isinstance(p["bias"], Mapping) else p["bias"]
            out: dict[str, float] = {}
            for tok, b in pairs:
                out[str(int(tok))] = out.get(str(int(tok)), 0.0) + float(b)
            kw["logit_bias"] = out
        elif n == "penalties":
            _only(e, target, ("repeat", "frequency", "presence", "last_n"), scope="vllm")
            kw.update(repetition_penalty=float(p["repeat"]), frequency_penalty=float(p["frequency"]),
                      presence_penalty=float(p["presence"]))
        elif n in _TEMPS:
            t = _temperature(e, target)
            if t <= 0:
                raise ConfigError(f"{e.label()}: t = {t!r}: vLLM reads temperature 0 as greedy; end the chain with "
                                  "greedy instead")
            kw["temperature"] = t
        elif n in ("min_p", "top_p"):
            _only(e, target, ("p",))
            kw[n] = float(p["p"])
        elif n == "top_k":
            _only(e, target, ("k",))
            kw["top_k"] = int(p["k"])
    if selector.name == "greedy":
        sampling = [e for e in active if e.name in ("temperature", "temp_ext", "min_p", "top_k", "top_p")]
        if sampling:
            raise ConfigError(f"{sampling[0].label()}: vLLM's greedy (temperature 0) skips temperature, min_p, "
                              "top_k and top_p, so a greedy chain cannot carry them")
        kw["temperature"] = 0.0
    elif selector.name == "dist":
        kw.setdefault("temperature", 1.0)
        if selector.p["seed"] is not None:
            kw["seed"] = int(selector.p["seed"])
    else:
        raise ConfigError(f"{selector.label()}: vLLM selects with sampling (dist) or greedy only, not {selector.name}")
    for e in stop:
        if e.name == "max_new_tokens":
            kw["max_tokens"] = int(e.p["n"])
        elif e.name == "stop_strings":
            kw["stop"] = list(e.p["strings"])
        elif e.name == "stop_sequences" and all(len(s) == 1 for s in e.p["sequences"]):
            kw["stop_token_ids"] = [int(s[0]) for s in e.p["sequences"]]
        elif e.name == "eos" and not e.p["ids"]:
            continue  # vLLM stops at the model's eos unless ignore_eos
        else:
            raise ConfigError(f"{e.label()}: vLLM cannot express the stopping criterion {e.name} with "
                              f"{_plain(e.p)} (it has max_tokens, stop strings and one-token stop_token_ids)")
    return kw


# --------------------------------------------------------------------------------------------------- facade
SOURCES = ("transformers", "llama.cpp", "vllm", "toml")
TARGETS = ("toml", "transformers", "llama.cpp", "vllm")


def import_chain(kind: str, source: Any) -> dict[str, Any]:
    """A chain dict from a source of the given kind (see SOURCES)."""
    if kind == "transformers":
        return from_transformers(source)
    if kind == "llama.cpp":
        return from_llama_cpp(source)
    if kind == "vllm":
        return from_vllm(source)
    if kind == "toml":
        return chain_to_dict(source)
    raise ConfigError(f"unknown source {kind!r}{_hint(kind, SOURCES)} (valid: {', '.join(SOURCES)})")


def export_chain(kind: str, chain: Any) -> Any:
    if kind == "toml":
        return to_toml(chain)
    if kind == "transformers":
        return to_transformers(chain)
    if kind == "llama.cpp":
        return to_llama_cpp(chain)
    if kind == "vllm":
        return to_vllm(chain)
    raise ConfigError(f"unknown target {kind!r}{_hint(kind, TARGETS)} (valid: {', '.join(TARGETS)})")


def convert(source: Any, *, from_: str, to: str) -> Any:
    """Import `source` as `from_` and export it as `to` (TOML text, a kwargs dict, or a list of flags)."""
    return export_chain(to, import_chain(from_, source))
