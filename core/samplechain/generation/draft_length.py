"""How many tokens each row drafts: the lengths that give the most tokens per unit of model work.

A drafted token the chain keeps saves a model call; one it does not keep costs the work of checking it. With a
row's acceptance `a` (the chance that a drafted token is kept once the ones before it were) and the cost `c` of
checking one more drafted token (a fraction of a model call's work per row), plus a step `s` that a call pays once
for having drafts at all, a draft of k tokens gives (1 - a^(k+1)) / (1 - a) tokens for 1 + s + c k of a call. Each
call picks the batch's draft lengths that maximise the
tokens per unit of work over all its rows (Dinkelbach's iteration for a ratio of sums), but for the length of a padded
batch's drafts (below):

- `a`, per row, in two parts, since acceptance comes in runs (a copied passage, then the model's own text): the
  chance that a draft's first token is kept after a miss or a call without a draft (entering a run), and that a
  token after a kept one is (staying in it). Each is the recency-weighted share of such checked positions that were
  kept (an older one weighing `_DECAY` per newer one; before any, 1/2 weighing one). A draft's first token takes the
  second rate where the row's last checked token was kept. Where the drafter names the kind of its next draft
  (Drafter.expect: prompt lookup's match length), the first rate is kept per kind, begun at the drafter's prior;
- `c` and `s`: timed. Each model call's time is fitted, recency-weighted, as alpha + beta F + step D, F the tokens
  the call runs (each row's newest token and its own draft on a runner that feeds rows their own tokens, every row as
  wide as the widest on one that pads them (`ModelRunner.pads_rows`) or advances rows together), D whether any row
  drafted: a many-token pass where the call would run one token a row can cost a step more than its tokens, or
  nothing where the host multiplies a few rows as fast as one (the transformers runner's checks on a CPU). The recency
  runs apart for calls with drafts and without (each group's weight falls with its own newer calls, slowly with the
  other group's), so that the calls of a long rest do not wash out what a draft was timed to cost. A drafter's own
  time per drafted token (a draft model's passes) adds to c. A draft table's `cost` fixes c, and no step, instead
  (the same drafts on every machine). On a runner whose calls' time steps up (`ModelRunner.stepped_widths`), each
  length of a call of one row is priced instead at what the calls of its width (F) were timed to take
  (recency-weighted), drawn toward the price of the next narrower width where a width was timed seldom, never or long
  ago: where the time is not linear in F (the transformers runner on a CPU multiplies up to four tokens about as fast
  as one, and five take a third more), a row drafts the tokens that come at one token's price even at a low
  acceptance, and stops short of the step unless acceptance pays for it. A width not yet timed is priced as the
  narrower ones, so it is tried once. What a width costs is the model's on this machine, not the text's: the
  generations of one model in a process share these prices (`width_prices`), so that a generation does not try every
  width anew, on drafts that mostly miss; and a runner may keep them, as ratios to a one-token call, for the next
  process on the machine (`ModelRunner.keep_widths`), which prices a width it has not timed by its kept ratio.

A padded batch (every row fed as many tokens as the widest) drafts one length for all its rows, and calls until its
slowest row is done: a length that gives the most tokens a call may gain only rows that finish early anyway, while
every call pays its columns. So where its rows draft, the length is the one with which the calls would take the least
time until every row has its tokens, were each call to draft it (`_finishing`): each row needs its tokens left over
what a call gives it calls, and a call costs the fit's time for the rows still going. The fit's step may be negative
there: a call with drafts can cost less than the line through the plain steps (a few-row product that runs faster
than the model's own).

Drafting at all costs a little more than its tokens (the drafter's call, a pass over several tokens): a draft must
gain 5% of a row's call more than its tokens cost. Where no draft pays, a row rests, then drafts again (a probe) to
measure its acceptance: as long a draft as would pay were the row entering runs at the prior rate (one token where
each drafted token costs; long where the step costs the most, as a long probe costs little more and can keep a run
whole). Where the drafter names the kind of the draft at hand, the prior is that kind's where it is lower, and a
draft that would not pay even at it is no probe: the rest goes on as long again (prompt lookup's one-token matches,
which begin a run about one time in six, are not probed where a drafted token costs 0.4-0.5 of a step). The rests
double while the probes miss. Both the first rest and the longest scale with what a one-token probe
costs: the first makes it about 5% of the calls' work, the longest about 1% (at most 64 calls; on a padded batch a
probe widens every row); a rest after a missed probe is at least the first rest at the cost as timed by then (the
first rests come before any draft was timed). Where every row is fed as many tokens as the widest (a padded batch,
rows advancing together), a resting row drafts as wide as the call for free, unless its drafter's own time per
token counts (a draft model): a kept token ends its rest, a miss leaves it. A row's first draft of a kind the
drafter expects kept more often than not is as long as it can be (a probe), on a call of one row. With
`adaptive = false` a row always drafts its drafter's `num_tokens`.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["DraftLengths", "width_prices"]

_DECAY = 0.95  # weight of a trial per newer trial: about the last 20 checked positions count
_PRIOR = 0.5  # acceptance before any trial, weighing as one trial
_FIT_DECAY = 0.9  # weight of a timed call per newer call of its group (with drafts or without): about the last 10
_OTHER_DECAY = 0.99  # ... and per newer call of the other group: the calls with drafts before a rest of 70 count half
_COST = 0.25  # c until calls of different widths have been timed
_PRIOR_SPREAD = 0.5  # how much the prior slope weighs in the fit, as a sum of squared deviations of F (tokens^2)
_STEP_SPREAD = 0.1  # how much "no step" weighs in the fit, as calls
_PROBE_SHARE = 0.01  # rests grow until a probe costs about this share of the calls' work
_FIRST_SHARE = 0.05  # a row's first rest is long enough that a probe after it costs about this share
# what drafting at all adds to a row's call (a share of it) beyond its drafted tokens: the drafter's call, a pass over
# several tokens instead of one; a draft must gain more than this
_OVERHEAD = 0.05
_LONGEST_PAUSE = 64  # the most calls a row whose probes miss rests
_WIDTH_DECAY = 0.8  # weight of a timed call of one width (F) per newer call of that width
_WIDTH_FORGET = 0.99  # ... and per newer call of another width: a width not run for ~70 calls counts half
_WIDTH_PRIOR = 1.0  # the next narrower width's price weighs in a width's as this many calls of it


# model -> F -> [recency-weighted seconds, weight] of its calls that ran F tokens, shared by its generations
_prices: weakref.WeakKeyDictionary[Any, dict[int, list[float]]] = weakref.WeakKeyDictionary()


def width_prices(model: Any) -> dict[int, list[float]]:
    """The record of what `model`'s calls of each width (F tokens) were timed to take in this process, shared by its
    generations (`DraftLengths.widths`); a record of its own for a model that cannot be weakly referenced."""
    try:
        return _prices.setdefault(model, {})
    except TypeError:
        return {}


class DraftLengths:
    """Per-row acceptance, rests and probes, and the timed cost of a drafted token.

    `longest`: each row's longest draft (its drafter's num_tokens); `fixed`: rows that always draft it; `cost`: per
    row, a fixed c or None (timed); `shape`: how a call's work grows with its drafts, "rows" (each row its own
    tokens), "padded" (every row as wide as the widest) or "together" (every row the batch's shortest draft)."""

    def __init__(self, longest: Sequence[int], fixed: Sequence[bool], cost: Sequence[float | None], shape: str):
        rows = len(longest)
        self.longest, self.fixed, self.cost, self.shape = list(longest), list(fixed), list(cost), shape
        # per row, recency-weighted kept / checked positions: [0] a draft's first position after a miss or a call
        # without a draft (entering a run), [1] a position after a kept one (staying in it)
        self.keeps = [[0.0, 0.0] for _ in range(rows)]
        self.trials = [[0.0, 0.0] for _ in range(rows)]
        self.streak = [False] * rows  # the row's last checked position was kept
        self.pause = [0] * rows  # calls a row rests after a probe missed (doubling while they miss)
        self.idle = [0] * rows  # calls the row still rests
        self.probing = [False] * rows  # rows whose current draft is a probe
        self.riding = [False] * rows  # resting rows drafting this call because its width is paid for anyway
        # per row, the kinds of draft its drafter told apart (Drafter.expect): kind -> [kept, checked, prior] of a
        # draft's first position entering a run; and the kind of the row's current draft
        self.kinds: list[dict[str, list[float]]] = [{} for _ in range(rows)]
        self.kind: list[str | None] = [None] * rows
        # recency-weighted sums over timed calls of x x^T and x t, x = (1, F, whether the call had drafts), apart for
        # calls without drafts [0] and with them [1]: each decays with the calls of its own group, and slowly with the
        # other group's, so that what a draft costs is not forgotten over the plain calls of a rest
        self._xx = [[[0.0] * 3 for _ in range(3)] for _ in range(2)]
        self._xt = [[0.0] * 3 for _ in range(2)]
        self._drafting = 0.0  # seconds a drafter takes per drafted token (recency-weighted)
        # F -> [recency-weighted seconds, weight] of the calls that ran F tokens: what a width costs where the time
        # is not linear in F (a runner that multiplies up to a few tokens as fast as one, then steps up); the
        # model's record (width_prices) where the loop gives it
        self.widths: dict[int, list[float]] = {}
        # F -> what a call of F tokens took against a one-token call, as an earlier process on the machine timed it
        # (ModelRunner.kept_widths): the price of a width this process has not timed yet
        self.kept: dict[int, float] = {}
        self.per_width = False  # price a call of one row per width (ModelRunner.stepped_widths)
        self._first_pause = 1  # a row's first rest: longer where a probe costs more
        self._longest_pause = 4  # the longest rest

    # ----------------------------------------------------------------- state
    def checkpoint(self) -> dict[str, Any]:
        return {
            "keeps": [list(k) for k in self.keeps],
            "trials": [list(t) for t in self.trials],
            "streak": list(self.streak),
            "pause": list(self.pause),
            "idle": list(self.idle),
            "probing": list(self.probing),
            "kinds": [{k: list(v) for k, v in kinds.items()} for kinds in self.kinds],
        }

    def restore(self, saved: dict[str, Any]) -> None:
        rows = len(self.keeps)
        for key in ("keeps", "trials", "streak", "pause", "idle", "probing", "kinds"):
            if key in saved and len(saved[key]) != rows:
                raise ValueError(f"lengths[{key!r}] holds {len(saved[key])} rows, not {rows}")
        counts = {
            key: [[float(x) for x in pair] for pair in saved.get(key, getattr(self, key))]
            for key in ("keeps", "trials")
        }
        whole = {key: [int(x) for x in saved.get(key, getattr(self, key))] for key in ("pause", "idle")}
        kinds = [{str(k): [float(x) for x in v] for k, v in row.items()} for row in saved.get("kinds", self.kinds)]
        for key, rows_of in (*counts.items(), ("kinds", [v for row in kinds for v in row.values()])):
            bad = [pair for pair in rows_of if len(pair) != (3 if key == "kinds" else 2) or not _counts(pair)]
            if bad:  # the acceptance estimates divide by these
                raise ValueError(f"lengths[{key!r}] holds {bad[0]}, not counts (numbers >= 0)")
        if any(x < 0 for row in whole.values() for x in row):
            raise ValueError(f"lengths['pause'] / lengths['idle'] hold a negative count: {whole}")
        self.keeps, self.trials, self.pause, self.idle = (
            counts["keeps"],
            counts["trials"],
            whole["pause"],
            whole["idle"],
        )
        self.streak = [bool(x) for x in saved.get("streak", self.streak)]
        self.probing = [bool(x) for x in saved.get("probing", self.probing)]
        self.kinds = kinds

    def acceptance(self, row: int) -> tuple[float, float]:
        """(the chance that the next draft's first token is kept, that a token after a kept one is)."""
        keeps, trials = self.keeps[row], self.trials[row]
        then = (keeps[1] + _PRIOR) / (trials[1] + 1.0)
        if self.streak[row]:
            return then, then
        kind = self.kind[row]
        if kind is not None:  # entering a run with a draft of a kind the drafter tells apart
            kept, checked, prior = self.kinds[row][kind]
            return (kept + prior) / (checked + 1.0), then
        return (keeps[0] + _PRIOR) / (trials[0] + 1.0), then

    # ----------------------------------------------------------------- observing
    def checked(self, row: int, kept: bool) -> None:
        """One drafted position of `row` checked: kept or not."""
        state = 1 if self.streak[row] else 0
        kind = self.kind[row]
        if not state and kind is not None:
            record = self.kinds[row][kind]
            record[0], record[1] = _DECAY * record[0] + kept, _DECAY * record[1] + 1.0
        self.kind[row] = None  # the draft's later positions follow a kept one
        self.keeps[row][state] = _DECAY * self.keeps[row][state] + kept
        self.trials[row][state] = _DECAY * self.trials[row][state] + 1.0
        self.streak[row] = kept
        if self.riding[row]:  # a free draft of a resting row: a kept one ends the rest, a missed one costs nothing
            self.riding[row] = False
            if kept:
                self.idle[row] = 0
        elif self.probing[row]:
            self.probing[row] = False
            if not kept:
                # doubling, and at least the first rest as it stands now: a rest begun while the fit knew little of
                # what a probe costs (the first calls, before any draft was timed) grows to it
                pause = self.pause[row]
                self.pause[row] = min(max(2 * pause, self._first_pause) if pause else 1, self._longest_pause)
                self.idle[row] = self.pause[row]

    def undrafted(self, row: int) -> None:
        """A call of `row` without a draft: its next draft starts a run."""
        self.streak[row] = False

    def timed(self, tokens: int, seconds: float, drafts: bool = False) -> None:
        """A model call that ran `tokens` tokens (F) took `seconds`; `drafts`: some row of it had a draft."""
        own = int(drafts)
        for group, (xx, xt) in enumerate(zip(self._xx, self._xt)):
            decay = _FIT_DECAY if group == own else _OTHER_DECAY
            for i in range(3):
                xt[i] *= decay
                for j in range(3):
                    xx[i][j] *= decay
        if self.per_width:  # what was timed long ago counts less, a width's own newer calls the most
            for width, record in list(self.widths.items()):  # a copy: another thread's generation may add a width
                decay = _WIDTH_DECAY if width == tokens else _WIDTH_FORGET
                record[0], record[1] = decay * record[0], decay * record[1]
            record = self.widths.setdefault(tokens, [0.0, 0.0])
            record[0], record[1] = record[0] + seconds, record[1] + 1.0
        x = (1.0, float(tokens), float(drafts))
        xx, xt = self._xx[own], self._xt[own]
        for i in range(3):
            xt[i] += x[i] * seconds
            for j in range(3):
                xx[i][j] += x[i] * x[j]

    def work(self, feeds: Sequence[int], held: int) -> int:
        """The tokens (F) a call runs that feeds its rows `feeds` tokens each: their sum, or on a padded batch (and
        rows advancing together) every one of the `held` rows as wide as the widest feed."""
        return sum(feeds) if self.shape == "rows" else held * max(feeds)

    def drafted(self, tokens: int, seconds: float) -> None:
        """A drafter proposed `tokens` tokens in `seconds`."""
        if tokens:
            self._drafting = 0.5 * self._drafting + 0.5 * seconds / tokens if self._drafting else seconds / tokens

    # ----------------------------------------------------------------- deciding
    def limits(
        self,
        rows: Sequence[int],
        room: Sequence[int],
        width: int,
        held: int,
        expect: Callable[[int], tuple[str, float] | None] | None = None,
    ) -> dict[int, int]:
        """The draft length of each of `rows` (rows with a drafter) this call, at most its `room`; `width`: the rows
        the call runs, `held`: the rows the runner holds (a padded call runs them all); `expect(row)`: the kind of
        draft the row's drafter would give and its chance that the first token is kept (Drafter.expect), or None;
        asked only of rows whose length follows their record (not of resting rows)."""
        out = dict.fromkeys(rows, 0)
        free: list[int] = []
        ceilings: list[int] = []
        self.riding = [False] * len(self.riding)
        for b, r in zip(rows, room):
            self.kind[b] = None
            if r <= 0:
                continue
            if self.fixed[b]:
                out[b] = min(self.longest[b], r)
            elif self.idle[b]:
                self.idle[b] -= 1
            else:
                free.append(b)
                ceilings.append(min(self.longest[b], r))
                self.probing[b] = False
                self._expected(b, None if expect is None else expect(b))
        if not free:
            return out
        unit, step = self._unit(width, held)
        fixed = [self.cost[b] for b in free]
        costs = [unit if c is None else c for c in fixed]
        step = step if all(c is None for c in fixed) else 0.0  # a fixed cost stands for the whole of a draft's cost
        # a padded probe widens every row
        probe = max(costs) * (1 if self.shape == "rows" else width) + step
        self._longest_pause = min(max(4, math.ceil(probe / _PROBE_SHARE)), _LONGEST_PAUSE)
        self._first_pause = min(max(1, round(probe / _FIRST_SHARE)), self._longest_pause)
        rates = [self.acceptance(b) for b in free]
        lengths = self._best(rates, costs, ceilings, width, step)
        if self.shape == "padded" and width > 1 and all(c is None for c in fixed):
            common = self._finishing(dict(zip(free, zip(rates, ceilings))), rows, room, held)
            if common is not None:  # whether a row drafts at all stays its record's call (rests, probes)
                lengths = [min(max(common, 1), top) if k else 0 for k, top in zip(lengths, ceilings)]
        if width == 1 and fixed == [None] and self.per_width:
            lengths = [self._one_row(rates[0], ceilings[0], held, lengths[0])]
        for i, (b, k) in enumerate(zip(free, lengths)):
            if self._hopeful(b, width):
                out[b], self.probing[b] = ceilings[i], True
            elif k:
                out[b], self.pause[b] = k, 0
            elif self.pause[b]:  # back from a rest: probe, unless the draft at hand would not pay even at its prior
                probe = self._probe(b, rates[i], costs[i], ceilings[i], width, step)
                if probe:
                    out[b], self.probing[b] = probe, True
                else:  # the rest goes on as long again (nothing was measured: it does not double)
                    self.idle[b] = self.pause[b]
            else:  # no draft now: rest, then probe
                self.pause[b] = self.idle[b] = self._first_pause
        if self.shape != "rows":
            self._ride(out, rows, room, held)
        return out

    def _finishing(
        self, free: dict[int, tuple[tuple[float, float], int]], rows: Sequence[int], room: Sequence[int], held: int
    ) -> int | None:
        """A padded batch's common draft length: the M with which the calls take the least time until every row has
        its tokens, were every call to draft M. A row needs its tokens left over what a call gives it (its own and
        the kept ones, at its acceptance; a resting row its own) calls, and a call costs what the fit says of the
        rows still going then, each padded to 1 + M tokens. The batch calls until its slowest row is done, so a
        longer draft that gains only rows that finish early anyway costs every call its width, while drafts that
        let most rows finish early leave the slow ones cheaper calls. `free`: each drafting row's acceptance and
        longest draft. None before any call was timed."""
        fit = self._fitted(signed=True)
        if fit is None:
            return None
        alpha, beta, step = fit
        going = [(b, r + 1) for b, r in zip(rows, room) if r >= 0]
        others = held - len(going)  # held rows that do not call this time (waiting): padded all the same
        best, best_m = math.inf, 0
        for m in range(max((top for _, top in free.values()), default=0) + 1):
            calls = sorted(
                n / (1.0 + _kept(free[b][0], min(m, free[b][1]))) if m and b in free else float(n) for b, n in going
            )
            total, before = 0.0, 0.0
            for i, needed in enumerate(calls):
                rows_now = len(calls) - i + others  # the rows still going, each padded to 1 + m tokens
                seconds = alpha + beta * rows_now * (1 + m)
                if m:
                    seconds += step + _OVERHEAD * (alpha + beta * rows_now) + self._drafting * rows_now * m
                total += (needed - before) * max(seconds, 0.1 * alpha)
                before = needed
            if total < best * (1 - 1e-9):
                best, best_m = total, m
        return best_m

    def _ride(self, out: dict[int, int], rows: Sequence[int], room: Sequence[int], held: int) -> None:
        """Where every row is fed as many tokens as the widest (or the batch's shortest draft), a row that does not
        draft this call drafts as far as the widest for free (its positions are run either way; on rows advancing
        together, a row without a draft would stop every row's): unless drafting costs more than a lookup."""
        widest = max(out.values(), default=0)
        if not widest:
            return
        fit = self._fitted()
        if fit is None or self._drafting * held > _OVERHEAD * (fit[0] + fit[1] * held):
            return
        for b, r in zip(rows, room):
            if not out[b] and r > 0 and self.longest[b]:
                out[b], self.riding[b] = min(widest, r, self.longest[b]), True

    def _one_row(self, rate: tuple[float, float], ceiling: int, held: int, linear: int) -> int:
        """A call of one row: the draft length that gives the most tokens per second, each length priced at what
        calls of its width take (`_priced`), so that on a runner whose time is flat for a few tokens and then steps up
        a row drafts the flat width's tokens at little more than a one-token call's price; `linear`, the fit's choice,
        before any call was timed."""
        fit = self._fitted()
        if fit is None:
            return linear
        widths = [self.work([1 + k], held) for k in range(ceiling + 1)]
        priced = self._priced(widths[-1], fit, widths[0])
        best, best_k = 1.0, 0
        plain = priced[widths[0]]
        for k in range(1, ceiling + 1):
            seconds = priced[widths[k]] + self._drafting * k
            value = (1 + _kept(rate, k)) * plain / (seconds + _OVERHEAD * plain)
            if value > best:
                best, best_k = value, k
        return best_k

    def _priced(self, widest: int, fit: tuple[float, float, float], plain: int) -> list[float]:
        """What a call of F = 0 ... `widest` tokens takes: each width's timed calls, drawn toward the price of the next
        narrower one (weighing _WIDTH_PRIOR calls; the narrowest toward the fitted price of a call of `plain` tokens,
        `fit` being (alpha, beta, step)), or toward its kept ratio to a one-token call (`kept`) where an earlier
        process timed it, at most the fitted line's price of a call with drafts (a kept ratio that one slow call
        inflated would otherwise keep its width from being tried, and so timed again, in every later process). A
        width never timed, or not for long, is priced as the narrower ones, optimistically, so it is tried: a call of
        more tokens rarely takes less time, and one slow call does not price a width out for good."""
        alpha, beta, step = fit
        out: list[float] = []
        price = max(alpha + beta * plain, 1e-12)
        for width in range(widest + 1):
            seconds, weight = self.widths.get(width, (0.0, 0.0))
            if width in self.kept and width > 1:
                prior = min(self.kept[width] * out[1], alpha + beta * width + step)
            else:
                prior = price
            price = _drawn(prior, seconds, weight)
            out.append(price)
        return out

    def width_ratios(self) -> dict[int, float]:
        """What the calls of each width of two tokens or more take against a one-token call, for the widths timed
        lately enough to count (weighing half a call or more), drawn toward their kept ratio as `_priced` draws
        them (one process's few calls of a width, on a noisy host, move it part of the way): what a next process
        keeps."""
        seconds, weight = self.widths.get(1, (0.0, 0.0))
        if weight < 1 or seconds <= 0:
            return {}
        one = seconds / weight
        out: dict[int, float] = {}
        for f, (s, w) in sorted(self.widths.items()):
            if f > 1 and w >= 0.5 and s > 0:
                out[f] = (_drawn(self.kept[f] * one, s, w) if f in self.kept else s / w) / one
        return out

    def _expected(self, row: int, expected: tuple[str, float] | None) -> None:
        """The kind of the row's next draft (a prior in [0, 1], drafting.expected_kind); a kind's record begins at
        the drafter's prior."""
        if expected is not None:
            self.kinds[row].setdefault(expected[0], [0.0, 0.0, expected[1]])
        self.kind[row] = None if expected is None else expected[0]

    def _hopeful(self, row: int, width: int) -> bool:
        """A row's first draft, of a kind its drafter expects kept more often than not: as long as it can be (a
        run kept whole at once; it also times a wide call, which the fit otherwise extrapolates), a probe if it
        misses. Only on a call of one row: in a batch it would widen the other rows (a padded batch) or make a call
        that could have been the plain step a checking one for every row; there it drafts by its record."""
        kind = self.kind[row]
        return width == 1 and kind is not None and not any(self.trials[row]) and self.kinds[row][kind][2] > 0.5

    def _probe(self, row: int, rate: tuple[float, float], cost: float, ceiling: int, width: int, step: float) -> int:
        """A probe's length: the draft that would pay if the row entered runs at the prior rate (where the step
        costs much more than a drafted token, a long probe costs little more than one token and can keep a run
        whole); at least one token. Where the drafter names the draft's kind, the prior is that kind's where it is
        lower, and a draft that would not pay even then is no probe (0; the module's docstring says why)."""
        kind = self.kind[row]
        prior = _PRIOR if kind is None else min(self.kinds[row][kind][2], _PRIOR)
        length = self._best([(max(rate[0], prior), rate[1])], [cost], [ceiling], width, step)[0]
        return length if kind is not None else max(length, 1)

    def _best(
        self, rates: list[tuple[float, float]], costs: list[float], ceilings: list[int], width: int, step: float
    ) -> list[int]:
        """The rows' draft lengths that give the most tokens per work, for how the runner feeds its rows."""
        if self.shape == "rows":
            return _per_row(rates, costs, ceilings, width, step)
        return _common(rates, costs, ceilings, width, step, self.shape == "together")

    def _unit(self, width: int, held: int) -> tuple[float, float]:
        """(c, s) timed, per row of the call without drafts: c the work a drafted token adds (where the call pads, a
        drafted position of every row, shared by its rows), s what a call pays once for having drafts at all (a
        many-token pass where a row's call would run one token: other kernels, on some engines a step up)."""
        fit = self._fitted()
        if fit is None:
            return _COST, 0.0
        alpha, beta, step = fit
        if self.shape == "rows":  # a call feeding each of its rows one token; a drafted token of one row
            call = max(alpha + beta * width, 1e-12)  # calls timed at 0 s (a coarse clock): no division by 0
            return (beta + self._drafting) * width / call, step * width / call
        call = max(alpha + beta * held, 1e-12)  # every held row is as wide as the widest
        return (beta * held + self._drafting * width) / call, step * width / call

    def _fitted(self, signed: bool = False) -> tuple[float, float, float] | None:
        """(alpha, beta, step) of t = alpha + beta F + step [the call had drafts], recency-weighted least squares;
        beta drawn toward the prior (c = _COST) and the step toward none while the calls tell them little. None
        before any call was timed."""
        (plain, drafted), (plain_t, drafted_t) = self._xx, self._xt
        xx = [[p + d for p, d in zip(p_row, d_row)] for p_row, d_row in zip(plain, drafted)]
        xt = [p + d for p, d in zip(plain_t, drafted_t)]
        w = xx[0][0]
        if w <= 0:
            return None
        prior = _COST * xt[0] / max(xx[0][1], w)  # beta with c = _COST: the mean time per mean token, times c
        a = [row[:] for row in xx]
        rhs = xt[:]
        a[1][1] += _PRIOR_SPREAD
        rhs[1] += _PRIOR_SPREAD * prior
        a[2][2] += _STEP_SPREAD
        solved = _solve3(a, rhs)
        mt = xt[0] / w
        if solved is None:
            return max(mt - prior * xx[0][1] / w, 0.1 * mt), prior, 0.0
        alpha, beta, step = solved
        return max(alpha, 0.1 * mt), max(beta, 0.0), step if signed else max(step, 0.0)


def _drawn(prior: float, seconds: float, weight: float) -> float:
    """A width's timed calls (`seconds` summed, recency-weighted to `weight` calls) drawn toward `prior`, which weighs
    _WIDTH_PRIOR calls."""
    return (_WIDTH_PRIOR * prior + seconds) / (_WIDTH_PRIOR + weight)


def _solve3(a: list[list[float]], b: list[float]) -> tuple[float, float, float] | None:
    """x with a x = b for a 3 x 3 system (Cramer's rule); None where a is singular."""

    def det(m: list[list[float]]) -> float:
        return (
            m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1])
            - m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0])
            + m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0])
        )

    d = det(a)
    if abs(d) < 1e-12 * max(1.0, abs(a[0][0] * a[1][1] * a[2][2])):
        return None
    cols = []
    for i in range(3):
        m = [row[:] for row in a]
        for r in range(3):
            m[r][i] = b[r]
        cols.append(det(m) / d)
    return cols[0], cols[1], cols[2]


def _kept(rate: tuple[float, float], k: int) -> float:
    """Expected kept tokens of a k-token draft: first (1 + then + ... + then^(k-1))."""
    first, then = rate
    return first * (1 - then**k) / (1 - then) if then < 1 else first * k


def _per_row(
    rates: list[tuple[float, float]], costs: list[float], ceilings: list[int], width: int, step: float
) -> list[int]:
    """Rows feeding their own tokens: the lengths that maximise (width + kept) / (width + step + sum of c k), the
    step paid once where any row drafts."""
    ratio, none = 1.0, [0] * len(rates)
    lengths = none
    for _ in range(32):  # Dinkelbach: each round's ratio is higher until the choice repeats
        chosen, surplus = [], 0.0
        for a, c, top in zip(rates, costs, ceilings):
            k = _longest_above(a, ratio * c, top)  # the best draft, if the row drafts at all
            gain = _kept(a, k) - ratio * (c * k + _OVERHEAD) if k else 0.0
            chosen.append(k if gain > 0 else 0)
            surplus += max(gain, 0.0)
        if surplus <= ratio * step:  # what the drafts gain does not pay the call's step
            break
        gained = width + sum(_kept(a, k) for a, k in zip(rates, chosen))
        work = width + step + sum(c * k + _OVERHEAD for c, k in zip(costs, chosen) if k)
        if gained / work <= ratio + 1e-12:
            break
        lengths, ratio = chosen, gained / work
    return lengths


def _longest_above(rate: tuple[float, float], bar: float, top: int) -> int:
    """The k <= top whose positions all pay: each one's chance of being reached and kept is above the bar."""
    k, p = 0, rate[0]
    while k < top and p > bar:
        k, p = k + 1, p * rate[1]
    return k


def _common(
    rates: list[tuple[float, float]], costs: list[float], ceilings: list[int], width: int, step: float, together: bool
) -> list[int]:
    """Rows padded to one width (together: each row drafting the batch's shortest draft, a row going on only while
    every row's token was kept): the width M that maximises tokens per work; each row drafts up to M."""
    best, best_m = 1.0, 0
    gained, work = float(width), float(width)
    reach = [first for first, _ in rates]  # each row's chance of keeping its draft up to position m
    per_position = max(costs) * width
    work += _OVERHEAD * width + step
    for m in range(1, max(ceilings) + 1):
        if together:
            if m > min(ceilings):
                break
            gained += width * math.prod(reach)
        else:
            gained += sum(p for p, top in zip(reach, ceilings) if m <= top)
        reach = [p * then for p, (_, then) in zip(reach, rates)]
        work += per_position
        if gained / work > best:
            best, best_m = gained / work, m
    return [min(best_m, top) for top in ceilings]


def _counts(values: list[float]) -> bool:
    return all(math.isfinite(x) and x >= 0 for x in values)
