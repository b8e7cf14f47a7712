"""The per-request store: parameters, RNG position and sampler state of every request in a running batch.

Lifecycle (as llama.cpp's sampler accept, and vLLM's persistent batch):
    add(request_id, params)    a request joins; its parameters are validated and its seeds resolved
    accept(request_ids, tokens)  the chosen tokens advance RNG positions (and, via the chain, sampler state)
    remove(request_id)         a request leaves; its slot is freed and reused
    reset(request_id)          back to position 0 and initial sampler state, parameters kept
    set_position(request_id, n)  the RNG position only (a serving engine that discarded or replayed steps)
Rows live in preallocated column tensors indexed by slot, so a batch is one gather, never a Python loop over rows.
"""

from __future__ import annotations

import collections
import difflib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs
import numpy as np
import torch

from .. import rng
from ..errors import ConfigError, RequestError
from .config import EntrySpec, parse_params

__all__ = ["Column", "StoreLayout", "RequestStore", "BatchView"]

_DTYPES = {float: torch.float32, int: torch.int64, bool: torch.bool}


def _mapping(request_id: str, params: Any) -> Mapping[str, Any]:
    if not isinstance(params, Mapping):
        raise RequestError(
            f"request {request_id!r}: params = {params!r}: a mapping of parameter names to values, e.g. "
            "{'seed': 1, 'top_k': 40}"
        )
    return params


def _id_list(request_ids: Iterable[str], where: str) -> list[str]:
    """Request ids as a list; a string is refused (it would be read as one-character ids)."""
    if isinstance(request_ids, str):
        raise RequestError(f"{where}({request_ids!r}): a list of request ids (e.g. [{request_ids!r}]), not a string")
    return list(request_ids)


def _stored(column: torch.Tensor, slot: int) -> Any:
    """A stored parameter as plain data that validates again: a float32 value as the shortest decimal that rounds
    back to it (0.99, not 0.9900000095367432, which a [0, 0.99] range would refuse on restore() or update())."""
    value = column[slot].item()
    if column.dtype == torch.float32:
        return float(str(np.float32(value)))
    return value


@attrs.frozen
class Column:
    entry: int  # index of the sampler in the chain
    field: str
    dtype: torch.dtype
    is_seed: bool


@attrs.frozen
class StoreLayout:
    """Which per-request columns a chain needs, derived once from its entries."""

    entries: tuple[EntrySpec, ...]
    columns: tuple[Column, ...]
    aliases: Mapping[str, tuple[tuple[int, str], ...]]  # flat name -> (entry, field) pairs
    state: Mapping[tuple[int, str], tuple[torch.dtype, tuple[int, ...], Any]]

    @classmethod
    def for_entries(cls, entries: Sequence[EntrySpec], samplers: Sequence[Any]) -> StoreLayout:
        from ..params import is_seed_field

        columns: list[Column] = []
        aliases: dict[str, list[tuple[int, str]]] = {}
        state: dict[tuple[int, str], tuple[torch.dtype, tuple[int, ...], Any]] = {}
        for i, (entry, sampler) in enumerate(zip(entries, samplers)):
            attrs.resolve_types(entry.cls.Params)
            for f in attrs.fields(entry.cls.Params):
                base = f.type
                if getattr(base, "__args__", None) and type(None) in base.__args__:  # int | None
                    base = next(a for a in base.__args__ if a is not type(None))
                if base not in _DTYPES:
                    continue  # strings, lists ...: chain-level only, not per-request vectors
                columns.append(Column(i, f.name, _DTYPES[base], is_seed_field(f)))
            for alias, field in entry.cls.request_aliases.items():
                aliases.setdefault(alias, []).append((i, field))
            for name, spec in sampler.state_spec().items():
                state[(i, name)] = spec
        return cls(tuple(entries), tuple(columns), {k: tuple(v) for k, v in aliases.items()}, state)

    def resolve(
        self, request_id: str, params: Mapping[str, Any], *, draw_seeds: bool = True
    ) -> dict[tuple[int, str], Any]:
        """Validate per-request parameters (flat aliases or `<id>.<field>` keys, as RequestStore.add takes them)
        against each sampler's Params: the value of every column, unseeded seeds drawn (draw_seeds) or None. A
        RequestError names the request, the key and the fix; nothing is stored, so this is also add()'s check
        without a store (the vLLM frontend's validation)."""
        entries = self.entries
        by_id = {e.id: i for i, e in enumerate(entries)}
        overrides: dict[int, dict[str, Any]] = {}
        given_as: dict[tuple[int, str], str] = {}  # the key that set each field (an alias: "seed", "temperature")
        for key, value in _mapping(request_id, params).items():
            if key in self.aliases:
                targets = self.aliases[key]
            elif "." in key and key.rsplit(".", 1)[0] in by_id:
                entry_id, field = key.rsplit(".", 1)
                targets = ((by_id[entry_id], field),)
            else:
                known = sorted(self.aliases) + [f"{e.id}.{f.name}" for e in entries for f in attrs.fields(e.cls.Params)]
                close = difflib.get_close_matches(key, known, n=2)
                hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
                raise RequestError(
                    f"request {request_id!r}: unknown parameter {key!r} for this chain{hint} "
                    f"(valid: {', '.join(known) or 'none'})"
                )
            for i, field in targets:
                overrides.setdefault(i, {})[field] = value
                given_as[(i, field)] = key
        columns = {(col.entry, col.field) for col in self.columns}
        for i, fields in overrides.items():
            for field in fields:
                if (i, field) not in columns:  # a text or structured setting: one value for the whole chain
                    raise RequestError(
                        f"request {request_id!r}: {entries[i].id}.{field} = {fields[field]!r}: this setting is the "
                        f"chain's, not per request (only numbers and flags vary by request); set it in the chain "
                        f"file, or load a second chain for these requests"
                    )
        resolved: dict[tuple[int, str], Any] = {}
        for i, entry in enumerate(entries):
            if i not in overrides:  # the chain's own values, validated when it was loaded
                checked = entry.params
            else:
                merged = attrs.asdict(entry.params, recurse=False)
                merged.update(overrides[i])
                try:
                    checked = parse_params(entry.cls, merged, source=f"request {request_id!r}", path=entry.id)
                except ConfigError as exc:
                    message = str(exc)
                    for field in overrides[i]:  # set by another name ("seed" for xtc.seed): the error says so
                        path, key = f"{entry.id}.{field}", given_as[(i, field)]
                        if key not in (path, entry.id):
                            message = message.replace(f"{path} = ", f"{path} (given as {key!r}) = ", 1)
                    raise RequestError(message) from None
            for col in self.columns:
                if col.entry != i:
                    continue
                value = getattr(checked, col.field)
                if col.is_seed and value is None and draw_seeds:
                    value = rng.fresh_seed()
                resolved[(i, col.field)] = value
        return resolved


@attrs.define
class BatchView:
    """A batch composition: slots (B,) and every entry's parameters gathered for it (cached until it changes)."""

    request_ids: tuple[str, ...]
    slots: torch.Tensor  # (B,) int64, on the host
    device_slots: torch.Tensor  # the same, on the store's device (copied once per composition, not per step)
    params: list[dict[str, torch.Tensor]]  # per entry: field -> (B,) on the device
    scalars: list[dict[str, Any]]  # per entry: field -> shared value or None
    bounds: list[dict[str, tuple[Any, Any]]] = attrs.field(factory=list)  # per entry: field -> (min, max)


class RequestStore:
    """Per-request parameters, RNG positions and sampler state, in slot-indexed column tensors."""

    def __init__(self, layout: StoreLayout, *, device: torch.device | str = "cpu", capacity: int = 8) -> None:
        self.layout = layout
        self.device = torch.device(device)
        self._capacity = 0
        self._slots: dict[str, int] = {}
        self._free: list[int] = []
        self._params: dict[tuple[int, str], torch.Tensor] = {}  # host tensors (capacity,)
        self._positions = torch.zeros(0, dtype=torch.int64, device=self.device)  # device-resident, as the state
        self._state: dict[tuple[int, str], torch.Tensor] = {}  # device tensors (capacity, ...)
        self._version = 0
        self._cache: BatchView | None = None
        self._cache_version = -1
        self._grow(capacity)

    # ----------------------------------------------------------------- storage
    def _grow(self, capacity: int) -> None:
        old = self._capacity
        if capacity <= old:
            return

        def extend(t: torch.Tensor | None, shape: tuple[int, ...], dtype: torch.dtype, fill: Any, dev) -> torch.Tensor:
            # ordinary tensors also where the store grows under torch.inference_mode: each step changes them in
            # place, which an inference tensor refuses outside that mode
            with torch.inference_mode(False):
                new = torch.full((capacity, *shape), fill, dtype=dtype, device=dev)
                if t is not None and old:
                    new[:old] = t
            return new

        for col in self.layout.columns:
            key = (col.entry, col.field)
            self._params[key] = extend(self._params.get(key), (), col.dtype, 0, "cpu")
        self._positions = extend(self._positions, (), torch.int64, 0, self.device)
        for key, (dtype, shape, init) in self.layout.state.items():
            self._state[key] = extend(self._state.get(key), shape, dtype, init, self.device)
        self._free.extend(range(capacity - 1, old - 1, -1))
        self._capacity = capacity

    # ----------------------------------------------------------------- lifecycle
    def __contains__(self, request_id: object) -> bool:
        return request_id in self._slots

    def __len__(self) -> int:
        return len(self._slots)

    @property
    def request_ids(self) -> list[str]:
        return list(self._slots)

    def add(self, request_id: str, params: Mapping[str, Any] | None = None) -> None:
        """A request joins. params: flat aliases ({"top_p": 0.9, "seed": 7}) or `<id>.<field>` keys."""
        if request_id in self._slots:
            raise RequestError(f"request {request_id!r} is already in the store; remove() it first or use a new id")
        values = self.layout.resolve(request_id, params or {})
        if not self._free:
            self._grow(max(8, 2 * self._capacity))
        slot = self._free.pop()
        for key, value in values.items():
            self._params[key][slot] = value
        self._positions[slot] = 0
        self._reset_state(slot)
        self._slots[request_id] = slot
        self._version += 1

    def add_many(self, request_ids: Sequence[str], params: Mapping[str, Any] | None = None) -> None:
        """Several requests join with the same parameters (validated once; unseeded rows get their own seeds)."""
        ids = _id_list(request_ids, "add_many")
        clash = [r for r in ids if r in self._slots]
        if not clash and len(set(ids)) != len(ids):  # O(n): add_many of many ids must stay linear
            clash = sorted(r for r, times in collections.Counter(ids).items() if times > 1)
        if clash:
            raise RequestError(f"request id(s) {clash} already in the store or repeated; use distinct new ids")
        if not ids:
            return
        values = self.layout.resolve(ids[0], params or {}, draw_seeds=False)
        while len(self._free) < len(ids):
            self._grow(max(8, 2 * self._capacity))
        slots = torch.tensor([self._free.pop() for _ in ids], dtype=torch.int64)
        for col in self.layout.columns:
            value = values[(col.entry, col.field)]
            if col.is_seed and value is None:
                fresh = [rng.fresh_seed() for _ in ids]
                self._params[(col.entry, col.field)][slots] = torch.tensor(fresh, dtype=torch.int64)
            else:
                self._params[(col.entry, col.field)][slots] = value
        self._positions[slots.to(self.device)] = 0
        for key, (_dtype, _shape, init) in self.layout.state.items():
            self._state[key][slots.to(self.device)] = init
        self._slots.update(zip(ids, slots.tolist()))
        self._version += 1

    def update(self, request_id: str, params: Mapping[str, Any]) -> None:
        """Change some parameters of a request in place (validated first: a bad value changes nothing)."""
        slot = self._slot(request_id)
        current = {
            f"{self.layout.entries[c.entry].id}.{c.field}": _stored(self._params[(c.entry, c.field)], slot)
            for c in self.layout.columns
        }
        values = self.layout.resolve(request_id, {**current, **_mapping(request_id, params)})
        for key, value in values.items():
            self._params[key][slot] = value
        self._version += 1

    def remove(self, request_id: str) -> None:
        slot = self._slot(request_id)
        del self._slots[request_id]
        self._reset_state(slot)  # nothing of the old request survives in a reused slot
        self._free.append(slot)
        self._version += 1

    def reset(self, request_id: str | None = None) -> None:
        """Position 0 and initial sampler state for one request (or all); parameters are kept."""
        slots = [self._slot(request_id)] if request_id is not None else list(self._slots.values())
        for slot in slots:
            self._positions[slot] = 0
            self._reset_state(slot)

    def set_position(self, request_id: str, position: int) -> None:
        """Move a request's RNG position to `position` (the number of tokens it has accepted), its parameters and
        sampler state kept: for a serving engine whose step was discarded, or a request resumed with output."""
        slot = self._slot(request_id)
        if isinstance(position, bool) or not isinstance(position, (int, np.integer)) or position < 0:
            raise RequestError(
                f"request {request_id!r}: position must be an integer >= 0 (its number of accepted tokens), "
                f"got {position!r}"
            )
        self._positions[slot] = int(position)

    def clone(self, source: str, target: str) -> None:
        """Fork a request (beam search, n > 1): the copy gets every parameter, the position and all state."""
        src = self._slot(source)
        if target in self._slots:
            raise RequestError(f"request {target!r} is already in the store; clone() needs a new id")
        if not self._free:
            self._grow(max(8, 2 * self._capacity))
        slot = self._free.pop()
        for t in self._params.values():
            t[slot] = t[src]
        self._positions[slot] = self._positions[src]
        for t in self._state.values():
            t[slot] = t[src]
        self._slots[target] = slot
        self._version += 1

    def save_row(self, request_id: str) -> tuple[torch.Tensor, dict[Any, torch.Tensor]]:
        """A request's RNG position and sampler state, copied as tensors (no host read): `load_row` sets them back,
        as a generation does that takes a row's last tokens back."""
        slot = self._slot(request_id)
        return self._positions[slot].clone(), {key: t[slot].clone() for key, t in self._state.items()}

    def load_row(self, request_id: str, saved: tuple[torch.Tensor, Mapping[Any, torch.Tensor]]) -> None:
        slot = self._slot(request_id)
        if (
            not isinstance(saved, tuple)
            or len(saved) != 2
            or not isinstance(saved[1], Mapping)
            or set(saved[1]) != set(self._state)
        ):
            raise RequestError(f"load_row({request_id!r}): expected what save_row() of this store returned")
        position, state = saved
        self._positions[slot] = position
        for key, value in state.items():
            self._state[key][slot] = value

    def _reset_state(self, slot: int) -> None:
        for key, (_dtype, _shape, init) in self.layout.state.items():
            self._state[key][slot] = init

    def _slot(self, request_id: str) -> int:
        try:
            return self._slots[request_id]
        except KeyError:
            close = difflib.get_close_matches(str(request_id), [str(r) for r in self._slots], n=1)
            hint = f"; did you mean {close[0]!r}?" if close else "; add() it first"
            raise RequestError(f"unknown request {request_id!r}{hint}") from None

    # ----------------------------------------------------------------- batches
    def batch(self, request_ids: Sequence[str]) -> BatchView:
        """Slots and parameters for this batch composition; cached while the composition is unchanged."""
        ids = tuple(_id_list(request_ids, "batch"))
        cache = self._cache
        if cache is not None and self._cache_version == self._version and cache.request_ids == ids:
            return cache
        if len(set(ids)) != len(ids):
            dup = sorted({r for r in ids if ids.count(r) > 1})
            raise RequestError(f"request id(s) {dup} appear more than once in one batch; clone() to fork a request")
        slots = torch.tensor([self._slot(r) for r in ids], dtype=torch.int64)
        params: list[dict[str, torch.Tensor]] = [{} for _ in self.layout.entries]
        scalars: list[dict[str, Any]] = [{} for _ in self.layout.entries]
        bounds: list[dict[str, tuple[Any, Any]]] = [{} for _ in self.layout.entries]
        for col in self.layout.columns:
            host = self._params[(col.entry, col.field)].index_select(0, slots)
            first = host[0] if len(ids) else None
            shared = first is not None and bool((host == first).all())
            scalars[col.entry][col.field] = first.item() if shared and first is not None else None
            if len(ids):
                bounds[col.entry][col.field] = (host.min().item(), host.max().item())
            params[col.entry][col.field] = host.to(self.device, non_blocking=True)
        view = BatchView(ids, slots, slots.to(self.device, non_blocking=True), params, scalars, bounds)
        self._cache, self._cache_version = view, self._version
        return view

    def positions(self, view: BatchView) -> torch.Tensor:
        """(B,) int64 RNG positions of the batch, on the device: no copy from the host in a step."""
        return self._positions.index_select(0, view.device_slots)

    def state_of(self, view: BatchView, entry: int) -> dict[str, torch.Tensor]:
        return {name: t.index_select(0, view.device_slots) for (i, name), t in self._state.items() if i == entry}

    def advance(
        self, view: BatchView, new_state: Mapping[tuple[int, str], torch.Tensor], failed: torch.Tensor | None = None
    ) -> None:
        """Commit one accepted step: positions += 1 and the samplers' updated state rows. failed: a 0-d bool
        device flag (a step whose check is deferred, on a backend that never waits for the host): when it is set,
        nothing changes, decided on the device without a host read."""
        slots = view.device_slots
        step = torch.ones_like(slots) if failed is None else (~failed).to(torch.int64).expand(len(slots))
        self._positions.index_add_(0, slots, step)
        for key, rows in new_state.items():
            rows = rows.to(self._state[key].dtype)
            if failed is not None:
                rows = torch.where(failed, self._state[key].index_select(0, slots), rows)
            self._state[key].index_copy_(0, slots, rows)

    # ----------------------------------------------------------------- serialisation
    def snapshot(self, request_ids: Iterable[str] | None = None) -> dict[str, Any]:
        """Plain data (JSON-able lists and numbers) for some or all requests: parameters, position, state."""
        out: dict[str, Any] = {}
        for rid in _id_list(request_ids, "snapshot") if request_ids is not None else self._slots:
            slot = self._slot(rid)
            out[rid] = {
                "params": {f"{self.layout.entries[i].id}.{f}": _stored(t, slot) for (i, f), t in self._params.items()},
                "position": int(self._positions[slot]),
                "state": {f"{self.layout.entries[i].id}.{n}": t[slot].tolist() for (i, n), t in self._state.items()},
            }
        return out

    def restore(self, snapshot: Mapping[str, Any]) -> None:
        """Add the requests of a snapshot() (from this chain) with their exact parameters, position and state.

        All or nothing: an id already in the store, or a row that is not this chain's snapshot, is one error and
        the store keeps exactly what it held."""
        if not isinstance(snapshot, Mapping):
            raise RequestError(f"restore(): expected the dict snapshot() returned, got {type(snapshot).__name__}")
        clash = sorted(rid for rid in snapshot if rid in self._slots)
        if clash:
            raise RequestError(
                f"restore(): request id(s) {clash} already in the store; remove() them first or restore into a new store"
            )
        ids = {e.id: i for i, e in enumerate(self.layout.entries)}
        added: list[str] = []
        try:
            for rid, row in snapshot.items():
                if not isinstance(row, Mapping) or not {"params", "position", "state"} <= row.keys():
                    got = sorted(row) if isinstance(row, Mapping) else type(row).__name__
                    raise RequestError(
                        f"restore(): request {rid!r}: expected a row of snapshot() (params, position, state), got {got}"
                    )
                position, state = row["position"], row["state"]
                if isinstance(position, bool) or not isinstance(position, int) or not 0 <= position < 2**63:
                    raise RequestError(
                        f"restore(): request {rid!r}: position = {position!r}: expected the request's RNG position "
                        "(an integer >= 0)"
                    )
                if not isinstance(state, Mapping):
                    raise RequestError(f"restore(): request {rid!r}: state = {state!r}: expected a table of states")
                self.add(rid, row["params"])
                added.append(rid)
                slot = self._slots[rid]
                self._positions[slot] = position
                for key, value in state.items():
                    entry_id, _, name = key.rpartition(".")
                    t = self._state.get((ids.get(entry_id, -1), name))
                    if t is None:
                        names = sorted(f"{self.layout.entries[i].id}.{n}" for i, n in self._state)
                        raise RequestError(
                            f"restore(): request {rid!r}: {key!r} is not a state of this chain (its states: {names});"
                            " restore a snapshot of the same chain"
                        )
                    try:
                        t[slot] = torch.tensor(value, dtype=t.dtype, device=t.device)
                    except (TypeError, ValueError, RuntimeError, OverflowError) as exc:
                        raise RequestError(
                            f"restore(): request {rid!r}: state {key!r} = {value!r}: not a value of that state "
                            f"(shape {tuple(t.shape[1:])}, {t.dtype}): {exc}"
                        ) from None
        except BaseException:
            for rid in added:
                self.remove(rid)
            raise
