"""The chain executor.

One step of `Chain.sample(logits, store, request_ids)`, in order:

1. Check the logits: a (B, V) tensor of float32, float16 or bfloat16 (float64 accepted) on the backend's device.
   Anything not float32 or not contiguous is copied once into a float32 buffer the chain owns; a float32
   contiguous input is never modified in place (nor is one that requires grad: it is detached). With
   `nonfinite = "sanitize"` NaN and +inf are replaced here (see `checks.sanitized`), one sum over (B, V) when there are none.
2. Gather the batch from the request store: slots (B,), each sampler's parameters as (B,) tensors (cached while
   the batch composition is unchanged), RNG positions (B,).
3. Run the transforms and filters in the declared order over the candidate set (logits (B, K) float32, token
   ids (B, K) int64). K starts at V; a truncating filter compacts it, so later stages never touch the full
   vocabulary again. Masked candidates are -inf.
4. The selector (last entry) returns a candidate position per row; token id = ids[position].
5. logprob of the chosen token = logit - logsumexp over the candidates the selector saw (the processed
   distribution; `logprobs_at` asks for another stage's, see `Chain.sample`, and `top_logprobs=n` for the n most
   likely tokens under it: both only cost passes when asked, and a step that asks runs without the fusions). A row
   with no finite candidate, or with NaN / +inf, is an error naming its request and what made it so (the logits
   as given, or the sampler after which the row had nothing): the check is one reduction over the B logprobs (no
   pass over the vocabulary); only a failing step looks closer, running the stages again.
6. Optionally scatter the processed logits back to (B, V) scores (-inf for removed tokens), as transformers does.
7. Accept (unless accept=False): stateful samplers compute their new state rows, then the store commits them and
   advances every row's RNG position by one. Nothing in the store changes before this point, so a step that
   fails anywhere leaves every request's state exactly as it was. With accept=token_ids (teacher forcing) the
   state advances with those tokens instead of the draw, and the logprobs reported are theirs.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import torch

from ..contracts import (
    Backend,
    Candidates,
    Sampler,
    SamplerSetup,
    sync_free_step,
    token_id_list,
)
from ..errors import ConfigError, RequestError, SamplechainError, SamplingError
from .backends import select_backend
from .checks import bad_rows, check_given_tokens, check_history, check_logits, check_unconditional
from .config import ChainConfig, load_config
from .discovery import PluginHost, get_host
from .logprobs import at_stages, logit_of, parse_stage, row_lse
from .stages import StepStages
from .step import DeferredSample, FusionPlan, SampleOutput, Step
from .store import RequestStore, StoreLayout

__all__ = ["Chain", "DeferredSample", "SampleOutput"]


class Chain(StepStages):
    """A validated sampler chain bound to a backend. Build with Chain.load(file | dict | "preset:NAME")."""

    def __init__(self, config: ChainConfig, *, host: PluginHost | None = None, backend: str | None = None) -> None:
        self.config = config
        self.host = host or get_host()
        self.samplers: tuple[Sampler, ...] = tuple(spec.cls(spec.params) for spec in config.samplers)
        self.layout = StoreLayout.for_entries(config.samplers, self.samplers)
        self.backend_name = backend or config.backend
        self._backends: dict[str, Backend] = {}
        self._stateful = [i for i, s in enumerate(self.samplers) if s.is_stateful()]
        # samplers that declare their change of the full vocabulary sparsely (executor fusion with top_k)
        self._sparse = {i for i, s in enumerate(self.samplers) if s.has_sparse_changes}
        # a selector a backend's fused truncate-and-draw kernel can run (dist), perhaps after samplers that tell it theirs
        self._fusable = self.samplers[-1].has_fused_part and not self.samplers[-1].is_stateful()
        self._fusion_kept = None
        self.needs_history = any(s.needs_history() for s in self.samplers)
        self.needs_unconditional_logits = any(s.needs_unconditional_logits() for s in self.samplers)
        self.setup: SamplerSetup | None = None  # the last prepare()'s
        self._stage_names: dict[str, tuple[int, bool]] = {}  # logprobs_at values, parsed
        if self.backend_name != "auto":  # an explicit backend must exist and run here, now
            self._backend_for(None)

    # ----------------------------------------------------------------- construction
    @classmethod
    def load(
        cls, source: str | Path | Mapping[str, Any], *, host: PluginHost | None = None, backend: str | None = None
    ) -> Chain:
        """From a TOML file, a TOML string, a dict, or "preset:NAME" (a preset from registry.toml)."""
        host = host or get_host()
        if isinstance(source, str) and source.startswith("preset:"):
            return cls.from_preset(source[len("preset:") :], host=host, backend=backend)
        return cls(load_config(source, host=host), host=host, backend=backend)

    @classmethod
    def from_preset(cls, name: str, *, host: PluginHost | None = None, backend: str | None = None) -> Chain:
        host = host or get_host()
        registry = host.registry
        if name not in registry.presets:
            close = difflib.get_close_matches(name, list(registry.presets), n=2)
            hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
            raise ConfigError(
                f"{registry.source.name}: presets.{name}: no such preset{hint} "
                f"(available: {', '.join(sorted(registry.presets))})"
            )
        table = {k: v for k, v in registry.presets[name].items() if k != "summary"}
        config = load_config({"name": name, **table}, host=host, name=f"{registry.source.name}: presets.{name}")
        return cls(config, host=host, backend=backend)

    @property
    def is_greedy(self) -> bool:
        """The chain ends in greedy (its result does not depend on any seed)."""
        return self.samplers[-1].name == "greedy"

    # ----------------------------------------------------------------- preparation
    def prepare(
        self,
        *,
        tokenizer: Any = None,
        model_config: Any = None,
        generation_config: Any = None,
        vocab_size: int | None = None,
        eos_token_ids: Any = None,
        **extra: Any,
    ) -> SamplerSetup:
        """Give every sampler what it reads once per generation (`Sampler.prepare`): the tokenizer, the model and
        generation configs, the vocabulary size and eos ids (found in the tokenizer and configs when not given).
        `generate()` calls it; call it yourself before `sample()` when a chain has samplers that need it (DRY's
        breaker strings, bad_words strings, grammar). Returns the setup it gave."""
        from ..tokens import eos_token_ids as stated_eos_ids

        eos = (
            stated_eos_ids(tokenizer, generation_config, model_config)
            if eos_token_ids is None
            else token_id_list(eos_token_ids)
        )
        if vocab_size is None and model_config is not None:
            vocab_size = getattr(model_config, "vocab_size", None)
        setup = SamplerSetup(vocab_size, tokenizer, model_config, generation_config, tuple(eos), extra)
        for i, sampler in enumerate(self.samplers):
            try:
                sampler.prepare(setup)
            except Exception as exc:
                raise self._wrap(i, exc, phase="prepare") from exc
        self.setup = setup
        return setup

    # ----------------------------------------------------------------- requests
    def new_store(self, *, device: torch.device | str | None = None, capacity: int = 8) -> RequestStore:
        """A per-request store for this chain, on the backend's device (cpu unless the chain pins another)."""
        if device is None:
            device = self._backend_for(None).device_type if self.backend_name != "auto" else "cpu"
        return RequestStore(self.layout, device=device, capacity=capacity)

    # ----------------------------------------------------------------- stepping
    def _backend_for(self, device_type: str | None) -> Backend:
        key = device_type or "*"
        backend = self._backends.get(key)
        if backend is None:
            backend = select_backend(self.host, self.backend_name, device_type)
            self._backends[key] = backend
        return backend

    def process(
        self,
        logits: torch.Tensor,
        store: RequestStore | None = None,
        request_ids: Sequence[str] | None = None,
        *,
        history: torch.Tensor | None = None,
        prompt_lengths: torch.Tensor | None = None,
        unconditional_logits: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Run the transforms and filters (not the selector) and return the processed scores (B, V) float32,
        -inf where a token was removed: what a transformers LogitsProcessorList returns. Nothing is accepted,
        no RNG position moves."""
        step = self._begin(logits, store, request_ids)
        if step.batch == 0:
            return step.logits.clone()
        self._inputs(step, history, prompt_lengths, unconditional_logits)
        return self._filter(step, self._candidates(step)).scores()

    def _store_for(
        self, logits: torch.Tensor, store: RequestStore | None, request_ids: Sequence[str] | None
    ) -> tuple[RequestStore, Sequence[str]]:
        batch = logits.shape[0]
        if store is None:
            if request_ids is not None:
                raise RequestError("request_ids were given without a store: pass store=chain.new_store() too")
            store = self.new_store(device=logits.device, capacity=max(batch, 1))
            request_ids = [f"row{i}" for i in range(batch)]
            store.add_many(request_ids)
        elif request_ids is None:
            raise RequestError("a store was given without request_ids: pass the id of every row, in row order")
        elif not isinstance(store, RequestStore):
            raise RequestError(f"store = {store!r}: a RequestStore from this chain's new_store()")
        if isinstance(request_ids, str):  # a string is a sequence of one-character ids
            raise RequestError(f"request_ids = {request_ids!r}: a list of ids, one per row (e.g. [{request_ids!r}])")
        if len(request_ids) != batch:
            raise RequestError(
                f"logits have {batch} rows but {len(request_ids)} request ids were given; pass one id per row"
            )
        if store.layout is not self.layout:
            raise RequestError("this store belongs to another chain; create it with this chain's new_store()")
        if store.device.type != logits.device.type:
            raise SamplingError(
                f"logits are on {logits.device.type} but the request store is on {store.device.type}; "
                f"create the store with chain.new_store(device={logits.device.type!r})"
            )
        return store, request_ids

    def _sync_free(self, logits: Any) -> bool:
        """Whether this step runs on a backend that never waits for the host (`Backend.sync_free`)."""
        device = getattr(logits, "device", None)
        if not isinstance(device, torch.device):
            return False
        try:
            return self._backend_for(device.type).sync_free
        except SamplechainError:  # no backend for it: the step itself reports that
            return False

    def sample(
        self,
        logits: torch.Tensor,
        store: RequestStore | None = None,
        request_ids: Sequence[str] | None = None,
        *,
        accept: bool | torch.Tensor = True,
        return_scores: bool = False,
        history: torch.Tensor | None = None,
        prompt_lengths: torch.Tensor | None = None,
        unconditional_logits: torch.Tensor | None = None,
        logprobs_at: str | Sequence[str] = "processed",
        top_logprobs: int = 0,
    ) -> SampleOutput:
        """Choose one token per row. Without a store, each row is a fresh request with the chain's parameters.

        The step's pipeline, one method per stage, each taking the step's `Step` (built once, in `_begin`):
          1. `_begin`: the logits checked and the batch gathered from the store (parameters, RNG positions);
             `_inputs`: the history and unconditional logits checked;
          2. `_fusion`: the chain's tail a backend's fused truncate-and-draw kernel may run (default logprobs and
             no scores only);
          3. `_filter` (`_filter_keeping` where `logprobs_at` asks for stages): the transforms and filters;
          4. `_select`: the fused kernel's draw, or the remaining filters and the selector's; the chosen tokens'
             logprobs;
          5. `_verify`: a row without a finite logprob is an error (a device flag on a sync-free backend);
          6. `_output`: scores, logprobs at other stages, top_logprobs;
          7. accept: the stateful samplers' new state (`_updates`), committed with every row's RNG position.

        accept=False leaves the store untouched (call `accept` later); `sample_deferred` computes the new state but
        writes it only when told. accept=token_ids, a (B,) integer tensor, is teacher forcing (what
        `samplechain.generation.score` runs on): the stages and the draw run as usual (`token_ids` of the output is
        the chain's draw), but `logprobs` and `ranks` are those of the given tokens under `logprobs_at` (-inf where
        a stage removed one; `top_logprobs` are as without it), and the store advances with the given tokens: every
        row's RNG position moves, each stateful sampler's `accept` gets them (its `ctx.selected` is the draw).

        logprobs_at: the distribution under which `logprobs` (the chosen token's) and `top_logprobs` (the n best,
        top_logprobs=n) are given; one value for the batch or one per row (each stage asked for is computed once):
          "processed" (default): what the selector sampled from, after every transform and filter (vLLM's
                      processed_logprobs; llama.cpp's post_sampling_probs): logit - logsumexp over its candidates;
          "raw":      log_softmax of the logits as given to the chain, before any sampler (float32; after the
                      chain's own nonfinite = "sanitize" if set): vLLM's raw_logprobs;
          ENTRY:      right after that chain entry ran (its `id`, or its `use` / plugin name where only one entry has
                      it): the candidates earlier filters removed count as -inf, logprob = logit - logsumexp over
                      those left at that stage. Naming the last entry before the selector, or the selector, is
                      "processed".
        A suffix ":logits" gives the logit values at that stage instead ("temp:logits", "raw:logits"); vLLM's
        names raw_logprobs, raw_logits, processed_logprobs, processed_logits are accepted as they are. An unknown
        name is a ConfigError listing the chain's entries. The tokens never depend on it. The default costs nothing
        more; anything else (or top_logprobs > 0) runs the step without the backend's fused tail and keeps a copy of
        each stage asked for (one (B, K) copy and a log-sum-exp each)."""
        if not isinstance(accept, (bool, torch.Tensor)):
            raise TypeError(
                f"accept={accept!r}: pass True or False; or, teacher forcing, a (B,) tensor of the token ids to "
                "accept instead of the draw; to compute the state updates and commit them later, call "
                "chain.sample_deferred(...) and its result's commit()"
            )
        args = (logits, store, request_ids, return_scores, history, prompt_lengths, unconditional_logits)
        if not self._sync_free(logits):
            return self._sample(accept, *args, logprobs_at, top_logprobs)
        with sync_free_step():
            return self._sample(accept, *args, logprobs_at, top_logprobs)

    def sample_deferred(
        self,
        logits: torch.Tensor,
        store: RequestStore | None = None,
        request_ids: Sequence[str] | None = None,
        *,
        return_scores: bool = False,
        history: torch.Tensor | None = None,
        prompt_lengths: torch.Tensor | None = None,
        unconditional_logits: torch.Tensor | None = None,
        logprobs_at: str | Sequence[str] = "processed",
        top_logprobs: int = 0,
        given: torch.Tensor | None = None,
    ) -> DeferredSample:
        """`sample` whose acceptance waits: the stateful samplers' new state is computed (a failure there raises,
        changing nothing) but written, with every row's RNG position moved, only by the result's `commit()`.
        MixedChains computes every group's first, so a failure in any group of a mixed batch changes no request.
        given: (B,) token ids to accept instead of the draw, as `sample(accept=token_ids)` (teacher forcing)."""
        args = (logits, store, request_ids, return_scores, history, prompt_lengths, unconditional_logits)
        if not self._sync_free(logits):
            return self._sample_deferred(*args, logprobs_at, top_logprobs, given=given)
        with sync_free_step():
            return self._sample_deferred(*args, logprobs_at, top_logprobs, given=given)

    def _sample(self, accept: bool | torch.Tensor, *args: Any) -> SampleOutput:
        given = accept if isinstance(accept, torch.Tensor) else None
        step, out = self._step(*args, given=given)
        if (given is not None or accept) and step.batch:
            accepted = out.token_ids if step.given_tokens is None else step.given_tokens
            step.store.advance(step.view, self._updates(step, accepted), step.failed)
        return out

    def _sample_deferred(self, *args: Any, given: torch.Tensor | None = None) -> DeferredSample:
        step, out = self._step(*args, given=given)
        if not step.batch:
            return DeferredSample(out)
        accepted = out.token_ids if step.given_tokens is None else step.given_tokens
        return DeferredSample(out, step.store, step.view, self._updates(step, accepted), step.failed)

    def _step(
        self,
        logits: torch.Tensor,
        store: RequestStore | None,
        request_ids: Sequence[str] | None,
        return_scores: bool,
        history: torch.Tensor | None,
        prompt_lengths: torch.Tensor | None,
        unconditional_logits: torch.Tensor | None,
        logprobs_at: str | Sequence[str],
        top_logprobs: int,
        *,
        given: torch.Tensor | None = None,
    ) -> tuple[Step, SampleOutput]:
        """The pipeline of `sample` up to its acceptance: the step and its output (given: accept=token_ids)."""
        step = self._begin(logits, store, request_ids, logprobs_at, top_logprobs)
        if given is not None:
            step.given_tokens = check_given_tokens(given, step.logits)
            if step.modes is None:  # the given tokens' logprobs read the selector's candidates: no fused draw
                step.modes = [(len(self.samplers) - 1, False)] * step.batch
        if step.batch == 0:
            return step, self._empty(step, return_scores, top_logprobs)
        self._inputs(step, history, prompt_lengths, unconditional_logits)
        plan = None if return_scores or step.modes is not None else self._fusion(step)
        cand = self._candidates(step)
        if step.modes is not None:
            cand = self._filter_keeping(step, cand)
        else:
            cand = self._filter(step, cand, end=plan.start if plan else len(self.samplers) - 1)
        token_ids, logprobs = self._select(step, cand, plan)
        self._verify(step, logprobs)
        return step, self._output(step, token_ids, logprobs, return_scores, top_logprobs)

    def _begin(
        self,
        logits: torch.Tensor,
        store: RequestStore | None,
        request_ids: Sequence[str] | None,
        logprobs_at: str | Sequence[str] = "processed",
        top_logprobs: int = 0,
    ) -> Step:
        """The step: the logits checked (`checks.check_logits`), the batch's parameters and RNG positions."""
        given = logits  # as the caller passed them: a failing step names the NaN / +inf it finds there
        logits, writable = self._checked(logits)
        store, request_ids = self._store_for(logits, store, request_ids)
        backend = self._backend_for(logits.device.type)
        view = store.batch(request_ids)
        step = Step(store, view, store.positions(view), backend, given=given, logits=logits, writable=writable)
        step.modes = self._logprobs_modes(logprobs_at, top_logprobs, logits.shape[0])
        return step

    def _inputs(
        self,
        step: Step,
        history: torch.Tensor | None,
        prompt_lengths: torch.Tensor | None,
        unconditional_logits: torch.Tensor | None,
    ) -> None:
        """The step's history and unconditional logits, checked against its logits."""
        step.history = check_history(history, prompt_lengths, step.positions, step.logits)
        step.given_unconditional = unconditional_logits
        step.unconditional = self._checked_unconditional(unconditional_logits, step.logits)

    @staticmethod
    def _candidates(step: Step) -> Candidates:
        """The full vocabulary of the step's logits."""
        return Candidates(step.logits, None, step.logits.shape[1], False, step.writable)

    @staticmethod
    def _empty(step: Step, return_scores: bool, top_logprobs: int) -> SampleOutput:
        """The output of a step without rows."""
        empty = torch.zeros(0, dtype=torch.int64, device=step.logits.device)
        width = min(top_logprobs, step.logits.shape[1])
        tops = (empty.float().reshape(0, width), empty.reshape(0, width)) if top_logprobs else None
        return SampleOutput(empty, empty.float(), step.logits.clone() if return_scores else None, top_logprobs=tops)

    def _select(self, step: Step, cand: Candidates, plan: FusionPlan | None) -> tuple[torch.Tensor, torch.Tensor]:
        """The tokens (B,) and their logprobs (B,): the fused kernel's draw over the chain's tail where it runs (the
        full vocabulary reached it and the kernel takes the combination), else the tail's samplers and the
        selector's choice; `step.cand`, `.chosen` and `.lse` keep what the selector saw and chose."""
        last = len(self.samplers) - 1
        if plan is not None:
            if cand.ids is None:  # the tail in one kernel, on the full vocabulary
                fused = self._call(last, plan.kernel, cand.logits, plan.parts, plan.select, step.positions, last)
                if fused is not None:
                    token_ids, logprobs = fused
                    return token_ids, logprobs
            cand = self._filter(step, cand, begin=plan.start)  # compacted in front, or declined: the samplers run it
        try:
            # the normaliser of what the selector sees, taken first: right after the previous pass over the
            # logits the worker threads are still awake (measurably cheaper than after the selector)
            lse = row_lse(cand.logits, step.backend)
            chosen = self.samplers[last].select(cand, self._context(step, last))
        except Exception as exc:
            raise self._wrap(last, exc) from exc
        self._check_selection(last, chosen, cand)
        step.cand, step.chosen, step.lse = cand, chosen, lse
        return cand.ids_at(chosen[:, None]).squeeze(1), cand.logits.gather(1, chosen[:, None]).squeeze(1) - lse

    def _verify(self, step: Step, logprobs: torch.Tensor) -> None:
        """A row without a finite logprob fails the step: at once, or on a sync-free backend through a device flag
        (`step.failed`) that `SampleOutput.check` reads."""
        if step.backend.sync_free:
            step.failed = ~torch.isfinite(logprobs).all()
        elif not _all_finite(logprobs):
            raise self._failure(step, logprobs)

    def _failure(self, step: Step, logprobs: torch.Tensor) -> Exception:
        """The error of a step whose logprobs are not all finite, naming the requests and why (`checks.bad_rows`)."""
        return bad_rows(
            ~torch.isfinite(logprobs),
            step.view.request_ids,
            step.given,
            step.given_unconditional,
            lambda: self._stages(step),
            sanitize=self._sanitize,
            describe=self._describe,
            selector=len(self.samplers) - 1,
        )

    def _output(
        self, step: Step, token_ids: torch.Tensor, logprobs: torch.Tensor, return_scores: bool, top_logprobs: int
    ) -> SampleOutput:
        """The step's SampleOutput: scores, and logprobs at the stages logprobs_at asked for, when asked."""
        scores = step.cand.scores() if return_scores and step.cand is not None else None
        reported, tops, ranks = logprobs, None, None
        if step.modes is not None and step.kept is not None and step.cand is not None:
            # set: logprobs_at runs the step without the fused draw, so the selector chose
            step.kept[len(self.samplers) - 1] = step.cand
            tokens, processed, selection = token_ids, logprobs, (step.chosen, step.lse)
            if step.given_tokens is not None:  # teacher forcing: the given tokens' logprobs, not the draw's
                tokens = step.given_tokens
                processed = logit_of(step.cand, tokens) - step.lse  # type: ignore[operator]
                selection = (None, step.lse)
            reported, tops, ranks = at_stages(step.kept, step.modes, tokens, processed, selection, top_logprobs)  # type: ignore[arg-type]
        deferred = None if step.failed is None else (step.failed, functools.partial(self._failure, step, logprobs))
        return SampleOutput(token_ids, reported, scores, deferred, tops, ranks)

    def reads_history(self, store: RequestStore, request_ids: Sequence[str]) -> bool:
        """Whether a step of these requests reads the tokens so far (`sample`'s history= and prompt_lengths=): some
        sampler that needs them is not a no-op on this batch (penalties at repeat 1.0 and no frequency or presence
        penalty, DRY at multiplier 0 are). A caller that builds the history for each step (the vLLM processor) may
        skip it where this is False; a sampler that needs it says so when it is missing."""
        if not self.needs_history:
            return False
        step = self._step_of(store, request_ids)
        return any(
            s.needs_history() and not self._call(i, s.is_noop, self._context(step, i))
            for i, s in enumerate(self.samplers)
        )

    def logprobs_stage(self, logprobs_at: str) -> tuple[int, bool]:
        """(stage, as logits) of a `logprobs_at` value (see `sample`): stage -1 is the logits as given, i the
        distribution right after entry i, len(samplers) - 1 the processed one (what the selector saw)."""
        found = self._stage_names.get(logprobs_at) if isinstance(logprobs_at, str) else None
        if found is None:
            found = self._stage_names[logprobs_at] = parse_stage(self.config.samplers, logprobs_at)
        return found

    def _logprobs_modes(
        self, logprobs_at: str | Sequence[str], top_logprobs: int, batch: int
    ) -> list[tuple[int, bool]] | None:
        """Each row's (stage, as logits); None for the default (processed logprobs, no top-n: the fast path)."""
        if top_logprobs == 0 and logprobs_at == "processed":  # the default: nothing to parse
            return None
        if isinstance(top_logprobs, bool) or not isinstance(top_logprobs, int) or top_logprobs < 0:
            raise ConfigError(f"top_logprobs = {top_logprobs!r}: must be an integer >= 0")
        if isinstance(logprobs_at, str):
            modes = [self.logprobs_stage(logprobs_at)] * batch
        elif not isinstance(logprobs_at, (list, tuple)):
            raise ConfigError(
                f"logprobs_at = {logprobs_at!r}: one stage for the batch (for example 'raw', 'processed' or an entry's "
                "id) or a list of one per row"
            )
        else:
            modes = [self.logprobs_stage(v) for v in logprobs_at]
            if len(modes) != batch:
                raise RequestError(
                    f"logprobs_at lists {len(modes)} values for {batch} rows: give one string for "
                    "the batch or one per row"
                )
        processed = (len(self.samplers) - 1, False)
        return None if not top_logprobs and all(m == processed for m in modes) else modes

    def accept(self, store: RequestStore, request_ids: Sequence[str], token_ids: torch.Tensor) -> None:
        """Record chosen tokens (as llama.cpp's accept) when sample() ran with accept=False."""
        step = self._step_of(store, request_ids)
        store.advance(step.view, self._updates(step, token_ids))

    def _step_of(self, store: RequestStore, request_ids: Sequence[str]) -> Step:
        """A step of these requests without logits: their parameters and RNG positions (accept, reads_history)."""
        view = store.batch(request_ids)
        return Step(store, view, store.positions(view), self._backend_for(store.device.type))

    @property
    def _sanitize(self) -> bool:
        return self.config.nonfinite == "sanitize"

    def _checked(self, logits: Any) -> tuple[torch.Tensor, bool]:
        return check_logits(logits, self._sanitize)

    def _checked_unconditional(self, uncond: torch.Tensor | None, logits: torch.Tensor) -> torch.Tensor | None:
        needed_by = (
            [s.qualified_name() for s in self.samplers if s.needs_unconditional_logits()] if uncond is None else []
        )
        return check_unconditional(uncond, logits, needed_by, self._sanitize)

    def _wrap(self, i: int, exc: Exception, phase: str = "step") -> SamplechainError:
        text = f"{self._describe(i)} failed during {phase}"
        if isinstance(exc, SamplechainError):
            return type(exc)(f"{text}: {exc}")
        return SamplingError(f"{text}: {type(exc).__name__}: {exc}; no request state was changed")

    def _check_selection(self, last: int, chosen: Any, cand: Candidates) -> None:
        if not (
            isinstance(chosen, torch.Tensor) and chosen.dtype == torch.int64 and chosen.shape == (cand.batch_size,)
        ):
            got = f"{chosen.dtype} {tuple(chosen.shape)}" if isinstance(chosen, torch.Tensor) else type(chosen).__name__
            raise self._wrap(last, TypeError(f"select() must return a (B,) int64 tensor of positions, got {got}"))

    def _describe(self, i: int) -> str:
        """ "sampler 'top_k' (top_k.v1 at samplers[2], plugin 'top_k' (samplechain-top-k 0.1.0))": entry i."""
        spec = self.config.samplers[i]
        info = self.host.provider("sampler", spec.cls)
        plugin = info.describe() if info else "an in-process plugin"
        return f"sampler {spec.use!r} ({spec.cls.qualified_name()} at {spec.path}, {plugin})"

    # ----------------------------------------------------------------- description
    def describe(self) -> list[dict[str, Any]]:
        out = []
        for spec, sampler in zip(self.config.samplers, self.samplers):
            out.append(
                {
                    "use": spec.use,
                    "name": spec.cls.qualified_name(),
                    "id": spec.id,
                    "stage": spec.cls.stage.value,
                    "params": attrs.asdict(spec.params),
                    "argmax_invariant": sampler.is_argmax_invariant(),
                    "stateful": sampler.is_stateful(),
                }
            )
        return out

    def __repr__(self) -> str:
        steps = " -> ".join(s["name"] for s in self.describe())
        return f"Chain({self.config.name or self.config.source}: {steps}, backend={self.backend_name})"


def _all_finite(x: torch.Tensor) -> bool:
    """Every entry finite: one reduction (a sum could overflow: -3e38 x 4 is -inf), through numpy on the CPU (a
    few microseconds less a step than torch's two calls)."""
    if x.device.type == "cpu" and not x.requires_grad:
        return bool(np.isfinite(x.numpy()).all())
    return bool(torch.isfinite(x).all())
