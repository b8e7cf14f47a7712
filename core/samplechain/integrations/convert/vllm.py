"""vLLM / OpenAI sampling params <-> chain: `from_vllm`, `to_vllm`. See docs/convert.md for the mapping table."""

from __future__ import annotations

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
    _hint,
    _off,
    _only,
    _order,
    _plain,
    _temperature,
)

# --------------------------------------------------------------------------------------------------- vLLM
_VLLM_ORDER = [
    "allowed_tokens",
    "bad_words",
    "min_new_tokens",
    "logit_bias",
    "penalties",
    "temperature",
    "min_p",
    "top_k",
    "top_p",
]
_VLLM_KNOWN = {
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "frequency_penalty",
    "presence_penalty",
    "seed",
    "logit_bias",
    "allowed_token_ids",
    "bad_words",
    "min_tokens",
    "stop",
    "stop_token_ids",
    "max_tokens",
    "max_completion_tokens",
    "ignore_eos",
}
# request-level settings of SamplingParams / the OpenAI API that are no part of a chain (dropped with a warning
# when not at their default)
_VLLM_REQUEST = {
    "n": 1,
    "best_of": None,
    "logprobs": None,
    "top_logprobs": None,
    "prompt_logprobs": None,
    "detokenize": True,
    "skip_special_tokens": True,
    "spaces_between_special_tokens": True,
    "include_stop_str_in_output": False,
    "output_kind": None,
    "truncate_prompt_tokens": None,
    "stream": False,
    "echo": False,
    "user": None,
    "model": None,
    "prompt": None,
    "messages": None,
    "extra_args": None,
    "logits_processors": None,
    "stream_options": None,
}


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
                warnings.warn(
                    f"{where}: {key} = {value!r} is a request setting, not part of a chain: dropped",
                    ConvertWarning,
                    stacklevel=2,
                )
            continue
        raise ConfigError(
            f"{where}: unknown key {key!r}{_hint(key, sorted(_VLLM_KNOWN | set(_VLLM_REQUEST)))} "
            f"(supported: {', '.join(sorted(_VLLM_KNOWN))})"
        )

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
        {
            "use": "penalties",
            "repeat": number("repetition_penalty", 1.0),
            "frequency": number("frequency_penalty", 0.0),
            "presence": number("presence_penalty", 0.0),
            "scope": "vllm",
        },
    ]
    seed = raw.get("seed")
    if temperature < 1e-5:
        samplers.append({"use": "greedy"})
        name = "vllm (greedy)"
    else:
        samplers += [
            {"use": "temperature", "t": temperature},
            {"use": "min_p", "p": number("min_p", 0.0)},
            {"use": "top_k", "k": max(top_k, 0)},
            {"use": "top_p", "p": number("top_p", 1.0)},
            {"use": "dist"} if seed is None else {"use": "dist", "seed": seed},
        ]
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
        warnings.warn(
            f"{where}: ignore_eos = true is a generate() setting (generate(..., ignore_eos=True)), not "
            "part of a chain: dropped",
            ConvertWarning,
            stacklevel=2,
        )
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
                raise ConfigError(
                    f"{e.label()}: vLLM's bad_words are strings (words = [...]); token-id sequences "
                    f"(ids = {_plain(p['ids'])}) cannot be expressed"
                )
            kw["bad_words"] = list(p["words"])
        elif n == "min_new_tokens":
            if p["eos_ids"]:
                raise ConfigError(
                    f"{e.label()}: eos_ids = {list(p['eos_ids'])}: vLLM's min_tokens masks the "
                    "model's eos and the stop_token_ids, not a chosen list"
                )
            kw["min_tokens"] = int(p["n"])
        elif n == "logit_bias":
            pairs = p["bias"].items() if isinstance(p["bias"], Mapping) else p["bias"]
            out: dict[str, float] = {}
            for tok, b in pairs:
                out[str(int(tok))] = out.get(str(int(tok)), 0.0) + float(b)
            kw["logit_bias"] = out
        elif n == "penalties":
            _only(e, target, ("repeat", "frequency", "presence", "last_n"), scope="vllm")
            kw.update(
                repetition_penalty=float(p["repeat"]),
                frequency_penalty=float(p["frequency"]),
                presence_penalty=float(p["presence"]),
            )
        elif n in _TEMPS:
            t = _temperature(e, target)
            if t <= 0:
                raise ConfigError(
                    f"{e.label()}: t = {t!r}: vLLM reads temperature 0 as greedy; end the chain with greedy instead"
                )
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
            raise ConfigError(
                f"{sampling[0].label()}: vLLM's greedy (temperature 0) skips temperature, min_p, "
                "top_k and top_p, so a greedy chain cannot carry them"
            )
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
            raise ConfigError(
                f"{e.label()}: vLLM cannot express the stopping criterion {e.name} with "
                f"{_plain(e.p)} (it has max_tokens, stop strings and one-token stop_token_ids)"
            )
    return kw
