"""What the drafters that run a model share: each row's cache on the drafting model, and drawing through the chain.

`ModelDrafter` drafts every row of a `propose_rows` call in one loop over draft positions: the drafting model's
logits after each row's tokens (its own KV cache per row: `RowCache`), then one draw for all the rows that still
draft (`ChainDraw`), then the drawn tokens fed back, until each row has its `num_tokens` (or its limit).

`ChainDraw` draws through the chain that verifies the drafts (`DraftContext.chain`), from a copy of each request's
state in the generation's store (its seed, RNG position, stateful samplers' state), in a store of its own: with
`noise = "coupled"` the draw at a position uses the very Gumbel noise the verifying draw uses there, so where the
drafting model's distribution is close to the generation model's, both draws pick the same token (Gumbel coupling:
Daliri, Musco and Suresh, "Coupling without Communication and Drafter-Invariant Speculative Decoding",
arXiv:2408.07978). `"independent"` draws the same way with every seed moved to another stream, `"greedy"` takes the
drafting chain's most probable token. The copy's stateful samplers follow the drafted tokens and may differ from
the generation's after a rejected draft: that changes how many drafts are kept, and in mode match never the
tokens.

`BatchCache` runs the rows of the first call together on the drafting model through the model's runner
(`DraftContext.runner_for`: transformers, llama.cpp or a runner plugin), one cache row each, keeping the tokens each
row's cache holds: a call compares them with the row's tokens, cuts the row back to the common prefix and feeds the
rest, every row in one forward pass, and each drafted position is one pass for all the rows still drafting. That
needs a runner that cuts and feeds rows on their own (`per_row_truncate`, `extend_rows`); with another runner, and
for a row that first drafts later, `RowCache` does the same for one row on a runner of its own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import attrs
import torch

from samplechain import finite, in_range, max_positions, one_of
from samplechain.drafters import Draft, DraftContext, Drafter, Proposal
from samplechain.tokens import left_pad

__all__ = [
    "NOISES",
    "BatchCache",
    "ChainDraw",
    "ModelDrafter",
    "RowCache",
    "logit_columns",
    "noise_field",
    "num_tokens_field",
    "p_min_field",
    "swapped",
    "tokenizer_size",
]

NOISES = ("coupled", "independent", "greedy")
_OTHER_STREAM = 0x9E3779B97F4A7C15  # added to every seed (mod 2**63) for noise = "independent"
_SEED_MASK = 2**63 - 1


def num_tokens_field(default: int = 5) -> Any:
    return attrs.field(default=default, validator=in_range(1, None, hint="the longest draft"))


def noise_field() -> Any:
    return attrs.field(default="coupled", validator=one_of(*NOISES))


def p_min_field() -> Any:
    """A draft ends after a token the drafting chain gave less than this probability (0: never)."""
    return attrs.field(default=0.0, validator=[finite, in_range(0.0, 1.0, hint="0 disables")])


class ChainDraw:
    """Draws drafted tokens through the generation's chain (a `Chain`, or a `MixedChains` row by row) from copies
    of the requests' states; see the module's docstring."""

    def __init__(self, context: DraftContext, noise: str) -> None:
        self.noise = noise
        self.request_ids = context.request_ids
        chain, store = context.chain, context.store
        if hasattr(chain, "row_chains"):  # a MixedChains: one chain per prompt, a store per chain
            self.chains = dict(chain.chains)
            self.sources = {key: store.stores[key] for key in self.chains}
            self.key_of = [store.chain_of(rid) for rid in context.request_ids]
        else:
            self.chains, self.sources = {"": chain}, {"": store}
            self.key_of = [""] * len(context.request_ids)
        self.stores = {
            key: c.new_store(device=self.sources[key].device, capacity=max(1, len(context.request_ids)))
            for key, c in self.chains.items()
        }
        self.columns = context.vocab_size
        self.vocab_limit = tokenizer_size(context.tokenizer)
        self.history: dict[int, list[int]] = {}

    def begin(self, rows: Sequence[int], tokens: Sequence[torch.Tensor]) -> None:
        """Copy each row's request state (the state after its `tokens`) into the drafting stores."""
        for row, t in zip(rows, tokens):
            rid, key = self.request_ids[row], self.key_of[row]
            snapshot = self.sources[key].snapshot([rid])
            store = self.stores[key]
            if self.noise == "independent":
                _move_seeds(snapshot[rid], store)
            if rid in store:
                store.remove(rid)
            store.restore(snapshot)
            self.history[row] = t.tolist()

    def draw(self, rows: Sequence[int], logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """One drafted token for each of `rows` from their drafting logits (n, V): the tokens (n,) on the CPU, the
        drafting chain's processed distribution (n, V) they were drawn from (None for noise = "greedy") and each
        token's probability under it (n,) float32 on the CPU."""
        if 0 < self.columns != logits.shape[1]:  # a draft model padded to another width (its tokens are the same)
            logits = _fit(logits, self.columns)
        if self.vocab_limit is not None and self.vocab_limit < logits.shape[1]:
            logits[:, self.vocab_limit :] = float("-inf")  # as the generation masks them
        groups: dict[str, list[int]] = {}
        for i, row in enumerate(rows):
            groups.setdefault(self.key_of[row], []).append(i)
        tokens = torch.empty(len(rows), dtype=torch.int64)
        chance = torch.empty(len(rows), dtype=torch.float32)
        probs = None if self.noise == "greedy" else torch.empty(logits.shape, dtype=torch.float32)
        for key, members in groups.items():
            chain, store = self.chains[key], self.stores[key]
            ids = [self.request_ids[rows[i]] for i in members]
            part = logits[members].to(store.device)
            history = self._history([rows[i] for i in members], store.device) if chain.needs_history else None
            greedy = self.noise == "greedy"
            # under classifier-free guidance the draft runs without a negative prompt: its own logits as the
            # unconditional ones leave them as they are (the guided draws of the model decide what is kept)
            uncond = part if chain.needs_unconditional_logits else None
            out = chain.sample(
                part, store, ids, accept=not greedy, return_scores=True, history=history, unconditional_logits=uncond
            ).check()
            scores = out.scores
            assert scores is not None  # asked for with return_scores
            chosen = out.token_ids
            if greedy:  # the stateful samplers follow the token drafted, not the one drawn
                chosen = scores.argmax(dim=-1)
                chain.accept(store, ids, chosen)
            index = torch.tensor(members, dtype=torch.int64)
            tokens[index] = chosen.cpu()
            dist = torch.softmax(scores.float(), dim=-1)
            chance[index] = dist.gather(1, chosen[:, None].to(dist.device))[:, 0].cpu()
            if probs is not None:
                probs[index] = dist.cpu()
        for row, token in zip(rows, tokens.tolist()):
            self.history[row].append(token)
        return tokens, probs, chance

    def _history(self, rows: Sequence[int], device: torch.device) -> torch.Tensor:
        """The rows' tokens so far, drafts included, left-padded with -1: (n, L). The chain takes each row's
        prompt length as its tokens less its RNG position, which the drafting store advances with the drafts."""
        width = max(len(self.history[r]) for r in rows)
        out = torch.full((len(rows), width), -1, dtype=torch.int64)
        for i, r in enumerate(rows):
            seq = self.history[r]
            out[i, width - len(seq) :] = torch.tensor(seq, dtype=torch.int64)
        return out.to(device)


def _fit(logits: torch.Tensor, columns: int) -> torch.Tensor:
    """(n, V') logits cut or padded (with -inf) to `columns`."""
    if logits.shape[1] > columns:
        return logits[:, :columns].clone()
    pad = logits.new_full((logits.shape[0], columns - logits.shape[1]), float("-inf"))
    return torch.cat([logits, pad], dim=1)


def _move_seeds(snapshot: dict[str, Any], store: Any) -> None:
    """Every seed of a request's snapshot moved to another stream (noise = "independent")."""
    layout = store.layout
    for col in layout.columns:
        if col.is_seed:
            key = f"{layout.entries[col.entry].id}.{col.field}"
            if snapshot["params"].get(key) is not None:
                snapshot["params"][key] = (int(snapshot["params"][key]) + _OTHER_STREAM) & _SEED_MASK


def tokenizer_size(tokenizer: Any) -> int | None:
    if tokenizer is None:
        return None
    try:
        return len(tokenizer)
    except TypeError:
        return None


def logit_columns(model: Any) -> int | None:
    """How many logit columns `model` gives: its output embedding's rows, else its config's vocab_size."""
    head = getattr(model, "get_output_embeddings", None)
    weight = getattr(head() if callable(head) else None, "weight", None)
    if isinstance(weight, torch.Tensor) and weight.ndim == 2:
        return int(weight.shape[0])
    size = getattr(getattr(model, "config", None), "vocab_size", None)
    return size if isinstance(size, int) else None


def _common(held: torch.Tensor, tokens: torch.Tensor) -> int:
    """How many leading tokens `held` and `tokens` share."""
    width = min(len(held), len(tokens))
    differ = (held[:width] != tokens[:width]).nonzero()
    return int(differ[0]) if len(differ) else width


def _device(model: Any) -> Any:
    return getattr(model, "device", None) or torch.device("cpu")


def drafting_runner(runner_cls: Any, model: Any, ids: torch.Tensor, mask: torch.Tensor | None) -> Any:
    """A runner of the drafting model, told so before it is made (`ModelRunner.drafting`: its warnings about numerics
    that could change the tokens are kept for the generation's own model, and it takes on none of the generation's
    guarantees of numerics, such as the transformers runner's batch-invariant passes)."""
    runner = runner_cls.__new__(runner_cls)
    runner.drafting = True
    runner.__init__(model, ids, mask)
    return runner


class RowCache:
    """One row on the drafting model: its runner (a batch of one row, with its own cache) and the tokens that
    cache holds."""

    def __init__(self, runner_cls: type, model: Any) -> None:
        self.runner_cls, self.model = runner_cls, model
        self.device = _device(model)
        self.runner: Any = None
        self.held = torch.zeros(0, dtype=torch.int64)  # the tokens in the cache, in order
        self.last: torch.Tensor | None = None  # the logits after `held` (V,)

    def logits_after(self, tokens: torch.Tensor) -> torch.Tensor:
        """The drafting model's logits (V,) after `tokens` (the row's prompt and tokens so far)."""
        n, held = len(tokens), len(self.held)
        common = _common(self.held, tokens)
        if common == n == held and self.last is not None:
            return self.last
        keep = min(common, n - 1)
        if self.runner is None or keep < 1:
            self.runner = drafting_runner(self.runner_cls, self.model, tokens[None].to(self.device), None)
            self.last = self.runner.prefill()[0]
        else:
            if keep < held:
                self.runner.truncate(keep)
            self.last = self.runner.extend(tokens[None, keep:].to(self.device))[0, -1]
        self.held = tokens.clone()
        return self.last

    def feed(self, token: int) -> torch.Tensor:
        """The logits (V,) after one more token."""
        assert self.runner is not None  # logits_after ran first
        self.last = self.runner.extend(torch.tensor([[token]], dtype=torch.int64, device=self.device))[0, -1]
        self.held = torch.cat([self.held, torch.tensor([token], dtype=torch.int64)])
        return self.last


class BatchCache:
    """Rows on one runner of the drafting model, a cache row each, cut back and fed row by row in one pass per
    call (`open` gives None where the runner cannot cut rows on their own)."""

    def __init__(self, runner: Any, rows: Sequence[int], tokens: Sequence[torch.Tensor], device: Any) -> None:
        self.runner, self.device = runner, device
        self.index = {row: i for i, row in enumerate(rows)}
        width = max(len(t) for t in tokens)
        self.pad = [width - len(t) for t in tokens]  # the left padding of each cache row
        self.held = [t.clone() for t in tokens]
        self.last = list(runner.prefill().unbind(0))  # the logits after each row's `held`

    @classmethod
    def open(
        cls, runner_cls: type, model: Any, rows: Sequence[int], tokens: Sequence[torch.Tensor]
    ) -> BatchCache | None:
        device = _device(model)
        ids = left_pad([t.tolist() for t in tokens], 0)
        mask = left_pad([[1] * len(t) for t in tokens], 0)
        runner = drafting_runner(runner_cls, model, ids.to(device), mask.to(device))
        if not getattr(runner, "per_row_truncate", False):
            return None
        return cls(runner, rows, tokens, device)

    def logits_after(self, rows: Sequence[int], tokens: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The drafting model's logits (V,) after each row's `tokens`: rows cut back where they differ from what
        their cache holds, then the rest of every row fed in one pass."""
        before = [pad + len(held) for pad, held in zip(self.pad, self.held)]
        lengths = list(before)
        feeds: dict[int, torch.Tensor] = {}
        for row, t in zip(rows, tokens):
            i = self.index[row]
            common = _common(self.held[i], t)
            if common == len(t) == len(self.held[i]):
                continue
            keep = min(common, len(t) - 1)
            if keep < 1:
                raise RuntimeError(f"row {row}'s tokens no longer start with the prompt its drafting cache holds")
            lengths[i], feeds[i] = self.pad[i] + keep, t[keep:]
            self.held[i] = t.clone()
        if lengths != before:
            self.runner.truncate(lengths)
        if feeds:
            self._extend(feeds)
        return [self.last[self.index[row]] for row in rows]

    def feed(self, rows: Sequence[int], tokens: Sequence[int]) -> list[torch.Tensor]:
        """The logits (V,) after one more token in each of `rows`, in one pass."""
        feeds = {self.index[row]: torch.tensor([token], dtype=torch.int64) for row, token in zip(rows, tokens)}
        for i, t in feeds.items():
            self.held[i] = torch.cat([self.held[i], t])
        self._extend(feeds)
        return [self.last[self.index[row]] for row in rows]

    def release(self, rows: Sequence[int]) -> None:
        """Rows that will not draft again leave the runner's batch (where it can drop rows: transformers), so the
        passes that follow run only the rows still drafting."""
        gone = [self.index.pop(row) for row in rows if row in self.index]
        if gone:
            self.runner.release(gone)

    def _extend(self, feeds: dict[int, torch.Tensor]) -> None:
        logits = self.runner.extend_rows(list(feeds), [t.to(self.device) for t in feeds.values()])
        for i, out in zip(feeds, logits):
            self.last[i] = out[-1]


class ModelDrafter(Drafter):
    """A drafter that runs a causal LM of the generation's vocabulary and draws through the chain. Subclasses set
    `name`, `Params` (with `num_tokens`, `noise` and, to end drafts at unsure tokens, `p_min`) and
    `drafting_model(context)` (the model, refusing what they cannot run: one ConfigError), and may wrap the model's
    calls in `running()`."""

    def __init__(self, params: Any = None) -> None:
        super().__init__(params)
        self._rows: list[RowCache | None] = []
        self._batch: BatchCache | None = None
        self._batch_tried = False
        self._draw: ChainDraw | None = None
        self._model: Any = None
        self._positions: int | None = None
        self._runner_cls: type | None = None

    def drafting_model(self, context: DraftContext) -> Any:
        raise NotImplementedError

    def running(self) -> contextlib.AbstractContextManager[Any]:
        """Around every call of the drafting model (a subclass may change the model for the call's time)."""
        return contextlib.nullcontext()

    def start(self, rows: int, context: DraftContext) -> None:
        self._model = self.drafting_model(context)
        self._positions = max_positions(getattr(self._model, "config", None))  # None: the model states none
        self._runner_cls = context.runner_for(self._model)
        self._draw = ChainDraw(context, self.params.noise)
        self._rows = [None] * rows
        self._batch, self._batch_tried = None, False

    def propose(self, row: int, tokens: torch.Tensor, limit: int) -> Proposal:
        return self.propose_rows([row], [tokens], [limit])[0]

    def propose_rows(
        self, rows: Sequence[int], tokens: Sequence[torch.Tensor], limits: Sequence[int]
    ) -> list[Proposal]:
        if self._draw is None or self._runner_cls is None:
            raise RuntimeError(f"drafter {self.name}: start(rows, context) was not called before the first proposal")
        # a draft of k tokens feeds the drafting model k - 1 of them after the row's tokens: within its positions
        room = self._positions
        wants = [min(self.params.num_tokens, int(limit)) for limit in limits]
        if room is not None:
            wants = [min(want, room - len(t) + 1) for want, t in zip(wants, tokens)]
        live = [i for i, want in enumerate(wants) if want > 0]
        logits: dict[int, torch.Tensor] = {}
        if live:  # a row past the drafting model's positions is not run on it
            with self.running():
                logits = dict(zip(live, self._logits_after([rows[i] for i in live], [tokens[i] for i in live])))
        self._draw.begin([rows[i] for i in live], [tokens[i] for i in live])
        drafted: list[list[int]] = [[] for _ in rows]
        probs: list[list[torch.Tensor]] = [[] for _ in rows]
        p_min = float(getattr(self.params, "p_min", 0.0))
        while live:
            chosen, dist, chance = self._draw.draw([rows[i] for i in live], torch.stack([logits[i] for i in live]))
            unsure = set()  # rows whose token the drafting chain gave less than p_min: their draft ends with it
            for j, i in enumerate(live):
                drafted[i].append(int(chosen[j]))
                if dist is not None:
                    probs[i].append(dist[j])
                if float(chance[j]) < p_min:
                    unsure.add(i)
            live = [i for i in live if len(drafted[i]) < wants[i] and i not in unsure]
            with self.running():
                fed = self._feed([rows[i] for i in live], [drafted[i][-1] for i in live])
            for i, out in zip(live, fed):
                logits[i] = out
        return [
            Draft(torch.tensor(d, dtype=torch.int64), torch.stack(p) if p else None) for d, p in zip(drafted, probs)
        ]

    def finish(self, rows: Sequence[int]) -> None:
        if self._batch is not None:
            self._batch.release(rows)
        for row in rows:
            if row < len(self._rows):
                self._rows[row] = None

    def _logits_after(self, rows: Sequence[int], tokens: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        if not self._batch_tried and len(rows) > 1:  # the first call's rows share one runner where it can
            assert self._runner_cls is not None  # set by start
            self._batch_tried = True
            self._batch = BatchCache.open(self._runner_cls, self._model, rows, tokens)
        batch, mine = self._batch, self._batched(rows)
        found = (
            self._batch_call(batch.logits_after, [rows[j] for j in mine], [tokens[j] for j in mine])
            if batch and mine
            else []
        )
        out = dict(zip(mine, found))
        return [out[j] if j in out else self._cache(row).logits_after(tokens[j]) for j, row in enumerate(rows)]

    def _feed(self, rows: Sequence[int], tokens: Sequence[int]) -> list[torch.Tensor]:
        """The logits after one more token in each row: one pass for the rows of the batch, one per other row."""
        batch, mine = self._batch, self._batched(rows)
        found = (
            self._batch_call(batch.feed, [rows[j] for j in mine], [tokens[j] for j in mine]) if batch and mine else []
        )
        out = dict(zip(mine, found))
        return [out[j] if j in out else self._cache(row).feed(tokens[j]) for j, row in enumerate(rows)]

    def _batch_call(self, method: Any, rows: list[int], values: list[Any]) -> list[torch.Tensor]:
        """A call of the batch's cache; where it fails, its rows may be cut and fed in part, so every row goes on
        with a cache of its own (`RowCache`), and the caller's failure stays that of the rows it asked for."""
        try:
            return list(method(rows, values))
        except Exception:
            self._batch = None
            raise

    def _batched(self, rows: Sequence[int]) -> list[int]:
        """The indices of `rows` that the batch's cache holds."""
        return [] if self._batch is None else [j for j, row in enumerate(rows) if row in self._batch.index]

    def _cache(self, row: int) -> RowCache:
        if row >= len(self._rows):
            self._rows.extend([None] * (row + 1 - len(self._rows)))
        cache = self._rows[row]
        if cache is None:
            assert self._runner_cls is not None  # set by start
            cache = self._rows[row] = RowCache(self._runner_cls, self._model)
        return cache


@contextlib.contextmanager
def swapped(owner: Any, name: str, value: Any) -> Iterator[None]:
    """`owner.name` is `value` inside the block, its own value again after it (also after an error)."""
    original = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, original)
