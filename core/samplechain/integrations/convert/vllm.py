"""vLLM / OpenAI sampling params <-> chain: `from_vllm`, `to_vllm`. See docs/convert.md for the mapping table."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any

from ...errors import ConfigError
from .common import (
    ConvertWarning,
    _checked,
    _commute,
    _Entry,
    _exported,
    _hint,
    _off,
    _only,
    _order,
    _plain,
    _temperature,
    read_json_object,
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
    return read_json_object(source, what), str(source)


def _vllm_known_keys(raw: Mapping[str, Any], where: str) -> None:
    """Unknown keys are an error; request-level keys away from their default are dropped with a warning."""
    for key, value in raw.items():
        if key in _VLLM_KNOWN:
            continue
        if key in _VLLM_REQUEST:
            if value != _VLLM_REQUEST[key]:
                warnings.warn(
                    f"{where}: {key} = {value!r} is a request setting, not part of a chain: dropped",
                    ConvertWarning,
                    stacklevel=3,  # from_vllm's caller
                )
            continue
        raise ConfigError(
            f"{where}: unknown key {key!r}{_hint(key, sorted(_VLLM_KNOWN | set(_VLLM_REQUEST)))} "
            f"(supported: {', '.join(sorted(_VLLM_KNOWN))})"
        )


def _get(raw: Mapping[str, Any], key: str, default: Any) -> Any:
    """A setting, or `default` where it is missing or null (vLLM reads null as unset)."""
    value = raw.get(key)
    return default if value is None else value


def _number(raw: Mapping[str, Any], where: str, key: str, default: float) -> float:
    value = _get(raw, key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{where}: {key} = {value!r}: expected a number")
    return float(value)


def _vllm_samplers(raw: Mapping[str, Any], where: str) -> tuple[list[dict[str, Any]], str]:
    """vLLM's sampler pipeline for these settings (masks, penalties, then greedy or the warpers and dist), named."""
    temperature = _number(raw, where, "temperature", 1.0)
    if temperature < 0:
        raise ConfigError(f"{where}: temperature = {temperature!r}: must be >= 0 (0 is greedy)")
    top_k = _get(raw, "top_k", 0)
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < -1:
        raise ConfigError(f"{where}: top_k = {top_k!r}: expected an integer >= -1 (0 or -1 disables)")
    bias = _get(raw, "logit_bias", {})
    if not isinstance(bias, Mapping):
        raise ConfigError(f"{where}: logit_bias = {bias!r}: expected an object {{token_id: bias}}")
    for token, value in bias.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: logit_bias[{token!r}] = {value!r}: expected a number (the bias)")
    bad = _list(raw, where, "bad_words", "a string or a list of strings")
    min_tokens = _get(raw, "min_tokens", 0)
    if isinstance(min_tokens, bool) or not isinstance(min_tokens, int) or min_tokens < 0:
        raise ConfigError(f"{where}: min_tokens = {min_tokens!r}: expected an integer >= 0")
    samplers: list[dict[str, Any]] = [
        {"use": "allowed_tokens", "ids": _list(raw, where, "allowed_token_ids", "a list of token ids")},
        {"use": "bad_words", "words": bad} if bad else {"use": "bad_words", "ids": []},
        {"use": "min_new_tokens", "n": min_tokens},
        {"use": "logit_bias", "bias": {str(k): float(v) for k, v in bias.items()}},
        {
            "use": "penalties",
            "repeat": _number(raw, where, "repetition_penalty", 1.0),
            "frequency": _number(raw, where, "frequency_penalty", 0.0),
            "presence": _number(raw, where, "presence_penalty", 0.0),
            "scope": "vllm",
        },
    ]
    if temperature < 1e-5:
        return samplers + [{"use": "greedy"}], "vllm (greedy)"
    seed = raw.get("seed")
    return samplers + [
        {"use": "temperature", "t": temperature},
        {"use": "min_p", "p": _number(raw, where, "min_p", 0.0)},
        {"use": "top_k", "k": max(top_k, 0)},
        {"use": "top_p", "p": _number(raw, where, "top_p", 1.0)},
        {"use": "dist"} if seed is None else {"use": "dist", "seed": seed},
    ], "vllm"


def _vllm_stop_criteria(raw: Mapping[str, Any], where: str) -> list[dict[str, Any]]:
    """max_tokens (or max_completion_tokens), stop strings and stop_token_ids as stop criteria."""
    stop: list[dict[str, Any]] = []
    max_tokens = raw.get("max_tokens", raw.get("max_completion_tokens"))
    if max_tokens is not None:
        stop.append({"use": "max_new_tokens", "n": max_tokens})
    strings = _list(raw, where, "stop", "a string or a list of strings")
    if strings:
        stop.append({"use": "stop_strings", "strings": strings})
    ids = _list(raw, where, "stop_token_ids", "a list of token ids")
    if ids:
        stop.append({"use": "stop_sequences", "sequences": [[t] for t in ids]})
    return stop


def _list(raw: Mapping[str, Any], where: str, key: str, expected: str) -> list[Any]:
    """A list setting (one string stands for a list of it where strings are expected); its items are checked by the
    chain entry it becomes."""
    value = _get(raw, key, [])
    if isinstance(value, str) and "string" in expected:
        return [value]
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"{where}: {key} = {value!r}: expected {expected}")
    return list(value)


def from_vllm(source: Any) -> dict[str, Any]:
    """The chain vLLM's sampler runs for these SamplingParams (a dict, or a JSON file of one), in vLLM's order.

    temperature 0 (below 1e-5, vLLM's _SAMPLING_EPS) is greedy; max_tokens, stop and stop_token_ids become stop
    criteria. Request-level keys (n, logprobs ...) are dropped with a ConvertWarning; unknown keys are an error.
    """
    raw, label = _load_json(source, "vLLM sampling parameters")
    where = f"{label}: vLLM params"
    _vllm_known_keys(raw, where)
    samplers, name = _vllm_samplers(raw, where)
    stop = _vllm_stop_criteria(raw, where)
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


# Each step's SamplingParams keywords from its entry (after checking the entry fits them).
_VllmKwargs = Callable[[_Entry, str], dict[str, Any]]


def _vllm_bad_words(e: _Entry, target: str) -> dict[str, Any]:
    if e.p["ids"] or e.p["eos_ids"]:
        raise ConfigError(
            f"{e.label()}: vLLM's bad_words are strings (words = [...]); token-id sequences "
            f"(ids = {_plain(e.p['ids'])}) cannot be expressed"
        )
    return {"bad_words": list(e.p["words"])}


def _vllm_min_tokens(e: _Entry, target: str) -> dict[str, Any]:
    if e.p["eos_ids"]:
        raise ConfigError(
            f"{e.label()}: eos_ids = {list(e.p['eos_ids'])}: vLLM's min_tokens masks the "
            "model's eos and the stop_token_ids, not a chosen list"
        )
    return {"min_tokens": int(e.p["n"])}


def _vllm_logit_bias(e: _Entry, target: str) -> dict[str, Any]:
    pairs = e.p["bias"].items() if isinstance(e.p["bias"], Mapping) else e.p["bias"]
    out: dict[str, float] = {}
    for tok, b in pairs:  # a token named twice: vLLM adds one bias per token, so the biases add up
        out[str(int(tok))] = out.get(str(int(tok)), 0.0) + float(b)
    return {"logit_bias": out}


def _vllm_penalties(e: _Entry, target: str) -> dict[str, Any]:
    _only(e, target, ("repeat", "frequency", "presence", "last_n"), scope="vllm")
    return {
        "repetition_penalty": float(e.p["repeat"]),
        "frequency_penalty": float(e.p["frequency"]),
        "presence_penalty": float(e.p["presence"]),
    }


def _vllm_temperature(e: _Entry, target: str) -> dict[str, Any]:
    t = _temperature(e, target)
    if t <= 0:
        raise ConfigError(
            f"{e.label()}: t = {t!r}: vLLM reads temperature 0 as greedy; end the chain with greedy instead"
        )
    return {"temperature": t}


def _vllm_probability(e: _Entry, target: str) -> dict[str, Any]:
    _only(e, target, ("p",))
    return {e.name: float(e.p["p"])}


def _vllm_top_k(e: _Entry, target: str) -> dict[str, Any]:
    _only(e, target, ("k",))
    return {"top_k": int(e.p["k"])}


_VLLM_KWARGS: dict[str, _VllmKwargs] = {
    "allowed_tokens": lambda e, t: {"allowed_token_ids": list(e.p["ids"])},
    "bad_words": _vllm_bad_words,
    "min_new_tokens": _vllm_min_tokens,
    "logit_bias": _vllm_logit_bias,
    "penalties": _vllm_penalties,
    "temperature": _vllm_temperature,
    "temp_ext": _vllm_temperature,
    "min_p": _vllm_probability,
    "top_p": _vllm_probability,
    "top_k": _vllm_top_k,
}


def _vllm_steps(body: list[_Entry], target: str) -> list[_Entry]:
    """The entries that do something, each one a step of vLLM's sampler, in an order vLLM can run."""
    active = [e for e in body if not _off(e)]
    ranked = []
    for e in active:
        name = "temperature" if e.name == "temp_ext" else e.name
        if name not in _VLLM_ORDER:
            raise ConfigError(f"{e.label()}: vLLM's sampler has no {e.name} step (it has: {', '.join(_VLLM_ORDER)})")
        ranked.append((e, _VLLM_ORDER.index(name)))
    _order(ranked, target, f"vLLM's sampler runs {' -> '.join(_VLLM_ORDER)} in that order", _commute)
    return active


def _vllm_selector(selector: _Entry, active: list[_Entry], kw: dict[str, Any]) -> None:
    """temperature 0 for greedy (which then carries no warpers); dist samples, with its seed."""
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


def _vllm_stop(stop: list[_Entry], kw: dict[str, Any]) -> None:
    """The stop criteria as max_tokens, stop and stop_token_ids."""
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


def to_vllm(chain: Any) -> dict[str, Any]:
    """vLLM SamplingParams keyword arguments for this chain; ConfigError where vLLM's fixed pipeline cannot run it."""
    target = "vLLM"
    samplers, stop = _exported(chain, "vLLM")
    active = _vllm_steps(samplers[:-1], target)
    kw: dict[str, Any] = {}
    for e in active:
        kw.update(_VLLM_KWARGS[e.name](e, target))
    _vllm_selector(samplers[-1], active, kw)
    _vllm_stop(stop, kw)
    return kw
