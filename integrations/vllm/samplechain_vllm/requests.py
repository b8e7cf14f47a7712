"""What a request asks for: the chain and the per-request parameters in `SamplingParams.extra_args`.

Kept free of vLLM imports so the frontend's `validate_params` and the unit tests share exactly this code.

    extra_args = {"samplechain": "llama.cpp"}                                  a preset
    extra_args = {"samplechain": {"preset": "llama.cpp", "params": {"top_k": 20}}}
    extra_args = {"samplechain": {"chain": "creative.toml"}}                   a file in SAMPLECHAIN_VLLM_CHAIN_DIR
    extra_args = {"samplechain": {"chain": {"samplers": [...]}}}               an inline chain table
    extra_args = {"samplechain": {"params": {"temperature": 0.5}}}             the server's default chain
    extra_args = {"samplechain": "off"}                                        opt out of a server default
    extra_args = {"samplechain": {"preset": "llama.cpp", "logprobs_at": "temp"}}   logprobs after an entry
    extra_args = {"samplechain": {"preset": "greedy", "stop_regex": ["\\n\\n+"]}}     stop on a regex (SGLang's)

The OpenAI-compatible server passes `vllm_xargs` as extra_args, and it only takes flat values (strings, numbers,
lists of them), so there the same reads:

    vllm_xargs = {"samplechain": "llama.cpp", "samplechain.top_k": 20, "samplechain.seed": 7}
    vllm_xargs = {"samplechain": "llama.cpp", "samplechain.logprobs_at": "processed"}
    vllm_xargs = {"samplechain": "llama.cpp", "samplechain.stop_regex": "(?i)the end"}      one pattern or a list
    vllm_xargs = {"samplechain": "{\"chain\": {\"samplers\": [{\"use\": \"greedy\"}]}}"}   JSON in a string

The seed of a seeded chain is `params["seed"]`, else `SamplingParams.seed`, else a fresh one (as generate()).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

__all__ = [
    "EXTRA_KEY",
    "VLLM_SEED_KEY",
    "ChainSpec",
    "RequestSpec",
    "RequestSpecError",
    "parse_request",
    "DEFAULT_CHAIN_ENV",
    "CHAIN_DIR_ENV",
]

EXTRA_KEY = "samplechain"
PARAM_PREFIX = EXTRA_KEY + "."  # flat per-request parameters: "samplechain.top_k": 20
_OFF = ("off", "none")  # and False (the Python API)
DEFAULT_CHAIN_ENV = "SAMPLECHAIN_VLLM_CHAIN"  # a chain for requests that name none ("preset:llama.cpp", a file)
CHAIN_DIR_ENV = "SAMPLECHAIN_VLLM_CHAIN_DIR"  # the only folder requests may name chain files from
_KEYS = ("preset", "chain", "params", "logprobs_at", "stop_regex")
LOGPROBS_KEY = "logprobs_at"  # Chain.sample's logprobs_at for this request's logprobs (default: the engine's mode)
STOP_REGEX_KEY = "stop_regex"  # patterns that end the request (SGLang's stop_regex), as generate(stop_regex=...)
# SamplingParams.seed, moved into extra_args by the frontend (validation.hand_over_seed): vLLM then draws its own,
# redundant, sample of a samplechain row without a per-request generator
VLLM_SEED_KEY = "vllm_seed"


class RequestSpecError(ValueError):
    """extra_args["samplechain"] is malformed; vLLM turns a ValueError from validate_params into HTTP 400."""


@attrs.frozen
class ChainSpec:
    """One chain, identified by `key` (equal keys share a loaded chain and its request store)."""

    key: str
    source: Any  # what Chain.load takes: "preset:NAME", a Path, or a dict


@attrs.frozen
class RequestSpec:
    chain: ChainSpec
    params: Mapping[str, Any]
    seed: int | None = None  # SamplingParams.seed: used by a seeded chain when params give no seed
    logprobs_at: str | None = None  # where the request's logprobs come from; None: vLLM's logprobs_mode
    stop_regex: tuple[str, ...] = ()  # the request's own stop_regex patterns (the chain's `stop` list adds its own)


def _preset(name: str) -> ChainSpec:
    name = name[len("preset:") :] if name.startswith("preset:") else name
    if not name:
        raise RequestSpecError('samplechain: empty preset name; give one such as "llama.cpp"')
    return ChainSpec(f"preset:{name}", f"preset:{name}")


def _chain_file(name: str, *, trusted: bool) -> ChainSpec:
    """A chain file. From a request only inside SAMPLECHAIN_VLLM_CHAIN_DIR (a request must not make the server
    read arbitrary paths); the server's own default (trusted) may be anywhere."""
    path = Path(name).expanduser()
    if not trusted:
        root = os.environ.get(CHAIN_DIR_ENV)
        if not root:
            raise RequestSpecError(
                f"samplechain: chain file {name!r} refused: the server allows no chain files; start it with "
                f'{CHAIN_DIR_ENV}=/path/to/chains, or send the chain inline ({{"chain": {{"samplers": [...]}}}})'
            )
        base = Path(root).expanduser().resolve()
        path = (base / path).resolve()
        if base not in path.parents:
            raise RequestSpecError(
                f"samplechain: chain file {name!r} is outside {CHAIN_DIR_ENV} ({base}); name a file inside that folder"
            )
    if not path.is_file():
        raise RequestSpecError(f"samplechain: chain file {name!r} not found (looked at {path})")
    return ChainSpec(f"file:{path}:{path.stat().st_mtime_ns}", path)


def _chain(value: Any, *, trusted: bool = False) -> ChainSpec:
    if isinstance(value, Mapping):
        try:
            key = json.dumps(value, sort_keys=True)
        except (TypeError, ValueError) as exc:
            raise RequestSpecError(f"samplechain: inline chain is not plain JSON data: {exc}") from None
        return ChainSpec(f"inline:{key}", dict(value))
    if not isinstance(value, str):
        raise RequestSpecError(
            f"samplechain: chain must be a preset name, a chain file name or a chain table, got {type(value).__name__}"
        )
    if value.startswith("preset:"):
        return _preset(value)
    if value.endswith((".toml", ".json")) or "/" in value:
        return _chain_file(value, trusted=trusted)
    return _preset(value)


def default_chain() -> ChainSpec | None:
    """The server-wide chain from SAMPLECHAIN_VLLM_CHAIN, or None (requests without extra_args run unchanged)."""
    value = os.environ.get(DEFAULT_CHAIN_ENV, "").strip()
    return _chain(value, trusted=True) if value else None


def parse_request(extra_args: Mapping[str, Any] | None, seed: int | None = None) -> RequestSpec | None:
    """The request's chain and parameters, or None when samplechain does not apply to it.

    `seed` is SamplingParams.seed (or, once the frontend handed it over, extra_args' samplechain.vllm_seed); it
    seeds a seeded chain unless params give their own."""
    extra = extra_args or {}
    raw = extra.get(EXTRA_KEY, None)
    flat = {k[len(PARAM_PREFIX) :]: v for k, v in extra.items() if isinstance(k, str) and k.startswith(PARAM_PREFIX)}
    logprobs_at = flat.pop(LOGPROBS_KEY, None)
    stop_regex = flat.pop(STOP_REGEX_KEY, None)
    if VLLM_SEED_KEY in flat:
        seed = _handed_seed(flat.pop(VLLM_SEED_KEY), seed)
    if raw is False or (isinstance(raw, str) and raw.strip().lower() in _OFF):
        if flat or logprobs_at is not None or stop_regex is not None:
            given = list(flat) + [
                k for k, v in ((LOGPROBS_KEY, logprobs_at), (STOP_REGEX_KEY, stop_regex)) if v is not None
            ]
            raise RequestSpecError(
                f"samplechain: {raw!r} turns samplechain off but parameters were given "
                f"({', '.join(PARAM_PREFIX + k for k in given)})"
            )
        return None
    if isinstance(raw, str) and raw.lstrip().startswith("{"):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise RequestSpecError(f"samplechain: the value starts with '{{' but is not valid JSON: {exc}") from None
    if raw is None and (flat or stop_regex is not None):
        raw = {}
    params: dict[str, Any] = {}
    if raw is None or raw is True:
        chain = default_chain()
        if chain is None:
            if raw is True:
                raise RequestSpecError(
                    f"samplechain: true asks for the server's default chain but none is set "
                    f'({DEFAULT_CHAIN_ENV}); name a preset: {{"samplechain": "llama.cpp"}}'
                )
            return None
    elif isinstance(raw, str):
        chain = _chain(raw)
    elif isinstance(raw, Mapping):
        chain = _object_chain(raw)
        params = _object_params(raw)
        logprobs_at = _once(raw, LOGPROBS_KEY, logprobs_at)
        stop_regex = _once(raw, STOP_REGEX_KEY, stop_regex)
    else:
        raise RequestSpecError(
            f"samplechain: expected a preset name or an object with preset / chain / params, got {type(raw).__name__}"
        )
    clash = sorted(set(params) & set(flat))
    if clash:
        raise RequestSpecError(
            f"samplechain: parameter(s) {clash} given both in params and as {PARAM_PREFIX}NAME; give each once"
        )
    params.update(flat)
    if logprobs_at is not None and not isinstance(logprobs_at, str):
        raise RequestSpecError(
            f'samplechain: {LOGPROBS_KEY} must be a string such as "raw", "processed" or a '
            f"chain entry's id, got {logprobs_at!r}"
        )
    return RequestSpec(chain, params, None if seed is None else int(seed), logprobs_at, _patterns(stop_regex))


def _handed_seed(handed: Any, seed: int | None) -> int:
    """The seed the frontend handed over in extra_args, which must agree with SamplingParams.seed when both are set."""
    if isinstance(handed, bool) or not isinstance(handed, int):
        raise RequestSpecError(
            f"samplechain: {PARAM_PREFIX}{VLLM_SEED_KEY} must be an integer (the request's seed), got {handed!r}"
        )
    if seed is not None and seed != handed:
        raise RequestSpecError(
            f"samplechain: seed = {seed} but {PARAM_PREFIX}{VLLM_SEED_KEY} = {handed}: two "
            f"seeds for one request; give it once"
        )
    return handed


def _object_chain(raw: Mapping[str, Any]) -> ChainSpec:
    """The chain an object form names: its preset, its chain, or the server's default."""
    unknown = sorted(set(raw) - set(_KEYS))
    if unknown:
        raise RequestSpecError(f"samplechain: unknown key(s) {unknown}; use {', '.join(_KEYS)}")
    if "preset" in raw and "chain" in raw:
        raise RequestSpecError("samplechain: give either preset or chain, not both")
    if "preset" in raw:
        if not isinstance(raw["preset"], str):
            raise RequestSpecError(f"samplechain: preset must be a name, got {raw['preset']!r}")
        return _preset(raw["preset"])
    if "chain" in raw:
        return _chain(raw["chain"])
    found = default_chain()
    if found is None:
        raise RequestSpecError(
            f'samplechain: no chain named and the server has no default ({DEFAULT_CHAIN_ENV}); add "preset" or "chain"'
        )
    return found


def _object_params(raw: Mapping[str, Any]) -> dict[str, Any]:
    given = raw.get("params", {}) or {}
    if not isinstance(given, Mapping) or not all(isinstance(k, str) for k in given):
        raise RequestSpecError(f"samplechain: params must be an object of parameter names, got {given!r}")
    return dict(given)


def _once(raw: Mapping[str, Any], key: str, flat_value: Any) -> Any:
    """A setting given in the object or as a flat samplechain.KEY, not both."""
    if key not in raw:
        return flat_value
    if flat_value is not None:
        raise RequestSpecError(f"samplechain: {key} given both in the object and as {PARAM_PREFIX}{key}; give it once")
    return raw[key]


def _patterns(value: Any) -> tuple[str, ...]:
    """stop_regex as given: one pattern or a list of them (each checked when the criterion is built)."""
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not value or not all(isinstance(p, str) for p in value):
        raise RequestSpecError(
            f"samplechain: {STOP_REGEX_KEY} must be a regular expression or a non-empty list of "
            f'them, e.g. "(?i)the end" or ["END", "\\\\n{{2,}}"], got {value!r}'
        )
    return tuple(value)
