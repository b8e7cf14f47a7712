"""Stopping criteria combined by OR, one answer per row.

`Stopping` holds the criteria of one generation: the chain's `stop = [...]` entries, criteria built by name
(`Stopping.criterion("eos", host=...)`), and runtime extras: a StoppingCriterion instance, a plain callable
`fn(ctx: StopContext) -> (B,) bool`, or a transformers `StoppingCriteria` object (called as
`crit(input_ids, scores)`). It checks what transformers' `validate_stopping_criteria` checks: a length limit is
present, and the same criterion is not given twice with different parameters.

A row's finish reason is the `reason` of the first criterion (in declared order) that stops it, or the reason of
its StopMatch when it is a text criterion (`stop_regex:<pattern>`); `StopResult.matches` keeps those matches, from
which the output text is cut (`cut_text`: before the match, or after it with include_stop_str_in_output).

min_new_tokens (vLLM's `min_tokens`): while a row has generated fewer than its `StopSetup.min_new_tokens`, the
criteria with a `min_new_tokens_gate` do not stop it: eos and repetition ("tokens") fire from the min_new_tokens-th
token on, stop strings and stop_regex ("text") only after it, as vLLM's scheduler and detokenizer decide; length
limits, timers and callables are never held back.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import attrs
import torch

from ..contracts import StopContext, StopMatch, StoppingCriterion, StopSetup
from ..errors import ConfigError, SamplingError
from .config import EntrySpec, parse_params
from .discovery import PluginHost, get_host

__all__ = [
    "Stopping",
    "StopResult",
    "CallableCriterion",
    "TransformersCriterion",
    "as_criterion",
    "as_rows",
    "cut_text",
    "min_new_tokens_of",
]


@attrs.frozen
class StopResult:
    """done: (B,) bool, the rows any criterion stopped this step. reasons[b]: the first criterion's reason.
    any: whether any row stopped (a Python bool, so the loop need not look at `done` on most steps).
    matches: row -> the StopMatch of a text criterion that stopped it (stop strings, stop_regex)."""

    done: torch.Tensor
    reasons: list[str | None]
    any: bool = True
    matches: dict[int, StopMatch] = attrs.field(factory=dict)


def cut_text(text: str, match: StopMatch | None, include: bool = False) -> str:
    """A row's decoded new text cut at its stop match: before the matched text (vLLM's default), or right after it
    with `include` (include_stop_str_in_output). A match that began in the prompt cuts at the text's start."""
    if match is None:
        return text
    end = len(text) - match.trailing
    start = end - len(match.text)
    if end < 0 or text[max(start, 0) : end] != match.text[max(-start, 0) :]:
        # the tokenizer's decode differs from the criterion's view of the tail: find the match's last occurrence
        at = text.rfind(match.text)
        if at < 0:
            return text
        start, end = at, at + len(match.text)
    return text[:end] if include else text[: max(start, 0)]


def min_new_tokens_of(store: Any, request_ids: Sequence[str]) -> torch.Tensor | None:
    """(B,) int64 each request's min_new_tokens: the largest value of the fields the chain's samplers declare
    (`Sampler.min_new_tokens_field`) in its request store (a RequestStore or a MixedStore); None when no sampler
    declares one. An entry with id "ignore_eos" (what the llama.cpp converter writes for --ignore-eos: eos banned
    for good) bans eos without holding back the other criteria."""
    stores = getattr(store, "stores", None)
    route = getattr(store, "route", None)
    out = torch.zeros(len(request_ids), dtype=torch.int64)
    found = False
    for key, sub in stores.items() if stores is not None else [(None, store)]:
        rows = [b for b, r in enumerate(request_ids) if route is None or route.get(r) == key]
        fields = [
            (i, e.cls.min_new_tokens_field)
            for i, e in enumerate(sub.layout.entries)
            if getattr(e.cls, "min_new_tokens_field", None) and e.id != "ignore_eos"
        ]
        if not rows or not fields:
            continue
        found = True
        view = sub.batch([request_ids[b] for b in rows])
        for i, field in fields:
            value = view.params[i][field].to("cpu", torch.int64)
            out[rows] = torch.maximum(out[rows], value)
    return out if found else None


class CallableCriterion(StoppingCriterion):
    """A plain Python callable `fn(ctx) -> (B,) bool tensor` (or a list of bools) used as a criterion."""

    name = "callable"

    def __init__(self, fn: Callable[[StopContext], Any], reason: str | None = None) -> None:
        super().__init__(None)
        # Callable[..., Any]: a subclass calls it its own way (TransformersCriterion: fn(input_ids, scores))
        self.fn: Callable[..., Any] = fn
        self._reason = reason or getattr(fn, "__name__", None) or type(fn).__name__

    @property
    def reason(self) -> str:
        return self._reason

    def label(self) -> str:
        return f"stopping callable {self._reason!r}"

    def call(self, ctx: StopContext) -> Any:
        return self.fn(ctx)

    def check(self, ctx: StopContext) -> torch.Tensor:
        return as_rows(self.call(ctx), ctx.input_ids.shape[0], ctx.input_ids.device, self.label())


class TransformersCriterion(CallableCriterion):
    """A transformers `StoppingCriteria` (called as `crit(input_ids, scores)`), answered per row.

    A criterion that answers one bool for the whole batch (transformers' ConfidenceCriteria does) is applied to
    every row, as transformers applies it.
    """

    def __init__(self, criterion: Any) -> None:
        super().__init__(criterion, reason=type(criterion).__name__)

    def label(self) -> str:
        return f"transformers criterion {self._reason}"

    def call(self, ctx: StopContext) -> Any:
        scores = ctx.scores
        if scores is None:
            scores = torch.zeros(ctx.input_ids.shape[0], 1)
        return self.fn(ctx.input_ids, scores)


def as_rows(value: Any, batch: int, device: torch.device, label: str) -> torch.Tensor:
    """A criterion's answer as a (B,) bool tensor: a Python bool (or a one-element answer) means every row."""
    if isinstance(value, bool):
        return torch.full((batch,), value, dtype=torch.bool, device=device)
    out = torch.as_tensor(value, device=device)
    if out.dim() == 0 or (out.dim() == 1 and out.shape[0] == 1 and batch != 1):
        out = out.reshape(1).expand(batch)
    if out.shape != (batch,):
        raise SamplingError(
            f"{label} returned shape {tuple(out.shape)}; a stopping criterion must return one bool per row, "
            f"shape ({batch},)"
        )
    return out.to(torch.bool)


def as_criterion(obj: Any) -> StoppingCriterion:
    """A StoppingCriterion instance as is; a transformers StoppingCriteria or a callable wrapped."""
    if isinstance(obj, StoppingCriterion):
        return obj
    if isinstance(obj, type) and issubclass(obj, StoppingCriterion):
        raise ConfigError(f"{obj.__name__} is a class; pass an instance, e.g. {obj.__name__}({obj.__name__}.Params())")
    if _is_transformers_criterion(obj):
        return TransformersCriterion(obj)
    if callable(obj):
        return CallableCriterion(obj)
    raise ConfigError(
        f"stopping criterion {obj!r} is neither a StoppingCriterion, a transformers StoppingCriteria nor a "
        "callable fn(ctx) -> (B,) bool"
    )


def _is_transformers_criterion(obj: Any) -> bool:
    return any(c.__name__ == "StoppingCriteria" and c.__module__.startswith("transformers") for c in type(obj).__mro__)


class Stopping:
    """The criteria of one generation, validated, combined by OR."""

    def __init__(self, criteria: Iterable[Any] = (), *, require_length_limit: bool = True) -> None:
        self.criteria: list[StoppingCriterion] = []
        self._gate_cache: tuple[torch.Tensor | None, int] = (None, 0)  # (setup.min_new_tokens, its largest value)
        for obj in criteria:
            self.add(obj)
        if require_length_limit:
            self.require_length_limit()

    @classmethod
    def from_entries(cls, entries: Sequence[EntrySpec], extra: Iterable[Any] = (), **kwargs: Any) -> Stopping:
        """The chain's `stop = [...]` entries (instantiated in order) followed by runtime extras."""
        return cls([spec.cls(spec.params) for spec in entries] + list(extra), **kwargs)

    @staticmethod
    def criterion(
        name: str, params: dict[str, Any] | None = None, *, host: PluginHost | None = None, source: str = "generate()"
    ) -> StoppingCriterion:
        """Build one criterion by (versioned) name with validated parameters: `criterion("eos")`."""
        cls = (host or get_host()).get("stopping_criterion", name)
        return cls(parse_params(cls, params or {}, source=source, path=cls.name))

    # ----------------------------------------------------------------- composition
    def add(self, obj: Any) -> None:
        """Add a criterion. The same criterion twice with the same parameters is kept once; with different
        parameters it is an error (as transformers refuses a custom criterion that duplicates a default one)."""
        crit = as_criterion(obj)
        if not isinstance(crit, CallableCriterion):
            for have in self.criteria:
                if type(have) is type(crit):
                    if have.params == crit.params:
                        return
                    raise ConfigError(
                        f"stopping criterion {crit.qualified_name()} is given twice with different parameters: "
                        f"{have.params} and {crit.params}; keep one (e.g. drop it from the chain's stop list or "
                        f"from the generate() arguments)"
                    )
        self.criteria.append(crit)

    def has(self, name: str) -> bool:
        return any(c.name == name for c in self.criteria)

    @property
    def has_length_limit(self) -> bool:
        return any(c.is_length_limit for c in self.criteria)

    def require_length_limit(self) -> None:
        if not self.has_length_limit:
            raise ConfigError(
                'no length limit among the stopping criteria: add { use = "max_new_tokens", n = 128 } to the '
                "chain's stop list, or pass max_new_tokens= / max_length="
            )

    def max_new_tokens(self, setup: StopSetup) -> int | None:
        """The tightest bound the length limits put on new tokens (None when none states one)."""
        bounds = [b for c in self.criteria if (b := c.max_new_tokens(setup)) is not None]
        return min(bounds) if bounds else None

    # ----------------------------------------------------------------- running
    def prepare(self, setup: StopSetup) -> None:
        for crit in self.criteria:
            crit.prepare(setup)

    def hold_back(self) -> int:
        """Characters a stream keeps back: the most any text criterion may cut off later."""
        return max((c.hold_back() for c in self.criteria), default=0)

    def _gates(self, ctx: StopContext) -> dict[str, torch.Tensor] | None:
        """Per gate kind, (B,) bool: rows past their min_new_tokens (None: no row has one, nothing is held)."""
        least = ctx.setup.min_new_tokens
        if least is None:
            return None
        if self._gate_cache[0] is not least:  # one host read per generation, not per step
            self._gate_cache = (least, int(least.max()) if least.numel() else 0)
        if ctx.step > self._gate_cache[1]:  # every row is past its minimum
            return None
        least = least.to(ctx.input_ids.device)
        return {"tokens": ctx.step >= least, "text": ctx.step > least}

    def check(self, ctx: StopContext) -> StopResult:
        batch = ctx.input_ids.shape[0]
        device = ctx.input_ids.device
        done: torch.Tensor | None = None
        reasons: list[str | None] = [None] * batch
        matches: dict[int, StopMatch] = {}
        gates = self._gates(ctx)
        for crit in self.criteria:
            gate = crit.min_new_tokens_gate if gates is not None else None  # asked anyway: criteria keep state
            try:
                hit = crit.check(ctx)
            except SamplingError:
                raise
            except Exception as exc:
                label = (
                    crit.label()
                    if isinstance(crit, CallableCriterion)
                    else f"stopping criterion {crit.qualified_name()}"
                )
                raise SamplingError(f"{label} failed at step {ctx.step}: {type(exc).__name__}: {exc}") from exc
            if hit is False:  # "no row": the common answer of length limits, without building a tensor
                continue
            hit = as_rows(hit, batch, device, f"stopping criterion {crit.qualified_name()}")
            if gate is not None and gates is not None:  # a gate is only asked for when there are gates
                hit = hit & gates[gate]
            new = hit if done is None else hit & ~done
            rows = new.nonzero().flatten().tolist()
            if rows:
                for b, match in zip(rows, crit.matches(ctx, rows)):
                    reasons[b] = crit.reason if match is None else match.reason
                    if match is not None:
                        matches[b] = match
                done = hit.clone() if done is None else done | hit
        if done is None:
            return StopResult(torch.zeros(batch, dtype=torch.bool, device=device), reasons, False)
        return StopResult(done, reasons, True, matches)

    def __iter__(self):
        return iter(self.criteria)

    def __len__(self) -> int:
        return len(self.criteria)

    def __repr__(self) -> str:
        return f"Stopping({', '.join(c.reason for c in self.criteria)})"
