"""transformers adapters: a chain as a LogitsProcessorList, criteria as a StoppingCriteriaList, and a chain plus
criteria as a `custom_generate` callable for `model.generate(custom_generate=...)`.

    model.generate(**enc, logits_processor=as_logits_processor(chain, seed=7), do_sample=False,
                   stopping_criteria=as_stopping_criteria(["eos", {"use": "stop_strings", "strings": ["\\n"]}],
                                                          tokenizer=tok))
    model.generate(**enc, custom_generate=as_custom_generate(chain), max_new_tokens=40)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import LogitsProcessor, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria

from ..chain import Chain
from ..contracts import StopContext, StoppingCriterion, StopSetup
from ..errors import ConfigError
from ..plugins import PluginHost
from ..stopping import Stopping

__all__ = [
    "ChainLogitsProcessor",
    "ChainStoppingCriteria",
    "as_logits_processor",
    "as_stopping_criteria",
    "as_custom_generate",
]


def _chain(chain: Any, host: PluginHost | None) -> Chain:
    if isinstance(chain, Chain):
        return chain
    if isinstance(chain, (str, Path, Mapping)):
        return Chain.load(chain, host=host)
    raise ConfigError(f"chain={chain!r}: pass a Chain, a TOML file path, a dict, or 'preset:NAME'")


def _per_row(params: Any, batch: int) -> list[dict[str, Any]]:
    if params is None or isinstance(params, Mapping):
        return [dict(params or {}) for _ in range(batch)]
    rows = [dict(p or {}) for p in params]
    if len(rows) != batch:
        raise ConfigError(f"params has {len(rows)} entries for a batch of {batch} rows: give one per row, or one "
                          "mapping for all")
    return rows


class ChainLogitsProcessor(LogitsProcessor):
    """A chain inside transformers' generation loop. Row b of the batch is request "b" of the processor's own
    store (parameters from `params`, seed from `seed` unless the row sets its own), created at the first call;
    a call with another batch size or a shorter input than the last one starts a new generation (fresh
    requests). `reset()` does the same explicitly.

    select=True (the default for chains ending in a sampling selector): the whole chain runs, RNG positions
    advance, and the returned scores keep only the chosen token (at its processed log-probability; every other
    token -inf), so transformers' argmax or multinomial picks exactly the chain's token: `model.generate` then
    gives the same tokens as samplechain's own loop with the same seed. Pass do_sample=False, so transformers
    adds no warpers of its own in front of the chain. The price: `output_scores` shows that one-hot mask.
    select=False: only the transforms and filters run (`Chain.process`), and transformers samples from the
    processed scores with its own RNG, as it does with its own warpers.
    """

    def __init__(self, chain: Any, *, params: Any = None, seed: int | None = None, select: bool | None = None,
                 host: PluginHost | None = None) -> None:
        self.chain = _chain(chain, host)
        self.params = params
        self.seed = seed
        self.select = select if select is not None else self.chain.samplers[-1].name != "greedy"
        self.reset()

    def reset(self) -> None:
        self.store = None
        self.request_ids: list[str] = []
        self._shape: tuple[int, int] | None = None

    def _start(self, batch: int, device: torch.device) -> None:
        self.store = self.chain.new_store(device=device.type, capacity=batch)
        self.request_ids = [str(b) for b in range(batch)]
        seeded = "seed" in self.store.layout.aliases
        for rid, p in zip(self.request_ids, _per_row(self.params, batch)):
            if seeded and self.seed is not None:
                p.setdefault("seed", self.seed)
            self.store.add(rid, p)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        batch, length = input_ids.shape
        if self.store is None or self._shape is None or batch != self._shape[0] or length <= self._shape[1]:
            self._start(batch, scores.device)
        self._shape = (batch, length)
        if not self.select:
            return self.chain.process(scores, self.store, self.request_ids)
        out = self.chain.sample(scores, self.store, self.request_ids)
        masked = torch.full_like(scores, float("-inf"), dtype=torch.float32)
        return masked.scatter_(1, out.token_ids[:, None], out.logprobs[:, None])


def as_logits_processor(chain: Any, *, params: Any = None, seed: int | None = None, select: bool | None = None,
                        host: PluginHost | None = None) -> LogitsProcessorList:
    """A LogitsProcessorList holding a ChainLogitsProcessor (see there for select=True / False)."""
    return LogitsProcessorList([ChainLogitsProcessor(chain, params=params, seed=seed, select=select, host=host)])


def _criteria(spec: Any, host: PluginHost | None) -> Stopping:
    if isinstance(spec, Stopping):
        return spec
    items = [spec] if isinstance(spec, (str, Mapping, StoppingCriterion)) or callable(spec) else list(spec)
    out = Stopping(require_length_limit=False)
    for item in items:
        if isinstance(item, str):
            out.add(Stopping.criterion(item, host=host))
        elif isinstance(item, Mapping):
            params = {k: v for k, v in item.items() if k != "use"}
            if "use" not in item:
                raise ConfigError(f"stopping criterion {dict(item)!r}: needs use = NAME, e.g. "
                                  "{'use': 'stop_strings', 'strings': ['\\n']}")
            out.add(Stopping.criterion(item["use"], params, host=host))
        else:
            out.add(item)
    return out


class ChainStoppingCriteria(StoppingCriteria):
    """samplechain criteria inside transformers' loop: one bool per row, finish reasons kept in
    `finish_reasons` (row -> reason, first criterion that stopped it). The setup is taken at the first call
    (prompt length = input length - 1; left padding found from the pad token); a call with another batch size
    or a shorter input starts a new generation."""

    def __init__(self, stopping: Stopping, *, tokenizer: Any = None, model: Any = None,
                 pad_token_id: int | None = None) -> None:
        self.stopping = stopping
        self.tokenizer = tokenizer
        self.model = model
        self.pad_token_id = pad_token_id
        self.setup: StopSetup | None = None
        self.finish_reasons: list[str | None] = []
        self._last = 0

    def _pad_id(self) -> int | None:
        if self.pad_token_id is not None:
            return self.pad_token_id
        for src in (getattr(self.tokenizer, "pad_token_id", None),
                    getattr(getattr(self.model, "generation_config", None), "pad_token_id", None)):
            if src is not None:
                return int(src)
        return None

    def _start(self, input_ids: torch.Tensor) -> None:
        import time

        batch, length = input_ids.shape
        prompt = input_ids[:, : length - 1]
        pad = self._pad_id()
        if pad is not None and prompt.shape[1] > 0:
            is_pad = (prompt == pad).to(torch.int64)
            leading = is_pad.cumprod(dim=1).sum(dim=1)  # left padding: the run of pad tokens at the start
            lengths = (length - 1) - leading
        else:
            lengths = torch.full((batch,), length - 1, dtype=torch.int64)
        self.setup = StopSetup(
            batch_size=batch, prompt_length=length - 1, prompt_lengths=lengths.cpu(), device=input_ids.device,
            tokenizer=self.tokenizer, model_config=getattr(self.model, "config", None),
            generation_config=getattr(self.model, "generation_config", None), start_time=time.monotonic(),
        )
        self.stopping.prepare(self.setup)
        self.finish_reasons = [None] * batch

    def __call__(self, input_ids: torch.LongTensor, scores: Any = None, **kwargs: Any) -> torch.BoolTensor:
        batch, length = input_ids.shape
        if self.setup is None or batch != self.setup.batch_size or length <= self._last:
            self._start(input_ids)
        self._last = length
        last_scores = scores[-1] if isinstance(scores, (tuple, list)) and scores else (
            scores if isinstance(scores, torch.Tensor) else None)
        token_ids = input_ids[:, -1]
        logprobs = None
        if last_scores is not None:
            logprobs = torch.log_softmax(last_scores.float(), dim=-1).gather(1, token_ids[:, None]).squeeze(1)
        ctx = StopContext(input_ids, length - self.setup.prompt_length, token_ids, self.setup, logprobs, last_scores)
        result = self.stopping.check(ctx)
        for b, reason in enumerate(result.reasons):
            if reason is not None and self.finish_reasons[b] is None:
                self.finish_reasons[b] = reason
        return result.done


def as_stopping_criteria(criteria: Any, *, tokenizer: Any = None, model: Any = None, pad_token_id: int | None = None,
                         host: PluginHost | None = None) -> StoppingCriteriaList:
    """A StoppingCriteriaList from a Stopping, or a list of names ("eos"), dicts ({"use": "stop_strings",
    "strings": [...]}), StoppingCriterion instances or callables. transformers keeps its own length limit."""
    return StoppingCriteriaList([ChainStoppingCriteria(_criteria(criteria, host), tokenizer=tokenizer, model=model,
                                                       pad_token_id=pad_token_id)])


def as_custom_generate(chain: Any, *, stop: Sequence[Any] = (), host: PluginHost | None = None,
                       **defaults: Any) -> Any:
    """A callable for `model.generate(custom_generate=...)` that runs samplechain's own loop with `chain`.

    From transformers it takes input_ids and attention_mask, the length limit (generation_config.max_length,
    which transformers derives from max_new_tokens), eos and pad ids, and `return_dict_in_generate` /
    `output_scores` / `output_logits`. transformers' own logits processors (built from the generation config,
    e.g. repetition_penalty) run before the chain; its stopping criteria run next to ours (its length and eos
    criteria are replaced by ours). Extra keywords of model.generate: `seed`, `params` (per-row chain
    parameters), `stop_strings`. `defaults` are passed to the loop; `tokenizer=` belongs there (transformers
    does not hand model.generate's tokenizer to a custom_generate callable).
    """
    from ..generation import generate as sc_generate

    resolved = _chain(chain, host)

    def custom_generate(model: Any, input_ids: torch.LongTensor, logits_processor: Any = None,
                        stopping_criteria: Any = None, generation_config: Any = None, tokenizer: Any = None,
                        seed: int | None = None, params: Any = None, stop_strings: Any = None,
                        **model_kwargs: Any) -> Any:
        gc = generation_config or model.generation_config
        extra: list[Any] = list(stop)
        for crit in stopping_criteria or []:
            if not isinstance(crit, (MaxLengthCriteria, EosTokenCriteria)):
                extra.append(crit)
        eos = getattr(gc, "_eos_token_tensor", None)
        if eos is None:
            eos = gc.eos_token_id
        pad = getattr(gc, "_pad_token_tensor", None)
        pad = int(pad) if isinstance(pad, torch.Tensor) and pad.numel() == 1 else gc.pad_token_id
        kwargs: dict[str, Any] = dict(defaults)
        # transformers drops `tokenizer` before calling a custom_generate callable: take it from the defaults
        tokenizer = tokenizer if tokenizer is not None else kwargs.pop("tokenizer", None)
        kwargs.pop("tokenizer", None)
        kwargs.update(
            input_ids=input_ids,
            attention_mask=model_kwargs.get("attention_mask"),
            chain=resolved,
            stop=extra,
            max_length=int(gc.max_length) if gc.max_length else None,
            eos_token_id=eos if eos is not None and (not isinstance(eos, torch.Tensor) or eos.numel()) else None,
            pad_token_id=pad,
            seed=seed if seed is not None else kwargs.get("seed"),
            params=params if params is not None else kwargs.get("params"),
            stop_strings=stop_strings or kwargs.get("stop_strings"),
            output_scores=bool(gc.output_scores),
            output_logits=bool(gc.output_logits),
            logits_processor=logits_processor if logits_processor else None,
            generation_config=gc,
        )
        if eos is None:
            kwargs["ignore_eos"] = True
        out = sc_generate(model, tokenizer, None, **kwargs)
        return out if gc.return_dict_in_generate else out.sequences

    return custom_generate
