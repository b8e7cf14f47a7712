"""A samplechain chain as llama-cpp-python's sampler: a `logits_processor` that leaves llama.cpp one token to pick.

llama-cpp-python runs a `logits_processor` as a custom sampler, the first in llama.cpp's sampler chain
(`Llama._init_sampler`): it is called as `processor(input_ids, scores)` with the sequence so far (prompt, then the
tokens generated so far) and the step's logits in token-id order (the candidates array as `llama_sampler_sample`
fills it, before any other sampler reorders it), and what it returns replaces those logits. After it come
llama.cpp's own penalties, top_k, typical, top_p, min_p, temperature and dist (or greedy at temperature 0).

`SamplechainLogitsProcessor` runs the chain on the row (one request in its own store: the chain's per-request
parameters, its seed, the state of penalties, DRY, mirostat ...; history-reading samplers get `input_ids`, the
prompt is the sequence at the first call), and returns the logits with every token but the chain's choice at
-inf: whatever llama.cpp's sampler settings are, it can only pick that token. The chosen token's logprob, which
llama.cpp cannot report (it sees one finite logit), is kept in `.logprobs`.

One processor is one request: it counts its steps from its first call, and a call whose sequence is not the last
one plus the chosen token starts a new request (as a fresh processor would: the same parameters and seed, so the
same tokens for the same prompt). Give every `create_completion` / `create_chat_completion` call its own
(`SamplechainLogitsProcessor.factory` loads the chain once and makes them); `.tokens` and `.logprobs` describe the
last request. Concurrent requests need one processor each.

Not with `logit_bias=`: llama-cpp-python then replaces the processor list by `list.extend`'s None and never calls
it (a `logit_bias` sampler in the chain does the same); llama.cpp's `grammar=` may refuse the chain's token.

Errors: the constructor checks the chain, the parameters, the seed and `logprobs_at`, and raises there.
llama-cpp-python calls the processor from a ctypes callback, which prints an exception and samples the
unchanged logits. The processor keeps it in `.error` and, when it knows the end-of-sequence token (`llama=`),
ends the request with it; check `.error` after the call.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from samplechain import Chain

__all__ = ["ChainSource", "SamplechainLogitsProcessor"]

logger = logging.getLogger("samplechain_llama_cpp")
ChainSource = Chain | str | Path | Mapping[str, Any]
_REQUEST = "llama.cpp"


def _load(chain: ChainSource) -> Chain:
    return chain if isinstance(chain, Chain) else Chain.load(chain)


class SamplechainLogitsProcessor:
    """`logits_processor=[SamplechainLogitsProcessor(chain, params, seed=...)]` for `Llama.create_completion`,
    `create_chat_completion` or `Llama.__call__`: the chain picks every token of the request.

    chain:       a Chain, a chain file (TOML), a TOML string, a dict, or "preset:NAME" (default `preset:llama.cpp`);
    params:      the request's parameters (`{"temperature": 0.7, "top_p": 0.9, "repeat_penalty": 1.1}` or
                 `ID.FIELD` keys), as `store.add(request_id, params)` takes them;
    seed:        the request's seed, for chains that draw (ignored by greedy chains; `params["seed"]` wins);
    logprobs_at: the distribution `.logprobs` is given under (`Chain.sample`'s `logprobs_at`: "processed",
                 "raw", an entry's id ...);
    llama:       the `Llama` the processor serves, for `chain.prepare` (vocabulary size, end-of-sequence id);
    tokenizer:   a tokenizer for `chain.prepare`, for samplers that resolve strings (DRY's breakers, bad_words).

    After the request: `.tokens` (the chosen ids), `.logprobs` (their logprobs), `.prompt_length`."""

    def __init__(
        self,
        chain: ChainSource = "preset:llama.cpp",
        params: Mapping[str, Any] | None = None,
        *,
        seed: int | None = None,
        logprobs_at: str = "processed",
        llama: Any = None,
        tokenizer: Any = None,
    ) -> None:
        self.chain = _load(chain)
        if params is not None and not isinstance(params, Mapping):
            raise TypeError(
                f"SamplechainLogitsProcessor: params = {params!r}: expected a mapping of parameter names to values, "
                'such as {"temperature": 0.7, "top_p": 0.9}'
            )
        self.params = dict(params or {})
        if seed is not None and "seed" not in self.params and "seed" in self.chain.layout.aliases:
            self.params["seed"] = seed
        self.chain.logprobs_stage(logprobs_at)  # an unknown stage is refused here, not inside llama.cpp's callback
        self.logprobs_at = logprobs_at
        if llama is not None and not callable(getattr(llama, "token_eos", None)):
            raise TypeError(
                f"SamplechainLogitsProcessor: llama = {llama!r}: expected the llama_cpp.Llama the processor serves"
            )
        self.eos = None if llama is None else int(llama.token_eos())
        if llama is not None or tokenizer is not None:
            self.chain.prepare(
                tokenizer=tokenizer,
                vocab_size=None if llama is None else int(llama.n_vocab()),
                eos_token_ids=None if llama is None else [int(llama.token_eos())],
            )
        self.reset()

    @classmethod
    def factory(
        cls, chain: ChainSource = "preset:llama.cpp", **defaults: Any
    ) -> Callable[..., SamplechainLogitsProcessor]:
        """A maker of fresh processors (one per request) sharing one loaded chain: `make(params, seed=...)`; keyword
        arguments given here are the defaults of every processor it makes."""
        loaded = _load(chain)

        def make(params: Mapping[str, Any] | None = None, **kwargs: Any) -> SamplechainLogitsProcessor:
            return cls(loaded, params, **{**defaults, **kwargs})

        return make

    def reset(self) -> None:
        """Forget the request: the next call starts a new one (a new prompt, the store's state and position 0)."""
        self.store = self.chain.new_store(capacity=1)
        self.store.add(_REQUEST, self.params)
        self.prompt_length: int | None = None
        self.tokens: list[int] = []
        self.logprobs: list[float] = []
        self.error: Exception | None = None
        self._last: np.ndarray | None = None  # the sequence of the last call

    def as_list(self) -> Any:
        """This processor in a `llama_cpp.LogitsProcessorList` (what `logits_processor=` is typed as)."""
        from llama_cpp import LogitsProcessorList

        return LogitsProcessorList([self])

    def _history(self, input_ids: np.ndarray) -> torch.Tensor:
        ids = np.asarray(input_ids, dtype=np.int64).reshape(-1)
        last = self._last
        follows = last is not None and ids.shape[0] == last.shape[0] + 1 and np.array_equal(ids[:-1], last)
        if follows and int(ids[-1]) != self.tokens[-1]:
            raise RuntimeError(
                f"SamplechainLogitsProcessor: llama.cpp took token {int(ids[-1])} where the chain chose "
                f"{self.tokens[-1]}: leave llama.cpp no grammar or sampler that can refuse the chain's token "
                "(samplechain has grammar and logit_bias samplers of its own)"
            )
        if not follows:  # a new sequence: a new request, as a fresh processor
            self.reset()
            self.prompt_length = int(ids.shape[0])
        self._last = ids
        return torch.from_numpy(ids)[None]

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        try:
            token = self._choose(input_ids, scores)
        except Exception as exc:
            # llama-cpp-python calls this from a ctypes callback, which prints an exception and goes on with the
            # unchanged logits: keep it, and end the request with its end-of-sequence token where that is known
            self.error = exc
            if self.eos is None:
                raise
            logger.error("SamplechainLogitsProcessor: %s; the request ends", exc)
            token = self.eos
        result = np.full(np.shape(scores)[-1], -np.inf, dtype=np.float32)
        # 0.0, not the token's logit: a chain may choose a token whose logit is -inf (a forced one), and llama.cpp
        # needs one finite candidate; its own samplers after this one cannot move the choice either way
        result[token] = 0.0
        return result

    def _choose(self, input_ids: np.ndarray, scores: np.ndarray) -> int:
        history = self._history(input_ids)
        if np.ndim(scores) != 1:
            raise ValueError(
                f"SamplechainLogitsProcessor: scores of shape {np.shape(scores)}: expected one row of logits, one per "
                "vocabulary token (one processor serves one sequence)"
            )
        row = np.array(scores, dtype=np.float32, copy=True).reshape(1, -1)  # llama-cpp-python passes a strided view
        kwargs: dict[str, Any] = {}
        if self.chain.reads_history(self.store, [_REQUEST]):
            kwargs = {"history": history, "prompt_lengths": torch.tensor([self.prompt_length])}
        out = self.chain.sample(
            torch.from_numpy(row), self.store, [_REQUEST], logprobs_at=self.logprobs_at, **kwargs
        ).check()
        token = int(out.token_ids[0])
        self.tokens.append(token)
        self.logprobs.append(float(out.logprobs[0]))
        return token
