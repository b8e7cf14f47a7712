"""Chain configs: TOML file or dict -> attrs classes via cattrs, unknown keys forbidden.

Every error names the file, the key path, the bad value and what was expected:
    chain.toml: chain.samplers[2].p = 1.5: must be in [0, 1]

A chain may name the drafter its generations speculate with (docs/speculative.md): a `[draft]` table beside
`[chain]` (or a `draft` key of the chain table), `{ use = "prompt_lookup", num_tokens = 8 }`, validated here like
a chain entry and kept as written in `ChainConfig.draft`.
"""

from __future__ import annotations

import collections.abc
import difflib
import math
import numbers
import os
import sys
import typing
import warnings
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

import attrs
import cattrs
import torch
from cattrs.errors import ClassValidationError, ForbiddenExtraKeysError, IterableValidationError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from ..contracts import Stage
from ..drafters import SETTINGS, draft_settings
from ..errors import ChainWarning, ConfigError, UnknownPluginError
from ..guards import SETTINGS as GUARD_SETTINGS
from ..guards import guard_settings
from .discovery import PluginHost, get_host

__all__ = ["ChainConfig", "EntrySpec", "load_config", "parse_params", "converter"]

_CHAIN_KEYS = ("samplers", "stop", "backend", "nonfinite", "name", "description", "draft", "guards")
_KEYS = _CHAIN_KEYS
NONFINITE = ("error", "sanitize")  # what a NaN or +inf logit does; checks.sanitized says how "sanitize" cleans


@attrs.frozen
class EntrySpec:
    """One resolved entry of a chain: a sampler or a stopping criterion with its validated parameters."""

    use: str  # as written: "top_p" or "top_p.v1"
    cls: type[Any]
    params: Any  # an instance of cls.Params: the chain's defaults
    id: str  # label for per-request parameters ("top_p", or the entry's `id`)
    path: str  # "chain.samplers[2]"


@attrs.frozen
class ChainConfig:
    samplers: tuple[EntrySpec, ...]
    stop: tuple[EntrySpec, ...] = ()
    backend: str = "auto"
    name: str | None = None
    description: str = ""
    source: str = "<dict>"
    nonfinite: str = "error"  # one of NONFINITE
    # the drafter generations with this chain speculate with, as written ({"use": "prompt_lookup", ...}); None: none
    draft: dict[str, Any] | None = attrs.field(default=None, hash=False)
    # the guards generations with this chain run (docs/guards.md), as written ({"use": "banned_strings", ...})
    guards: tuple[dict[str, Any], ...] = attrs.field(default=(), hash=False)


def _strict(kind: type, expect: str):  # cattrs' defaults would turn "0.9" into 0.9 and "false" into True
    accepted = {float: numbers.Real, int: numbers.Integral}.get(kind, kind)

    def hook(value: Any, _type: Any) -> Any:
        if isinstance(value, bool) and kind is not bool:
            raise TypeError(f"expected {expect}")
        if not isinstance(value, accepted):  # numpy scalars count as numbers
            raise TypeError(f"expected {expect}")
        return kind(value)

    return hook


@lru_cache(maxsize=1)
def converter() -> cattrs.Converter:
    conv = cattrs.Converter(forbid_extra_keys=True)
    conv.register_structure_hook(float, _strict(float, "a number"))
    conv.register_structure_hook(int, _strict(int, "an integer"))
    conv.register_structure_hook(bool, _strict(bool, "true or false"))
    conv.register_structure_hook(str, _strict(str, "a string"))
    conv.register_structure_hook_factory(_is_array, lambda t: _array_hook(conv, t))
    return conv


def _is_array(t: Any) -> bool:
    return typing.get_origin(t) in (list, tuple, collections.abc.Sequence)


def _array_hook(conv: cattrs.Converter, t: Any):
    """Arrays stay arrays: cattrs would turn the string "abc" into ["a", "b", "c"]."""
    args = typing.get_args(t)
    item = args[0] if args else Any
    origin = typing.get_origin(t)

    def hook(value: Any, _type: Any) -> Any:
        if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, (list, tuple)):
            raise TypeError('expected an array, e.g. [1, 2] or ["a"]')
        errors, out = [], []
        for i, v in enumerate(value):
            try:
                out.append(v if item is Any else conv.structure(v, item))
            except Exception as exc:  # noqa: BLE001 - collected with the index, as cattrs does
                exc.__notes__ = [  # type: ignore[attr-defined]  # the stubs add __notes__ only from Python 3.11
                    *getattr(exc, "__notes__", []),
                    cattrs.errors.IterableValidationNote(f"Structuring {t} @ index {i}", i, item),
                ]
                errors.append(exc)
        if errors:
            raise IterableValidationError(f"While structuring {t!r}", errors, t)
        return tuple(out) if origin is tuple else out

    return hook


def _walk(exc: BaseException, path: str) -> list[tuple[str, str]]:
    """Flatten a cattrs error tree into (key path, message) pairs."""
    if isinstance(exc, ForbiddenExtraKeysError):
        return [(f"{path}.{k}", "unknown key") for k in sorted(exc.extra_fields)]
    if isinstance(exc, ClassValidationError):
        noted, other = exc.group_exceptions()
        out = [pair for sub, note in noted for pair in _walk(sub, f"{path}.{note.name}")]
        return out + [pair for sub in other for pair in _walk(sub, path)]
    if isinstance(exc, IterableValidationError):
        indexed, other = exc.group_exceptions()
        out = [pair for sub, note in indexed for pair in _walk(sub, f"{path}[{note.index}]")]
        return out + [pair for sub in other for pair in _walk(sub, path)]
    if isinstance(exc, KeyError):
        return [(path, "required key missing")]
    return [(path, str(exc))]


def _value_at(raw: Any, relative: str) -> Any:
    """The value at a relative key path such as ".p" or ".words[1]"; _MISSING when absent."""
    cur = raw
    for part in relative.replace("[", ".[").split(".")[1:]:
        try:
            cur = cur[int(part[1:-1])] if part.startswith("[") else cur[part]
        except (KeyError, IndexError, TypeError, ValueError):
            return _MISSING
    return cur


_MISSING = object()


def _line(source: str, path: str, value: Any, message: str) -> str:
    shown = "" if value is _MISSING or isinstance(value, Mapping) else f" = {value!r}"
    return f"{source}: {path}{shown}: {message}"


_F32 = torch.finfo(torch.float32)


def _check_storable(kind: Any, value: Any) -> None:
    """Numbers travel as float32 / int64 columns: a value that would silently become 0 or inf is refused."""
    if getattr(kind, "__args__", None) and type(None) in kind.__args__:
        kind = next(a for a in kind.__args__ if a is not type(None))
    if kind is float and isinstance(value, float) and math.isfinite(value):
        if abs(value) > _F32.max:
            raise ValueError(f"too large for float32 (parameters are float32; largest is {_F32.max:.4g})")
        if value != 0.0 and abs(value) < _F32.smallest_normal:
            raise ValueError(
                f"too small for float32 (parameters are float32): use 0 or a magnitude of at least "
                f"{_F32.smallest_normal:.4g}"
            )
    elif kind is int and isinstance(value, int) and not -(2**63) <= value < 2**63:
        raise ValueError("out of the int64 range (parameters are int64)")


def parse_params(cls: type[Any], raw: Mapping[str, Any], *, source: str, path: str) -> Any:
    """Validate raw parameters against cls.Params: types, ranges, unknown keys. Raises one ConfigError."""
    if not isinstance(raw, Mapping):
        raise ConfigError(
            f"{source}: {path} = {raw!r}: expected a table of {path}'s parameters (a dict such as {{'n': 10}})"
        )
    params_cls = cls.Params
    attrs.resolve_types(params_cls)
    fields = {f.name: f for f in attrs.fields(params_cls)}
    problems: list[str] = []
    for key in raw:
        if key not in fields:
            close = difflib.get_close_matches(key, list(fields), n=1, cutoff=0.5)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            valid = ", ".join(fields) if fields else "none"
            problems.append(
                _line(
                    source,
                    f"{path}.{key}",
                    raw[key],
                    f"unknown parameter of {cls.qualified_name()} (valid: {valid}){hint}",
                )
            )
    if problems:
        raise ConfigError("\n".join(problems))
    try:
        with attrs.validators.disabled():
            params = converter().structure(dict(raw), params_cls)
    except Exception as exc:  # noqa: BLE001 - re-raised as one ConfigError with paths
        pairs = _walk(exc, path)
        raise ConfigError("\n".join(_line(source, p, _value_at(raw, p[len(path) :]), m) for p, m in pairs)) from None
    for field in fields.values():
        value = getattr(params, field.name)
        try:
            if field.validator is not None:
                field.validator(params, field, value)
            _check_storable(field.type, value)
        except (ValueError, TypeError) as exc:
            shown = raw.get(field.name, value)  # as the user wrote it ([1, 2], not the stored (1, 2))
            problems.append(_line(source, f"{path}.{field.name}", shown, str(exc)))
    if problems:
        raise ConfigError("\n".join(problems))
    return params


def _resolve_entries(
    raw_list: Any, kind: str, *, source: str, path: str, host: PluginHost
) -> tuple[list[EntrySpec], list[str]]:
    specs: list[EntrySpec] = []
    problems: list[str] = []
    if not isinstance(raw_list, list):
        return specs, [_line(source, path, raw_list, 'expected an array of tables like { use = "top_k", k = 40 }')]
    for i, raw in enumerate(raw_list):
        where = f"{path}[{i}]"
        if not isinstance(raw, Mapping):
            problems.append(_line(source, where, raw, 'expected a table like { use = "top_k", k = 40 }'))
            continue
        use = raw.get("use")
        if not isinstance(use, str):
            problems.append(
                _line(
                    source,
                    f"{where}.use",
                    raw.get("use", _MISSING),
                    "required: the name of a " + kind.replace("_", " "),
                )
            )
            continue
        try:
            cls = host.get(kind, use)
        except UnknownPluginError as exc:
            problems.append(_line(source, f"{where}.use", use, str(exc)))
            continue
        label = raw.get("id", cls.name)
        if not isinstance(label, str) or not label:
            problems.append(_line(source, f"{where}.id", label, "expected a non-empty string"))
            continue
        body = {k: v for k, v in raw.items() if k not in ("use", "id")}
        try:
            params = parse_params(cls, body, source=source, path=where)
        except ConfigError as exc:
            problems.append(str(exc))
            continue
        specs.append(EntrySpec(use=use, cls=cls, params=params, id=label, path=where))
    return specs, problems


def _check_shape(samplers: list[EntrySpec], source: str) -> list[str]:
    selectors = [s for s in samplers if s.cls.stage is Stage.SELECT]
    if not samplers:
        return [f'{source}: chain.samplers: empty; a chain needs at least a selector, e.g. {{ use = "dist" }}']
    problems = []
    if not selectors:
        last = samplers[-1]
        problems.append(
            f"{source}: {last.path}.use = {last.use!r}: the chain must end in exactly one selector "
            f'(greedy, dist, ...); append {{ use = "dist" }} or {{ use = "greedy" }}'
        )
    elif len(selectors) > 1 or samplers[-1].cls.stage is not Stage.SELECT:
        found = ", ".join(f"{s.path} ({s.use})" for s in selectors)
        problems.append(
            f"{source}: {selectors[-1].path}.use = {selectors[-1].use!r}: a chain has exactly one selector and it "
            f"is the last entry; selectors found at {found}"
        )
    seen: dict[str, str] = {}
    for s in samplers:
        if s.id in seen:
            problems.append(
                f"{source}: {s.path}.id = {s.id!r}: already used by {seen[s.id]}; give one of them a distinct "
                f"`id` so per-request parameters can address it"
            )
        seen[s.id] = s.path
    return problems


def _pitfalls(samplers: list[EntrySpec], source: str) -> list[str]:
    """Known pitfalls of an order that is valid (warned, never refused)."""
    out: list[str] = []
    truncation = next((s for s in samplers if s.cls.effective_role() == "truncation"), None)
    if truncation is None:
        return out
    first = samplers.index(truncation)
    for s in samplers[first + 1 :]:
        role = s.cls.effective_role()
        if role in ("penalty", "bias"):
            out.append(
                f"{source}: {s.path}.use = {s.use!r}: a {role} placed after the truncation {truncation.use!r} "
                f"({truncation.path}) can only touch the tokens that survived it, never bring back one it removed; "
                f"llama.cpp, transformers and vLLM apply {'penalties' if role == 'penalty' else 'biases'} first "
                f"(move it before {truncation.use!r})"
            )
        elif s.cls.replaces_truncation:
            out.append(
                f"{source}: {s.path}.use = {s.use!r} chooses its own candidate set, and llama.cpp drops truncation "
                f"samplers ({truncation.use!r} at {truncation.path}) when mirostat is on; here they run first and "
                f"{s.use} sees only their survivors (keep only temperature before {s.use!r} for llama.cpp's behaviour)"
            )
    return out


def _read_source(
    source: str | Path | Mapping[str, Any], name: str | None, host: PluginHost
) -> tuple[dict[str, Any], str]:
    """The settings of a dict, a TOML string (one with a newline) or a TOML file, and the label errors name."""
    if isinstance(source, Mapping):
        return dict(source), name or "<dict>"
    if not isinstance(source, (str, os.PathLike)) or not str(source).strip():
        raise ConfigError(
            f"chain source = {source!r}: expected a chain file's path, a TOML string, a dict of the chain's tables "
            f"or 'preset:NAME'" + ("" if isinstance(source, str) else f", got {type(source).__name__}")
        )
    text_given = isinstance(source, str) and "\n" in source
    label = name or ("<string>" if text_given else str(source))
    if text_given:
        text = str(source)
    else:
        text = read_text_file(
            source, label, "TOML", f"chain file not found{_not_found_hint(str(source), host)}", "the chain file"
        )
    try:
        return tomllib.loads(text), label
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{label}: not valid TOML: {exc}") from None


def read_text_file(path: str | os.PathLike[str], label: str, kind: str, not_found: str, what: str) -> str:
    """A settings file's UTF-8 text, or one ConfigError naming it (`label: not_found`, not text, cannot be read)."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{label}: {not_found}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{label}: not a {kind} file (not UTF-8 text: {exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise ConfigError(f"{label}: cannot read {what}: {exc.strerror or exc}") from None


def _not_found_hint(source: str, host: PluginHost) -> str:
    """Why a string that names no file may have been meant otherwise: a preset's name, or one line of TOML."""
    if source in host.registry.presets:
        return f"; for the preset of that name give 'preset:{source}'"
    try:
        tomllib.loads(source)
    except tomllib.TOMLDecodeError:
        return ""
    return "; a string is read as TOML text only when it has a newline (one line is a file's name): add one"


def _check_chain_keys(chain: Mapping[str, Any], label: str, prefix: str) -> list[str]:
    """Problems with the chain table's own keys: unknown ones, samplers missing, kinds, nonfinite's value."""
    problems = [
        _line(
            label,
            f"{prefix}{k}",
            chain[k],
            f"unknown key; expected one of {', '.join(_CHAIN_KEYS)}"
            + (f"; did you mean {c[0]!r}?" if (c := difflib.get_close_matches(k, _KEYS, n=1)) else ""),
        )
        for k in chain
        if k not in _KEYS
    ]
    if "samplers" not in chain:
        problems.append(f"{label}: {prefix}samplers: required key missing (an array of sampler tables)")
    for key, typ, expect in (
        ("backend", str, 'a backend name or "auto"'),
        ("name", str, "a string"),
        ("description", str, "a string"),
    ):
        if key in chain and not isinstance(chain[key], typ):
            problems.append(_line(label, f"{prefix}{key}", chain[key], f"expected {expect}"))
    if chain.get("nonfinite", "error") not in NONFINITE:
        problems.append(
            _line(
                label,
                f"{prefix}nonfinite",
                chain["nonfinite"],
                f"must be one of {', '.join(map(repr, NONFINITE))} (what a NaN or +inf logit does: "
                f'"error" raises naming the request, "sanitize" replaces it as transformers\' '
                f"remove_invalid_values does)",
            )
        )
    return problems


def _check_backend(host: PluginHost, backend: Any, label: str, prefix: str) -> list[str]:
    if backend == "auto":
        return []
    try:
        host.get("backend", backend)
    except UnknownPluginError as exc:
        return [_line(label, f"{prefix}backend", backend, str(exc))]
    return []


_DRAFT_EXAMPLE = 'a [draft] table with use = "prompt_lookup" (and its parameters: num_tokens = 8)'


def _tables(raw: Mapping[str, Any], label: str) -> tuple[Any, str, Any, str, list[str]]:
    """(the chain table, its key prefix, the draft table or None, its key path, problems): a file holds `[chain]`
    and optionally `[draft]`, or the chain's keys at the top (`draft` then among them)."""
    if "chain" not in raw:
        return raw, "", raw.get("draft"), "draft", []
    chain = raw["chain"]
    problems = [
        _line(
            label,
            k,
            raw[k],
            "unknown table; a chain file holds [chain] and optionally [draft]"
            + (f"; did you mean {c[0]!r}?" if (c := difflib.get_close_matches(k, ["chain", "draft"], n=1)) else ""),
        )
        for k in raw
        if k not in ("chain", "draft")
    ]
    inner = chain.get("draft") if isinstance(chain, Mapping) else None
    if inner is not None and raw.get("draft") is not None:
        problems.append(f"{label}: draft: given twice, as [draft] and as chain.draft; keep one")
    if inner is not None:
        return chain, "chain.", inner, "chain.draft", problems
    return chain, "chain.", raw.get("draft"), "draft", problems


def _check_draft(draft: Any, label: str, path: str, host: PluginHost) -> tuple[dict[str, Any] | None, list[str]]:
    """The draft table as written (a bare name becomes {"use": name}) after the drafter's own checks: it is known,
    its parameters are valid and it can be made from them. (None, problems) when it is not."""
    if isinstance(draft, str):
        draft = {"use": draft}
    if not isinstance(draft, Mapping):
        return None, [_line(label, path, draft, f"expected a drafter's name or table, e.g. {_DRAFT_EXAMPLE}")]
    use = draft.get("use", _MISSING)
    if not isinstance(use, str):
        return None, [_line(label, f"{path}.use", use, f"required: the drafter's name, e.g. {_DRAFT_EXAMPLE}")]
    try:
        cls = host.get("drafter", use)
    except UnknownPluginError as exc:
        return None, [_line(label, f"{path}.use", use, f"{exc} (samplechain plugins lists the drafters)")]
    body = {k: v for k, v in draft.items() if k != "use"}
    try:
        draft_settings(draft)
        params = {k: v for k, v in body.items() if k not in SETTINGS}
        cls(parse_params(cls, params, source=label, path=path))  # cross-parameter checks live in the drafter
    except ConfigError as exc:
        text = str(exc)
        if text.startswith(f"{label}: "):
            return None, [text]
        return None, [f"{label}: {text}" if text.startswith(f"{path}.") else f"{label}: {path}: {text}"]
    except (ValueError, TypeError) as exc:
        return None, [f"{label}: {path}: drafter {use} refuses its parameters: {type(exc).__name__}: {exc}"]
    return {"use": use, **body}, []


def _check_guards(raw: Any, label: str, path: str, host: PluginHost) -> tuple[tuple[dict[str, Any], ...], list[str]]:
    """The guards as written (a bare name becomes {"use": name}) after each guard's own checks; problems named by
    their key path."""
    if not isinstance(raw, (list, tuple)):
        return (), [_line(label, path, raw, "expected a list of guard tables, e.g. [{use = 'banned_strings', ...}]")]
    out, problems = [], []
    for i, entry in enumerate(raw):
        where = f"{path}[{i}]"
        entry = {"use": entry} if isinstance(entry, str) else entry
        use = entry.get("use", _MISSING) if isinstance(entry, Mapping) else _MISSING
        if not isinstance(use, str):
            problems.append(_line(label, f"{where}.use", use, "required: the guard's name, e.g. 'banned_strings'"))
            continue
        try:
            cls = host.get("guard", use)
            guard_settings(entry)
            params = {k: v for k, v in entry.items() if k != "use" and k not in GUARD_SETTINGS}
            cls(parse_params(cls, params, source=label, path=where))
        except UnknownPluginError as exc:
            problems.append(_line(label, f"{where}.use", use, f"{exc} (samplechain plugins lists the guards)"))
        except ConfigError as exc:
            text = str(exc)
            problems.append(text if text.startswith(f"{label}: ") else f"{label}: {where}: {text}")
        except (ValueError, TypeError) as exc:
            problems.append(f"{label}: {where}: guard {use} refuses its parameters: {type(exc).__name__}: {exc}")
        else:
            out.append(dict(entry))
    return tuple(out), problems


def load_config(
    source: str | Path | Mapping[str, Any], *, host: PluginHost | None = None, name: str | None = None
) -> ChainConfig:
    """Parse a chain from a TOML file path, a TOML string (if it has a newline) or a dict."""
    host = host or get_host()
    raw, label = _read_source(source, name, host)
    chain, prefix, draft_raw, draft_path, problems = _tables(raw, label)
    if not isinstance(chain, Mapping):
        raise ConfigError(f"{label}: chain: expected a table [chain] with samplers = [...]")
    problems += _check_chain_keys(chain, label, prefix)
    draft, more = (None, []) if draft_raw is None else _check_draft(draft_raw, label, draft_path, host)
    problems += more
    guards, more = _check_guards(chain.get("guards", []), label, f"{prefix}guards", host)
    problems += more
    samplers, more = _resolve_entries(
        chain.get("samplers", []), "sampler", source=label, path=f"{prefix}samplers", host=host
    )
    problems += more
    stop, more = _resolve_entries(
        chain.get("stop", []), "stopping_criterion", source=label, path=f"{prefix}stop", host=host
    )
    problems += more
    if not problems:
        problems += _check_shape(samplers, label)
    if not problems and draft is not None and draft.get("mode") == "rejection":
        selector = samplers[-1].cls
        if selector.name not in ("dist", "greedy"):
            problems.append(
                _line(
                    label,
                    f"{draft_path}.mode",
                    "rejection",
                    f"the chain's selector {selector.qualified_name()} chooses from a distribution of its own, and "
                    "the rejection test draws from the softmax of the processed logits (dist's); end the chain in "
                    "dist or use mode 'match'",
                )
            )
    backend = chain.get("backend", "auto")
    if not problems:
        problems += _check_backend(host, backend, label, prefix)
    if problems:
        raise ConfigError("\n".join(problems))
    for text in _pitfalls(samplers, label):
        warnings.warn(text, ChainWarning, stacklevel=3)
    return ChainConfig(
        samplers=tuple(samplers),
        stop=tuple(stop),
        backend=backend,
        name=chain.get("name"),
        description=chain.get("description", ""),
        source=label,
        nonfinite=chain.get("nonfinite", "error"),
        draft=draft,
        guards=guards,
    )
