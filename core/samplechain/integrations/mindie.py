"""A MindIE-LLM compatible batched `sample()` on samplechain's executor.

    from samplechain.integrations.mindie import MindIESampler, SamplingData, SamplingParam

    sampler = MindIESampler()
    data = SamplingData.from_numpy(all_input_ids, output_ids, to_tensor=torch.from_numpy,
                                   is_prefill=True, request_ids=np.array([11, 12]))
    param = SamplingParam.from_numpy(repetition_penalty=np.array([1.1, 1.0], np.float32), ...,
                                     do_sample=np.array([True, False]), to_tensor=torch.from_numpy)
    next_tokens, logits_or_logprobs = sampler.sample(logits, data, param)

The argument names, shapes and dtypes follow MindIE-LLM's `Sampler.sample`, `SamplingData.from_numpy` and
`SamplingParam.from_numpy` (mindie_llm/text_generator/utils/sampling_metadata.py). Two chains run the rows of one
batch through `samplechain.MixedChains` (one batched call per chain, atomic commit):

    greedy rows   penalties(scope="vllm") -> greedy
    sampled rows  penalties(scope="vllm") -> temperature -> top_k -> top_p -> dist (seeded, batch-invariant)

Penalties (MindIE's handler order: repetition, then frequency, then presence): repetition_penalty over every token
of `all_input_ids` (input + output); frequency / presence over `output_ids` only. Ids outside [0, vocab) are
padding (MindIE pads with pad_token_id in [-1, vocab_size]).

Returns `next_tokens` (B,) int64 and `logits_or_logprobs` (B,) float32: a greedy row's chosen-token logit after
the penalties, a sampled row's log-probability under the processed distribution it was drawn from; None when every
row of the batch is greedy. See docs/mindie.md for the full mapping and the documented differences.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from ..engine.chain import Chain
from ..engine.discovery import PluginHost
from ..engine.mixed import MixedChains, MixedStore
from ..errors import ConfigError

__all__ = [
    "MindIEArgumentError",
    "SamplingData",
    "SamplingParam",
    "MindIESampler",
    "Sampler",
    "GREEDY_CHAIN",
    "SAMPLING_CHAIN",
]

_PENALTIES = {"use": "penalties", "repeat": 1.0, "frequency": 0.0, "presence": 0.0, "last_n": -1, "scope": "vllm"}
GREEDY_CHAIN: dict[str, Any] = {"name": "mindie-greedy", "samplers": [dict(_PENALTIES), {"use": "greedy"}]}
SAMPLING_CHAIN: dict[str, Any] = {
    "name": "mindie-sampling",
    "samplers": [
        dict(_PENALTIES),
        {"use": "temperature", "t": 1.0},
        {"use": "top_k", "k": 0},
        {"use": "top_p", "p": 1.0},
        {"use": "dist"},
    ],
}
_GREEDY, _SAMPLE = "greedy", "sample"


class MindIEArgumentError(ConfigError):
    """A MindIE argument is invalid (type, dimension, length, dtype or range). `argument` names it."""

    def __init__(self, argument: str, message: str) -> None:
        super().__init__(f"{argument}: {message}")
        self.argument = argument


# --------------------------------------------------------------------------------------------- validation
def _as_numpy(name: str, value: Any) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    if not isinstance(value, np.ndarray):
        raise MindIEArgumentError(name, f"must be a numpy.ndarray, got {type(value).__name__}")
    return value


def _check_dims(name: str, value: np.ndarray, ndim: int) -> None:
    if value.ndim != ndim:
        raise MindIEArgumentError(
            name,
            f"must be a {ndim}-D array (one {'row' if ndim == 2 else 'value'} per request), got shape {value.shape}",
        )


def _check_kind(name: str, value: np.ndarray, kinds: str, what: str) -> None:
    if value.dtype.kind not in kinds:
        raise MindIEArgumentError(name, f"must be an array of {what}, got dtype {value.dtype}")


def _check_length(name: str, value: np.ndarray, expected: int, against: str) -> None:
    if len(value) != expected:
        raise MindIEArgumentError(name, f"has {len(value)} rows but {against} has {expected}; give one per request")


def _ids_to_numpy(name: str, value: Any) -> np.ndarray:
    """all_input_ids / output_ids as stored (possibly a backend tensor from to_tensor) -> int64 numpy (B, L)."""
    if isinstance(value, torch.Tensor):
        arr = value.detach().cpu().numpy()
    else:
        arr = np.asarray(value)
    _check_dims(name, arr, 2)
    _check_kind(name, arr, "iu", "integer token ids")
    return arr.astype(np.int64, copy=False)


class SamplingData:
    """Batch metadata: token ids for the penalties, and the request ids that let calls share per-request state.

    Build it with `SamplingData.from_numpy` (validation happens there, as in MindIE). `all_input_ids` and
    `output_ids` hold what `to_tensor` returned for the numpy arrays (None when not given)."""

    def __init__(
        self,
        all_input_ids: Any,
        output_ids: Any,
        is_prefill: bool = True,
        request_ids: np.ndarray | None = None,
        to_tensor: Callable | None = None,
    ) -> None:
        self.all_input_ids = all_input_ids
        self.output_ids = output_ids
        self.is_prefill = is_prefill
        self.request_ids = request_ids
        self.to_tensor = to_tensor

    @classmethod
    def from_numpy(
        cls,
        all_input_ids: np.ndarray | None = None,
        output_ids: np.ndarray | None = None,
        to_tensor: Callable | None = None,
        is_prefill: bool = True,
        request_ids: np.ndarray | None = None,
    ) -> SamplingData:
        """all_input_ids: 2-D int (B, L), every input and output token of each request (repetition_penalty).
        output_ids: 2-D int (B, L'), every output token of each request (frequency / presence penalty).
        to_tensor: converts the numpy arrays to backend tensors; required when either id array is given.
        is_prefill: True when the batch produces each request's first token (the request starts fresh).
        request_ids: 1-D int (B,), a unique id per request; with is_prefill it keeps per-request state across
        calls. Ids outside [0, vocab) in the id arrays are padding."""
        if not isinstance(is_prefill, (bool, np.bool_)):
            raise MindIEArgumentError("is_prefill", f"must be a bool, got {type(is_prefill).__name__}")
        arrays = {}
        for name, value in (("all_input_ids", all_input_ids), ("output_ids", output_ids)):
            if value is None:
                continue
            arr = _as_numpy(name, value)
            _check_dims(name, arr, 2)
            _check_kind(name, arr, "iu", "integer token ids")
            arrays[name] = arr
        if arrays and to_tensor is None:
            raise MindIEArgumentError(
                "to_tensor", "is required when all_input_ids or output_ids is given (e.g. to_tensor=torch.from_numpy)"
            )
        if to_tensor is not None and not callable(to_tensor):
            raise MindIEArgumentError("to_tensor", f"must be callable, got {type(to_tensor).__name__}")
        if request_ids is not None:
            request_ids = _as_numpy("request_ids", request_ids)
            _check_dims("request_ids", request_ids, 1)
            if len(set(request_ids.tolist())) != len(request_ids):
                dup = sorted({r for r in request_ids.tolist() if request_ids.tolist().count(r) > 1})
                raise MindIEArgumentError("request_ids", f"must be unique within a batch, repeated: {dup}")
            for name, arr in arrays.items():
                _check_length(name, arr, len(request_ids), "request_ids")
        if len(arrays) == 2 and len(arrays["output_ids"]) != len(arrays["all_input_ids"]):
            _check_length("output_ids", arrays["output_ids"], len(arrays["all_input_ids"]), "all_input_ids")
        # to_tensor is given whenever an array is (checked above)
        tensors = {name: to_tensor(arr) for name, arr in arrays.items()} if to_tensor is not None else {}
        return cls(
            all_input_ids=tensors.get("all_input_ids"),
            output_ids=tensors.get("output_ids"),
            is_prefill=bool(is_prefill),
            request_ids=request_ids,
            to_tensor=to_tensor,
        )

    def __repr__(self) -> str:
        return (
            f"SamplingData(all_input_ids={self.all_input_ids!r}, output_ids={self.output_ids!r}, "
            f"is_prefill={self.is_prefill}, request_ids={self.request_ids!r})"
        )


_FLOAT_PARAMS = ("repetition_penalty", "frequency_penalty", "presence_penalty", "temperature", "top_p")
_INT_PARAMS = ("top_k", "seed")
_ALL_PARAMS = (
    "repetition_penalty",
    "frequency_penalty",
    "presence_penalty",
    "temperature",
    "top_k",
    "top_p",
    "seed",
    "do_sample",
)


class SamplingParam:
    """Per-request post-processing parameters, one 1-D numpy array per parameter (None: the neutral value for
    every row). Build it with `SamplingParam.from_numpy`. The validated arrays are kept as read-only numpy copies
    under their own names (`param.temperature`, ...); the caller's arrays are never modified."""

    def __init__(self, arrays: dict[str, np.ndarray | None], to_tensor: Callable | None = None) -> None:
        self.to_tensor = to_tensor
        self.repetition_penalty: np.ndarray | None = arrays.get("repetition_penalty")
        self.frequency_penalty: np.ndarray | None = arrays.get("frequency_penalty")
        self.presence_penalty: np.ndarray | None = arrays.get("presence_penalty")
        self.temperature: np.ndarray | None = arrays.get("temperature")
        self.top_k: np.ndarray | None = arrays.get("top_k")
        self.top_p: np.ndarray | None = arrays.get("top_p")
        self.seed: np.ndarray | None = arrays.get("seed")
        self.do_sample: np.ndarray | None = arrays.get("do_sample")

    @classmethod
    def from_numpy(
        cls,
        repetition_penalty: np.ndarray | None = None,
        frequency_penalty: np.ndarray | None = None,
        presence_penalty: np.ndarray | None = None,
        temperature: np.ndarray | None = None,
        top_k: np.ndarray | None = None,
        top_p: np.ndarray | None = None,
        seed: np.ndarray | None = None,
        do_sample: np.ndarray | None = None,
        to_tensor: Callable | None = None,
    ) -> SamplingParam:
        """Each argument a 1-D array with one value per request, or None. Ranges (MindIE's documentation):
        repetition_penalty > 0 (1 = off); frequency_penalty / presence_penalty any finite value (0 = off, negative
        rewards); temperature > 0 (1 = off; 0 is accepted and makes the row greedy, as MindIE's code does);
        top_k int >= 0 (0 = off; >= vocab keeps every token); 0 < top_p <= 1 (1 = off); seed int >= 0;
        do_sample bool. to_tensor is required when any array is given."""
        given = dict(
            repetition_penalty=repetition_penalty,
            frequency_penalty=frequency_penalty,
            presence_penalty=presence_penalty,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            seed=seed,
            do_sample=do_sample,
        )
        arrays: dict[str, np.ndarray | None] = {}
        first: str | None = None
        for name in _ALL_PARAMS:
            value = given[name]
            if value is None:
                arrays[name] = None
                continue
            arr = _as_numpy(name, value)
            _check_dims(name, arr, 1)
            if name in _FLOAT_PARAMS:
                _check_kind(name, arr, "fiu", "floats")
                arr = arr.astype(np.float64)
                if not np.isfinite(arr).all():
                    raise MindIEArgumentError(name, f"must be finite, got {arr.tolist()}")
            elif name in _INT_PARAMS:
                _check_kind(name, arr, "iu", "integers")
                arr = arr.astype(np.int64)
            else:  # do_sample
                _check_kind(name, arr, "biu", "bools")
                arr = arr.astype(bool)
            if first is None:
                first = name
            else:
                _check_length(name, arr, len(arrays[first]), first)  # type: ignore[arg-type]
            arr.setflags(write=False)
            arrays[name] = arr
        if first is not None and to_tensor is None:
            raise MindIEArgumentError(
                "to_tensor", "is required when any sampling parameter is given (e.g. to_tensor=torch.from_numpy)"
            )
        checks = (
            ("repetition_penalty", lambda a: a > 0, "must be > 0 (1.0 = no penalty)"),
            ("temperature", lambda a: a >= 0, "must be >= 0 (1.0 = unchanged; 0 = greedy)"),
            ("top_k", lambda a: a >= 0, "must be >= 0 (0 = off)"),
            ("top_p", lambda a: (a > 0) & (a <= 1), "must be in (0, 1] (1.0 = off)"),
            ("seed", lambda a: a >= 0, "must be >= 0"),
        )
        for name, ok, text in checks:
            column = arrays[name]
            if column is not None and not bool(np.all(ok(column))):
                bad = column[~ok(column)].tolist()
                raise MindIEArgumentError(name, f"{text}, got {bad}")
        return cls(arrays, to_tensor)

    @property
    def batch_size(self) -> int | None:
        for name in _ALL_PARAMS:
            arr = getattr(self, name)
            if arr is not None:
                return len(arr)
        return None

    def effective_do_sample(self, batch: int) -> np.ndarray:
        """(B,) bool: which rows sample. do_sample (default False) becomes True where a sampling parameter is set
        to a non-neutral value (temperature != 1, top_k > 0, top_p < 1); temperature == 0 always means greedy."""
        do = np.zeros(batch, dtype=bool) if self.do_sample is None else self.do_sample.copy()
        if self.temperature is not None:
            do |= self.temperature != 1.0
        if self.top_k is not None:
            do |= self.top_k > 0
        if self.top_p is not None:
            do |= self.top_p < 1.0
        if self.temperature is not None:
            do &= self.temperature != 0.0
        return do

    def __repr__(self) -> str:
        parts = ", ".join(f"{n}={getattr(self, n)!r}" for n in _ALL_PARAMS if getattr(self, n) is not None)
        return f"SamplingParam({parts})"


# --------------------------------------------------------------------------------------------- the sampler
class _Request:
    __slots__ = ("route", "params", "prompt", "generated")

    def __init__(self, route: str, params: dict[str, Any], prompt: np.ndarray) -> None:
        self.route = route
        self.params = params
        self.prompt = prompt  # valid all_input_ids tokens of the prefill call (for calls that omit the ids)
        self.generated: list[int] = []  # tokens this sampler chose since the prefill


class MindIESampler:
    """MindIE-LLM's `Sampler.sample(logits, sampling_data, sampling_param) -> (next_tokens, logits_or_logprobs)`.

    Requests named by `SamplingData.request_ids` keep their state between calls: `is_prefill=True` (re)starts
    them (RNG position 0, fresh parameters); `is_prefill=False` continues them (the seeded draw moves on one
    position per token, the parameters of the call apply). Without request_ids every call is a batch of new
    requests: a seeded row then draws from position 0 on every call, as MindIE warns. `clear(ids)` forgets
    finished requests."""

    def __init__(self, *, host: PluginHost | None = None, backend: str | None = None) -> None:
        self.mixed = MixedChains(
            {
                _GREEDY: Chain.load(GREEDY_CHAIN, host=host, backend=backend),
                _SAMPLE: Chain.load(SAMPLING_CHAIN, host=host, backend=backend),
            }
        )
        self.store: MixedStore = self.mixed.new_store()
        self._requests: dict[str, _Request] = {}

    # ----------------------------------------------------------------- request cache
    def __contains__(self, request_id: object) -> bool:
        return str(request_id) in self._requests

    def __len__(self) -> int:
        return len(self._requests)

    def clear(self, request_ids: Sequence[Any] | None = None) -> None:
        """Forget finished requests (all of them when request_ids is None)."""
        keys = list(self._requests) if request_ids is None else [str(r) for r in np.asarray(request_ids).tolist()]
        for key in keys:
            if key in self._requests:
                self.store.remove(key)
                del self._requests[key]

    def position(self, request_id: Any) -> int:
        """Tokens sampled for a request since its prefill (its RNG position)."""
        key = str(request_id)
        chain = self.store.chain_of(key)
        return int(self.store.stores[chain].snapshot([key])[key]["position"])

    # ----------------------------------------------------------------- sampling
    def __call__(
        self, logits: Any, sampling_data: SamplingData | None, sampling_param: SamplingParam | None
    ) -> tuple[np.ndarray | None, np.ndarray]:
        """MindIE's inner `self.sampler(...)` order: (logits_or_logprobs, next_tokens)."""
        tokens, values = self.sample(logits, sampling_data, sampling_param)
        return values, tokens

    def sample(
        self, logits: Any, sampling_data: SamplingData | None = None, sampling_param: SamplingParam | None = None
    ) -> tuple[np.ndarray, np.ndarray | None]:
        logits = self._check_logits(logits)
        batch, vocab = logits.shape
        data = sampling_data if sampling_data is not None else SamplingData(None, None)
        param = sampling_param if sampling_param is not None else SamplingParam({})
        if not isinstance(data, SamplingData):
            raise MindIEArgumentError("sampling_data", f"must be a SamplingData, got {type(data).__name__}")
        if not isinstance(param, SamplingParam):
            raise MindIEArgumentError("sampling_param", f"must be a SamplingParam, got {type(param).__name__}")
        all_ids = None if data.all_input_ids is None else _ids_to_numpy("all_input_ids", data.all_input_ids)
        out_ids = None if data.output_ids is None else _ids_to_numpy("output_ids", data.output_ids)
        for name, arr in (("all_input_ids", all_ids), ("output_ids", out_ids), ("request_ids", data.request_ids)):
            if arr is not None:
                _check_length(name, arr, batch, "logits")
        for name in _ALL_PARAMS:
            arr = getattr(param, name)
            if arr is not None:
                _check_length(name, arr, batch, "logits")

        do_sample = param.effective_do_sample(batch)
        rows = [self._row_params(param, b, bool(do_sample[b])) for b in range(batch)]

        if data.request_ids is None:
            store = self.mixed.new_store(capacity=max(batch, 1))
            ids = [f"row{b}" for b in range(batch)]
            for rid, (route, params) in zip(ids, rows):
                store.add(rid, params, chain=route)
            cached: list[_Request | None] = [None] * batch
        else:
            store = self.store
            ids = [str(r) for r in data.request_ids.tolist()]
            cached = []
            for b, (rid, (route, params)) in enumerate(zip(ids, rows)):
                cached.append(self._join(rid, route, params, data.is_prefill, all_ids, b, vocab))

        penalised = any(
            p.get("repetition_penalty", 1.0) != 1.0
            or p.get("frequency_penalty", 0.0) != 0.0
            or p.get("presence_penalty", 0.0) != 0.0
            for _, p in rows
        )
        extra: dict[str, Any] = {}
        if penalised:
            extra["history"], extra["prompt_lengths"] = self._history(all_ids, out_ids, cached, vocab, logits.device)
        any_greedy = not bool(do_sample.all())
        out = self.mixed.sample(logits, store, ids, return_scores=any_greedy, **extra).check()

        tokens = out.token_ids.cpu().numpy().astype(np.int64)
        for req, tok in zip(cached, tokens.tolist()):
            if req is not None:
                req.generated.append(int(tok))
        if not bool(do_sample.any()):
            return tokens, None
        values = out.logprobs.clone()
        if any_greedy:
            greedy_rows = torch.from_numpy(~do_sample).to(logits.device)
            assert out.scores is not None  # asked for with return_scores=any_greedy
            chosen = out.scores.gather(1, out.token_ids[:, None]).squeeze(1)
            values = torch.where(greedy_rows, chosen, values)
        return tokens, values.cpu().numpy().astype(np.float32)

    # ----------------------------------------------------------------- helpers
    @staticmethod
    def _check_logits(logits: Any) -> torch.Tensor:
        if isinstance(logits, np.ndarray):
            logits = torch.from_numpy(logits)
        if not isinstance(logits, torch.Tensor):
            raise MindIEArgumentError(
                "logits",
                f"must be a torch.Tensor (or numpy array) of shape (batch, vocab), got {type(logits).__name__}",
            )
        if logits.ndim != 2:
            raise MindIEArgumentError("logits", f"must have shape (batch, vocab), got {tuple(logits.shape)}")
        return logits

    @staticmethod
    def _row_params(param: SamplingParam, b: int, sampled: bool) -> tuple[str, dict[str, Any]]:
        def value(name: str, default: Any) -> Any:
            arr = getattr(param, name)
            return default if arr is None else arr[b].item()

        params: dict[str, Any] = {
            "repetition_penalty": float(value("repetition_penalty", 1.0)),
            "frequency_penalty": float(value("frequency_penalty", 0.0)),
            "presence_penalty": float(value("presence_penalty", 0.0)),
        }
        if not sampled:
            return _GREEDY, params
        params["temperature"] = float(value("temperature", 1.0))
        params["top_k"] = int(value("top_k", 0))
        params["top_p"] = float(value("top_p", 1.0))
        seed = value("seed", None)
        if seed is not None:  # None: the store draws a fresh seed when the request joins (and keeps it)
            params["seed"] = int(seed)
        return _SAMPLE, params

    def _join(
        self,
        rid: str,
        route: str,
        params: dict[str, Any],
        is_prefill: bool,
        all_ids: np.ndarray | None,
        b: int,
        vocab: int,
    ) -> _Request:
        req = self._requests.get(rid)
        if is_prefill or req is None:
            if req is not None:
                self.store.remove(rid)
            prompt = np.zeros(0, dtype=np.int64)
            if all_ids is not None:
                row = all_ids[b]
                prompt = row[(row >= 0) & (row < vocab)].copy()
            self.store.add(rid, params, chain=route)
            req = _Request(route, params, prompt)
            self._requests[rid] = req
            return req
        if route != req.route:  # do_sample changed mid-request: move it, keeping its RNG position
            position = self.position(rid)
            self.store.remove(rid)
            self.store.add(rid, params, chain=route)
            target = self.store.stores[route]
            snap = target.snapshot([rid])
            snap[rid]["position"] = position
            target.remove(rid)
            target.restore(snap)
        elif params != req.params:
            self.store.update(rid, params)
        req.route, req.params = route, params
        return req

    @staticmethod
    def _history(
        all_ids: np.ndarray | None,
        out_ids: np.ndarray | None,
        cached: list[_Request | None],
        vocab: int,
        device: torch.device,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, L) history for the penalties (scope "vllm"): each row's all_input_ids tokens then its output_ids
        tokens, right-aligned with -1 on the left; prompt_lengths = the all_input_ids part. Rows of a continued
        request whose call omits an id array use the request's cached prompt + generated tokens instead."""
        batch = len(cached)

        def pad(rows: list[np.ndarray]) -> np.ndarray:
            width = max((len(r) for r in rows), default=0)
            out = np.full((batch, width), -1, dtype=np.int64)
            for b, r in enumerate(rows):
                out[b, : len(r)] = r
            return out

        ins, outs = all_ids, out_ids
        if ins is None:
            ins = pad(
                [
                    np.asarray(r.prompt.tolist() + r.generated, dtype=np.int64)
                    if r is not None
                    else np.zeros(0, np.int64)
                    for r in cached
                ]
            )
        if outs is None:
            outs = pad(
                [np.asarray(r.generated, dtype=np.int64) if r is not None else np.zeros(0, np.int64) for r in cached]
            )
        ins = np.where((ins >= 0) & (ins < vocab), ins, -1)
        outs = np.where((outs >= 0) & (outs < vocab), outs, -1)
        both = np.concatenate([ins, outs], axis=1)
        valid = both >= 0
        order = np.argsort(valid, axis=1, kind="stable")  # padding first, tokens in their order after it
        history = np.take_along_axis(both, order, axis=1)
        if history.shape[1] == 0:
            history = np.full((batch, 1), -1, dtype=np.int64)
        prompt_lengths = (ins >= 0).sum(axis=1)
        return (
            torch.from_numpy(np.ascontiguousarray(history)).to(device),
            torch.from_numpy(prompt_lengths.astype(np.int64)).to(device),
        )


Sampler = MindIESampler  # MindIE's name
