"""What a samplechain request asks for, checked and handed over: the chain it names (loaded once per process), its
store parameters, the stopping criteria the processor enforces, and vLLM's fields the chain takes over
(thinking_token_budget, seed). vLLM's frontend runs `check_request` in `validate_params` (a problem is an HTTP 400
naming it) and the hand-overs before the request is copied for the engine; the engine checks a joining request again.
A server with vLLM's speculative decoding builds no processor, so there every samplechain request is refused.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import attrs

from samplechain import Chain, Stopping

from .requests import PARAM_PREFIX, VLLM_SEED_KEY, ChainSpec, RequestSpec, RequestSpecError, parse_request

__all__ = [
    "BUDGET_ALIAS",
    "CHAIN_CACHE_SIZE",
    "check_request",
    "hand_over_budget",
    "hand_over_seed",
    "load_chain",
    "refuse_speculative",
    "request_params",
    "stop_criteria",
    "thinking_budget",
]

logger = logging.getLogger("samplechain_vllm")
CHAIN_CACHE_SIZE = 32  # chains loaded per process (an LRU); the processor forgets idle groups beyond it too
_chains: OrderedDict[str, Chain] = OrderedDict()  # per process: the frontend validates, the engine runs
BUDGET_ALIAS = "thinking_token_budget"  # vLLM's SamplingParams field, and reasoning_budget's per-request alias
_VLLM_STOPS = ("eos",)  # criteria vLLM applies itself (its eos, stop_token_ids); length limits are max_tokens
_NO_LOGPROBS = ("confidence",)  # criteria that read the chosen token's probability, which the processor lacks
_warned: set[tuple[str, str]] = set()


def load_chain(spec: ChainSpec) -> Chain:
    """The chain of a spec, loaded once per process (LRU of 32): every request naming it reuses the object."""
    chain = _chains.get(spec.key)
    if chain is not None:
        _chains.move_to_end(spec.key)
        return chain
    chain = Chain.load(spec.source)
    _chains[spec.key] = chain
    while len(_chains) > CHAIN_CACHE_SIZE:
        _chains.popitem(last=False)
    return chain


def request_params(chain: Chain, spec: RequestSpec) -> dict[str, Any]:
    """The request's store parameters: its params, plus SamplingParams.seed when the chain is seeded (as
    generate(seed=...) does; a greedy chain has no seed and ignores it)."""
    params = dict(spec.params)
    if spec.seed is not None and "seed" not in params and "seed" in chain.layout.aliases:
        params["seed"] = spec.seed
    return params


def _targets(chain: Chain, key: str) -> set[tuple[int, str]]:
    """The (entry, field) pairs a per-request parameter name sets: an alias, or an `ID.FIELD` key."""
    layout = chain.layout
    if key in layout.aliases:
        return set(layout.aliases[key])
    entry, _, field = key.rpartition(".")
    return {(i, field) for i, e in enumerate(layout.entries) if e.id == entry} if entry else set()


def thinking_budget(sampling_params: Any, spec: RequestSpec, chain: Chain) -> tuple[RequestSpec, bool | None]:
    """SamplingParams.thinking_token_budget as the budget of the chain's sampler that takes vLLM's name
    (reasoning_budget): (the spec with it, carry), carry None when the field is not the chain's (unset, or no such
    sampler: vLLM's own), False when the request's parameters give the same budget already, True when extra_args
    must carry it. The same budget given both ways is fine; two different ones are an error (which was meant?)."""
    budget = getattr(sampling_params, BUDGET_ALIAS, None)
    wanted = set(chain.layout.aliases.get(BUDGET_ALIAS, ()))
    if budget is None or not wanted:
        return spec, None
    given = {k: v for k, v in spec.params.items() if _targets(chain, k) & wanted}
    for key, value in given.items():
        if value != budget:
            raise RequestSpecError(
                f"samplechain: thinking_token_budget = {budget} but the samplechain parameter "
                f"{key!r} = {value!r}: two budgets for one request; give it once"
            )
    if given:
        return spec, False
    return attrs.evolve(spec, params={**spec.params, BUDGET_ALIAS: budget}), True


def stop_criteria(chain: Chain, spec: RequestSpec, key: str | None = None) -> list[Any]:
    """Fresh instances (text criteria keep state) of the request's criteria the processor enforces: the chain's
    `stop` entries but length limits (vLLM's max_tokens) and eos (vLLM's own), then the request's stop_regex."""
    crits = []
    for entry in chain.config.stop:
        if entry.cls.is_length_limit or entry.cls.name in _VLLM_STOPS:
            continue
        if entry.cls.name in _NO_LOGPROBS:
            if key is not None and (key, entry.cls.name) not in _warned:
                _warned.add((key, entry.cls.name))
                logger.warning(
                    "samplechain: chain %s: the %r stopping criterion needs each chosen token's "
                    "probability, which the vLLM processor does not compute; it is ignored",
                    key,
                    entry.cls.name,
                )
            continue
        crits.append(entry.cls(entry.params))
    if spec.stop_regex:
        crits.append(
            Stopping.criterion(
                "stop_regex", {"patterns": list(spec.stop_regex)}, source=f"request '{PARAM_PREFIX}stop_regex'"
            )
        )
    return crits


def refuse_speculative(speculative_config: Any) -> None:
    """Refuse a samplechain request on a server with vLLM's speculative decoding (a speculative_config): vLLM builds
    no entry-point logits processor there (`build_logitsprocs` in vllm/v1/sample/logits_processor/__init__.py), so
    the chain would not run and the request would get vLLM's own sampling instead."""
    if not speculative_config:  # vLLM's own test
        return
    method = getattr(speculative_config, "method", None)
    raise RequestSpecError(
        f"samplechain: this server runs vLLM's speculative decoding (speculative_config"
        f"{f', method {method!r}' if method else ''}), under which vLLM runs no logits processor plugin, so the "
        f"samplechain chain would not run; serve without speculative_config to use samplechain chains, or use "
        f'samplechain\'s own speculative decoding (samplechain.generation.generate(..., draft="prompt_lookup"), '
        f"docs/speculative.md)"
    )


def check_request(
    sampling_params: Any, trial: bool = True, speculative_config: Callable[[], Any] | None = None
) -> tuple[RequestSpec, Chain, bool | None] | None:
    """Parse and load what a request asks for: (spec, chain, how vLLM's thinking_token_budget goes to the chain: see
    thinking_budget); any problem is a ValueError naming it and the fix. trial: also check its parameters as a
    store would (the frontend's validation; a joining request is added to its group's store, which checks the same,
    and fails alone where that refuses it). speculative_config: gives the server's speculative config (the
    frontend's), asked once the request turns out to want a chain, which is then refused under one."""
    spec = parse_request(getattr(sampling_params, "extra_args", None), getattr(sampling_params, "seed", None))
    if spec is None:
        return None
    if speculative_config is not None:
        refuse_speculative(speculative_config())
    try:
        chain = load_chain(spec.chain)
        if chain.config.guards:
            raise RequestSpecError(
                f"samplechain: the chain's guards ({', '.join(g['use'] for g in chain.config.guards)}) take text back, "
                "which vLLM's step cannot; drop the chain's guards here, or generate with "
                "samplechain.generation.generate, which runs them"
            )
        spec, carry = thinking_budget(sampling_params, spec, chain)
        if trial:
            chain.layout.resolve("extra_args", request_params(chain, spec), draw_seeds=False)
        if spec.logprobs_at is not None:
            chain.logprobs_stage(spec.logprobs_at)
        crits = stop_criteria(chain, spec)
        if crits:
            Stopping(crits, require_length_limit=False)  # the same criterion twice with other parameters: refused
            if getattr(sampling_params, "ignore_eos", False):
                names = ", ".join(dict.fromkeys(c.name for c in crits))
                raise RequestSpecError(
                    f"samplechain: the request's stopping criteria ({names}) end it with the end-of-sequence token, "
                    f"which ignore_eos=True does not stop at; drop ignore_eos, or the criteria"
                )
    except RequestSpecError:
        raise
    except Exception as exc:  # ConfigError, RequestError, PluginError ...: one clear line for the HTTP 400
        raise RequestSpecError(f"samplechain: {exc}".replace("\n", " ")) from exc
    return spec, chain, carry


def hand_over_budget(sampling_params: Any, carry: bool) -> None:
    """The chain enforces thinking_token_budget: clear vLLM's field (else vLLM refuses the request without a
    reasoning config, and with one forces the end marker a second time, after the chain) and, unless the request
    gives the same budget already, carry it in extra_args to the engine. Runs in vLLM's frontend, before vLLM's own
    check of the field and before the request is copied for the engine."""
    budget = sampling_params.thinking_token_budget
    if carry:
        sampling_params.extra_args = {**(sampling_params.extra_args or {}), PARAM_PREFIX + BUDGET_ALIAS: budget}
    sampling_params.thinking_token_budget = None


def hand_over_seed(sampling_params: Any) -> None:
    """The chain draws the request's token and leaves it the only finite logit, so vLLM's own sample after it can
    only pick that token: move SamplingParams.seed into extra_args (the chain's seed, as before), so that vLLM
    draws that redundant sample with its batch's shared generator instead of a per-request one (a seeded row costs
    vLLM's CPU sampler one generator call and a host read a step). Only with n = 1: vLLM gives choice i of n > 1
    the seed seed + i after this point. Runs in vLLM's frontend, before the request is copied for the engine."""
    seed = getattr(sampling_params, "seed", None)
    if seed is None or getattr(sampling_params, "n", 1) != 1:
        return
    sampling_params.extra_args = {**(sampling_params.extra_args or {}), PARAM_PREFIX + VLLM_SEED_KEY: int(seed)}
    sampling_params.seed = None
