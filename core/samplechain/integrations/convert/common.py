"""What every converter shares: a chain's entries as the converters read them, the chain as a plain dict and as
TOML, and the checks of disabled values and of order that each target applies."""

from __future__ import annotations

import difflib
import json
import math
import os
import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from ...engine.config import ChainConfig, EntrySpec, load_config, read_text_file
from ...engine.discovery import split_versioned
from ...errors import ChainWarning, ConfigError

__all__ = ["ConvertWarning", "chain_to_dict", "normalized", "to_toml"]


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
            out[f.name] = f.default.factory() if factory else f.default
        return out


def _config(chain: Any) -> ChainConfig:
    if isinstance(chain, ChainConfig):
        return chain
    if hasattr(chain, "config") and isinstance(chain.config, ChainConfig):
        return chain.config
    if isinstance(chain, str) and chain.startswith("preset:"):
        from ...engine.chain import Chain

        return Chain.from_preset(chain[len("preset:") :]).config
    return load_config(chain)


def _entries(chain: Any) -> tuple[list[_Entry], list[_Entry], ChainConfig]:
    with warnings.catch_warnings():  # pitfalls of an order were reported when the chain was made
        warnings.simplefilter("ignore", ChainWarning)
        cfg = _config(chain)
    return [_Entry(s) for s in cfg.samplers], [_Entry(s) for s in cfg.stop], cfg


def _exported(chain: Any, target: str) -> tuple[list[_Entry], list[_Entry]]:
    """The samplers and stop criteria of a chain exported to an engine; guards, which read and take back text, it
    cannot run: one ConfigError naming them."""
    samplers, stop, cfg = _entries(chain)
    if cfg.guards:
        names = ", ".join(str(g.get("use")) for g in cfg.guards)
        raise ConfigError(
            f"the chain's guards ({names}) take text back, which {target} cannot express: export a chain without "
            "guards, or generate with samplechain"
        )
    return samplers, stop


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
    if cfg.draft is not None:
        out["draft"] = _plain(cfg.draft)
    if cfg.guards:
        out["guards"] = [_plain(g) for g in cfg.guards]
    return out


def normalized(chain: Any) -> dict[str, Any]:
    """Samplers and stop criteria with every parameter filled in (no name): two chains that run the same compare
    equal."""
    samplers, stop, _ = _entries(chain)
    return {
        "samplers": [_entry_dict(e, compact=False) for e in samplers],
        "stop": [_entry_dict(e, compact=False) for e in stop],
    }


def read_json_object(source: Any, what: str, label: str | None = None) -> dict[str, Any]:
    """The JSON object in the file `source`, or one ConfigError naming the file: not a path, missing, unreadable,
    not JSON, or JSON of another kind than an object of `what`."""
    if not isinstance(source, (str, os.PathLike)) or not str(source).strip():
        raise ConfigError(f"{source!r}: expected a dict of {what} or the path of a JSON file of them")
    label = label or str(source)
    text = read_text_file(source, label, "JSON", f"file not found (expected a JSON object of {what})", "the file")
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{label}: not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{label}: expected a JSON object of {what}, got {type(raw).__name__}")
    return raw


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
    """TOML text of a chain (`[chain]` with one inline table per sampler, stopping criterion and guard, then its
    `[draft]` table if it has one) that `Chain.load` accepts."""
    data = chain if isinstance(chain, Mapping) and "samplers" in chain else chain_to_dict(chain)
    lines = ["[chain]"]
    for key in ("name", "description", "backend"):
        if key in data:
            lines.append(f"{key} = {_toml_value(data[key])}")
    for key in ("samplers", "stop", "guards"):
        if data.get(key):
            lines.append(f"{key} = [")
            lines += [f"  {_toml_value(_plain(e))}," for e in data[key]]
            lines.append("]")
    draft = data.get("draft")
    if draft is not None:
        table = {"use": draft} if isinstance(draft, str) else _plain(draft)
        lines += ["", "[draft]"] + [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------- disabled values
_OFF: dict[str, Callable[[dict[str, Any]], bool]] = {
    "penalties": lambda p: (
        (p["repeat"] == 1 and p["frequency"] == 0 and p["presence"] == 0)
        or (p["scope"] == "llama.cpp" and p["last_n"] == 0)
    ),
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
            raise ConfigError(
                f"{e.label()}: {key} = {_plain(value)!r} cannot be expressed in {target}"
                + (f" (it has only {key} = {_plain(want)!r})" if want is not attrs.NOTHING else "")
            )


def _order(
    active: list[tuple[_Entry, int]], target: str, why: str, commute: Callable[[str, str], bool] = lambda a, b: False
) -> None:
    """`active` is (entry, rank in the target's fixed order): every inverted pair must commute."""
    for i, (a, ra) in enumerate(active):
        for b, rb in active[i + 1 :]:
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
            raise ConfigError(
                f"{e.label()}: delta = {e.p['delta']!r} (dynamic temperature) cannot be expressed in "
                f"{target}, which has only a fixed temperature"
            )
        _only(e, target, ("t", "delta", "exponent", "formula"))
    return float(e.p["t"])


def _stop_eos(stop: list[_Entry]) -> list[int] | None:
    ids: list[int] | None = None
    for e in stop:
        if e.name == "eos" and e.p["ids"]:
            ids = list(e.p["ids"])
    return ids
