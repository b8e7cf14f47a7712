"""What a generation's draft= asks for, before any model call: its drafter loaded, its mode checked, and the chain
able to speculate."""

from __future__ import annotations

import json
import numbers
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import attrs
import torch

from ..drafters import MODES, SETTINGS, Draft, Drafter
from ..engine.config import parse_params
from ..engine.discovery import PluginHost
from ..engine.mixed import MixedChains
from ..errors import ConfigError, PluginError

if TYPE_CHECKING:
    from .session import Generation

__all__ = [
    "check_forkable",
    "checked_mode",
    "drafter_state",
    "expected_kind",
    "keeps_state",
    "load_drafter",
    "load_spec",
    "longest_draft",
    "params_key",
    "proposal_tensors",
    "stop_ids",
    "vocab_of",
]

_LONGEST = 64  # the longest draft of a drafter without num_tokens


def load_spec(spec: Any, host: PluginHost, kind: str, base: type, settings: Sequence[str], example: str) -> Any:
    """A `kind` plugin object from a name ("prompt_lookup", "prompt_lookup.v1"), a table {"use": NAME, ...its
    parameters, and the loop's `settings`}, an object of `base`, or a table {"use": OBJECT, ...the loop's
    `settings`}; unknown names and bad parameters are one ConfigError naming them (`example`: a table to show)."""
    if isinstance(spec, base):
        return spec
    label = "draft" if kind == "drafter" else "guards"
    if isinstance(spec, str):
        name, raw = spec, {}
    elif isinstance(spec, Mapping):
        raw = dict(spec)
        name = raw.pop("use", None)
        if isinstance(name, base):  # an object with the loop's settings beside it
            extra = sorted(set(raw) - set(settings))
            if extra:
                raise ConfigError(
                    f"{label} = {spec!r}: a table whose `use` is a {kind} object takes only {list(settings)}, not "
                    f"{extra}; give the object its parameters when you make it"
                )
            return name
        if not isinstance(name, str):
            raise ConfigError(f"{label} = {spec!r}: a table names its {kind} with `use`, e.g. {example}")
    else:
        raise ConfigError(
            f"{label} = {spec!r}: pass a {kind}'s name, a table like {example} or a {base.__module__}.{base.__name__} "
            "object"
        )
    for key in settings:
        raw.pop(key, None)
    cls = host.get(kind, name)
    return cls(parse_params(cls, raw, source=label, path=f"{label}[{cls.name}]"))


def load_drafter(draft: Any, host: PluginHost) -> Drafter:
    """A drafter from a name, a `{"use": NAME, ...}` table or a Drafter object (`load_spec`)."""
    return cast(
        Drafter, load_spec(draft, host, "drafter", Drafter, SETTINGS, "{'use': 'prompt_lookup', 'num_tokens': 10}")
    )


# transformers' logits processors that keep state from call to call: SynthID's watermark (the contexts it has seen),
# the unbatched guidance processor (a cache of the unconditional context)
_STATEFUL_PROCESSORS = {"SynthIDTextWatermarkLogitsProcessor", "UnbatchedClassifierFreeGuidanceLogitsProcessor"}
# the arguments that take positions back: who then calls a processor there, and how to generate without them
_TAKING_BACK = {
    "draft=": ("a drafted generation", "a drafter (draft=False)"),
    "guards=": ("a guarded generation", "guards (guards=False)"),
}


def keeps_state(processor: Any) -> bool:
    """Whether a `logits_processor=` (or one of a list's) keeps state from call to call: it says so (`keeps_state =
    True`, as samplechain's ChainLogitsProcessor does), or it is one of transformers' processors that do."""
    if isinstance(processor, (list, tuple)):
        return any(keeps_state(p) for p in processor)
    return bool(getattr(processor, "keeps_state", False)) or any(
        c.__name__ in _STATEFUL_PROCESSORS for c in type(processor).__mro__
    )


def check_forkable(chain: Any, processor: Any = None, given: str = "draft=") -> None:
    """A drafter or a guard (`given`: "draft=" or "guards=") needs every sampler's state to be copied and set back;
    a sampler that declares it cannot be (`Sampler.forkable = False`) is refused here, naming it, and so is a
    `logits_processor=` that keeps state from call to call (`keeps_state`), which the positions taken back would
    move on."""
    doing, without = _TAKING_BACK[given]
    processors = [] if processor is None else list(processor) if isinstance(processor, (list, tuple)) else [processor]
    for p in processors:
        if keeps_state(p):
            chain_instead = (
                "pass its chain as chain= (and its params= and seed=) instead, or "
                if getattr(p, "keeps_state", False)
                else ""
            )
            raise ConfigError(
                f"{given} with logits_processor={type(p).__name__}: it keeps its own state from call to call, and "
                f"{doing} calls it at positions it then takes back; {chain_instead}generate without {without}"
            )
    for sampler in chain.samplers:  # a MixedChains' samplers are every chain's
        if not sampler.forkable:
            raise ConfigError(
                f"{given}: the chain's sampler {sampler.qualified_name()} cannot fork its state (forkable = False), "
                f"which {doing} needs to take positions back; generate without {without} or drop the sampler "
                "from the chain"
            )


def checked_mode(mode: Any, gen: Generation, row: int) -> str:
    """`mode` of row `row` once checked: "match", or "rejection" where the row's chain and the outputs allow it."""
    if mode not in ("match", "rejection"):
        raise ConfigError(f"draft mode = {mode!r}: {MODES}")
    if mode == "rejection":
        chain, which = gen.chain, "the chain's"
        if isinstance(chain, MixedChains):  # a mixed batch: the test draws through the row's own chain
            key = gen.store.chain_of(gen.request_ids[row])
            chain, which = chain.chains[key], f"prompt {row // gen.n}'s chain's"
        if chain.is_greedy:
            return "match"  # a greedy chain's distribution is its argmax: the test is the match
        selector = chain.samplers[-1]
        if selector.name != "dist":
            raise ConfigError(
                f"draft mode 'rejection' with {which} selector {selector.qualified_name()}: the test draws from "
                "the softmax of the processed logits, which only dist samples from (a selector such as mirostat "
                "chooses from a distribution of its own); end the chain in dist or use mode 'match'"
            )
    return mode


def proposal_tensors(proposal: Any, limit: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A drafter's proposal as (k <= limit,) int64 token ids on the CPU and its (k, V) float64 probabilities (or
    None); ValueError (or the conversion's error) where it is not a row of token ids in [0, vocab)."""
    given = proposal.tokens if isinstance(proposal, Draft) else proposal
    if given is None:
        return torch.zeros(0, dtype=torch.int64), None  # no guess
    tokens = torch.as_tensor(given)
    if tokens.numel() == 0:
        return torch.zeros(0, dtype=torch.int64), None  # no guess ([] is float32 to torch)
    if tokens.is_floating_point() or tokens.is_complex() or tokens.dtype == torch.bool:
        raise ValueError(f"proposed {tokens.tolist()} ({tokens.dtype}): integer token ids expected")
    draft = tokens.to(torch.int64).flatten()[:limit].cpu()
    if bool(((draft < 0) | (draft >= vocab)).any()):
        raise ValueError(f"proposed {draft.tolist()}: token ids in [0, {vocab}) expected")
    probs = proposal.probs if isinstance(proposal, Draft) else None
    if probs is not None:
        probs = torch.as_tensor(probs).detach().to("cpu", torch.float64)
        if probs.ndim != 2 or probs.shape[0] < len(draft):
            raise ValueError(f"Draft.probs of shape {tuple(probs.shape)}: (k, V) for {len(draft)} tokens")
        probs = probs[: len(draft)]
        _check_probs(draft, probs)
    return draft, probs


def _check_probs(draft: torch.Tensor, probs: torch.Tensor) -> None:
    """ValueError unless each row of `probs` is a distribution (finite, >= 0, summing to 1) that gives its drafted
    token some chance: what the rejection test divides by."""
    if not bool(torch.isfinite(probs).all()) or bool((probs < 0).any()):
        raise ValueError("Draft.probs holds values that are not finite or are negative: probabilities expected")
    sums = probs.sum(dim=1)
    if bool(((sums - 1.0).abs() > 1e-3).any()):
        raise ValueError(f"Draft.probs rows sum to {sums.tolist()}: each row a distribution (summing to 1) expected")
    inside = draft < probs.shape[1]
    if not bool(inside.all()) or bool((probs[torch.arange(len(draft)), draft] <= 0).any()):
        raise ValueError(f"Draft.probs gives a drafted token of {draft.tolist()} no chance: the draft draws from it")


def expected_kind(expected: Any) -> tuple[str, float] | None:
    """What Drafter.expect returned, checked: None, or (a kind's name, a chance in [0, 1])."""
    if expected is None:
        return None
    kind, chance = expected if isinstance(expected, (tuple, list)) and len(expected) == 2 else (None, None)
    if (
        not isinstance(kind, str)
        or isinstance(chance, bool)
        or not isinstance(chance, numbers.Real)
        or not 0.0 <= float(chance) <= 1.0
    ):
        raise ValueError(f"expect returned {expected!r}: None or (a kind's name, a chance in [0, 1]) expected")
    return kind, float(chance)


def vocab_of(model: Any) -> int:
    """The model's vocabulary size (logit columns; a drafted id must be below it), or a bound no id reaches."""
    size = getattr(model.config, "vocab_size", None)
    return int(size) if isinstance(size, int) else 1 << 62


def params_key(params: Any) -> tuple[Any, ...]:
    """A drafter's parameters as a key: plain values as they are, an object (a draft model) by its identity."""
    plain = (str, int, float, bool, type(None))

    def key(v: Any) -> Any:
        if isinstance(v, plain):
            return v
        if isinstance(v, (tuple, list)):
            return tuple(key(x) for x in v)
        return ("object", id(v))

    fields = attrs.asdict(params, recurse=False) if attrs.has(type(params)) else {"": params}
    return tuple((name, key(v)) for name, v in fields.items())


def stop_ids(gen: Generation) -> set[int]:
    """The token ids that end a row whatever came before them (past its min_new_tokens): the `eos` criteria's, as
    they resolved them (none with ignore_eos, the stop list's own ids where it sets them)."""
    return {
        i
        for crit in gen.stopping
        if getattr(crit, "name", None) == "eos" and callable(getattr(crit, "resolved_ids", None))
        for i in crit.resolved_ids()
    }


def drafter_state(drafter: Drafter) -> Any:
    """A drafter's `checkpoint()`, which must be plain JSON data; a failure is one PluginError naming the drafter,
    and the generation is unchanged (it goes on; a checkpoint can be asked for again)."""
    try:
        state = drafter.checkpoint()
        json.dumps(state)
    except Exception as exc:  # noqa: BLE001 - a drafter's bug, reported as the drafter's
        raise PluginError(
            f"drafter {drafter.qualified_name()}: checkpoint() failed or gave data that is not plain JSON "
            f"({type(exc).__name__}: {exc}); the generation goes on unchanged: fix the drafter's checkpoint(), or "
            "generate without it where checkpoints are needed"
        ) from exc
    return state


def longest_draft(drafter: Drafter) -> int:
    """A drafter's longest draft (its num_tokens): a whole number >= 1, checked here for every drafter, a third
    party's too (its Params may not check it)."""
    n = getattr(drafter.params, "num_tokens", _LONGEST)
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
        raise ConfigError(
            f"drafter {drafter.qualified_name()}: num_tokens = {n!r}; give the longest draft as a whole number of "
            "tokens >= 1"
        )
    return int(n)
