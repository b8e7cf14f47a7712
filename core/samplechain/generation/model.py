"""The built-in runner: a Hugging Face causal LM one step at a time, with its KV cache, as transformers' generate
does; and the choice of a runner for a model (`runner_for`).

`TransformersRunner` prepares the inputs the way `GenerationMixin.generate` prepares them for a decoder-only model
(position ids from the attention mask, the mask dropped when nothing is padded, `logits_to_keep=1`) and calls
the model's own `prepare_inputs_for_generation`, so any `AutoModelForCausalLM` that transformers can generate
with runs here too and gives the same logits.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from ..contracts import max_positions
from ..engine.discovery import PluginHost, _truthy, get_host
from ..errors import ConfigError
from ..runners import ModelRunner
from . import invariant
from .cache_room import dynamic_layers, make_room
from .products import _PACKED, COLUMNS, FEW_ROWS, LAYER_ROWS, PACKED, FewRowProducts, KeptLayouts, layouts_of

__all__ = ["ModelRunner", "TransformersRunner", "max_positions", "runner_for"]

# "1" (or true, yes, on): every transformers runner's passes are batch-invariant (TransformersRunner.batch_invariant),
# as for the command line's generations
BATCH_INVARIANT_ENV = "SAMPLECHAIN_BATCH_INVARIANT"
_CACHE_NAMES = ("cache", "past_key_values", "cache_params", "state", "mems", "past_buckets_states")
_MKL = torch.backends.mkl.is_available()


_GROUPED = "samplechain_grouped_sdpa"
_switched: dict[int, tuple[int, Any]] = {}  # id(config): (passes inside, the implementation to restore)
_switching = threading.Lock()


def _grouped_sdpa(
    module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None, **kwargs: Any
) -> tuple[torch.Tensor, None]:
    """transformers' sdpa attention, except that several queries under a mask attend to the shared key/value heads
    as they are (`enable_gqa`): transformers copies the keys and values once per query head there (repeat_kv), every
    layer, which in a check of eight rows costs nearly as much as the attention itself. The kernel is the same, and
    so is every number it gives."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    grouped = getattr(module, "num_key_value_groups", 1) > 1 and mask is not None and query.shape[2] > 1
    if not grouped or kwargs.get("dropout") or kwargs.get("position_bias") is not None or kwargs.get("softcap"):
        return sdpa_attention_forward(module, query, key, value, mask, **kwargs)
    out = F.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, scale=kwargs.get("scaling"), enable_gqa=True
    )
    return out.transpose(1, 2).contiguous(), None


@functools.cache
def _register_grouped() -> bool:
    return invariant.register_attention(_GROUPED, _grouped_sdpa)


@contextlib.contextmanager
def _attending(config: Any, implementation: str) -> Iterator[None]:
    """The model attends with `implementation` (_grouped_sdpa, invariant.attention) while inside: passes of several
    threads or runners on one model nest (counted per config), the last one out restores the model's own."""
    with _switching:
        inside, own = _switched.get(id(config), (0, config._attn_implementation))
        _switched[id(config)] = (inside + 1, own)
        config._attn_implementation = implementation
    try:
        yield
    finally:
        with _switching:
            inside, own = _switched.pop(id(config))
            if inside > 1:
                _switched[id(config)] = (inside - 1, own)
            else:
                config._attn_implementation = own


def runner_for(model: Any, host: PluginHost | None = None) -> type[ModelRunner]:
    """The runner class for `model`: the first registered runner that accepts it, else the transformers runner."""
    host = host or get_host()
    for name, info in list(host.plugins.items()):
        if info.status == "available" and _provides_runner(host, name):
            host.load(name, strict=False)
    for versions in host.registered("runner").values():
        cls = versions[max(versions)]
        if cls is not TransformersRunner and cls.accepts(model):
            return cls
    if not TransformersRunner.accepts(model):
        raise ConfigError(
            f"no model runner drives a {type(model).__name__}: pass a transformers causal LM "
            "(AutoModelForCausalLM), a samplechain.models.load_model(...) result, or install the runner plugin "
            "for its engine (samplechain plugins --available lists them)"
        )
    return TransformersRunner


def _provides_runner(host: PluginHost, name: str) -> bool:
    try:
        entry = host.registry.plugins.get(name)
    except Exception:  # a broken registry file must not hide installed runners
        return False
    return entry is not None and entry.kind == "runner"


def _crop(cache: Any, drop: int) -> None:
    """Cut `drop` positions off the end of a transformers cache. Layer by layer where it has layers: a layer no pass
    has filled (early_exit runs the first layers only) is left alone, which a sliding-window layer's own crop does
    not survive; a layer recording its past (`keep_past`) is trimmed back to its window even with nothing to cut."""
    layers = getattr(cache, "layers", None)
    if layers is None:
        if drop > 0:  # a negative count removes that many positions in every transformers 5.x
            cache.crop(-drop)
        return
    for layer in layers:
        if not getattr(layer, "is_initialized", True):
            continue
        if drop > 0:
            layer.crop(-drop)
        elif getattr(layer, "record_past", False):
            layer.crop(0)


class TransformersRunner(ModelRunner):
    """Prefill then one token per step (or several, `extend`), on a transformers model and its cache."""

    name = "transformers"
    pads_rows = True  # extend_rows gives every row the longest feed's columns (holes where it has fewer)
    # a pass of several tokens a row (a check: extend, extend_rows), and a step once rows were released, can run the
    # linear layers and the vocabulary head in another layout than the model's (FewRowProducts) with MKL on a CPU:
    # None times the layouts once per row count (the layers' up to 128 rows), the head and the other layers apart,
    # and runs each in the fastest (which one depends on the CPU: products.layouts_of), True runs the head and the
    # layers of 1-5 rows as W x^T at every such pass, False (on the class: every runner) never
    few_row_products: bool | None = None
    # a pass of several tokens a row (a check) attends with the key/value heads shared (_grouped_sdpa) instead of
    # copied per query head, on a CPU for a model on transformers' sdpa attention with grouped key/value heads;
    # False keeps transformers' attention
    grouped_attention = True
    # the cache's layers append a pass's keys and values in place, into room kept past their tokens (cache_room),
    # where transformers' DynamicLayer copies the whole cache into a new tensor every pass; False keeps its layers
    room = True
    # a step (one token a row) runs the runner's products as a check does, one row as a product of two columns, which
    # spares a step at B = 1 MKL's slow matrix-vector products (docs/performance.md, "Steps in the runner's
    # products"); the logits then differ from model.generate's by summation order, so it is off by default and
    # generation keeps model.generate's logits bit for bit; True (on the class: every runner) where speed matters more
    fast_steps = False
    # every pass (the prefill, steps, checks) gives each row's logits bit for bit whatever else it carries: its linear
    # layers on oneDNN's packed weights, its attention in float64 (generation/invariant.py), so drafts never change
    # a token and a prompt gives the same tokens alone or in any batch; needs a float32 model on a CPU with oneDNN,
    # whose kernels a runner checks once per model before it generates. The logits then differ from model.generate's
    # by summation order, so it is off by default; True (on the class: every runner) turns it on
    batch_invariant = False

    @classmethod
    def accepts(cls, model: Any) -> bool:
        return callable(getattr(model, "prepare_inputs_for_generation", None)) and hasattr(model, "config")

    def __init__(self, model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> None:
        if getattr(model.config, "is_encoder_decoder", False):
            raise ConfigError(
                f"{type(model).__name__} is an encoder-decoder model; samplechain.generate drives decoder-only "
                "causal LMs (AutoModelForCausalLM). Use the chain as a logits processor inside model.generate()."
            )
        super().__init__(model, input_ids, attention_mask)
        params = set(inspect.signature(model.forward).parameters)
        self.device = input_ids.device
        mask = attention_mask if attention_mask is not None else torch.ones_like(input_ids)
        self.kwargs: dict[str, Any] = {"use_cache": True}
        # the keyword the cache goes back in as: transformers >= 5.24 names it `cache` (past_key_values deprecated)
        takes = inspect.signature(model.prepare_inputs_for_generation).parameters
        self.cache_key = "cache" if "cache" in takes else "past_key_values"
        if "position_ids" in params:
            pos = mask.long().cumsum(-1) - 1
            self.kwargs["position_ids"] = pos.masked_fill(mask == 0, 0)
        # transformers drops an all-ones mask (no padding): the model then takes its faster causal path. Doing
        # the same keeps our logits bit-identical to model.generate's.
        self.mask_length = input_ids.shape[1]
        self.kwargs["attention_mask"] = None if bool((mask == 1).all()) else mask
        if "logits_to_keep" in params:
            self.kwargs["logits_to_keep"] = 1
        self._first = True
        self._recording = False  # the cache keeps states past a sliding window (`keep_past`)
        # which cache columns hold each row's tokens: rows of one batch keep different numbers of drafted tokens as
        # holes (masked columns) in the common cache, which needs explicit positions and a cache whose every column
        # stays visible (no sliding window, which would count the holes)
        self.live: torch.Tensor | None = None  # (B, columns) bool once a row has a hole
        self.per_row_truncate = "position_ids" in params and getattr(model.config, "sliding_window", None) is None
        self.rows = input_ids.shape[0]  # the batch as callers see it
        self.held: list[int] | None = None  # after `release`: the callers' rows the cache still holds, in its order
        self._held_index: torch.Tensor | None = None  # `held` as an index on the device
        # fixed for the runner's passes from here; a drafter's runner (draft_model) needs no such numerics
        self.batch_invariant = (self.batch_invariant or _truthy(BATCH_INVARIANT_ENV)) and not self.drafting
        if self.batch_invariant:
            self._require_invariance()
        if not (_MKL and self.device.type == "cpu"):
            self.few_row_products = False
        self.stepped_widths = self.few_row_products is not False
        kv_heads = getattr(model.config, "num_key_value_heads", None)
        groups = kv_heads is not None and kv_heads != getattr(model.config, "num_attention_heads", kv_heads)
        self.grouped_attention = (
            self.grouped_attention
            and self.device.type == "cpu"
            and groups
            and getattr(model.config, "_attn_implementation", None) == "sdpa"
            and _register_grouped()
        )

    def _require_invariance(self) -> None:
        """ConfigError where batch-invariant passes cannot run on this model and machine, or do not hold."""
        dtype = getattr(self.model, "dtype", torch.float32)
        needs = {
            "runs on a CPU": self.device.type == "cpu",
            "computes in float32": dtype == torch.float32,
            "runs on a torch with oneDNN's packed linear product": _PACKED,
            "attends through transformers' attention interface": invariant.register(),
        }
        why = next((need for need, met in needs.items() if not met), None)
        if why is not None:
            name = getattr(self.model.config, "name_or_path", "") or type(self.model).__name__
            raise ConfigError(
                f"TransformersRunner.batch_invariant needs a model that {why} ({name!r}: {self.device.type}, "
                f"{dtype}); set TransformersRunner.batch_invariant = False, or load the model in float32 on the CPU"
            )
        invariant.check(self.model, type(self))

    def _several_tokens(self) -> None:
        """Before a pass of several tokens a row: a warning, once a model, where the model computes in half
        precision, whose products over several tokens round otherwise than over one (drafts and scoring rely on
        equal logits)."""
        dtype = getattr(self.model, "dtype", None)
        if dtype not in (torch.bfloat16, torch.float16):
            return
        name = getattr(self.model.config, "name_or_path", "") or type(self.model).__name__
        self.warn_numerics(
            "half",
            f"{name!r} runs in {dtype}: a pass of several tokens a row (a check of drafted tokens, scoring) "
            "rounds its products otherwise than one-token steps (SmolLM2-135M's logits up to about "
            f"{0.5 if dtype == torch.bfloat16 else 0.1} apart), so drafts can change the tokens and scores differ "
            "from the generation's logprobs; for the exact tokens load the model in float32 (dtype=torch.float32)",
            stacklevel=5,  # past _forward, extend and torch.no_grad: the caller of extend
        )

    def _forward(self, ids: torch.Tensor, next_len: int | None, keep: int = 1) -> torch.Tensor:
        if keep > 1:
            self._several_tokens()
        inputs = self.model.prepare_inputs_for_generation(
            ids, next_sequence_length=next_len, is_first_iteration=self._first, **self.kwargs
        )
        if keep > 1 and "logits_to_keep" in inputs:
            inputs["logits_to_keep"] = keep
        # a pass that keeps one position a row (the prefill, a step) runs the model's own products, bit for bit
        # model.generate's, while the batch holds every row; once rows left it (`release`) its products run on fewer
        # rows than model.generate's, which MKL sums in another order anyway and in that layout, on some row counts,
        # more slowly than the whole batch's, so its steps may run the few-row products too (timed as checks are), as
        # every step may with `fast_steps`
        few = (keep > 1 or self.held is not None or (self.fast_steps and not self._first)) and self.few_row_products
        rows = ids.shape[0] * (next_len or ids.shape[1])
        layers = COLUMNS if few and rows in FEW_ROWS else None
        head = COLUMNS if few else None
        if self.batch_invariant:
            layers = head = PACKED
        elif few is None:  # timed: each part as it runs fastest on this machine, for the rows it takes in this pass
            started = time.perf_counter()
            layouts = layouts_of(self.model)
            layers = layouts.layout(False, rows) if rows in LAYER_ROWS else None
            head = layouts.layout(True, ids.shape[0] * keep)
            self.untimed += time.perf_counter() - started
        grouped = keep > 1 and self.grouped_attention and self.model.config._attn_implementation in ("sdpa", _GROUPED)
        attending = invariant.NAME if self.batch_invariant else _GROUPED if grouped else None
        inside = layers is not None or head is not None
        with FewRowProducts(self.model, layers, head, self.batch_invariant) if inside else contextlib.nullcontext():
            with _attending(self.model.config, attending) if attending else contextlib.nullcontext():
                out = self.model(**inputs, return_dict=True)
        for name in _CACHE_NAMES:
            if name in out and out[name] is not None:
                key = name if name in ("cache_params", "state") else self.cache_key
                self.kwargs[key] = out[name]
                break
        if self.room:
            make_room(self.kwargs.get(self.cache_key))
        self._first = False
        return out.logits[:, -keep:, :].to(copy=True, dtype=torch.float32, device=self.device)

    def _grow(self, k: int, real: torch.Tensor | None = None) -> None:
        """Positions and mask for k more columns in every row; `real` (B, k) bool marks the columns that hold a
        token of the row (the others are holes: masked, outside the row's sequence)."""
        mask = self.kwargs.get("attention_mask")
        if real is not None and mask is None:
            mask = torch.ones(self.input_ids.shape, dtype=torch.long, device=self.input_ids.device)
        pos = self.kwargs.get("position_ids")
        if pos is not None:
            # the next position of a row: its tokens so far (the mask counts them, holes and padding excluded)
            last = pos[:, -1:] if mask is None else mask.sum(-1, keepdim=True) - 1
            step = torch.arange(1, k + 1, device=pos.device).expand(pos.shape[0], k)
            if real is not None:  # a hole repeats its row's last position: masked, and within the model's table
                step = real.long().cumsum(-1)
            self.kwargs["position_ids"] = torch.cat([pos, last + step], dim=-1)
        if mask is not None:
            more = mask.new_ones((mask.shape[0], k)) if real is None else real.to(mask.dtype)
            self.kwargs["attention_mask"] = torch.cat([mask, more], dim=-1)
        if self.live is not None or real is not None:
            live = self.live if self.live is not None else torch.ones(self.input_ids.shape, dtype=torch.bool)
            self.live = torch.cat(
                [live, torch.ones((live.shape[0], k), dtype=torch.bool) if real is None else real.cpu()], -1
            )
        self.input_ids = torch.cat([self.input_ids, self.input_ids.new_zeros((self.input_ids.shape[0], k))], dim=-1)

    @torch.no_grad()
    def prefill(self) -> torch.Tensor:
        return self._forward(self.input_ids, None)[:, -1]

    @torch.no_grad()
    def step(self, input_ids: torch.Tensor, active: torch.Tensor | None = None) -> torch.Tensor:
        """input_ids: (B, L+1) every token so far; the model sees only the last one (the cache has the rest).
        Every row runs, `active` or not (skips_inactive is False)."""
        self._grow(1)
        self.input_ids[:, -1] = self._inner(input_ids[:, -1])
        return self._outer(self._forward(self.input_ids, 1)[:, -1])

    def keep_past(self) -> None:
        """Before a pass whose tokens may be taken back: a sliding-window cache layer keeps the states it would drop
        until the next cut (transformers' past recording), so `truncate` can cut it back past the window. Plain
        decoding never calls it, and keeps only the window."""
        cache = self.kwargs.get(self.cache_key)
        if cache is not None and hasattr(cache, "activate_past_recording") and not self._recording:
            cache.activate_past_recording()
            self._recording = True

    @torch.no_grad()
    def extend(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens: (B, K) appended to every row in one forward pass; the logits after each, (B, K, V)."""
        self.keep_past()
        k = tokens.shape[1]
        self._grow(k)
        self.input_ids[:, -k:] = self._inner(tokens)
        return self._outer(self._forward(self.input_ids, k, keep=k))

    @torch.no_grad()
    def extend_rows(self, rows: Sequence[int], tokens: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """rows[i] takes tokens[i] in one forward pass; every row gets as many cache columns as the longest feed,
        the ones it does not fill are holes (masked, its positions continue past them)."""
        if not self.per_row_truncate:
            return super().extend_rows(rows, tokens)
        self.keep_past()
        k = max(len(t) for t in tokens)
        block = torch.zeros((self.input_ids.shape[0], k), dtype=torch.int64)
        real = torch.zeros(block.shape, dtype=torch.bool)
        inner = self._positions(rows)
        for b, t in zip(inner, tokens):
            block[b, : len(t)] = t.cpu()
            real[b, : len(t)] = True
        self._grow(k, real.to(self.input_ids.device))
        self.input_ids[:, -k:] = block.to(self.input_ids.device)
        logits = self._forward(self.input_ids, k, keep=k)
        return [logits[b, : len(t)] for b, t in zip(inner, tokens)]

    def truncate(self, length: int | Sequence[int]) -> None:
        """Keep each row's first `length` columns of its sequence (one length, or one per row): the columns past
        it become holes, and the cache is cut back (DynamicCache.crop) past the last column any row still holds."""
        cache = self.kwargs.get(self.cache_key)
        if cache is None or not hasattr(cache, "crop"):
            raise ConfigError(f"{type(self.model).__name__}'s cache cannot be cut back (no DynamicCache.crop)")
        rows = self.input_ids.shape[0]
        wanted = [int(length)] * self.rows if isinstance(length, int) else [int(n) for n in length]
        if self.held is not None and len(wanted) == self.rows:  # the callers' rows: those the cache holds
            wanted = [wanted[r] for r in self.held]
        if len(set(wanted)) > 1 and not self.per_row_truncate:
            self._uniform_length(wanted)  # the error naming the lengths
        live = self.live if self.live is not None else torch.ones(self.input_ids.shape, dtype=torch.bool)
        held = live.sum(-1).tolist()
        if len(wanted) != rows or any(not 0 < n <= h for n, h in zip(wanted, held)):
            raise ConfigError(f"truncate({length}): the rows hold {held} columns; keep 1 to that many in each row")
        live = live & (live.long().cumsum(-1) <= torch.tensor(wanted)[:, None])
        n = int(live.long().cumsum(-1).argmax(-1).max()) + 1  # past the last column a row holds
        self.live = None if bool(live[:, :n].all()) else live
        if self.live is not None:
            mask = self.kwargs.get("attention_mask")
            if mask is None:
                mask = torch.ones(live.shape, dtype=torch.long, device=self.input_ids.device)
            self.kwargs["attention_mask"] = mask * live.to(mask.device, mask.dtype)
        _crop(cache, cache.get_seq_length() - n)
        self.input_ids = self.input_ids[:, :n]
        if self.live is not None:
            self.live = self.live[:, :n]
        for key in ("position_ids", "attention_mask"):
            if self.kwargs.get(key) is not None:
                self.kwargs[key] = self.kwargs[key][:, :n]

    def release(self, rows: Sequence[int]) -> None:
        """Rows that will not be fed again leave the batch: their cache rows, mask and positions are dropped, so the
        passes that follow run only the rows still going. Calls keep the callers' row indices; a released row's
        logits are zeros. A no-op where the cache cannot drop rows or rows advance together."""
        cache = self.kwargs.get(self.cache_key)
        if cache is None or not hasattr(cache, "batch_select_indices") or not self.per_row_truncate:
            return
        held = self.held if self.held is not None else list(range(self.rows))
        gone = set(rows)
        keep = [i for i, r in enumerate(held) if r not in gone]
        if not keep or len(keep) == len(held):
            return
        index = torch.tensor(keep, dtype=torch.int64, device=self.input_ids.device)
        cache.batch_select_indices(index)
        self.input_ids = self.input_ids[index]
        for key in ("position_ids", "attention_mask"):
            if self.kwargs.get(key) is not None:
                self.kwargs[key] = self.kwargs[key][index.to(self.kwargs[key].device)]
        if self.live is not None:
            self.live = self.live[index.cpu()]
        self.held = [held[i] for i in keep]
        self._held_index = torch.tensor(self.held, dtype=torch.int64, device=self.device)

    def kept_widths(self) -> dict[int, float]:
        """The width prices kept with the model's layouts on this machine (products.KeptLayouts), where its calls run
        in the few-row products."""
        kept = self._kept_layouts()
        return {} if kept is None else dict(kept.widths)

    def keep_widths(self, ratios: dict[int, float]) -> None:
        kept = self._kept_layouts() if ratios else None
        if kept is not None:
            kept.save_widths(ratios)

    def _kept_layouts(self) -> KeptLayouts | None:
        # batch-invariant passes run none of the timed layouts: their widths' prices are not those the file keeps
        return layouts_of(self.model).kept if self.stepped_widths and not self.batch_invariant else None

    def lookahead(self) -> contextlib.AbstractContextManager[None] | None:
        """A block whose passes are taken back when it ends: where every cache layer is a plain DynamicLayer, which
        grows by concatenation and so leaves the tensors it held untouched, or one appending in place past a floor
        kept for the block (cache_room), the runner keeps them and puts them back (nothing copied); None for other
        caches (a sliding window, quantized or static layers) and on a runner whose rows advance together."""
        cache = self.kwargs.get(self.cache_key)
        layers = getattr(cache, "layers", None)
        if not self.per_row_truncate or not layers or not all(type(layer) in dynamic_layers() for layer in layers):
            return None
        return self._taken_back(cache)

    @contextlib.contextmanager
    def _taken_back(self, cache: Any) -> Iterator[None]:
        layers = list(cache.layers)
        states = [dict(vars(layer)) for layer in layers]  # keys, values, and the room past them (cache_room)
        for layer in layers:
            if hasattr(layer, "floor"):  # the kept keys and values are not written over
                layer.floor = max(layer.floor, layer.get_seq_length())
        saved = (self.input_ids, self.live, dict(self.kwargs), self._first, self._recording)
        try:
            yield
        finally:
            cache.layers[:] = layers
            for layer, state in zip(layers, states):
                vars(layer).clear()
                vars(layer).update(state)
            self.input_ids, self.live, kwargs, self._first, self._recording = saved
            self.kwargs = dict(kwargs)

    def holds(self, row: int) -> torch.Tensor:
        """The tokens the cache holds for the callers' `row`: its columns that are neither padding nor holes."""
        (b,) = self._positions([row])
        real = torch.ones(self.input_ids.shape[1], dtype=torch.bool)
        mask = self.kwargs.get("attention_mask")
        if mask is not None:
            real &= mask[b].cpu().bool()
        if self.live is not None:
            real &= self.live[b]
        return self.input_ids[b].cpu()[real]

    def _inner(self, t: torch.Tensor) -> torch.Tensor:
        """The rows of a callers' (B, ...) tensor that the cache holds."""
        return t if self._held_index is None else t[self._held_index.to(t.device)]

    def _outer(self, logits: torch.Tensor) -> torch.Tensor:
        """(held rows, ...) logits as the callers' (B, ...), zeros for released rows."""
        if self._held_index is None:
            return logits
        out = logits.new_zeros((self.rows, *logits.shape[1:]))
        out[self._held_index] = logits
        return out

    def _positions(self, rows: Sequence[int]) -> list[int]:
        """The cache rows of the callers' `rows`."""
        if self.held is None:
            return [int(r) for r in rows]
        where = {r: i for i, r in enumerate(self.held)}
        missing = [int(r) for r in rows if int(r) not in where]
        if missing:
            raise ConfigError(f"rows {missing} were released from the batch and cannot be fed again")
        return [where[int(r)] for r in rows]

    def reorder(self, beam_idx: torch.Tensor) -> None:
        """Beam search: rows of the cache follow their beams (mask and positions are equal within a prompt)."""
        if self.held is not None:
            raise ConfigError("reorder: rows were released from this batch; beam search keeps every row")
        for name in _CACHE_NAMES:
            cache = self.kwargs.get(name)
            if cache is None:
                continue
            if hasattr(self.model, "_reorder_cache"):
                self.kwargs[name] = self.model._reorder_cache(cache, beam_idx)
            elif hasattr(cache, "reorder_cache"):
                cache.reorder_cache(beam_idx)
            else:
                raise ConfigError(
                    f"{type(self.model).__name__}'s cache cannot be reordered, so beam search cannot "
                    "run on it; use greedy or sampling"
                )
            break
