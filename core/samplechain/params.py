"""Parameter validators with messages that say what was expected, shared by config and per-request values; and
`env_switch`, the on/off environment variables of the core and the backends."""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from .errors import ConfigError

__all__ = [
    "in_range",
    "finite",
    "one_of",
    "seed_field",
    "sequence_seed",
    "params_label",
    "is_seed_field",
    "token_ids_field",
    "validators",
    "field_type",
    "env_switch",
]

_ON, _OFF = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")


def env_switch(name: str, *, default: bool, on: str, off: str, error: type[Exception] = ValueError) -> bool:
    """An on/off environment variable: 1 / true / yes / on or 0 / false / no / off (any case; set but empty is off),
    `default` when unset. Any other value raises `error` naming the variable, its value and what 1 and 0 mean
    (`on`, `off`)."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value not in _ON + _OFF:
        raise error(f"{name}={raw!r}: expected 1 ({on}) or 0 ({off})")
    return value in _ON


_SEED = "samplechain.seed"


def in_range(
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = False,
    high_open: bool = False,
    hint: str = "",
) -> Callable[[Any, attrs.Attribute, Any], None]:
    """attrs validator: low <= value <= high (or open bounds). The message reads `must be in (0, 1]`."""
    lo = "-inf" if low is None else f"{low:g}"
    hi = "inf" if high is None else f"{high:g}"
    text = f"must be in {'(' if low_open or low is None else '['}{lo}, {hi}{')' if high_open or high is None else ']'}"
    if hint:
        text += f" ({hint})"

    def check(_inst: Any, _attr: attrs.Attribute, value: Any) -> None:
        if isinstance(value, float) and math.isnan(value):
            raise ValueError(text)
        if low is not None and (value < low or (low_open and value == low)):
            raise ValueError(text)
        if high is not None and (value > high or (high_open and value == high)):
            raise ValueError(text)

    check.bounds = (low, high, low_open, high_open)  # type: ignore[attr-defined]  # what it accepts, for tools
    check.text = text  # type: ignore[attr-defined]
    return check


def finite(_inst: Any, _attr: attrs.Attribute, value: float) -> None:
    """attrs validator: a finite number."""
    if not math.isfinite(value):
        raise ValueError("must be a finite number")


def one_of(*choices: Any) -> Callable[[Any, attrs.Attribute, Any], None]:
    def check(_inst: Any, _attr: attrs.Attribute, value: Any) -> None:
        if value not in choices:
            raise ValueError(f"must be one of {', '.join(map(repr, choices))}")

    check.choices = choices  # type: ignore[attr-defined]
    return check


def validators(field: attrs.Attribute) -> list[Any]:
    """A Params field's validators as a flat list (attrs wraps a list of them in one `and_` validator); an
    `in_range` one carries `.bounds` (low, high, low_open, high_open) and `.text`, a `one_of` one `.choices`: what
    tools that generate or document values read (tests, the reference page)."""

    def flat(v: Any) -> list[Any]:
        if v is None:
            return []
        inner = getattr(v, "_validators", None)
        return [w for part in inner for w in flat(part)] if inner is not None else [v]

    return flat(field.validator)


def field_type(field: attrs.Attribute) -> Any:
    """The field's declared type without `| None` (`seed: int | None` -> int); resolve the class's string
    annotations first (`attrs.resolve_types`)."""
    kind = field.type
    args = getattr(kind, "__args__", None)
    if args and type(None) in args:
        kind = next(a for a in args if a is not type(None))
    return kind


def _seed_ok(_inst: Any, _attr: attrs.Attribute, value: int | None) -> None:
    if value is not None and not 0 <= value < 2**63:
        raise ValueError("must be an integer in [0, 2**63), or omitted for a fresh random seed")


def sequence_seed(base: Any, j: int, label: str) -> int:
    """Copy j's seed of a request seeded with `base` (return sequences, num_return_sequences): base + j, each copy
    its own stream. A seed that is not an integer in [0, 2**63) is one ConfigError naming where it was given
    (`label`: "seed", "params[1]['seed']"), before `int()` could round it or the store could only report the sum."""
    if isinstance(base, bool) or not isinstance(base, numbers.Integral) or not 0 <= int(base) + j < 2**63:
        hint = "leave it out for a fresh random seed"
        if isinstance(base, (list, tuple)):
            hint = "give a seed per prompt as params=[{'seed': 1}, {'seed': 2}, ...]"
        elif j:
            hint = f"return sequence {j} draws with seed + {j}"
        raise ConfigError(f"{label} = {base!r}: an integer in [0, 2**63) ({hint})")
    return int(base) + j


def params_label(params: Any, i: int, key: str) -> str:
    """Where prompt i's parameter `key` was given: params['seed'] (one mapping for all prompts) or
    params[1]['seed'] (one per prompt)."""
    return f"params[{key!r}]" if isinstance(params, Mapping) else f"params[{i}][{key!r}]"


def seed_field() -> Any:
    """A `seed` parameter: None (the default) draws a fresh seed when the request joins."""
    return attrs.field(default=None, validator=_seed_ok, metadata={_SEED: True})


def is_seed_field(field: attrs.Attribute) -> bool:
    return bool(field.metadata.get(_SEED))


def _token_ids_ok(_inst: Any, _attr: attrs.Attribute, value: tuple[int, ...]) -> None:
    if any(not isinstance(t, int) or t < 0 for t in value):
        raise ValueError(f"must be a list of non-negative token ids, got {list(value)}")


def token_ids_field() -> Any:
    """A list of token ids, empty by default (e.g. `eos_ids`: empty = the generation's eos ids, see
    `contracts.EosIds`)."""
    return attrs.field(default=(), validator=_token_ids_ok)
