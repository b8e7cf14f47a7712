"""Batch-invariant passes of a transformers model on a CPU (`TransformersRunner.batch_invariant`): a row's logits at a
position are the same bit for bit whatever else the pass carries (how many tokens, which other rows, their padding,
the holes of drafted tokens not kept), so a check of drafted tokens gives exactly a one-token step's logits and a
prompt gives the same tokens alone or in any batch.

A float32 pass depends on what else it carries through the order in which its sums run: the linear products' (MKL
picks a kernel per row count) and attention's over the keys (its kernels vectorise a row's keys by where they lie,
and the keys a row cannot see, padding, holes and later drafted tokens, move them). The passes therefore run every
linear layer on oneDNN's packed copies of its weights (one row as two: `products.product`), which sum each row in one
order whatever the other rows, and attend in float64 (`attention`): the float32 queries, keys and values are exact in
float64, every product of two of them too, and sums over them in different orders differ by about 1e-16 of their
size, far inside float32's rounding step (6e-8), so the one rounding to float32 at the end gives the same number
unless a result lies that close to the middle between two float32 numbers (a few values in a billion, by that
ratio). The rest of a pass (norms, rotary embeddings, activations, residual sums) works row by row, each row alike.

Whether a machine's kernels keep this is checked once per model and thread count (`check`), before a runner on it
generates: a few one-token steps against passes of several tokens and a padded batch with holes, and each weight's
product over many rows (up to 700) against a step's, compared bit for bit."""

from __future__ import annotations

import functools
import threading
import weakref
from typing import Any, cast

import torch

from ..errors import ConfigError
from . import products

NAME = "samplechain_invariant"  # the attention implementation's name in transformers' registries
_checked: weakref.WeakKeyDictionary[torch.nn.Module, dict[int, str | None]] = weakref.WeakKeyDictionary()
_checking = threading.RLock()


QUERY_BLOCK = 32  # queries attended together: their float64 scores over a long prompt stay in a core's cache


def attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention interface: query (B, H, n, d), key and value (B, H_kv, L, d), the mask from
    transformers' sdpa mask (boolean (B, 1, n, L), or None where nothing is padded: causal over the last n keys), in
    float64 rounded to the query's dtype once. A key a query cannot see weighs exactly 0; a query that sees none (a
    padding position) weighs alike the keys its block reads, so that no NaN reaches the keys and values later passes
    read.

    Queries go in blocks of QUERY_BLOCK, each over the keys up to its last query's position where the mask hides
    every later key (a causal model's): a long prompt's scores in one piece would spill out of the caches several
    times over, and half of them are hidden. Hidden keys add exact zeros, so a block changes only the order of a
    row's sums, which float64 absorbs (the module's docstring)."""
    extras = [name for name in ("softcap", "s_aux", "sinks", "position_bias") if kwargs.get(name) is not None]
    if extras:
        raise ConfigError(
            f"batch-invariant attention does not compute {', '.join(extras)} ({type(module).__name__}); "
            "set TransformersRunner.batch_invariant = False for this model"
        )
    rows, heads, n, width = query.shape
    kv_heads, length = key.shape[1], key.shape[2]
    groups = heads // kv_heads
    scale = width**-0.5 if scaling is None else scaling
    key, value = key.to(torch.float64), value.to(torch.float64)
    if mask is None and n > 1:
        mask = torch.ones(n, length, dtype=torch.bool, device=query.device).tril(length - n)
    causal = n <= QUERY_BLOCK or mask is None or not _sees_ahead(mask, length - n)
    blocks = []
    for start in range(0, n, QUERY_BLOCK):
        end = min(n, start + QUERY_BLOCK)
        seen = length - n + end if causal else length
        part = end - start
        q = query[:, :, start:end].to(torch.float64).reshape(rows, kv_heads, groups * part, width)
        scores = (q @ key[:, :, :seen].transpose(-1, -2)).mul_(scale).reshape(rows, kv_heads, groups, part, seen)
        if mask is not None:
            visible = mask[..., start:end, :seen]
            per_head = visible[:, :, None] if visible.dim() == 4 else visible  # (B, 1, n, L) over the heads' groups
            if visible.dtype == torch.bool:
                scores.masked_fill_(~per_head, torch.finfo(torch.float64).min)
            else:
                scores += per_head.to(torch.float64)
        weights = torch.softmax(scores, dim=-1).reshape(rows, kv_heads, groups * part, seen)
        blocks.append((weights @ value[:, :, :seen]).reshape(rows, heads, part, width))
    out = (blocks[0] if len(blocks) == 1 else torch.cat(blocks, 2)).to(query.dtype)
    return out.transpose(1, 2).contiguous(), None


def _sees_ahead(mask: torch.Tensor, offset: int) -> bool:
    """Whether some query i of `mask` (..., n, L) sees a key past position offset + i (not a causal mask)."""
    ahead = torch.ones(mask.shape[-2:], dtype=torch.bool, device=mask.device).triu(offset + 1)
    visible = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
    return bool((visible & ahead).any())


def register_attention(name: str, function: Any) -> bool:
    """`function` under `name` in transformers' attention and mask registries (the mask: sdpa's, boolean); False
    where transformers has no such registries."""
    try:
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
        from transformers.modeling_utils import AttentionInterface
    except ImportError:
        return False
    AttentionInterface.register(name, function)
    ALL_MASK_ATTENTION_FUNCTIONS.register(name, sdpa_mask)
    return True


@functools.cache
def register() -> bool:
    """`attention` under NAME in transformers' registries."""
    return register_attention(NAME, attention)


def check(model: torch.nn.Module, runner: type) -> None:
    """Raises ConfigError unless `runner`'s batch-invariant passes on `model` give one-token steps' logits bit for bit
    on this machine: one prompt's tokens one at a time, against the same tokens after a two-token prompt in one
    pass, and as the second row of a padded batch fed in one pass beside a row of another length (holes); and each
    weight's packed product over many rows against a step's (`_products_differ`). Checked once per model and thread
    count."""
    threads = torch.get_num_threads()
    with _checking:
        verdicts = _checked.setdefault(model, {})
        if threads not in verdicts:
            verdicts[threads] = None  # the check's own runners do not check again
            try:
                verdicts[threads] = _differs(model, runner)
            except BaseException:
                del verdicts[threads]  # not checked: the next runner checks again
                raise
        found = verdicts[threads]
    if found is not None:
        name = getattr(model.config, "name_or_path", "") or type(model).__name__
        raise ConfigError(
            f"TransformersRunner.batch_invariant: {name!r} does not give the same logits in a pass of several tokens "
            f"as in one-token steps on this machine ({found}); its layers' products or attention sum in an order "
            "that depends on the pass. Set TransformersRunner.batch_invariant = False: drafts then keep the tokens "
            'up to float32 summation order (docs/speculative.md, "Numerics")'
        )


@torch.no_grad()
def _differs(model: torch.nn.Module, runner: type) -> str | None:
    """Where the check's passes differ from one-token steps (None: nowhere)."""
    vocab = int(getattr(model.config, "vocab_size", 0) or 0)
    if vocab < 16:
        return None
    ids = torch.tensor([[3, 5, 7, 9, 11, 13]]) % vocab
    steps = runner(model, ids[:, :1], None)
    expected = [steps.prefill()[0]]
    for t in range(2, ids.shape[1] + 1):
        expected.append(steps.step(ids[:, :t])[0])
    want = torch.stack(expected)
    at_once = runner(model, ids[:, :2], None)
    got = torch.cat([at_once.prefill(), at_once.extend(ids[:, 2:])[0]])
    if not torch.equal(got, want[1:]):
        return f"a pass of {ids.shape[1] - 2} tokens: up to {(got - want[1:]).abs().max().item():.1e} apart"
    other = (torch.arange(4) * 3 + 2)[None] % vocab
    batch = torch.cat([other, torch.cat([torch.zeros(1, 3, dtype=torch.long), ids[:, :1]], -1)])
    mask = torch.tensor([[1, 1, 1, 1], [0, 0, 0, 1]])
    padded = runner(model, batch, mask)
    first = padded.prefill()[1:]
    if padded.per_row_truncate:  # the first row takes two tokens: three holes
        fed = padded.extend_rows([0, 1], [other[0, :2], ids[0, 1:]])[1]
    else:  # rows that advance together (a sliding window) take as many tokens each
        fed = padded.extend(torch.stack([(torch.arange(5) + 17) % vocab, ids[0, 1:]]))[1]
    got = torch.cat([first, fed])
    if not torch.equal(got, want):
        return f"a padded batch with holes: up to {(got - want).abs().max().item():.1e} apart"
    return _products_differ(model)


# row counts at which the packed products of the check's own passes are checked again: a long prompt's pass carries
# many rows a layer, a batch's check of long drafts up to about 150 a head, where oneDNN may pick other kernels
LAYER_COUNTS, HEAD_COUNTS = (3, 17, 150, 700), (3, 17, 150)


def _products_differ(model: torch.nn.Module) -> str | None:
    """Where one of the model's packed products gives a row other bits among many rows than as a pair of that row
    (a step's product), at each of LAYER_COUNTS (HEAD_COUNTS for the vocabulary head) rows: the first, the middle and
    the last; None where none does."""
    head, seen = products.head_of(model), set()
    for module, _ in products._linear_layers(model):
        weight = cast(torch.Tensor, module.weight)  # a Linear's or a Conv1D's
        transposed = type(module) is not torch.nn.Linear
        shape = (tuple(weight.shape), transposed)
        if shape in seen or weight.dtype != torch.float32:
            continue
        seen.add(shape)
        counts = HEAD_COUNTS if module is head else LAYER_COUNTS
        draws = torch.Generator().manual_seed(len(seen))
        x = torch.randn(max(counts), weight.shape[0 if transposed else 1], generator=draws)
        for rows in counts:
            together = products.product(weight, x[:rows], products.PACKED, transposed)
            for r in sorted({0, rows // 2, rows - 1}):
                alone = products.product(weight, x[r : r + 1], products.PACKED, transposed)[0]
                if not torch.equal(together[r], alone):
                    apart = (together[r] - alone).abs().max().item()
                    size = "x".join(str(n) for n in weight.shape)
                    return f"a product of the {size} weight over {rows} rows: row {r} up to {apart:.1e} apart"
    return None
