"""`watermark`: the green-list watermark of Kirchenbauer et al., as transformers' WatermarkLogitsProcessor, and
`detect()`, its detector (transformers' WatermarkDetector).

At every step a pseudo-random "green list" of int(V * greenlist_ratio) token ids is drawn from a torch.Generator
seeded by the previous tokens, and `bias` is added to the logits of the green tokens:

- "lefthash": seed = hashing_key * last_token, the green list is the first greenlist_size entries of
  torch.randperm(V) under that seed; every green token gets the bias.
- "selfhash": for each of the 40 best candidates c (in descending logit order), the seed is
  min(hashing_key * (T[w] + 1) * (T[c] + 1)) over the window w of the last context_width tokens of history + c
  (T = randperm(1_000_003) seeded with hashing_key, int64 products that wrap as torch's do); c gets the bias when
  it is in its own green list.

Seeds are taken mod 2**64 - 1 and the permutations are drawn on the history's device, as transformers draws them
on its `device`: the same green lists, bit for bit. Green lists are cached (LRU) by (device, V, size, seed):
drawing randperm(V) per row per step is the cost. A row with fewer than context_width tokens (its -1 padding not
counted) is left unchanged, as transformers skips a step whose input_ids are shorter; bias = 0 is a no-op.
"""

from __future__ import annotations

import math
import struct
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import torch

from samplechain import Backend, Candidates, Sampler, Stage, StepContext, finite, hookimpl, in_range, one_of
from samplechain.contracts import settle_ties

__all__ = ["Watermark", "WatermarkParams", "WatermarkDetection", "detect", "green_mask", "SCHEMES"]

SCHEMES = ("lefthash", "selfhash")
TABLE_SIZE = 1_000_003  # transformers' fixed_table size (selfhash)
SELFHASH_CANDIDATES = 40  # transformers' _score_rejection_sampling tries the 40 best tokens
_SEED_MOD = 2**64 - 1
_CACHE_BYTES = 64 * 2**20  # bool masks kept per (device, V): at least 16 of them


@attrs.frozen
class WatermarkParams:
    greenlist_ratio: float = attrs.field(
        default=0.25, validator=[finite, in_range(0.0, 1.0, low_open=True, high_open=True)]
    )
    bias: float = attrs.field(default=2.0, validator=[finite])
    hashing_key: int = attrs.field(default=15485863, validator=in_range(0, 2**63 - 1))
    seeding_scheme: str = attrs.field(default="lefthash", validator=one_of(*SCHEMES))
    context_width: int = attrs.field(default=1, validator=in_range(1, None))


# ---------------------------------------------------------------------------------------------------- green lists


class _GreenLists:
    """LRU cache: (device, V, size, seed) -> (V,) bool mask of the green tokens."""

    def __init__(self) -> None:
        self._masks: OrderedDict[tuple, torch.Tensor] = OrderedDict()
        self._tables: OrderedDict[tuple, torch.Tensor] = OrderedDict()

    def mask(self, seed: int, vocab: int, size: int, device: torch.device) -> torch.Tensor:
        key = (str(device), vocab, size, seed)
        hit = self._masks.get(key)
        if hit is not None:
            self._masks.move_to_end(key)
            return hit
        gen = torch.Generator(device=device)
        gen.manual_seed(seed % _SEED_MOD)
        perm = torch.randperm(vocab, generator=gen, device=device)
        mask = torch.zeros(vocab, dtype=torch.bool, device=device)
        mask[perm[:size]] = True
        self._masks[key] = mask
        while len(self._masks) > max(16, _CACHE_BYTES // max(vocab, 1)):
            self._masks.popitem(last=False)
        return mask

    def table(self, hashing_key: int, device: torch.device) -> torch.Tensor:
        """transformers' fixed_table: randperm(1_000_003) under a generator seeded with hashing_key."""
        key = (str(device), hashing_key)
        hit = self._tables.get(key)
        if hit is None:
            gen = torch.Generator(device=device)
            gen.manual_seed(hashing_key)
            hit = torch.randperm(TABLE_SIZE, generator=gen, device=device)
            self._tables[key] = hit
            while len(self._tables) > 4:
                self._tables.popitem(last=False)
        else:
            self._tables.move_to_end(key)
        return hit


_DETECTOR_CACHE = _GreenLists()


def green_mask(seed: int, vocab_size: int, greenlist_ratio: float, device: Any = "cpu") -> torch.Tensor:
    """(V,) bool: the green list transformers draws for `seed` (before the mod 2**64 - 1)."""
    return _DETECTOR_CACHE.mask(seed, vocab_size, int(vocab_size * greenlist_ratio), torch.device(device))


def _lefthash_seed(hashing_key: int, last_token: int) -> int:
    return hashing_key * last_token  # a Python int, as transformers' `hash_key * input_seq[-1].item()`


def _selfhash_seeds(table: torch.Tensor, hashing_key: int, windows: torch.Tensor) -> list[int]:
    """Seeds of windows (N, w) whose last column is the candidate: min over the window of the wrapping int64
    product hashing_key * (T[window] + 1) * (T[candidate] + 1), as transformers' set_seed."""
    a = table[windows % TABLE_SIZE] + 1
    b = table[windows[:, -1:] % TABLE_SIZE] + 1
    return (hashing_key * a * b).amin(dim=1).tolist()


def _float32_decimal(value: float, default: float) -> float:
    """The decimal a per-request float32 value was written as (its shortest round-tripping form), so that
    int(V * ratio) is computed on the same double as transformers' Python float."""
    if _f32(default) == value:
        return default
    for digits in range(1, 10):
        text = f"{value:.{digits}g}"
        if _f32(float(text)) == value:
            return float(text)
    return value


def _f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


# -------------------------------------------------------------------------------------------------------- sampler


class Watermark(Sampler):
    name = "watermark"
    stage = Stage.TRANSFORM
    Params = WatermarkParams
    request_aliases = {
        "greenlist_ratio": "greenlist_ratio",
        "watermark_bias": "bias",
        "hashing_key": "hashing_key",
        "watermark_context_width": "context_width",
    }
    summary = "green-list watermark: add bias to a pseudo-random green list seeded by the previous tokens"

    def __init__(self, params: WatermarkParams) -> None:
        super().__init__(params)
        self._cache = _GreenLists()

    def needs_history(self) -> bool:
        return True

    def apply(self, cand: Candidates, ctx: StepContext) -> Candidates:
        if ctx.scalar("bias") == 0.0:
            return cand
        history = ctx.history
        assert history is not None  # needs_history() is declared, so the chain passes it
        bias = ctx.param("bias").to(cand.logits.device)
        width = ctx.param("context_width").to(history.device)
        length = (history >= 0).sum(dim=1)
        active = (ctx.param("bias").to(history.device) != 0.0) & (length >= width)
        rows = active.nonzero().flatten().tolist()
        if not rows:
            return cand
        vocab = cand.vocab_size
        device = history.device
        keys = ctx.param("hashing_key").tolist()
        widths = width.tolist()
        ratios = ctx.param("greenlist_ratio").tolist()
        sizes = [int(vocab * _float32_decimal(r, self.params.greenlist_ratio)) for r in ratios]

        if self.params.seeding_scheme == "lefthash":
            last = history[:, -1].tolist()  # left padding: a row's last token is its last column
            green = torch.zeros(cand.batch_size, vocab, dtype=torch.bool, device=device)
            for b in rows:
                green[b] = self._cache.mask(_lefthash_seed(keys[b], last[b]), vocab, sizes[b], device)
            green = green.to(cand.logits.device)
            if cand.ids is not None:
                green = green.gather(1, cand.ids)
        else:
            green = self._selfhash(cand, ctx.backend, history, rows, keys, widths, sizes)
        out = torch.where(green, cand.logits + bias[:, None], cand.logits)
        return cand.replace_logits(out)

    def _selfhash(
        self,
        cand: Candidates,
        backend: Backend,
        history: torch.Tensor,
        rows: list[int],
        keys: list[int],
        widths: list[int],
        sizes: list[int],
    ) -> torch.Tensor:
        """(B, K) bool: candidates among each row's 40 best that fall in their own green list. Of logits tied at
        the 40th place the lowest token ids are among the 40 (transformers: its sort's choice), so the biased set
        depends on the row alone, not on the order an earlier filter or the batch left."""
        device = history.device
        n = min(SELFHASH_CANDIDATES, cand.width)
        if cand.is_sorted:
            values = cand.logits
            index = torch.arange(cand.width, device=values.device).expand(cand.batch_size, -1)
        else:  # a partial sort, one column more so a tie at the 40th place is seen
            values, index = backend.topk(cand.logits, min(n + 1, cand.width))
        counts = torch.full((cand.batch_size,), n, device=values.device)
        top = settle_ties(values, index, counts, cand.logits, cand.ids)[1][:, :n]
        tokens = cand.ids_at(top).to(device)  # (B, n)
        green = torch.zeros(cand.batch_size, n, dtype=torch.bool, device=device)
        for b in rows:
            table = self._cache.table(keys[b], device)
            w = widths[b]
            context = history[b, history.shape[1] - (w - 1) :] if w > 1 else history[b, :0]
            windows = torch.cat([context.expand(n, -1), tokens[b, :, None]], dim=1)  # (n, w)
            seeds = _selfhash_seeds(table, keys[b], windows)
            masks = torch.stack([self._cache.mask(s, cand.vocab_size, sizes[b], device) for s in seeds])
            green[b] = masks.gather(1, tokens[b, :, None]).squeeze(1)
        out = torch.zeros(cand.logits.shape, dtype=torch.bool, device=cand.logits.device)
        return out.scatter_(1, top, green.to(cand.logits.device))


@hookimpl
def register_samplers(register):
    register(Watermark)


# ------------------------------------------------------------------------------------------------------- detector


@attrs.frozen
class WatermarkDetection:
    """Per row (B,) float64 / int64 / bool tensors, as transformers' WatermarkDetectorOutput."""

    num_tokens_scored: torch.Tensor
    num_green_tokens: torch.Tensor
    green_fraction: torch.Tensor
    z_score: torch.Tensor
    p_value: torch.Tensor
    prediction: torch.Tensor

    @property
    def confidence(self) -> torch.Tensor:
        return 1 - self.p_value


def _rows(token_ids: Any) -> list[list[int]]:
    if isinstance(token_ids, torch.Tensor):
        token_ids = token_ids.tolist()
    token_ids = list(token_ids)
    if token_ids and not isinstance(token_ids[0], (list, tuple, torch.Tensor)):
        return [[int(t) for t in token_ids]]
    return [[int(t) for t in (r.tolist() if isinstance(r, torch.Tensor) else r)] for r in token_ids]


def _config(config: Any, overrides: Mapping[str, Any]) -> WatermarkParams:
    values: dict[str, Any] = {}
    if config is not None:
        if hasattr(config, "to_dict"):
            config = config.to_dict()
        values.update({k: v for k, v in dict(config).items() if k in attrs.fields_dict(WatermarkParams)})
    values.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return WatermarkParams(**values)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"watermark detector config {values}: {exc}") from None


def _rows_and_prompt_lengths(token_ids: Any, prompt_length: Any, prompt_ids: Any) -> tuple[list[list[int]], list[int]]:
    """The rows to score and each one's prompt length, from prompt_length (an int or one per row) or from the
    prompts each row (padding dropped) must start with."""
    rows = _rows(token_ids)
    if prompt_ids is not None:
        prompts = _rows(prompt_ids)
        if len(prompts) == 1 and len(rows) > 1:
            prompts = prompts * len(rows)
        if len(prompts) != len(rows):
            raise ValueError(f"{len(prompts)} prompts for {len(rows)} rows")
        rows = [[t for t in r if t >= 0] for r in rows]
        for i, (r, p) in enumerate(zip(rows, prompts)):
            if r[: len(p)] != p:
                raise ValueError(f"row {i} does not start with its prompt_ids")
        return rows, [len(p) for p in prompts]
    if isinstance(prompt_length, torch.Tensor) and prompt_length.ndim == 0:
        prompt_length = int(prompt_length)
    lengths = (
        [int(prompt_length)] * len(rows)
        if isinstance(prompt_length, int)
        else [int(x) for x in (prompt_length.tolist() if isinstance(prompt_length, torch.Tensor) else prompt_length)]
    )
    if len(lengths) != len(rows):
        raise ValueError(f"{len(lengths)} prompt lengths for {len(rows)} rows")
    return rows, lengths


def _scored_ids(
    row: list[int], plen: int, n: int, context_width: int, bos_token_id: Any, prompt_context: bool, i: int
) -> list[int]:
    """Row i's generated ids (padding and a leading bos dropped), after the prompt's last n - 1 with
    prompt_context; at least one token past the first context_width."""
    prompt = [t for t in row[:plen] if t >= 0]
    ids = [t for t in row[plen:] if t >= 0]
    if bos_token_id is not None and ids and ids[0] == bos_token_id:
        ids = ids[1:]
    if prompt_context and n > 1:
        ids = prompt[len(prompt) - min(n - 1, len(prompt)) :] + ids
    if len(ids) - context_width < 1:
        raise ValueError(
            f"row {i}: must have at least 1 token to score after the first "
            f"{context_width} (context_width) tokens, has {len(ids)}"
        )
    return ids


def detect(
    token_ids: Any,
    prompt_length: int | Sequence[int] = 0,
    vocab_size: int | None = None,
    *,
    prompt_ids: Any = None,
    config: Any = None,
    greenlist_ratio: float | None = None,
    hashing_key: int | None = None,
    seeding_scheme: str | None = None,
    context_width: int | None = None,
    z_threshold: float = 3.0,
    ignore_repeated_ngrams: bool = False,
    prompt_context: bool = False,
    bos_token_id: int | None = None,
    device: Any = "cpu",
) -> WatermarkDetection:
    """Score the generated tokens of each row for the watermark, as transformers' WatermarkDetector.

    token_ids: one sequence or a batch (B, L) (tensor or lists); negative ids (-1 padding) are dropped.
    prompt_length: how many leading entries of each row (padding included) are prompt: an int or one per row;
        or prompt_ids: the prompt(s), which each row (padding dropped) must start with.
    vocab_size: the logits' width at generation (required). config: a transformers WatermarkingConfig or a dict;
        greenlist_ratio / hashing_key / seeding_scheme / context_width override it (defaults as the sampler).
    Scored: as transformers' detector on the generated tokens alone, every n-gram of n = context_width + 1
    (lefthash; n = context_width for selfhash) whose last token is green under the seed of its prefix; with
    prompt_context=True the prompt's last n - 1 tokens precede them, so every generated token is scored.
    bos_token_id: a leading bos of the scored tokens is dropped (transformers drops the model's bos).
    ignore_repeated_ngrams: each distinct n-gram counts once. prediction: z_score > z_threshold.
    Raises ValueError for a row with no token to score (fewer than context_width + 1 tokens).
    """
    if vocab_size is None or int(vocab_size) < 1:
        raise ValueError("vocab_size is required: the width of the logits the watermark was applied to")
    vocab = int(vocab_size)
    cfg = _config(
        config,
        {
            "greenlist_ratio": greenlist_ratio,
            "hashing_key": hashing_key,
            "seeding_scheme": seeding_scheme,
            "context_width": context_width,
        },
    )
    rows, lengths = _rows_and_prompt_lengths(token_ids, prompt_length, prompt_ids)
    selfhash = cfg.seeding_scheme == "selfhash"
    n = cfg.context_width + 1 - int(selfhash)
    size = int(vocab * cfg.greenlist_ratio)
    dev = torch.device(device)
    table = _DETECTOR_CACHE.table(cfg.hashing_key, dev) if selfhash else None
    scored_counts, green_counts = [], []
    for i, (row, plen) in enumerate(zip(rows, lengths)):
        ids = _scored_ids(row, plen, n, cfg.context_width, bos_token_id, prompt_context, i)
        grams = [tuple(ids[j : j + n]) for j in range(len(ids) - n + 1)]
        counts: dict[tuple[int, ...], int] = {}
        for g in grams:
            counts[g] = counts.get(g, 0) + 1
        unique = list(counts)
        if selfhash:
            assert table is not None  # built above for selfhash
            seeds = _selfhash_seeds(table, cfg.hashing_key, torch.tensor(unique, dtype=torch.int64, device=dev))
        else:
            seeds = [_lefthash_seed(cfg.hashing_key, g[-2]) for g in unique]
        hit = {g: bool(_DETECTOR_CACHE.mask(s, vocab, size, dev)[g[-1]]) for g, s in zip(unique, seeds)}
        if ignore_repeated_ngrams:
            scored_counts.append(len(unique))
            green_counts.append(sum(hit.values()))
        else:
            scored_counts.append(len(grams))
            green_counts.append(sum(c * hit[g] for g, c in counts.items()))
    total = torch.tensor(scored_counts, dtype=torch.float64)
    green = torch.tensor(green_counts, dtype=torch.float64)
    ratio = cfg.greenlist_ratio
    z = (green - ratio * total) / torch.sqrt(total * ratio * (1 - ratio))
    p_value = 0.5 * torch.special.erfc(z / math.sqrt(2))
    return WatermarkDetection(total.to(torch.int64), green.to(torch.int64), green / total, z, p_value, z > z_threshold)
