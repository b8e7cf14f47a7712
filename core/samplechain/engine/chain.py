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
   fails anywhere leaves every request's state exactly as it was.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import torch

from ..contracts import (
    FUSED_SAMPLE,
    Backend,
    Candidates,
    FusedPart,
    Sampler,
    SamplerSetup,
    StepContext,
    sync_free_step,
    token_id_list,
)
from ..errors import ConfigError, RequestError, SamplechainError, SamplingError
from ..filters import patched_top
from .backends import select_backend
from .checks import bad_rows, check_history, check_logits, check_unconditional
from .config import ChainConfig, load_config
from .discovery import PluginHost, get_host
from .logprobs import at_stages, kept_copy, parse_stage, row_lse
from .store import RequestStore, StoreLayout

__all__ = ["Chain", "SampleOutput"]


@attrs.frozen
class SampleOutput:
    """token_ids (B,) int64; logprobs (B,) float32 of each chosen token under the processed distribution (or the
    stage and kind `logprobs_at` asked for: a logit where it asked for logits); scores (B, V) float32 processed
    logits when asked for (return_scores=True), else None; top_logprobs, when asked for (top_logprobs=n > 0), a pair
    (values (B, n) float32, token ids (B, n) int64) of the n most likely tokens under the same stage and kind, best
    first (-inf, with the id of some removed token, where a stage has fewer than n candidates left); ranks, when a
    stage other than the default was asked for or top_logprobs > 0, (B,) int64 rank of each chosen token under
    that distribution (1 for the most likely; tokens tied with it count, as vLLM's selected_token_ranks).

    On a backend whose step never waits for the host (`Backend.sync_free`: cuda) the step's check of its tokens
    is deferred to a device flag: call `check()` where the tokens are read anyway (generate() does); it raises
    the error the step would have raised, and a failed step changed no request's state."""

    token_ids: torch.Tensor
    logprobs: torch.Tensor
    scores: torch.Tensor | None = None
    deferred: tuple[torch.Tensor, Callable[[], Exception]] | None = attrs.field(default=None, repr=False, eq=False)
    top_logprobs: tuple[torch.Tensor, torch.Tensor] | None = attrs.field(default=None, eq=False)
    ranks: torch.Tensor | None = attrs.field(default=None, eq=False)

    def check(self) -> SampleOutput:
        """Raise the step's deferred error, if any (one host read of a device flag); returns self."""
        if self.deferred is not None:
            failed, error = self.deferred
            if bool(failed):
                raise error()
        return self


_FUSE_MIN = 1 << 20  # logits elements from which skipping the (B, V) copy pays for the fusion's extra calls


class Chain:
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
        logits, writable = self._checked(logits)
        store, request_ids = self._store_for(logits, store, request_ids)
        backend = self._backend_for(logits.device.type)
        view = store.batch(request_ids)
        positions = store.positions(view)
        cand = Candidates(logits, None, logits.shape[1], False, writable)
        if logits.shape[0] == 0:
            return logits.clone()
        hist = check_history(history, prompt_lengths, positions, logits)
        uncond = self._checked_unconditional(unconditional_logits, logits)
        cand = self._filter(cand, store, view, positions, backend, hist, uncond)
        return cand.scores()

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
        accept: bool | str = True,
        return_scores: bool = False,
        history: torch.Tensor | None = None,
        prompt_lengths: torch.Tensor | None = None,
        unconditional_logits: torch.Tensor | None = None,
        logprobs_at: str | Sequence[str] = "processed",
        top_logprobs: int = 0,
    ) -> SampleOutput:
        """Choose one token per row. Without a store, each row is a fresh request with the chain's parameters.

        accept=False leaves the store untouched (call `accept` later); accept="defer" returns (output, commit):
        the state updates are computed but only written when commit() is called (MixedChains uses it so a failure
        in any group of a mixed batch changes no request).

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
        args = (
            logits,
            store,
            request_ids,
            accept,
            return_scores,
            history,
            prompt_lengths,
            unconditional_logits,
            logprobs_at,
            top_logprobs,
        )
        if not self._sync_free(logits):
            return self._sample(*args)
        with sync_free_step():
            return self._sample(*args)

    def _sample(
        self,
        logits: torch.Tensor,
        store: RequestStore | None,
        request_ids: Sequence[str] | None,
        accept: bool | str,
        return_scores: bool,
        history: torch.Tensor | None,
        prompt_lengths: torch.Tensor | None,
        unconditional_logits: torch.Tensor | None,
        logprobs_at: str | Sequence[str] = "processed",
        top_logprobs: int = 0,
    ) -> SampleOutput:
        given = logits  # as the caller passed them: a failing step names the NaN / +inf it finds there
        logits, writable = self._checked(logits)
        batch, vocab = logits.shape
        store, request_ids = self._store_for(logits, store, request_ids)
        backend = self._backend_for(logits.device.type)
        view = store.batch(request_ids)
        positions = store.positions(view)
        modes = self._logprobs_modes(logprobs_at, top_logprobs, batch)  # None: processed logprobs, no top-n
        if batch == 0:
            empty = torch.zeros(0, dtype=torch.int64, device=logits.device)
            width = min(top_logprobs, vocab)
            tops = (empty.float().reshape(0, width), empty.reshape(0, width)) if top_logprobs else None
            out = SampleOutput(empty, empty.float(), logits.clone() if return_scores else None, top_logprobs=tops)
            return (out, lambda also=None: None) if accept == "defer" else out  # type: ignore[return-value]

        hist = check_history(history, prompt_lengths, positions, logits)
        uncond = self._checked_unconditional(unconditional_logits, logits)
        cand = Candidates(logits, None, vocab, False, writable)
        last = len(self.samplers) - 1
        contexts: dict[int, StepContext] = {}  # this step's, each built once
        plan = (
            None
            if return_scores or modes is not None
            else self._fusion(store, view, positions, backend, hist, uncond, contexts)
        )
        kept: dict[int, Candidates] = {}  # logprobs_at's stages: -1 the logits as given, i after entry i
        if modes is not None:
            wanted = sorted({stage for stage, _ in modes if stage < last})
            begin = 0
            for stage in wanted:  # the filter stops after each stage asked for: no swap or fusion crosses it
                if stage >= 0:
                    cand = self._filter(
                        cand, store, view, positions, backend, hist, uncond, begin=begin, end=stage + 1, cache=contexts
                    )
                    begin = stage + 1
                kept[stage] = kept_copy(cand)
            cand = self._filter(cand, store, view, positions, backend, hist, uncond, begin=begin, cache=contexts)
        else:
            cand = self._filter(
                cand, store, view, positions, backend, hist, uncond, end=plan[0] if plan else last, cache=contexts
            )
        fused = None
        if plan is not None:
            start, kernel, parts, select = plan
            if cand.ids is None:  # the tail in one kernel, on the full vocabulary
                fused = self._call(last, kernel, cand.logits, parts, select, positions, last)
            if fused is None:  # compacted in front, or a combination the kernel does not run: the samplers run it
                cand = self._filter(cand, store, view, positions, backend, hist, uncond, begin=start, cache=contexts)
        if fused is not None:
            token_ids, logprobs = fused
            selection = None
        else:
            try:
                # the normaliser of what the selector sees, taken first: right after the previous pass over the
                # logits the worker threads are still awake (measurably cheaper than after the selector)
                lse = row_lse(cand.logits, backend)
                chosen = self.samplers[last].select(
                    cand, self._context(store, view, positions, backend, last, hist, uncond, contexts)
                )
            except Exception as exc:
                raise self._wrap(last, exc) from exc
            self._check_selection(last, chosen, cand)
            token_ids = cand.ids_at(chosen[:, None]).squeeze(1)
            logprobs = cand.logits.gather(1, chosen[:, None]).squeeze(1) - lse
            selection = (cand, chosen)

        def error() -> Exception:
            return bad_rows(
                ~torch.isfinite(logprobs),
                view.request_ids,
                given,
                unconditional_logits,
                lambda: self._stages(given, store, view, positions, backend, hist, uncond),
                sanitize=self._sanitize,
                describe=self._describe,
                selector=last,
            )

        failed = None
        if backend.sync_free:  # a device flag, read by out.check() where the caller reads the tokens
            failed = ~torch.isfinite(logprobs).all()
        elif not bool(torch.isfinite(logprobs).all()):  # one reduction (a sum could overflow: -3e38 x 4 is -inf)
            raise error()
        scores = cand.scores() if return_scores else None
        reported, tops, ranks = logprobs, None, None
        if modes is not None:
            kept[last] = cand
            reported, tops, ranks = at_stages(kept, modes, token_ids, logprobs, (chosen, lse), top_logprobs)
        out = SampleOutput(token_ids, reported, scores, None if failed is None else (failed, error), tops, ranks)
        if accept == "defer":  # MixedChains: every group computes its update before any is committed
            updates = self._updates(store, view, positions, backend, token_ids, hist, selection=selection)

            def commit(also: torch.Tensor | None = None) -> None:  # also: another group's failure flag
                store.advance(view, updates, failed if also is None else also if failed is None else failed | also)

            return out, commit  # type: ignore[return-value]
        if accept:
            updates = self._updates(store, view, positions, backend, token_ids, hist, selection=selection)
            store.advance(view, updates, failed)
        return out

    def reads_history(self, store: RequestStore, request_ids: Sequence[str]) -> bool:
        """Whether a step of these requests reads the tokens so far (`sample`'s history= and prompt_lengths=): some
        sampler that needs them is not a no-op on this batch (penalties at repeat 1.0 and no frequency or presence
        penalty, DRY at multiplier 0 are). A caller that builds the history for each step (the vLLM processor) may
        skip it where this is False; a sampler that needs it says so when it is missing."""
        if not self.needs_history:
            return False
        view = store.batch(request_ids)
        positions = store.positions(view)
        backend = self._backend_for(store.device.type)
        return any(
            s.needs_history() and not self._call(i, s.is_noop, self._context(store, view, positions, backend, i))
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
        view = store.batch(request_ids)
        positions = store.positions(view)
        self._accept(store, view, positions, self._backend_for(store.device.type), token_ids)

    def _accept(
        self,
        store: RequestStore,
        view,
        positions,
        backend: Backend,
        token_ids: torch.Tensor,
        hist: tuple[torch.Tensor, torch.Tensor] | None = None,
        selection: tuple[Candidates, torch.Tensor] | None = None,
    ) -> None:
        store.advance(view, self._updates(store, view, positions, backend, token_ids, hist, selection))

    def _updates(
        self,
        store: RequestStore,
        view,
        positions,
        backend: Backend,
        token_ids: torch.Tensor,
        hist: tuple[torch.Tensor, torch.Tensor] | None = None,
        selection: tuple[Candidates, torch.Tensor] | None = None,
    ) -> dict[tuple[int, str], torch.Tensor]:
        """Every stateful sampler's new state rows; nothing is written to the store here."""
        updates: dict[tuple[int, str], torch.Tensor] = {}
        last = len(self.samplers) - 1
        for i in self._stateful:  # compute everything first: a failure here commits nothing
            ctx = self._context(store, view, positions, backend, i, hist)
            if i == last and selection is not None:  # the selector sees what it chose, in this very step
                ctx.selected_candidates, ctx.selected = selection
            try:
                for name, rows in self.samplers[i].accept(ctx, token_ids).items():
                    updates[(i, name)] = rows
            except Exception as exc:
                raise self._wrap(i, exc, phase="accept") from exc
        return updates

    def _filter(
        self,
        cand: Candidates,
        store: RequestStore,
        view,
        positions,
        backend: Backend,
        hist: tuple[torch.Tensor, torch.Tensor] | None,
        uncond: torch.Tensor | None,
        *,
        begin: int = 0,
        end: int | None = None,
        cache: dict[int, StepContext] | None = None,
    ) -> Candidates:
        """Run the samplers begin .. end - 1 (default: every sampler but the selector). An order-preserving
        transform (temperature, t > 0) right before a rank-only filter (top_k) runs after it instead, on the k
        survivors rather than the whole vocabulary: the same values, one (B, V) pass fewer."""
        i, last = begin, len(self.samplers) - 1 if end is None else end
        while i < last:
            ctx = self._context(store, view, positions, backend, i, hist, uncond, cache)
            if i in self._sparse and cand.ids is None and not cand.writable and cand.logits.numel() >= _FUSE_MIN:
                fused = self._fuse_sparse_then_rank(cand, ctx, i, store, view, positions, backend, hist, uncond, last)
                if fused is not None:
                    cand, i = fused
                    continue
            swap = i + 1 < last and self._swaps(i, ctx)
            steps = (
                [(i + 1, self._context(store, view, positions, backend, i + 1, hist, uncond, cache)), (i, ctx)]
                if swap
                else [(i, ctx)]
            )
            for j, ctx_j in steps:
                try:
                    cand = self.samplers[j].apply(cand, ctx_j)
                except Exception as exc:
                    raise self._wrap(j, exc) from exc
            i += len(steps)
        return cand

    def _swaps(self, i: int, ctx: StepContext) -> bool:
        """Sampler i is an order-preserving transform on this batch right before a rank-only filter, which the
        executor runs first."""
        return self.samplers[i + 1].is_rank_only() and self.samplers[i].preserves_order(ctx)

    def _fusion(
        self,
        store: RequestStore,
        view,
        positions,
        backend: Backend,
        hist,
        uncond,
        cache: dict[int, StepContext] | None = None,
    ) -> tuple[int, Callable[..., Any], list[FusedPart], FusedPart] | None:
        """The chain's tail a backend may run in one truncate-and-draw kernel (`FUSED_SAMPLE`): the selector and the
        samplers before it, back to the first that is neither a no-op on this batch nor a `FusedPart`. Returns
        (index of the tail's first sampler, the kernel, the parts in chain order (perhaps none: the selector
        alone), the selector's part), or None (no such kernel). Reads nothing on the device."""
        if not self._fusable:
            return None
        kernel = backend.kernel(FUSED_SAMPLE)
        if kernel is None:
            return None
        last = len(self.samplers) - 1
        found: list[tuple[int, FusedPart]] = []
        start = last
        takes = getattr(kernel, "fused_kinds", None)  # the parts the kernel may run: stop the walk at another
        for i in range(last - 1, -1, -1):
            ctx = self._context(store, view, positions, backend, i, hist, uncond, cache)
            if not self._call(i, self.samplers[i].is_noop, ctx):
                part = self._call(i, self.samplers[i].fused, ctx) if self.samplers[i].has_fused_part else None
                if part is None:
                    break
                if takes is not None and part.kind not in takes:
                    return None
                found.append((i, part))
            start = i
        if start > 0 and self._swaps(
            start - 1, self._context(store, view, positions, backend, start - 1, hist, uncond, cache)
        ):
            return None  # _filter would run the tail's first sampler (top_k) before the one in front of it
        select = self._call(
            last, self.samplers[last].fused, self._context(store, view, positions, backend, last, hist, uncond, cache)
        )
        if select is None or select.kind != "dist":
            return None
        parts = []
        ranked = False  # a top_k among the parts after this one
        for i, part in found:  # back to front
            if (
                part.kind == "temperature"
                and ranked
                and not isinstance(part.value, torch.Tensor)
                and not self._swaps(i, self._context(store, view, positions, backend, i, hist, uncond, cache))
            ):
                # a shared temperature ranks a following top_k by the raw logits only where _filter swaps them
                part = attrs.evolve(
                    part,
                    value=torch.full(positions.shape, float(part.value), dtype=torch.float32, device=positions.device),
                )
            ranked = ranked or part.kind == "top_k"
            parts.append(part)
        parts.reverse()
        return start, kernel, parts, select

    def _fuse_sparse_then_rank(
        self,
        cand: Candidates,
        ctx: StepContext,
        i: int,
        store: RequestStore,
        view,
        positions,
        backend: Backend,
        hist,
        uncond,
        last: int,
    ) -> tuple[Candidates, int] | None:
        """Sampler i changes a few tokens of the full vocabulary (penalties) and the next sampler before `last` that
        is not disabled this step keeps the k best (top_k): take the k best of the changed rows from a partial
        top-k of the original ones (filters.patched_top) instead of copying (B, V) to write the change. The same
        candidates and logits as running the two in turn; None when the pattern does not apply."""
        j = i + 1
        while j < last:
            ctx_j = self._context(store, view, positions, backend, j, hist, uncond)
            if not self._call(j, self.samplers[j].is_noop, ctx_j):
                break
            j += 1
        if j >= last or not self.samplers[j].is_rank_only():
            return None
        counts = self._call(j, self.samplers[j].rank_counts, cand, ctx_j)
        changes = None if counts is None else self._call(i, self.samplers[i].sparse_changes, cand, ctx)
        if changes is None:
            return None
        fused = self._call(j, patched_top, cand, changes, counts, backend)
        return None if fused is None else (fused, j + 1)

    def _call(self, i: int, fn, *args):
        """fn(*args) on behalf of sampler i: an exception names the sampler and the step."""
        try:
            return fn(*args)
        except Exception as exc:
            raise self._wrap(i, exc) from exc

    def _context(
        self,
        store: RequestStore,
        view,
        positions,
        backend: Backend,
        i: int,
        hist: tuple[torch.Tensor, torch.Tensor] | None = None,
        uncond: torch.Tensor | None = None,
        cache: dict[int, StepContext] | None = None,
    ) -> StepContext:
        """Sampler i's StepContext for this step; with `cache` (one step's), built once per sampler."""
        if cache is not None:
            ctx = cache.get(i)
            if ctx is None:
                ctx = cache[i] = self._context(store, view, positions, backend, i, hist, uncond)
            return ctx
        state = store.state_of(view, i) if i in self._stateful else {}
        history, lengths = hist if hist is not None else (None, None)
        missing = None
        if history is None and self.samplers[i].needs_history():
            missing = (
                f"{self.samplers[i].qualified_name()} reads the tokens so far: pass history= (B, L) token ids "
                "(prompt then generated, left padding as -1) to chain.sample; "
                "samplechain.generation.generate does this for you"
            )
        return StepContext(
            backend,
            view.params[i],
            view.scalars[i],
            positions,
            i,
            view.request_ids,
            state,
            history,
            lengths,
            unconditional_logits=uncond,
            missing_history=missing,
            bounds=view.bounds[i] if view.bounds else {},
        )

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

    def _stages(
        self,
        given: torch.Tensor,
        store: RequestStore,
        view,
        positions,
        backend: Backend,
        hist,
        uncond: torch.Tensor | None,
    ) -> Iterator[Candidates]:
        """The candidates as given (checked again from the caller's tensor: the step may have written its own
        copy), then after each transform and filter in the declared order, without the executor's fusions: the
        slow path a failing step takes to find the stage that emptied a row. Nothing is accepted."""
        logits, writable = self._checked(given)
        cand = Candidates(logits, None, logits.shape[1], False, writable)
        yield cand
        for i in range(len(self.samplers) - 1):
            ctx = self._context(store, view, positions, backend, i, hist, uncond)
            cand = self._call(i, self.samplers[i].apply, cand, ctx)
            yield cand

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
