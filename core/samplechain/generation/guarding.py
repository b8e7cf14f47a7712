"""Guards in the generation loop (docs/guards.md): a guarded row's tokens are drawn ahead of what is committed, and
a guard's `Rewind` takes the row back.

The loop that draws ahead is speculative decoding's (speculative.py: each row's drawn tokens wait in a queue, and
its cache is cut per row). `Guarding` adds, per guarded row:

- before each draw, the request's RNG position and sampler state (`store.save_row`) at that generated position,
  and the tokens banned there (their logits -inf);
- after each draw, every guard's `check` on the row's generated tokens (committed and drawn). A `Rewind(t)` cuts
  the drawn tokens from t on, sets the request's state back to what it was before token t was drawn, bans the
  token that stood at t at that position (bans past t are forgotten: they belonged to text that is gone) and
  leaves the cache to be cut back; the next call draws position t again. A row out of rewinds ends after the
  tokens before t, finish reason "guard:<guard>:<what it refused>";
- the tokens that may be committed: those before the first token any guard may still take back (`hold`), all of
  them once the row's text is final (an end-of-sequence drawn, or the length limit reached).
"""

from __future__ import annotations

import numbers
import warnings
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import torch

from ..engine.discovery import PluginHost
from ..errors import ConfigError, GenerationWarning
from ..guards import MAX_REWINDS, SETTINGS, Guard, GuardContext, Rewind, guard_settings
from ..strings import byte_table
from .drafting import load_spec

if TYPE_CHECKING:
    from .session import Generation

__all__ = ["Guarding", "failed", "load_guard", "load_guards", "start_guards"]


def load_guard(spec: Any, host: PluginHost) -> Guard:
    """A guard from a name, a `{"use": NAME, ...}` table or a Guard object (`load_spec`); its loop settings
    (`max_rewinds`) checked too."""
    guard_settings(spec)
    return cast(
        Guard,
        load_spec(spec, host, "guard", Guard, SETTINGS, "{'use': 'banned_strings', 'phrases': ['a testament to']}"),
    )


def _per_prompt(guards: Any, prompts: int) -> list[list[Any]]:
    """guards= as one list of specs per prompt: a list of specs (every prompt), or a list with one list (or None)
    per prompt."""
    if isinstance(guards, (str, Mapping, Guard)):
        guards = [guards]
    if not isinstance(guards, (list, tuple)):
        raise ConfigError(f"guards = {guards!r}: a list of guards (names, tables or Guard objects)")
    if guards and all(g is None or isinstance(g, (list, tuple)) for g in guards):
        if len(guards) != prompts:
            raise ConfigError(
                f"guards= lists {len(guards)} lists for {prompts} prompts: give one list per prompt (None for a "
                "prompt without guards), or one list of guards for all"
            )
        return [list(g or []) for g in guards]
    return [list(guards)] * prompts


def _of_chains(gen: Generation) -> list[list[Any]] | None:
    """The guards each prompt's chain names (a mixed batch: each prompt's own chain), or None when none does."""
    from ..engine.mixed import MixedChains

    chain = gen.chain
    if isinstance(chain, MixedChains):
        per_prompt = [list(chain.chains[k].config.guards) for k in chain.row_chains]
    else:
        per_prompt = [list(chain.config.guards)] * gen.num_prompts
    return per_prompt if any(per_prompt) else None


def load_guards(guards: Any, gen: Generation) -> list[list[tuple[Guard, int]]] | None:
    """Each prompt's guards with their `max_rewinds`, or None when no prompt has any: `guards=` as generate() takes
    it (None: each prompt's chain's `guards`; False: none), loaded and checked before any model call."""
    if guards is None:
        guards = _of_chains(gen)
    if guards is None or guards is False or (isinstance(guards, (list, tuple)) and not guards):
        return None
    specs = _per_prompt(guards, gen.num_prompts)
    if not any(specs):
        return None
    if gen.tokenizer is None:
        raise ConfigError(
            "guards= read the decoded text, which needs the tokenizer: pass tokenizer= to generate(), or drop guards="
        )
    loaded: dict[Any, Guard] = {}
    per_prompt: list[list[tuple[Guard, int]]] = []
    for i, row in enumerate(specs):
        guards_of_prompt = []
        for spec in row:
            try:
                limit = guard_settings(spec).get("max_rewinds", MAX_REWINDS)
                key = id(spec) if isinstance(spec, Guard) else repr(spec)
                if key not in loaded:
                    loaded[key] = load_guard(spec, gen.host)
            except ConfigError as exc:
                raise type(exc)(f"guards (prompt {i}): {exc}") from None
            guards_of_prompt.append((loaded[key], limit))
        per_prompt.append(guards_of_prompt)
    return per_prompt


def start_guards(per_row: Sequence[Sequence[tuple[Guard, Any]]], tokenizer: Any, request_ids: Sequence[str]) -> None:
    """Each guard object's `start`, with the rows that have it (row b: request `request_ids[b]`)."""
    rows = len(per_row)
    pieces = byte_table(tokenizer).pieces  # built once per tokenizer
    objects = {id(g): g for row in per_row for g, _ in row}
    for key, guard in objects.items():
        watched = tuple(b for b in range(rows) if any(id(g) == key for g, _ in per_row[b]))
        guard.start(rows, GuardContext(tokenizer, pieces, tuple(request_ids), watched))


def failed(guard: Guard, exc: Exception, where: str, outcome: str, stacklevel: int) -> str:
    """Warn that `guard` raised `exc` on `where` (a broken guard ends its row, never the batch); -> the finish
    reason it leaves."""
    reason = f"guard:{guard.name}:failed"
    warnings.warn(
        f"guard {guard.qualified_name()} failed on {where} ({type(exc).__name__}: {exc}); {outcome}, finish reason "
        f"'{reason}'",
        GenerationWarning,
        stacklevel=stacklevel,
    )
    return reason


class Guarding:
    """The guards of a generation's rows, their bans, saved states and rewind counts."""

    def __init__(self, per_row: Sequence[Sequence[tuple[Guard, int]]], gen: Generation) -> None:
        rows = len(per_row)
        self.guards = [list(g) for g in per_row]
        self.bans: list[dict[int, set[int]]] = [{} for _ in range(rows)]  # generated position -> banned ids
        self.saved: list[dict[int, Any]] = [{} for _ in range(rows)]  # position -> the request's state before it
        self.rewinds = torch.zeros(rows, dtype=torch.int64)
        self.used = [[0] * len(g) for g in per_row]  # rewinds per guard of the row
        self.ending: list[str | None] = [None] * rows  # a row out of rewinds (or whose guard failed): its reason
        start_guards(per_row, gen.tokenizer, gen.request_ids)

    @classmethod
    def prepare(cls, guards: Any, gen: Generation) -> Guarding | None:
        """The guards of a generation about to start, or None; refusals come here, before any model call. None
        takes each prompt's chain's `guards` (`ChainConfig.guards`); False runs none."""
        per_prompt = load_guards(guards, gen)
        if per_prompt is None:
            return None
        return cls([row for row in per_prompt for _ in range(gen.n)], gen)

    # ----------------------------------------------------------------- drawing
    def before_draw(self, gen: Generation, rows: Sequence[int], positions: Sequence[int], logits: torch.Tensor) -> None:
        """Rows about to draw at their generated `positions` (logits (len(rows), V), changed in place): each guarded
        row's state saved there, and its bans there applied."""
        for i, (b, at) in enumerate(zip(rows, positions)):
            if not self.guards[b]:
                continue
            self.saved[b][at] = gen.store.save_row(gen.request_ids[b])
            banned = self.bans[b].get(at)
            if banned:
                logits[i, list(banned)] = float("-inf")

    def check(self, gen: Generation, rows: Sequence[int], tokens_of: Any, final_of: Any) -> dict[int, int]:
        """After a draw: each guarded row's guards on its generated tokens. -> {row: the position it went back to}
        for the rows a guard took back (or ended)."""
        back: dict[int, int] = {}
        for b in rows:
            if not self.guards[b] or self.ending[b] is not None:
                continue
            tokens, final = tokens_of(b), final_of(b)
            for k, (guard, limit) in enumerate(self.guards[b]):
                try:
                    rewind = guard.check(b, tokens, final)
                    if rewind is not None and not isinstance(rewind, Rewind):
                        raise TypeError(f"check() returned {rewind!r}, not a Rewind or None")
                    if rewind is not None and not gen._steps <= int(rewind.token) < len(tokens):
                        raise ValueError(
                            f"Rewind to token {rewind.token}: tokens {gen._steps} to {len(tokens) - 1} can be taken "
                            "back (the earlier ones are committed: hold() did not hold them)"
                        )
                except Exception as exc:  # noqa: BLE001 - a broken guard ends its row, never the batch
                    self._failed(b, guard, exc)
                    back[b] = len(tokens)
                    break
                if rewind is None:
                    continue
                t = int(rewind.token)
                self.used[b][k] += 1
                if self.used[b][k] > limit:
                    self.ending[b] = f"guard:{guard.name}:{rewind.reason}"
                else:
                    self.rewinds[b] += 1
                    self.bans[b] = {p: ids for p, ids in self.bans[b].items() if p <= t}
                    self.bans[b].setdefault(t, set()).add(int(tokens[t]))
                    gen.store.load_row(gen.request_ids[b], self.saved[b][t])
                self.saved[b] = {p: s for p, s in self.saved[b].items() if p <= t}
                back[b] = t
                break
        return back

    def _failed(self, b: int, guard: Guard, exc: Exception) -> None:
        self.ending[b] = failed(guard, exc, f"row {b}", "the row ends with the tokens it has", stacklevel=7)

    def committable(self, gen: Generation, b: int, tokens: Sequence[int], final: bool) -> int:
        """How many of row b's drawn tokens (after its gen._steps committed ones) no guard may still take back."""
        drawn = len(tokens) - gen._steps
        if final or self.ending[b] is not None or not self.guards[b]:
            return drawn
        held = len(tokens)
        for guard, _ in self.guards[b]:
            try:
                hold = guard.hold(b, tokens)
                if isinstance(hold, bool) or not isinstance(hold, numbers.Integral):
                    raise TypeError(f"hold() returned {hold!r}, not a number of tokens")
            except Exception as exc:  # noqa: BLE001 - a broken guard ends its row, never the batch
                self._failed(b, guard, exc)
                return drawn  # the tokens its checks passed: the row ends with them
            held = min(held, int(hold))
        return max(0, min(drawn, held - gen._steps))

    def committed(self, b: int, position: int) -> None:
        """Position `position` of row b is committed: its saved state and bans are no longer needed."""
        self.saved[b].pop(position, None)
        self.bans[b].pop(position, None)

    # ----------------------------------------------------------------- checkpoints
    def checkpoint(self) -> dict[str, Any]:
        """Plain data: each row's bans, its request's saved states at the positions it drew past its last step
        (RNG position and sampler state), its rewind counts and why a row is ending."""

        def state(saved: Any) -> list[Any]:
            position, values = saved
            return [int(position), [[list(key), value.tolist()] for key, value in values.items()]]

        return {
            "bans": [[[p, sorted(ids)] for p, ids in sorted(row.items())] for row in self.bans],
            "saved": [[[p, state(s)] for p, s in sorted(row.items())] for row in self.saved],
            "rewinds": self.rewinds.tolist(),
            "used": [list(u) for u in self.used],
            "ending": list(self.ending),
        }

    def restore(self, saved: Mapping[str, Any]) -> None:
        rows = len(self.bans)
        if any(len(saved[key]) != rows for key in ("bans", "saved", "rewinds", "used", "ending")):
            raise ConfigError(f"resume: the checkpoint's guards are not for {rows} rows; the checkpoint is damaged")
        self.bans = [{int(p): {int(i) for i in ids} for p, ids in row} for row in saved["bans"]]
        self.saved = [
            {int(p): (torch.tensor(pos), {tuple(k): torch.tensor(v) for k, v in values}) for p, (pos, values) in row}
            for row in saved["saved"]
        ]
        self.rewinds = torch.tensor(saved["rewinds"], dtype=torch.int64)
        self.used = [[int(n) for n in u] + [0] * (len(g) - len(u)) for u, g in zip(saved["used"], self.guards)]
        self.ending = [None if e is None else str(e) for e in saved["ending"]]

    # ----------------------------------------------------------------- the speculation loop's hooks
    def generated(self, gen: Generation, spec: Any, b: int) -> list[int]:
        """Row b's generated tokens: committed, then drawn."""
        width = gen.attention_mask.shape[1]
        return gen.input_ids[b, width:].tolist() + [c.token for c in spec.pending[b]]

    def final(self, gen: Generation, spec: Any, b: int) -> bool:
        """Whether row b draws no more: a drawn token that stops it (an end-of-sequence token past its
        min_new_tokens), the length limit reached, or a draw past its drawn tokens that failed (`waiting`: a stop
        among them ends the row, or the generation fails at that position as without guards)."""
        return spec.waiting[b] or spec._drawn_all(gen, b, spec.stop_ids)

    def guard(self, gen: Generation, spec: Any, rows: Sequence[int]) -> set[int]:
        """Every guard of `rows` after a draw; the drawn tokens a rewind takes back are cut. -> the rows cut."""
        back = self.check(gen, rows, lambda b: self.generated(gen, spec, b), lambda b: self.final(gen, spec, b))
        for b, t in back.items():
            spec.drop(b, t - gen._steps)
        return set(back)

    def ready(self, gen: Generation, spec: Any, b: int) -> bool:
        """Whether row b has a drawn token no guard may take back."""
        if not spec.pending[b]:
            return False
        if not self.guards[b]:
            return True
        return self.committable(gen, b, self.generated(gen, spec, b), self.final(gen, spec, b)) > 0

    def drawing(self, gen: Generation, spec: Any, b: int) -> bool:
        """Whether row b must draw on although it has tokens waiting: none of them can be committed yet."""
        return bool(self.guards[b]) and self.ending[b] is None and not self.ready(gen, spec, b)

    def finish(self, gen: Generation, spec: Any) -> None:
        """End the rows a guard ended, once their tokens before the refused text are committed."""
        rows = [b for b, why in enumerate(self.ending) if why is not None and not spec.pending[b]]
        rows = [b for b in rows if not bool(gen.finished[b])]
        if rows:
            gen.end_rows(rows, [str(self.ending[b]) for b in rows])
