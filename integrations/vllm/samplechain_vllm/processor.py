"""A vLLM v1 logits processor that runs samplechain chains on vLLM's persistent batch.

vLLM calls, per engine step (vllm/v1/sample/logits_processor/interface.py):

    update_state(BatchUpdate | None)   requests removed, added (index, SamplingParams, prompt ids, live output ids)
                                       and moved (a -> b, or a <-> b) in the persistent batch
    apply(logits (B, V))               before vLLM's penalties, temperature and top-k/top-p

Each request that asks for samplechain (SamplingParams.extra_args, see requests.py) becomes one request in the
store of its chain; requests naming the same chain share one loaded chain and store, so a step is one batched
`Chain.sample` per chain in use. The chain's selector decides: apply() leaves only the chosen token finite in the
row, so vLLM's own sampling (greedy, or random at any temperature / top-k / top-p) can only pick that token.

Equal to samplechain's own `generate()`: the store position of a request is its number of generated tokens (as
generate()'s), its seed is SamplingParams.seed (or params["seed"]; with n = 1 the frontend moves the seed into
extra_args, so that vLLM's redundant sample after the chain's needs no per-request generator), and history-reading
samplers get prompt + output so far. Where vLLM samples a row whose token it then discards (a chunked prefill that
is not finished, a preempted request resumed with output already), the position is re-synchronised from the output
length before the step, so the noise for (seed, position, token) stays the one generate() uses.

Logprobs: vLLM computes a request's logprobs itself (`Sampler.forward`), by default (logprobs_mode "raw_logprobs")
from the logits before any logits processor: for samplechain rows that is samplechain's "raw" too. In the other
modes vLLM would report the distribution this processor leaves (only the chosen token, at 0.0), so for rows that
ask for logprobs the chain computes them itself (`Chain.sample(logprobs_at=...)`: the engine's processed_logprobs,
processed_logits, raw_logits, or the request's own `logprobs_at`, any chain entry included) and a wrapper around
vLLM's `Sampler.forward`, installed once per process, writes them (chosen token, top n, rank) into the sampler's
output. Requests asking for the whole vocabulary (logprobs=-1) keep vLLM's values.

Errors: a bad chain, preset, file or parameter is caught in `validate_params`, which vLLM's frontend runs when the
request arrives: the request gets HTTP 400 with samplechain's message and never reaches the engine. A failure
while sampling (every token masked for a row ...) must not take the engine down with the other requests: the
failing row alone is isolated, logged, and ended with the end-of-sequence token. A server with vLLM's speculative
decoding builds no logits processor from the entry-point group, so no chain could run there: `validate_params`
refuses every samplechain request of such a server (its speculative config read from vLLM's frontend, the caller).

Stopping: vLLM decides when a request ends, and a logits processor can only end one by leaving the end-of-sequence
token as its only finite logit. The chain's `stop = [...]` criteria that vLLM has no field for (stop_regex,
repetition, stop_strings, stop_sequences, max_time, plugins' own), and a request's `samplechain.stop_regex`, are
checked on the request's output before each step (one `Stopping` of batch size 1 per request: a request's text
criteria keep their state across steps whatever row it occupies); a request they stop gets the end-of-sequence
token at that step, one token after the match. Length limits and `eos` stay vLLM's (max_tokens, its own eos and
stop_token_ids). Requests without such criteria cost nothing: the rows to check are listed with the step's plan.

Thinking budget: vLLM's own `SamplingParams.thinking_token_budget` is enforced by vLLM after every logits processor
(vllm/v1/sample/thinking_budget_state.py, only with --reasoning-parser / --reasoning-config, else the request is
refused). For a request whose chain takes that parameter (the reasoning_budget sampler), `validate_params` hands
the field over to the chain: it becomes `samplechain.thinking_token_budget` and the field is cleared, so vLLM
neither refuses the request nor forces the end marker a second time over the chain's message.
"""

from __future__ import annotations

import functools
import itertools
import logging
import sys
import time
from collections.abc import Sequence
from types import FrameType
from typing import Any

import attrs
import numpy as np
import torch

from samplechain import Chain, StopContext, Stopping, StopSetup
from samplechain.engine.stopping import min_new_tokens_of
from samplechain.engine.store import RequestStore
from samplechain.tokens import eos_token_ids, left_pad

from .requests import RequestSpec
from .validation import (
    CHAIN_CACHE_SIZE,
    check_request,
    hand_over_budget,
    hand_over_seed,
    load_chain,
    request_params,
    stop_criteria,
)

try:  # the processor is a vLLM plugin; the request parsing above works without vLLM
    from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality
except ImportError:  # pragma: no cover - only without vLLM
    # the ignores are for a type check where vLLM is installed; without it (ignore_missing_imports) they are unused
    BatchUpdate = Any  # type: ignore[assignment,misc,unused-ignore]
    LogitsProcessor = object  # type: ignore[assignment,misc,unused-ignore]
    MoveDirectionality = None  # type: ignore[assignment,misc,unused-ignore]

__all__ = ["SamplechainLogitsProcessor", "load_chain", "request_params"]

logger = logging.getLogger("samplechain_vllm")


@attrs.define(eq=False)
class _Group:
    """A chain in use and its request store."""

    chain: Chain
    store: RequestStore
    rows: int = 0  # live requests


@attrs.define(eq=False)
class _Watch:
    """A request's stopping criteria: one Stopping of batch size 1 over its prompt + output (a host buffer that grows
    by doubling, so a step writes only its new tokens)."""

    stopping: Stopping
    setup: StopSetup
    ids: torch.Tensor  # (1, capacity) int64: the prompt, then the output tokens the criteria have seen
    checked: int  # output tokens the criteria have seen

    def _take(self, output: list[int], n: int) -> None:
        """Copy output tokens checked..n into the buffer."""
        start, first = self.setup.prompt_length, self.checked
        if start + n > self.ids.shape[1]:
            grown = torch.zeros(1, max(start + n, 2 * self.ids.shape[1]), dtype=torch.int64)
            grown[:, : start + first] = self.ids[:, : start + first]
            self.ids = grown
        if n - first == 1:  # the usual step: one token, no list-to-tensor copy
            self.ids[0, start + first] = output[first]
        else:
            self.ids[0, start + first : start + n] = torch.tensor(output[first:n], dtype=torch.int64)
        self.checked = n

    def caught_up(self, output: list[int]) -> _Watch:
        """A request resumed after preemption: every token but its newest was checked before; the next step checks
        the newest (criteria that read text rebuild it from the buffer then)."""
        n = _generated(output)
        if n > 1:
            self._take(output, n - 1)
        return self

    def check(self, output: list[int]) -> str | None:
        """The finish reason when the output's new tokens end the request, else None."""
        n = _generated(output)
        if n <= self.checked:  # nothing new (a discarded sample, a prefill step)
            return None
        start, first = self.setup.prompt_length, self.checked
        self._take(output, n)
        for step in range(first + 1, n + 1):  # one token per step, unless vLLM handed over several
            ctx = StopContext(
                input_ids=self.ids[:, : start + step],
                step=step,
                token_ids=self.ids[:, start + step - 1],
                setup=self.setup,
            )
            result = self.stopping.check(ctx)
            if result.any and bool(result.done[0]):
                return result.reasons[0] or "stop"
        return None


@attrs.define(eq=False)
class _Row:
    """A request in the persistent batch. `output` is vLLM's live list of the request's generated tokens."""

    rid: str
    group: _Group | None
    prompt: list[int]
    output: list[int]
    failed: str | None = None
    logprobs: int | None = None  # SamplingParams.logprobs: how many top tokens the request wants (None: none)
    at: str | None = None  # the request's logprobs_at (None: the engine's logprobs_mode)
    eos: int | None = None  # the request's end-of-sequence token (None: the tokenizer's)
    watch: _Watch | None = None  # its stopping criteria, when it has any
    stopped: str | None = None  # the criterion that ended it: it gets the end-of-sequence token until it leaves
    seen: np.ndarray | None = None  # prompt + output ids copied so far (history-reading chains): grows by doubling
    filled: int = 0  # how many of `seen` are set

    def sequence(self) -> np.ndarray:
        """The prompt and the generated ids (int64), kept in `seen`: a step copies only its new tokens (usually
        one), not the whole sequence."""
        prompt = len(self.prompt)
        n = prompt + _generated(self.output)
        seen = self.seen
        if (
            seen is None
            or n < self.filled
            or (self.filled > prompt and seen[self.filled - 1] != self.output[self.filled - prompt - 1])
        ):
            seen = np.empty(max(16, 2 * n), dtype=np.int64)  # first use, or vLLM's list changed under us
            seen[:prompt] = self.prompt
            self.seen, self.filled = seen, prompt
        if n > seen.shape[0]:
            grown = np.empty(2 * n, dtype=np.int64)
            grown[: self.filled] = seen[: self.filled]
            self.seen = seen = grown
        if n - self.filled == 1:  # the usual step
            seen[self.filled] = self.output[self.filled - prompt]
        elif n > self.filled:
            seen[self.filled : n] = self.output[self.filled - prompt : n - prompt]
        self.filled = n
        return seen[:n]


class SamplechainLogitsProcessor(LogitsProcessor):  # type: ignore[misc,valid-type,unused-ignore]  # as above
    """Registered in the `vllm.logits_processors` entry-point group; vLLM builds one per engine."""

    @classmethod
    def validate_params(cls, sampling_params: Any) -> None:
        checked = check_request(sampling_params, speculative_config=_frontend_speculative_config)
        if checked is None:
            return
        if checked[2] is not None:  # the chain enforces vLLM's thinking_token_budget
            hand_over_budget(sampling_params, checked[2])
        hand_over_seed(sampling_params)

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        model_config = getattr(vllm_config, "model_config", None)
        self._model_config = model_config
        self._hf_config = getattr(model_config, "hf_config", None)
        self._device = torch.device(device)
        self._tokenizer: Any = None
        self._tokenizer_loaded = False
        self._tokenizer_size: int | None = None
        self._groups: dict[str, _Group] = {}
        self._rows: dict[int, _Row] = {}
        self._ids = itertools.count()
        self._plan: list[tuple[_Group, list[int], torch.Tensor, tuple[str, ...]]] | None = None
        self._watched: list[int] = []  # batch indices of rows with stopping criteria (made with the plan)
        self._mode = str(getattr(model_config, "logprobs_mode", None) or "raw_logprobs")  # vLLM's engine argument
        # this step's logprobs of the rows the chain scores itself: batch index -> (value, top values, top ids, rank)
        self._pending: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        self._width = 0  # this step's batch size
        _install_sampler_hook()

    def is_argmax_invariant(self) -> bool:
        """False: the chain chooses the token, greedy requests included."""
        return False

    # ------------------------------------------------------------------ batch bookkeeping
    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        for index in batch_update.removed:
            self._release(self._rows.pop(index, None))
        for index, params, prompt, output in batch_update.added:
            self._release(self._rows.pop(index, None))  # an added request may replace the index's occupant
            row = self._join(params, prompt, output)
            if row is not None:
                self._rows[index] = row
        for a, b, direction in batch_update.moved:
            row_a, row_b = self._rows.pop(a, None), self._rows.pop(b, None)
            if row_a is not None:
                self._rows[b] = row_a
            if row_b is not None:
                if direction == MoveDirectionality.SWAP:
                    self._rows[a] = row_b
                else:  # a one-way move overwrote b
                    self._release(row_b)
        self._plan = None

    def _join(self, params: Any, prompt: Sequence[int] | None, output: list[int]) -> _Row | None:
        rid = f"vllm-{next(self._ids)}"
        eos = getattr(params, "eos_token_id", None)  # set by vLLM's frontend; None with ignore_eos
        try:
            checked = check_request(params, trial=False)
        except ValueError as exc:  # validated by the frontend already; a direct engine user may skip that
            logger.error("samplechain: request %s refused: %s", rid, exc)
            return _Row(rid, None, list(prompt or ()), output, failed=str(exc), eos=eos)
        if checked is None:
            return None
        spec, chain, _ = checked
        try:  # a failure here must not leave update_state half done (vLLM would stop the engine)
            group = self._groups.get(spec.chain.key)
            if group is None:
                self._prepare(chain)
                group = self._groups[spec.chain.key] = _Group(chain, chain.new_store(device=self._device.type))
            group.store.add(rid, request_params(chain, spec))
        except Exception as exc:
            logger.error("samplechain: request %s cannot join its chain %s: %s", rid, spec.chain.key, exc)
            return _Row(rid, None, list(prompt or ()), output, failed=f"{type(exc).__name__}: {exc}", eos=eos)
        group.rows += 1
        row = _Row(
            rid,
            group,
            list(prompt or ()),
            output,
            logprobs=getattr(params, "logprobs", None),
            at=spec.logprobs_at,
            eos=eos,
        )
        try:
            row.watch = self._watch(row, chain, spec, getattr(params, "min_tokens", 0) or 0)
        except Exception as exc:  # a criterion's prepare() (no tokenizer ...): the request fails alone
            logger.error("samplechain: request %s: its stopping criteria cannot start: %s", rid, exc)
            row.failed = f"{type(exc).__name__}: {exc}"
            self._release(row)
            return row
        if _generated(output):  # resumed after preemption: continue at its position
            self._set_position(row, _generated(output))
        return row

    def _watch(self, row: _Row, chain: Chain, spec: RequestSpec, min_tokens: int) -> _Watch | None:
        """The request's stopping criteria, prepared on its prompt (None when it has none). The minimum that holds
        back eos, repetition, stop strings and stop_regex is the larger of vLLM's min_tokens and the chain's
        min_new_tokens, as vLLM holds back its own stops."""
        crits = stop_criteria(chain, spec, spec.chain.key)
        if not crits:
            return None
        chain_least = min_new_tokens_of(row.group.store, [row.rid])  # type: ignore[union-attr]
        least = max(int(chain_least[0]) if chain_least is not None else 0, int(min_tokens))
        setup = StopSetup(
            batch_size=1,
            prompt_length=len(row.prompt),
            prompt_lengths=torch.tensor([len(row.prompt)]),
            device=torch.device("cpu"),
            tokenizer=self._load_tokenizer(),
            model_config=self._hf_config,
            start_time=time.monotonic(),
            min_new_tokens=torch.tensor([least]) if least else None,
        )
        stopping = Stopping(crits, require_length_limit=False)
        stopping.prepare(setup)
        ids = torch.zeros(1, max(16, 2 * len(row.prompt)), dtype=torch.int64)
        ids[0, : len(row.prompt)] = torch.tensor(row.prompt, dtype=torch.int64)
        # a resumed request: its earlier tokens were checked before; its newest one is checked at the next step
        return _Watch(stopping, setup, ids, 0).caught_up(row.output)

    def _release(self, row: _Row | None) -> None:
        if row is None or row.group is None:
            return
        group, row.group, row.watch = row.group, None, None
        group.store.remove(row.rid)
        group.rows -= 1
        if group.rows == 0 and len(self._groups) > CHAIN_CACHE_SIZE:  # forget idle chains beyond the cache
            for key, g in list(self._groups.items()):
                if g is group:
                    del self._groups[key]

    def _prepare(self, chain: Chain) -> None:
        """What generate() gives every sampler once: tokenizer (DRY breakers, bad-word strings), model config,
        vocabulary size, eos ids."""
        chain.prepare(
            tokenizer=self._load_tokenizer(),
            model_config=self._hf_config,
            vocab_size=getattr(self._hf_config, "vocab_size", None),
        )

    def _load_tokenizer(self) -> Any:
        if not self._tokenizer_loaded:
            self._tokenizer_loaded = True
            name = getattr(self._model_config, "tokenizer", None)
            if name:
                try:
                    from transformers import AutoTokenizer

                    self._tokenizer = AutoTokenizer.from_pretrained(
                        name,
                        revision=getattr(self._model_config, "tokenizer_revision", None),
                        trust_remote_code=bool(getattr(self._model_config, "trust_remote_code", False)),
                    )
                    self._tokenizer_size = len(self._tokenizer)
                except Exception as exc:  # samplers that need it say so in prepare()
                    logger.warning("samplechain: could not load the tokenizer %r: %s", name, exc)
        return self._tokenizer

    # ------------------------------------------------------------------ the step
    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        self._pending, self._width = {}, logits.shape[0]
        if not self._rows:
            return logits
        if self._plan is None:
            self._plan = self._make_plan()
        if self._watched:  # did the last token end a request with stopping criteria?
            self._stop_rows()
            if self._plan is None:
                self._plan = self._make_plan()
        for group, indices, index, rids in self._plan:
            rows = [self._rows[i] for i in indices]
            self._sync_positions(group, rows, rids)
            try:
                tokens = self._sample(group, logits.index_select(0, index), rows, rids, indices)
            except Exception:
                self._plan = None  # the composition changes: the failing rows leave their group
                tokens = self._isolate(group, logits, indices, rows)
            _keep_only(logits, index, tokens)
        ended = [i for i, r in self._rows.items() if r.failed is not None or r.stopped is not None]
        if ended:
            self._end(logits, ended)
        return logits

    def _stop_rows(self) -> None:
        """Rows whose criteria fire on their newest token leave their chain and get the end-of-sequence token from
        this step on (vLLM then finishes them: finish_reason "stop")."""
        for i in self._watched:
            row = self._rows[i]
            try:
                reason = row.watch.check(row.output)  # type: ignore[union-attr]
            except Exception as exc:  # a criterion that breaks ends its request alone, as a failing sampler does
                row.failed = f"{type(exc).__name__}: {exc}"
                logger.error(
                    "samplechain: request %s (batch row %d): a stopping criterion failed and the request is "
                    "ended with the end-of-sequence token: %s",
                    row.rid,
                    i,
                    row.failed,
                )
                reason = None
            if reason is not None:
                row.stopped = reason
                logger.debug("samplechain: request %s stopped by %s", row.rid, reason)
            if row.failed is not None or row.stopped is not None:
                self._release(row)
                self._plan = None

    def _make_plan(self) -> list[tuple[_Group, list[int], torch.Tensor, tuple[str, ...]]]:
        by_group: dict[int, tuple[_Group, list[int]]] = {}
        self._watched = []
        for i in sorted(self._rows):
            row = self._rows[i]
            if row.group is not None and row.failed is None:
                by_group.setdefault(id(row.group), (row.group, []))[1].append(i)
                if row.watch is not None:
                    self._watched.append(i)
        return [
            (g, idx, torch.tensor(idx, dtype=torch.int64, device=self._device), tuple(self._rows[i].rid for i in idx))
            for g, idx in by_group.values()
        ]

    def _sample(
        self, group: _Group, logits: torch.Tensor, rows: Sequence[_Row], rids: Sequence[str], indices: Sequence[int]
    ) -> torch.Tensor:
        limit = self._vocab_limit(logits.shape[1])
        if limit is not None:  # as generate(): columns past the tokenizer are tokens nobody can decode
            logits[:, limit:] = float("-inf")
        kwargs: dict[str, Any] = _history(rows, logits.device) if group.chain.reads_history(group.store, rids) else {}
        modes = [self._logprobs_at(row) for row in rows]
        scored = [j for j, mode in enumerate(modes) if mode is not None]
        if scored:  # top_logprobs >= 1: the rank comes with it
            kwargs["logprobs_at"] = [mode or "processed" for mode in modes]
            kwargs["top_logprobs"] = max(1, max(rows[j].logprobs or 0 for j in scored))
        out = group.chain.sample(logits, group.store, rids, **kwargs).check()
        if scored:
            self._record([indices[j] for j in scored], torch.tensor(scored, device=logits.device), out)
        return out.token_ids

    def _logprobs_at(self, row: _Row) -> str | None:
        """Where the chain scores the row's logprobs; None where it does not (no logprobs asked for, the whole
        vocabulary asked for, or vLLM's own raw logprobs, taken before this processor, are the ones asked for)."""
        if row.logprobs is None or row.logprobs < 0:
            return None
        if row.at is not None:
            return row.at
        return None if self._mode == "raw_logprobs" else self._mode

    def _record(self, indices: Sequence[int], at: torch.Tensor, out: Any) -> None:
        values, ids = out.top_logprobs
        parts = (out.logprobs[at], values[at], ids[at], out.ranks[at])
        for k, i in enumerate(indices):
            self._pending[i] = tuple(p[k] for p in parts)

    def fill_logprobs(self, tensors: Any) -> None:
        """Write this step's chain-scored rows into vLLM's LogprobsTensors (column 0 the sampled token, then the
        top n, and its rank); called by the wrapper around Sampler.forward right after the step."""
        pending, self._pending = self._pending, {}
        if (
            not pending
            or tensors is None
            or tensors.logprob_token_ids.ndim != 2
            or tensors.logprobs.shape[0] != self._width
        ):  # the whole vocabulary, or not this step's rows
            return
        width = tensors.logprobs.shape[1] - 1
        index = torch.tensor(list(pending), dtype=torch.int64, device=tensors.logprobs.device)
        value, top_values, top_ids, rank = (
            torch.stack([p[k] for p in pending.values()]).to(tensors.logprobs.device) for k in range(4)
        )
        n = min(width, top_values.shape[1])
        tensors.logprobs[index, 0] = value.to(tensors.logprobs.dtype)
        tensors.logprobs[index, 1 : 1 + n] = top_values[:, :n].to(tensors.logprobs.dtype)
        tensors.logprob_token_ids[index, 1 : 1 + n] = top_ids[:, :n].to(tensors.logprob_token_ids.dtype)
        tensors.selected_token_ranks[index] = rank.to(tensors.selected_token_ranks.dtype)

    def _isolate(
        self, group: _Group, logits: torch.Tensor, indices: Sequence[int], rows: Sequence[_Row]
    ) -> torch.Tensor:
        """A batched step failed: sample each row alone so only the culprits fail (nothing was accepted)."""
        tokens = torch.zeros(len(rows), dtype=torch.int64, device=logits.device)
        for k, (i, row) in enumerate(zip(indices, rows)):
            try:
                tokens[k] = self._sample(group, logits[i : i + 1].clone(), [row], [row.rid], [i])[0]
            except Exception as exc:
                row.failed = f"{type(exc).__name__}: {exc}"
                logger.error(
                    "samplechain: request %s (batch row %d, prompt %r...) failed and is ended with the "
                    "end-of-sequence token: %s",
                    row.rid,
                    i,
                    row.prompt[:8],
                    row.failed,
                )
                self._release(row)
        return tokens

    def _end(self, logits: torch.Tensor, indices: Sequence[int]) -> None:
        """Failed and stopped requests finish: their end-of-sequence token is the only finite one (vLLM then stops
        them)."""
        eos = [self._rows[i].eos for i in indices]
        index = torch.tensor(indices, dtype=torch.int64, device=logits.device)
        logits.index_fill_(0, index, float("-inf"))
        logits[index, torch.tensor([self._eos_id() if e is None else e for e in eos], device=logits.device)] = 0.0

    def _eos_id(self) -> int:
        """The first eos id the tokenizer or the model config states (vLLM's own eos comes from these two, not from
        a generation config), 0 when neither states one."""
        ids = eos_token_ids(self._load_tokenizer(), model_config=self._hf_config)
        return ids[0] if ids else 0

    def _vocab_limit(self, width: int) -> int | None:
        n = self._tokenizer_size
        return n if n is not None and width > n else None

    # ------------------------------------------------------------------ positions
    def _sync_positions(self, group: _Group, rows: Sequence[_Row], rids: Sequence[str]) -> None:
        """The store position must be the number of tokens the request has generated (what generate() uses for
        the noise): a discarded sample (unfinished chunked prefill) leaves it one ahead; fix those rows."""
        have = group.store.positions(group.store.batch(rids)).tolist()
        for row, pos in zip(rows, have):
            n = _generated(row.output)
            if pos != n:
                self._set_position(row, n)

    @staticmethod
    def _set_position(row: _Row, position: int) -> None:
        row.group.store.set_position(row.rid, position)  # type: ignore[union-attr]


_FRONTEND_MODULE = "vllm.v1.engine.input_processor"
_FRONTEND_DEPTH = 8  # frames searched; vLLM's InputProcessor is 4 up (check_request, validate_params, its validator)


def _frontend_speculative_config() -> Any:
    """The speculative config of the vLLM frontend that validates this request (None: none, or no such frontend).
    vLLM hands validate_params the SamplingParams alone; its caller is InputProcessor._validate_params (through
    validate_logits_processors_parameters), which has just checked the same SamplingParams against its own
    `speculative_config`, so that is read from the caller's frame. The processor cannot tell instead: vLLM does not
    build it under a speculative config."""
    frontend = getattr(sys.modules.get(_FRONTEND_MODULE), "InputProcessor", None)
    if frontend is None:  # not loaded: no vLLM frontend in this process (validate_params called directly)
        return None
    frame: FrameType | None = sys._getframe(1)
    for _ in range(_FRONTEND_DEPTH):
        if frame is None:
            break
        owner = frame.f_locals.get("self")
        if isinstance(owner, frontend):
            return getattr(owner, "speculative_config", None)
        frame = frame.f_back
    return None


def _install_sampler_hook() -> None:
    """A logits processor cannot hand logprobs back to vLLM: wrap `Sampler.forward` (once per process) so that each
    samplechain processor of the batch writes its chain-scored rows into the step's LogprobsTensors."""
    try:
        from vllm.v1.sample.sampler import Sampler
    except ImportError:  # pragma: no cover - only without vLLM
        return
    if getattr(Sampler.forward, "_samplechain", False):
        return
    original = Sampler.forward

    @functools.wraps(original)
    def forward(self: Any, logits: torch.Tensor, sampling_metadata: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(self, logits, sampling_metadata, *args, **kwargs)
        procs = getattr(getattr(sampling_metadata, "logitsprocs", None), "non_argmax_invariant", ())
        for proc in procs:
            if isinstance(proc, SamplechainLogitsProcessor):
                proc.fill_logprobs(out.logprobs_tensors)
        return out

    forward._samplechain = True  # type: ignore[attr-defined]
    Sampler.forward = forward  # type: ignore[method-assign,unused-ignore]  # the wrap this hook exists for


def _generated(output: Sequence[int]) -> int:
    """Generated tokens so far, without async scheduling's trailing -1 placeholders."""
    n = len(output)
    while n and output[n - 1] == -1:
        n -= 1
    return n


def _history(rows: Sequence[_Row], device: torch.device) -> dict[str, torch.Tensor]:
    """history (B, L): prompt then generated ids, left-padded with -1; prompt_lengths (B,) (as generate()). Each
    row's ids are kept from step to step (_Row.sequence), so a step costs O(B) Python, not O(B * L)."""
    hist = left_pad([row.sequence() for row in rows], -1)
    lengths = torch.tensor([len(row.prompt) for row in rows], dtype=torch.int64)
    return {"history": hist.to(device), "prompt_lengths": lengths.to(device)}


def _keep_only(logits: torch.Tensor, index: torch.Tensor, tokens: torch.Tensor) -> None:
    """Rows `index` keep only their chosen token finite (0.0): any sampler after this one picks it."""
    logits.index_fill_(0, index, float("-inf"))
    logits[index, tokens.to(logits.device)] = 0.0
