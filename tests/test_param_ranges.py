"""Every sampler's out-of-range parameters, generated from the samplers' own schemas (docs/errors.md row
`param_out_of_range_every_sampler`).

For every registered sampler (every version), every parameter whose validators declare a range (`params.in_range`),
a set of choices (`params.one_of`), a seed range (`params.seed_field`) or finiteness (`params.finite`) gets a value
just outside it. In a chain config that value must be one `ConfigError` naming the key path, the value and what is
allowed; as a per-request parameter (for the numeric fields the store keeps per request) one `RequestError` that
adds nothing to the store. No hand-written list: a new sampler, or a new field, is covered the day it is
registered.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

import attrs
import pytest

from samplechain import Chain, ConfigError, RequestError, Stage, get_host
from samplechain.engine.store import _DTYPES
from samplechain.params import field_type, finite, is_seed_field, validators

# fewer would mean the generator lost its way (a renamed validator, an empty host), not that every field is valid
MIN_CONFIG_CASES = 60
MIN_REQUEST_CASES = 50


@attrs.frozen
class Bad:
    """One out-of-range value: `use` names the sampler's version, `allowed` is what the message must say."""

    use: str  # "top_p.v1"
    cls: type
    field: str
    value: Any
    allowed: str
    per_request: bool  # the store keeps this field per request (numbers and bools), so store.add() checks it too

    def __str__(self) -> str:
        return f"{self.use}.{self.field}={self.value!r}"


def _cast(field: attrs.Attribute, value: Any) -> Any:
    """A number as the field's own type (an int field gets 2, not 2.0: the config would refuse the float)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        kind = field_type(field)
        if kind is int and (isinstance(value, int) or float(value).is_integer()):
            return int(value)
        if kind is float:
            return float(value)
    return value


def _accepts(inst: Any, field: attrs.Attribute, value: Any) -> bool:
    try:
        for v in validators(field):
            v(inst, field, value)
    except (ValueError, TypeError):
        return False
    return True


def _bad_values(field: attrs.Attribute) -> Iterator[tuple[Any, str]]:
    """(value, text the error must contain) for each bound the field's validators declare."""
    checks = validators(field)
    if is_seed_field(field):
        yield -1, "must be an integer in [0, 2**63)"
    for v in checks:
        if hasattr(v, "bounds"):  # params.in_range
            low, high, low_open, high_open = v.bounds
            if low is not None:
                yield _cast(field, low if low_open else low - 1), v.text
            if high is not None:
                yield _cast(field, high if high_open else high + 1), v.text
        elif hasattr(v, "choices"):  # params.one_of
            outside = "no-such-choice" if all(isinstance(c, str) for c in v.choices) else max(v.choices) + 1
            yield outside, "must be one of " + ", ".join(map(repr, v.choices))
        elif v is finite and not any(hasattr(w, "bounds") for w in checks):  # a range already refuses inf
            yield math.inf, "must be a finite number"


def _valid(field: attrs.Attribute) -> Any:
    """A value the field's validators accept (for required fields, so the config gets as far as the bad one)."""
    tries: list[Any] = [1, 0, 0.5, -1, 2]
    for v in validators(field):
        if hasattr(v, "bounds"):
            bounds = [b for b in v.bounds[:2] if b is not None]
            tries = [*bounds, sum(bounds) / len(bounds), *(b + s for b in bounds for s in (1, -1)), *tries]
        elif hasattr(v, "choices"):
            tries = [*v.choices, *tries]
    for value in map(lambda t: _cast(field, t), tries):
        if _accepts(None, field, value):
            return value
    raise AssertionError(f"no valid value found for required field {field.name!r}: teach _valid() its validator")


def required_values(cls: type) -> dict[str, Any]:
    attrs.resolve_types(cls.Params)
    return {f.name: _valid(f) for f in attrs.fields(cls.Params) if f.default is attrs.NOTHING}


def out_of_range_cases() -> list[Bad]:
    """Every (sampler version, field, bad value) the registered samplers' schemas define."""
    host = get_host()
    host.load_all()
    cases = []
    for name, versions in sorted(host.registered("sampler").items()):
        for version, cls in sorted(versions.items()):
            attrs.resolve_types(cls.Params)
            for field in attrs.fields(cls.Params):
                per_request = field_type(field) in _DTYPES
                for value, allowed in _bad_values(field):
                    cases.append(Bad(f"{name}.v{version}", cls, field.name, value, allowed, per_request))
    return cases


def chain_config(case: Bad, **fields: Any) -> dict[str, Any]:
    """A chain with the case's sampler first (its required fields valid, `fields` on top) and a selector last."""
    entry = {"use": case.use, **required_values(case.cls), **fields}
    return {"samplers": [entry] if case.cls.stage is Stage.SELECT else [entry, {"use": "greedy"}]}


CASES = out_of_range_cases()
REQUEST_CASES = [c for c in CASES if c.per_request]


def test_the_schemas_yield_enough_cases_to_mean_something():
    assert len(CASES) >= MIN_CONFIG_CASES, f"only {len(CASES)} generated out-of-range cases"
    assert len(REQUEST_CASES) >= MIN_REQUEST_CASES, f"only {len(REQUEST_CASES)} per-request cases"
    # every kind of bound the generator reads still occurs: none silently stopped being recognised
    kinds = {"must be in", "must be one of", "must be an integer in [0, 2**63)", "must be a finite number"}
    assert kinds == {k for k in kinds if any(c.allowed.startswith(k) for c in CASES)}


@pytest.mark.parametrize("case", CASES, ids=str)
def test_out_of_range_in_a_chain_config_is_one_config_error_naming_path_value_and_range(case: Bad):
    with pytest.raises(ConfigError) as caught:
        Chain.load(chain_config(case, **{case.field: case.value}))
    text = str(caught.value)
    assert type(caught.value) is ConfigError
    line = f"<dict>: samplers[0].{case.field} = {case.value!r}: {case.allowed}"
    assert line in text, text
    # one line per problem, and the bad value is the only new one (grammar's defaults lack a source: that line
    # is there without the bad value too)
    others = [t for t in text.splitlines() if not t.startswith(line)]
    assert others == _problems(chain_config(case)), text


def _problems(config: dict[str, Any]) -> list[str]:
    try:
        Chain.load(config)
    except ConfigError as exc:
        return str(exc).splitlines()
    return []


@pytest.mark.parametrize("case", REQUEST_CASES, ids=str)
def test_out_of_range_per_request_is_a_request_error_that_adds_nothing(case: Bad):
    chain = Chain.load(chain_config(case))
    store = chain.new_store()
    store.add("kept", {})
    before = json.dumps(store.snapshot(), sort_keys=True)
    entry = chain.config.samplers[0].id
    with pytest.raises(RequestError) as caught:
        store.add("r", {f"{entry}.{case.field}": case.value})
    assert f"request 'r': {entry}.{case.field} = {case.value!r}: {case.allowed}" in str(caught.value)
    assert "r" not in store and store.request_ids == ["kept"]
    assert json.dumps(store.snapshot(), sort_keys=True) == before
