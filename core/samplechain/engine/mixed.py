"""Mixed chains in one batch: each row of a batch may follow its own chain (another order, other samplers).

    mixed = MixedChains({"creative": Chain.load("preset:llama.cpp"), "exact": Chain.load("preset:greedy")})
    store = mixed.new_store()
    store.add("a", chain="creative", params={"temperature": 1.1})
    store.add("b", chain="exact")
    out = mixed.sample(logits, store, ["a", "b"])       # one token per row, in row order

The executor groups the rows by chain, runs each chain on its rows (one batched call per chain, not per row), and
scatters the results back to row order. Every group computes its state updates before any is committed, so a
failure in one group changes no request of any group. A row gives exactly what its chain gives for it alone (or in
a batch of its own chain): seeded draws are batch-invariant.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ..errors import ConfigError, RequestError
from .chain import Chain, SampleOutput
from .checks import check_given_tokens
from .store import RequestStore

__all__ = ["MixedChains", "MixedStore"]


class MixedStore:
    """The per-request store of a MixedChains: one RequestStore per chain and the chain of each request."""

    def __init__(self, stores: Mapping[str, RequestStore]) -> None:
        self.stores = dict(stores)
        self.route: dict[str, str] = {}

    def __contains__(self, request_id: object) -> bool:
        return request_id in self.route

    def __len__(self) -> int:
        return len(self.route)

    def chain_of(self, request_id: str) -> str:
        try:
            return self.route[request_id]
        except KeyError:
            raise RequestError(f"unknown request {request_id!r}: add it with store.add(id, chain=...)") from None

    def add(self, request_id: str, params: Mapping[str, Any] | None = None, *, chain: str) -> None:
        if chain not in self.stores:
            raise ConfigError(f"chain {chain!r} is not one of this mixed batch's chains ({', '.join(self.stores)})")
        if request_id in self.route:
            raise RequestError(f"request {request_id!r} already exists (on chain {self.route[request_id]!r})")
        self.stores[chain].add(request_id, params)
        self.route[request_id] = chain

    def update(self, request_id: str, params: Mapping[str, Any]) -> None:
        self.stores[self.chain_of(request_id)].update(request_id, params)

    def remove(self, request_id: str) -> None:
        self.stores[self.chain_of(request_id)].remove(request_id)
        del self.route[request_id]

    def clone(self, source: str, target: str) -> None:
        """Fork a request onto its own chain: every parameter, the position and all sampler state."""
        if target in self.route:
            raise RequestError(
                f"request {target!r} already exists (on chain {self.route[target]!r}); clone() needs a new id"
            )
        chain = self.chain_of(source)
        self.stores[chain].clone(source, target)
        self.route[target] = chain

    def save_row(self, request_id: str) -> Any:
        return self.stores[self.chain_of(request_id)].save_row(request_id)

    def load_row(self, request_id: str, saved: Any) -> None:
        self.stores[self.chain_of(request_id)].load_row(request_id, saved)

    def groups(self, request_ids: Sequence[str]) -> dict[str, list[int]]:
        """The rows of `request_ids` by chain: chain key -> the row indices of its requests, in row order."""
        out: dict[str, list[int]] = {}
        for row, rid in enumerate(request_ids):
            out.setdefault(self.chain_of(rid), []).append(row)
        return out

    def seeded(self, chain: str) -> bool:
        return "seed" in self.stores[chain].layout.aliases

    def snapshot(self) -> dict[str, Any]:
        return {"route": dict(self.route), "stores": {k: s.snapshot() for k, s in self.stores.items()}}

    def restore(self, snapshot: Mapping[str, Any]) -> None:
        """Add the requests of a snapshot() of these chains; all or nothing, as RequestStore.restore."""
        stores = snapshot.get("stores") if isinstance(snapshot, Mapping) else None
        route = snapshot.get("route") if isinstance(snapshot, Mapping) else None
        if not isinstance(stores, Mapping) or not isinstance(route, Mapping) or not set(stores) <= set(self.stores):
            raise RequestError(
                f"restore(): expected a snapshot() of a store of these chains ({sorted(self.stores)}), "
                f"got {sorted(snapshot) if isinstance(snapshot, Mapping) else type(snapshot).__name__}"
            )
        done: list[tuple[str, Mapping[str, Any]]] = []
        try:
            for key, snap in stores.items():
                self.stores[key].restore(snap)
                done.append((key, snap))
        except Exception:
            for key, snap in done:
                for rid in snap:
                    self.stores[key].remove(rid)
            raise
        self.route.update(route)


def _check_batch(logits: Any, request_ids: Sequence[str], logprobs_at: Any) -> None:
    if not isinstance(logits, torch.Tensor) or logits.ndim != 2:
        raise RequestError("logits must be a (batch, vocab) tensor")
    if isinstance(request_ids, str):  # a string is a sequence of one-character ids
        raise RequestError(f"request_ids = {request_ids!r}: a list of ids, one per row (e.g. [{request_ids!r}])")
    if not isinstance(logprobs_at, (str, list, tuple)):
        raise ConfigError(
            f"logprobs_at = {logprobs_at!r}: one stage for the batch (for example 'raw', 'processed' or an entry's "
            "id) or a list of one per row"
        )
    if len(request_ids) != logits.shape[0]:
        raise RequestError(f"logits have {logits.shape[0]} rows but {len(request_ids)} request ids were given")


class MixedChains:
    """Several chains over the rows of one batch. Duck-types the parts of Chain that generate() uses."""

    row_chains: list[str]  # set by generate() for chain=[...] (prompt i -> its chain's key); absent otherwise

    def __init__(self, chains: Mapping[str, Chain] | Sequence[Chain]) -> None:
        if not isinstance(chains, Mapping):
            chains = {str(i): c for i, c in enumerate(chains)}
        if not chains:
            raise ConfigError("MixedChains needs at least one chain")
        for key, c in chains.items():
            if not isinstance(c, Chain):
                raise ConfigError(f"chains[{key!r}] is a {type(c).__name__}, not a Chain: load it with Chain.load")
        self.chains: dict[str, Chain] = dict(chains)
        self.needs_history = any(c.needs_history for c in self.chains.values())
        self.needs_unconditional_logits = any(c.needs_unconditional_logits for c in self.chains.values())
        self.samplers = tuple(s for c in self.chains.values() for s in c.samplers)

    @property
    def is_greedy(self) -> bool:
        return all(c.is_greedy for c in self.chains.values())

    @property
    def stop_entries(self) -> tuple[Any, ...]:
        """The chains' [stop] criteria: they must agree (stopping is decided for the whole batch)."""
        entries = {key: tuple(c.config.stop) for key, c in self.chains.items()}
        first = next(iter(entries.values()))
        if any(e != first for e in entries.values()):
            raise ConfigError(
                "the chains of a mixed batch declare different [stop] criteria; stopping is decided for "
                "the whole batch: give the criteria to generate(stop=...) and drop them from the chains"
            )
        return first

    def prepare(self, **kwargs: Any) -> None:
        for c in self.chains.values():
            c.prepare(**kwargs)

    def new_store(self, *, device: torch.device | str | None = None, capacity: int = 8) -> MixedStore:
        return MixedStore({k: c.new_store(device=device, capacity=capacity) for k, c in self.chains.items()})

    def sample(
        self,
        logits: torch.Tensor,
        store: MixedStore,
        request_ids: Sequence[str],
        *,
        accept: bool | torch.Tensor = True,
        return_scores: bool = False,
        history: torch.Tensor | None = None,
        prompt_lengths: torch.Tensor | None = None,
        unconditional_logits: torch.Tensor | None = None,
        logprobs_at: str | Sequence[str] = "processed",
        top_logprobs: int = 0,
    ) -> SampleOutput:
        """Chain.sample, group by group (logprobs_at: one value, or one per row naming an entry of its own chain;
        accept=token_ids: teacher forcing, each group's rows given their tokens)."""
        _check_batch(logits, request_ids, logprobs_at)
        given = check_given_tokens(accept, logits) if isinstance(accept, torch.Tensor) else None
        groups = store.groups(request_ids)
        batch, vocab = logits.shape
        device = logits.device
        token_ids = torch.empty(batch, dtype=torch.int64, device=device)
        logprobs = torch.empty(batch, dtype=torch.float32, device=device)
        scores = torch.full((batch, vocab), float("-inf"), device=device) if return_scores else None
        per_row = not isinstance(logprobs_at, str)
        if per_row and len(logprobs_at) != batch:
            raise RequestError(
                f"logprobs_at lists {len(logprobs_at)} values for {batch} rows: give one string for "
                "the batch or one per row"
            )
        tops, ranks = None, None
        commits = []
        failed, checks = None, []  # deferred checks (sync-free backends): one flag for the whole batch
        for key, rows in groups.items():
            index = torch.tensor(rows, dtype=torch.int64, device=device)
            chain = self.chains[key]
            extra = _group_inputs(chain, index, history, prompt_lengths, unconditional_logits)
            part = logits.index_select(0, index) if len(groups) > 1 else logits
            drawn = chain.sample_deferred(
                part,
                store.stores[key],
                [request_ids[r] for r in rows],
                return_scores=return_scores,
                top_logprobs=top_logprobs,
                logprobs_at=[logprobs_at[r] for r in rows] if per_row else logprobs_at,
                given=None if given is None else given.index_select(0, index),
                **extra,
            )
            out = drawn.output
            token_ids.index_copy_(0, index, out.token_ids)
            logprobs.index_copy_(0, index, out.logprobs)
            if out.top_logprobs is not None:
                if tops is None:
                    tops = tuple(
                        torch.empty((batch,) + t.shape[1:], dtype=t.dtype, device=device) for t in out.top_logprobs
                    )
                for whole, got in zip(tops, out.top_logprobs):
                    whole.index_copy_(0, index, got)
            if out.ranks is not None:
                if ranks is None:  # a group on the default path leaves its rows at 0 (no rank computed)
                    ranks = torch.zeros(batch, dtype=torch.int64, device=device)
                ranks.index_copy_(0, index, out.ranks)
            if scores is not None and out.scores is not None:  # every group returns scores when asked
                scores.index_copy_(0, index, out.scores)
            commits.append(drawn)
            if out.deferred is not None:
                checks.append(out.deferred)
                failed = out.deferred[0] if failed is None else failed | out.deferred[0]
        if given is not None or accept:
            for held in commits:  # nothing can fail here: every update was computed above
                held.commit(failed)  # a deferred failure in any group: no group commits (decided on the device)
        deferred = None if failed is None else (failed, lambda: next(error() for flag, error in checks if bool(flag)))
        return SampleOutput(token_ids, logprobs, scores, deferred, tops, ranks)  # type: ignore[arg-type]

    def accept(self, store: MixedStore, request_ids: Sequence[str], token_ids: torch.Tensor) -> None:
        """Record chosen tokens after a sample(accept=False), group by group."""
        for key, rows in store.groups(request_ids).items():
            self.chains[key].accept(store.stores[key], [request_ids[r] for r in rows], token_ids[rows])

    def __repr__(self) -> str:
        return f"MixedChains({', '.join(f'{k}: {c!r}' for k, c in self.chains.items())})"


def _group_inputs(
    chain: Chain,
    index: torch.Tensor,
    history: torch.Tensor | None,
    prompt_lengths: torch.Tensor | None,
    unconditional_logits: torch.Tensor | None,
) -> dict[str, Any]:
    """The rows `index` of the step's other inputs, for a group's chain (only those it reads)."""
    extra: dict[str, Any] = {}
    if chain.needs_history:
        extra["history"] = None if history is None else history.index_select(0, index.to(history.device))
        extra["prompt_lengths"] = (
            None if prompt_lengths is None else prompt_lengths.index_select(0, index.to(prompt_lengths.device))
        )
    if chain.needs_unconditional_logits and unconditional_logits is not None:
        extra["unconditional_logits"] = unconditional_logits.index_select(0, index)
    return extra
