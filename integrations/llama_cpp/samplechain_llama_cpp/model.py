"""A GGUF model on llama.cpp, shaped like the transformers models samplechain's generation loop reads.

`load_gguf(path)` gives a `LlamaCppModel` (the `llama_cpp.Llama`, a config, a generation config and the CPU device)
and the transformers tokenizer converted from the same file. `LlamaCppRunner` decodes on contexts of its own, made
from the Llama's weights (`LlamaCppModel.context`), so the Llama object itself stays free for llama-cpp-python's own
calls (`model.llama.create_completion(...)`).
"""

from __future__ import annotations

import contextlib
import difflib
import inspect
import os
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from samplechain.errors import ConfigError, SamplechainError
from samplechain.models import check_gguf, gguf_tokenizer_path

__all__ = ["LlamaCppConfig", "LlamaCppContext", "LlamaCppModel", "load_gguf"]

DEFAULT_N_CTX = 4096
_INSTALL = "pip install llama-cpp-python (it builds from its sdist; scripts/setup_llama_cpp.sh does it once)"


def _llama_cpp() -> Any:
    try:
        import llama_cpp
    except ImportError as exc:
        raise ConfigError(f"the llama.cpp engine needs llama-cpp-python ({exc}): {_INSTALL}") from None
    return llama_cpp


class LlamaCppConfig:
    """What the generation loop reads from a Hugging Face config, for a GGUF model on llama.cpp."""

    model_type = "llama.cpp"
    is_encoder_decoder = False

    def __init__(self, *, name_or_path: str, vocab_size: int, n_ctx: int, n_ctx_train: int, **meta: Any) -> None:
        self.name_or_path = name_or_path
        self._name_or_path = name_or_path
        self.vocab_size = vocab_size
        self.max_position_embeddings = n_ctx  # the context each row gets, not the training context
        self.n_ctx_train = n_ctx_train
        for key, value in meta.items():
            setattr(self, key, value)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items() if not k.startswith("_")} | {"model_type": self.model_type}

    def __repr__(self) -> str:
        return f"LlamaCppConfig({self.to_dict()})"


class LlamaCppContext:
    """A llama.cpp context of its own on the model's weights: `n_seq_max` sequences, each with a KV cache stream of
    its own of `n_ctx / n_seq_max` cells, and a batch of `n_batch` tokens. Freed with its model, or when
    garbage-collected.

    Not one unified cache: there, the cells of a row interleave with the other rows' as they grow, the attention
    sums run in another order, and after a few steps a row's logits drift from its run alone (by up to ~1 on the
    default model, as the rounding goes through quantized activations). A stream per sequence keeps each row's
    cells as they are at B = 1, and its logits bit for bit."""

    def __init__(self, llama: Any, *, n_seq_max: int, n_ctx: int) -> None:
        lib = _llama_cpp()
        params = lib.llama_context_default_params()
        own = llama.context_params  # the Llama's own settings: its logits and ours agree bit for bit
        for field in ("n_batch", "n_ubatch", "n_threads", "n_threads_batch", "flash_attn_type", "type_k", "type_v"):
            setattr(params, field, getattr(own, field))
        for field in ("rope_scaling_type", "rope_freq_base", "rope_freq_scale", "yarn_orig_ctx", "offload_kqv"):
            setattr(params, field, getattr(own, field))
        params.n_ctx = n_ctx
        params.n_seq_max = n_seq_max
        params.kv_unified = False
        params.no_perf = True
        ctx = lib.llama_init_from_model(llama._model.model, params)
        if not ctx:
            raise ConfigError(
                f"llama.cpp could not create a context of {n_ctx} cells for {n_seq_max} sequences on "
                f"{llama.model_path!r}: lower n_ctx in load_gguf(..., n_ctx=...) or the batch size"
            )
        self.ctx = ctx
        self.n_ctx, self.n_seq_max = lib.llama_n_ctx(ctx), n_seq_max
        self.n_batch = int(params.n_batch)
        self.flash_attn = int(params.flash_attn_type) != lib.LLAMA_FLASH_ATTN_TYPE_DISABLED
        self.n_threads = int(params.n_threads)  # a one-token decode's threads (n_threads_batch: several tokens)
        self.float_kv = int(params.type_k) in (lib.GGML_TYPE_F16, lib.GGML_TYPE_F32)
        self.n_vocab = int(lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(llama._model.model)))
        self.mem = lib.llama_get_memory(ctx)
        self.batch = lib.llama_batch_init(self.n_batch, 0, 1)
        self.owner: weakref.ref[Any] | None = None
        # the Llama must outlive the context: keep a reference, free the context and batch first
        self._finalizer = weakref.finalize(self, _free, lib, ctx, self.batch, llama)

    def close(self) -> None:
        self._finalizer()

    @property
    def in_use(self) -> bool:
        return self.owner is not None and self.owner() is not None

    def clear(self) -> None:
        # the cells' metadata only: a decode writes every cell it uses, and zeroing the buffers (n_ctx cells a row,
        # ~94 MB at 4096) would cost ~10 ms a generation
        _llama_cpp().llama_memory_clear(self.mem, False)

    def decode(self, seq: np.ndarray, pos: np.ndarray, tokens: np.ndarray, logits: np.ndarray) -> np.ndarray:
        """One llama_decode of len(tokens) <= n_batch tokens (token i of sequence seq[i] at position pos[i]); a view
        of the logits of the tokens flagged in `logits`, (n, V) in batch order, valid until the next decode."""
        lib, b, n = _llama_cpp(), self.batch, len(tokens)
        _fill(b.token, tokens, np.int32)
        _fill(b.pos, pos, np.int32)
        _fill(b.n_seq_id, np.ones(n, dtype=np.int32), np.int32)
        _fill(b.logits, logits, np.int8)
        seq_ids = b.seq_id
        for i, s in enumerate(seq.tolist()):
            seq_ids[i][0] = s
        b.n_tokens = n
        rc = lib.llama_decode(self.ctx, b)
        if rc != 0:
            if rc == 1:
                raise ConfigError(
                    f"llama.cpp's KV cache is full ({self.n_ctx // self.n_seq_max} cells a row): load the model "
                    "with a larger n_ctx (load_gguf(path, n_ctx=...)) or generate fewer tokens"
                )
            raise SamplechainError(f"llama_decode returned {rc} for a batch of {n} tokens")
        n_out = int(np.count_nonzero(logits))
        ptr = lib.llama_get_logits(self.ctx)
        return np.ctypeslib.as_array(ptr, shape=(n_out, self.n_vocab))


def _fill(ptr: Any, values: np.ndarray, dtype: Any) -> None:
    """values into the C array `ptr` in one copy (no Python loop over tokens)."""
    if len(values):
        np.ctypeslib.as_array(ptr, shape=(len(values),))[:] = np.asarray(values, dtype=dtype)


def _free(lib: Any, ctx: Any, batch: Any, llama: Any) -> None:
    lib.llama_batch_free(batch)
    lib.llama_free(ctx)
    del llama


class LlamaCppModel:
    """A `llama_cpp.Llama` with what samplechain's generation reads from a model: `config` (vocab_size,
    max_position_embeddings = n_ctx, is_encoder_decoder, name_or_path, model_type "llama.cpp"), `generation_config`
    (eos, bos and pad ids from the GGUF's metadata), `device` (the CPU). `llama` is the Llama, `path` its file."""

    def __init__(self, llama: Any, path: str | os.PathLike[str]) -> None:
        from transformers import GenerationConfig

        self.llama = llama
        self.path = Path(path)
        self.device = torch.device("cpu")
        meta = dict(getattr(llama, "metadata", {}) or {})
        self.config = LlamaCppConfig(
            name_or_path=str(self.path),
            vocab_size=int(llama.n_vocab()),
            n_ctx=int(llama.n_ctx()),
            n_ctx_train=int(llama._model.n_ctx_train()),
            architecture=meta.get("general.architecture"),
        )
        eos = [i for i in dict.fromkeys((int(llama.token_eos()), int(llama._model.token_eot()))) if i >= 0]
        bos = int(llama.token_bos())
        pad = meta.get("tokenizer.ggml.padding_token_id")
        self.generation_config = GenerationConfig(
            eos_token_id=eos[0] if len(eos) == 1 else eos or None,
            bos_token_id=bos if bos >= 0 else None,
            pad_token_id=int(pad) if pad is not None else (eos[0] if eos else None),
        )
        self._contexts: list[LlamaCppContext] = []

    def __repr__(self) -> str:
        return f"LlamaCppModel({str(self.path)!r}, n_ctx={self.config.max_position_embeddings})"

    def context(self, rows: int, owner: Any) -> LlamaCppContext:
        """A context for `rows` sequences of up to n_ctx positions each (rows x n_ctx cells), cleared and held by
        `owner` while it lives. Contexts are kept and reused: a later generation of as many rows or fewer allocates
        nothing."""
        free = [c for c in self._contexts if not c.in_use and c.n_seq_max >= rows]
        if free:
            ctx = min(free, key=lambda c: c.n_seq_max)
        else:
            lib = _llama_cpp()
            most = int(lib.llama_max_parallel_sequences())
            if rows > most:
                raise ConfigError(f"llama.cpp runs at most {most} sequences at once; got a batch of {rows} rows")
            ctx = LlamaCppContext(self.llama, n_seq_max=rows, n_ctx=self.config.max_position_embeddings * rows)
            self._contexts.append(ctx)
        ctx.owner = weakref.ref(owner)
        ctx.clear()
        return ctx

    def close(self) -> None:
        """Free the contexts and the Llama now (otherwise when garbage-collected)."""
        for ctx in self._contexts:
            ctx.close()
        self._contexts.clear()
        self.llama.close()


@contextlib.contextmanager
def _extra_buffers(lib: Any, enabled: bool) -> Iterator[None]:
    """Llama() reads llama_model_default_params() (of the llama_cpp.llama_cpp module) when it loads, and has no
    argument for use_extra_bufts: it is set on what that call returns, for the time of the load."""
    low = lib.llama_cpp
    default = low.llama_model_default_params

    def params() -> Any:
        p = default()
        p.use_extra_bufts = enabled
        return p

    low.llama_model_default_params = params
    try:
        yield
    finally:
        low.llama_model_default_params = default


_COUNTS = {"n_ctx": 0, "n_batch": 1, "n_ubatch": 1, "n_threads": 1, "n_threads_batch": 1}  # the least of each


def _check_llama_kwargs(lib: Any, kwargs: dict[str, Any]) -> None:
    """Refuse what `llama_cpp.Llama` would take and ignore (it has **kwargs: a misspelt `n_ctxx=` sets nothing)
    or turn into an unrelated failure later (a negative context size)."""
    params = inspect.signature(lib.Llama.__init__).parameters
    known = [
        n
        for n, p in params.items()
        if n not in ("self", "model_path") and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
    ]
    for key, value in kwargs.items():
        if key == "model_path":
            raise ConfigError(
                f"llama.cpp engine: model_path={value!r}: the model file is the loader's first argument "
                "(load_model(path), load_gguf(path)), not a keyword"
            )
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            raise ConfigError(
                f"llama.cpp engine: {key}={value!r} is not an argument of llama_cpp.Llama"
                + (f"; did you mean {close[0]!r}?" if close else f" (its arguments: {', '.join(known)})")
            )
        least = _COUNTS.get(key)
        if (
            least is not None
            and value is not None
            and (isinstance(value, bool) or not isinstance(value, int) or value < least)
        ):
            zero = " (0: the model's training context)" if key == "n_ctx" else ""
            raise ConfigError(f"llama.cpp engine: {key}={value!r}: expected an integer >= {least}{zero}")


def load_gguf(
    path: str | os.PathLike[str], *, extra_buffer_types: bool = False, tokenizer: Any = None, **llama_kwargs: Any
) -> tuple[LlamaCppModel, Any]:
    """(LlamaCppModel, tokenizer) for the GGUF file `path`; `llama_kwargs` go to `llama_cpp.Llama` (n_ctx: default
    4096 or the training context when smaller; n_threads: default every core; verbose: default False; flash_attn:
    default True, as llama.cpp's own tools run a CPU model: a decode of several tokens then gives the logits of
    one-token decodes, which speculative decoding's exact tokens need, docs/speculative.md).

    extra_buffer_types: llama.cpp's repacked and AMX weight layouts. Off by default: a native build's AMX kernels
    stop the process with an illegal instruction on virtual machines whose CPU flags announce AMX without enabling
    it. The tokenizer is the transformers one converted from the file (`gguf_tokenizer_path`), unless given."""
    file = check_gguf(path)
    lib = _llama_cpp()
    _check_llama_kwargs(lib, llama_kwargs)
    kwargs: dict[str, Any] = {"n_threads": os.cpu_count() or 1, "verbose": False, "flash_attn": True} | llama_kwargs
    try:
        with _extra_buffers(lib, extra_buffer_types):
            llama = lib.Llama(str(file), **({"n_ctx": DEFAULT_N_CTX} | kwargs))
            train = int(llama._model.n_ctx_train())
            if "n_ctx" not in kwargs and 0 < train < DEFAULT_N_CTX:  # positions past training are not the model's
                llama.close()
                llama = lib.Llama(str(file), **kwargs, n_ctx=train)
    except TypeError as exc:
        raise ConfigError(f"llama.cpp engine: llama_cpp.Llama refused the arguments {llama_kwargs}: {exc}") from None
    except (ValueError, RuntimeError) as exc:
        if "context" in str(exc):  # the weights loaded; the context's settings did not work
            raise ConfigError(
                f"llama.cpp loaded {str(file)!r} but could not make a context with {llama_kwargs} ({exc}): check "
                "n_ctx, n_batch and the other context settings (and the memory they need)"
            ) from None
        raise ConfigError(
            f"llama.cpp could not load {str(file)!r} ({exc}): is it a complete GGUF file of an architecture this "
            "llama-cpp-python build supports? (upgrade llama-cpp-python for newer architectures)"
        ) from None
    model = LlamaCppModel(llama, file)
    if tokenizer is None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(gguf_tokenizer_path(file))
    return model, tokenizer
