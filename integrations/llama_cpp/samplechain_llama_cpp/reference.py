"""llama.cpp's own samplers on given logits, through llama-cpp-python's low-level bindings: the reference the
conformance tests (tests/test_conformance.py) and benchmarks/bench_llamacpp.py compare samplechain with.

`LlamaSamplers(specs)` is one llama.cpp sampler chain (`llama_sampler_chain_init` and one `llama_sampler_init_*`
per spec, no dist unless asked for); `kept(logits)` does what `llama_sampler_sample` does before its selector (the
candidates array filled in token-id order, `llama_sampler_apply`) and returns the surviving candidates. History
for penalties and DRY goes in through `accept` (what llama.cpp's server does with the prompt and each token).
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .model import _extra_buffers

__all__ = ["LlamaSamplers", "Spec", "kept_of_scores", "open_llama", "softmax"]

Spec = tuple[str, Mapping[str, Any]]  # (llama.cpp sampler name, its arguments)
_TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])


def _bindings() -> Any:
    import llama_cpp

    return llama_cpp


def open_llama(path: str | Path, **kwargs: Any) -> Any:
    """`llama_cpp.Llama(model_path=path, **kwargs)` (verbose off unless given) on the plain CPU kernels: a virtual
    machine may report AMX and not enable it, and then the first batched decode stops the process with an illegal
    instruction (`load_gguf`'s `extra_buffer_types`)."""
    with _extra_buffers(_bindings(), False):
        return _bindings().Llama(model_path=str(path), **{"verbose": False, **kwargs})


def softmax(logits: np.ndarray) -> np.ndarray:
    """Probabilities of finite logits, in float64."""
    x = np.asarray(logits, dtype=np.float64)
    e = np.exp(x - x.max())
    return e / e.sum()


def kept_of_scores(scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(token ids, probabilities) of the finite entries of a processed row (samplechain's `process` output), in
    token-id order."""
    row = np.asarray(scores, dtype=np.float32)
    ids = np.flatnonzero(np.isfinite(row))
    return ids.astype(np.int64), softmax(row[ids])


class LlamaSamplers:
    """One llama.cpp sampler chain over a vocabulary of `vocab` tokens. specs: ("penalties", {last_n, repeat,
    frequency, presence}), ("dry", {multiplier, base, allowed_length, penalty_last_n, breakers, vocab}) with
    `vocab` the model's `llama_vocab` pointer, ("top_n_sigma", {n}), ("top_k", {k}), ("typical", {p, min_keep}),
    ("top_p", {p, min_keep}), ("min_p", {p, min_keep}), ("xtc", {probability, threshold, min_keep, seed}),
    ("temp", {t}), ("temp_ext", {t, delta, exponent}), ("greedy", {}), ("dist", {seed})."""

    def __init__(self, vocab: int, specs: Sequence[Spec]) -> None:
        self.L = _bindings()
        L = self.L
        self.vocab = vocab
        self._keep: list[Any] = []  # ctypes buffers the samplers point into (DRY's breaker strings)
        self.chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
        for name, args in specs:
            L.llama_sampler_chain_add(self.chain, self._init(name, dict(args)))
        self.data = (L.llama_token_data * vocab)()
        self.view = np.frombuffer(self.data, dtype=_TOKEN_DATA)
        self.ids = np.arange(vocab, dtype=np.int32)
        self.array = L.llama_token_data_array(self.data, vocab, -1, False)

    def _init(self, name: str, a: dict[str, Any]) -> Any:
        L = self.L
        if name == "penalties":
            return L.llama_sampler_init_penalties(
                self.vocab, a["last_n"], a.get("repeat", 1.0), a.get("frequency", 0.0), a.get("presence", 0.0)
            )
        if name == "dry":
            words = [s.encode() for s in a["breakers"]]
            breakers = (ctypes.c_char_p * max(len(words), 1))(*words)
            self._keep.append(breakers)
            return L.llama_sampler_init_dry(
                a["vocab"], a["multiplier"], a["base"], a["allowed_length"], a["penalty_last_n"], breakers, len(words)
            )
        if name == "xtc":
            return L.llama_sampler_init_xtc(a["probability"], a["threshold"], a.get("min_keep", 1), a.get("seed", 0))
        if name == "temp_ext":
            return L.llama_sampler_init_temp_ext(a["t"], a["delta"], a["exponent"])
        if name in ("typical", "top_p", "min_p"):
            return getattr(L, f"llama_sampler_init_{name}")(a["p"], a.get("min_keep", 1))
        if name == "dist":
            return L.llama_sampler_init_dist(a.get("seed", 0))
        if name == "greedy":
            return L.llama_sampler_init_greedy()
        value = {"top_n_sigma": "n", "top_k": "k", "temp": "t"}[name]
        return getattr(L, f"llama_sampler_init_{name}")(a[value])

    def accept(self, tokens: Sequence[int] | np.ndarray) -> None:
        for token in np.asarray(tokens).tolist():
            self.L.llama_sampler_accept(self.chain, int(token))

    def reset(self) -> None:
        self.L.llama_sampler_reset(self.chain)

    def apply(self, logits: np.ndarray) -> np.ndarray:
        """The candidates array after the chain (a view into the reused buffer: copy what you keep); `.selected`
        of `self.array` is the chosen index where the chain ends in a selector."""
        self.view["id"] = self.ids
        self.view["logit"] = logits
        self.view["p"] = 0.0
        self.array.data = ctypes.cast(self.data, type(self.array.data))
        self.array.size, self.array.selected, self.array.sorted = self.vocab, -1, False
        self.L.llama_sampler_apply(self.chain, ctypes.byref(self.array))
        # a sampler may move the array's start (xtc drops the most likely candidates by advancing `data`)
        start = (ctypes.addressof(self.array.data.contents) - ctypes.addressof(self.data)) // _TOKEN_DATA.itemsize
        return self.view[start : start + self.array.size]

    def kept(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(token ids, probabilities) of the candidates left with a finite logit, in token-id order, the
        probabilities a softmax over them (what dist draws from); a candidate at -inf has probability 0, the same as
        a removed one."""
        cur = self.apply(logits)
        ids, values = cur["id"].astype(np.int64), cur["logit"]
        finite = np.isfinite(values)
        if not finite.all():
            ids, values = ids[finite], values[finite]
        if ids.size > 1 and not (ids[1:] > ids[:-1]).all():  # a sampler sorted the candidates
            order = np.argsort(ids, kind="stable")
            ids, values = ids[order], values[order]
        return ids, softmax(values)

    def close(self) -> None:
        if self.chain is not None:
            self.L.llama_sampler_free(self.chain)
            self.chain = None

    def __enter__(self) -> LlamaSamplers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
