"""Speculative decoding, `Generation(..., draft=...)`: in mode match (the default) it never changes the tokens.

A drafter (samplechain.drafters) guesses the next tokens of each row; one model call (`runner.extend_rows`, or
`extend` where rows advance together) gives the logits at every guessed position; the chain then samples those
positions one by one as the plain loop samples its steps (the same store, seeds, history, stopping criteria). In the
`match` mode a guess is kept only when the chain's own draw at its position equals it, so a seeded or greedy request
gives the tokens it gives without a drafter, whatever the chain; `rejection` keeps it with probability min(1, p/q).
A row's drawn tokens wait until every unfinished row has one, then go out together as one step; each row's cache is
cut back to its drawn tokens but the newest, which its next call feeds. A call where no row drafts and every row
waits on it is the plain loop's step. The draft lengths: draft_length.py.

A multi-token pass equals one-token steps up to float32 summation order on transformers (about 1e-5 on the logits)
and bit for bit on llama.cpp with flash attention (docs/speculative.md, "Numerics"): a draw that such a difference
flips is the only way the tokens can differ from a generation without a drafter.
"""

from __future__ import annotations

import functools
import time
import warnings
import weakref
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import torch

from ..drafters import DraftContext, Drafter, draft_settings
from ..errors import ConfigError, GenerationWarning
from ..models import load_model
from ..runners import ModelRunner
from .draft_length import DraftLengths, width_prices
from .drafting import (
    check_forkable,
    checked_mode,
    drafter_state,
    expected_kind,
    load_drafter,
    longest_draft,
    params_key,
    proposal_tensors,
    stop_ids,
    vocab_of,
)
from .drawing import Checked, Drawing, Drawn
from .guarding import Guarding
from .guided import GuidedRunner, unconditional_of
from .model import runner_for
from .outputs import GenerationOutput, ordinary
from .rejection import rejection_draw

if TYPE_CHECKING:
    from .session import Generation

__all__ = ["Speculation", "load_drafter", "rejection_draw"]


class Speculation(Drawing):
    """A generation's drafter and its per-row counts: `drafted` tokens sent to the model, `kept` (drafted tokens
    that came out), `model_calls` (forward passes that produced the row's tokens, the prefill included)."""

    def __init__(
        self,
        drafters: Sequence[Drafter | None],
        gen: Generation,
        *,
        mode: str | Sequence[str] = "match",
        adaptive: bool | Sequence[bool] = True,
        cost: Sequence[float | None] | None = None,
        guarding: Guarding | None = None,
    ) -> None:
        rows = len(drafters)
        modes = [mode] * rows if isinstance(mode, str) else list(mode)
        # per row: the mode's test
        self.rejection = [checked_mode(m, gen, b) == "rejection" for b, m in enumerate(modes)]
        self.drafters = list(drafters)
        self.guarding = guarding  # guards that take text back (guarding.py); None: none
        self._guard_cut: set[int] = set()  # rows a guard took back in the current call
        # per row (plain ints: a step's bookkeeping stays off the tensor library)
        self.drafted, self.kept, self.model_calls = [0] * rows, [0] * rows, [0] * rows
        self.off = [d is None for d in drafters]  # rows without drafts (none asked, or their drafter failed)
        # each row's draft length: chosen per call up to its drafter's longest (num_tokens), or fixed at it
        self.lengths = DraftLengths(
            [longest_draft(d) if d is not None else 0 for d in drafters],
            [not adaptive] * rows if isinstance(adaptive, bool) else [not a for a in adaptive],
            [None] * rows if cost is None else list(cost),
            "rows",
        )
        self.pending: list[list[Drawn]] = [[] for _ in range(rows)]  # drawn, not yet committed, per row
        self.q: list[torch.Tensor | None] = [None] * rows  # the current draft's probabilities (rejection mode)
        self._fed: list[int] = []
        self.released = [False] * rows  # rows handed to the runner's release
        # the generation's runner while `run` runs it (weak: the cache goes when the generation's loop ends)
        self._runner: weakref.ref[ModelRunner] | None = None
        self.told = [False] * rows  # rows whose drafter heard they are done (`Drafter.finish`)
        # rows whose draw ahead of their committed tokens failed: they draw again once those are committed (drawing.py)
        self.waiting = [False] * rows
        self.stop_ids: set[int] = set()  # the ids that end a row (past min_new_tokens), once the run begins
        self._prompts: list[int] = []  # each row's prompt length, once the run begins
        self._positions: list[int] | None = None  # each row's positions past its prompt (None: the model states none)
        size = getattr(gen.model.config, "vocab_size", None)
        context = DraftContext(
            model=gen.model,
            tokenizer=gen.tokenizer,
            chain=gen.chain,
            store=gen.store,
            request_ids=tuple(gen.request_ids),
            vocab_size=int(size) if isinstance(size, int) else 0,
            device=gen.input_ids.device,
            runner_for=functools.partial(runner_for, host=gen.host),
            load_model=load_model,
            generation_runner=self._generation_runner,
        )
        for drafter in self._distinct():
            try:
                drafter.start(rows, context)
            except ConfigError:  # bad input (a draft model of another vocabulary): one error before generation
                raise
            except Exception as exc:  # noqa: BLE001 - a drafter's failure costs speed, never tokens
                self._switch_off([b for b, d in enumerate(self.drafters) if d is drafter], drafter, exc)

    @classmethod
    def prepare(cls, draft: Any, gen: Generation, guards: Any = None) -> Speculation | None:
        """The speculation of a generation about to start, or None when no row drafts; refusals come here, before
        any model call.

        `draft`: one drafter for every prompt, a list with one per prompt (None: that prompt does not draft), False
        for none; None takes each prompt's chain's `[draft]` table (`ChainConfig.draft`; a mixed batch: each
        prompt's own chain). A prompt's drafter serves its num_return_sequences rows; rows whose drafters are the
        same (the same object, or the same drafter and parameters) share one Drafter object, which drafts them
        together. With guards (guarding.py) the loop runs even where no row drafts: it draws a guarded row's tokens
        ahead of what it commits."""
        guarding = Guarding.prepare(guards, gen)
        if guarding is not None:
            check_forkable(gen.chain, gen.logits_processor, "guards=")
        alone = None if guarding is None else cls([None] * len(gen.request_ids), gen, guarding=guarding)
        if draft is False:
            return alone
        per_prompt = isinstance(draft, (list, tuple))
        if draft is None:
            from ..engine.mixed import MixedChains

            chain = gen.chain
            mixed = isinstance(chain, MixedChains)  # prompt i follows chain.chains[chain.row_chains[i]]
            configs = [chain.chains[k].config for k in chain.row_chains] if mixed else [chain.config] * gen.num_prompts
            specs = [c.draft for c in configs]
        elif per_prompt:
            if len(draft) != gen.num_prompts:
                raise ConfigError(
                    f"draft= lists {len(draft)} drafters for {gen.num_prompts} prompts: give one per prompt (None "
                    "for a prompt that does not draft), or one drafter for all"
                )
            specs = [None if d is False else d for d in draft]
        else:
            specs = [draft] * gen.num_prompts
        if all(spec is None for spec in specs):
            return alone
        check_forkable(gen.chain, gen.logits_processor)
        loaded: dict[int, Drafter] = {}  # id of a spec (specs holds them all) -> its drafter
        shared: dict[Any, Drafter] = {}  # (class, parameters) -> the one drafter of every spec that asks for it
        drafters: list[Drafter | None] = []
        settings: list[dict[str, Any]] = []
        for i, spec in enumerate(specs):
            settings += [draft_settings(spec)] * gen.n
            if spec is not None and id(spec) not in loaded:
                try:
                    drafter = load_drafter(spec, gen.host)
                except ConfigError as exc:
                    if not per_prompt:
                        raise
                    raise type(exc)(f"draft[{i}] (prompt {i}): {exc}") from None
                given = spec.get("use") if isinstance(spec, Mapping) else spec
                if drafter is not given:  # loaded from a name: one object per drafter and parameters
                    drafter = shared.setdefault((type(drafter), params_key(drafter.params)), drafter)
                loaded[id(spec)] = drafter
            drafters += [None if spec is None else loaded[id(spec)]] * gen.n
        return cls(
            drafters,
            gen,
            mode=[s.get("mode", "match") for s in settings],
            adaptive=[s.get("adaptive", True) for s in settings],
            cost=[s.get("cost") for s in settings],
            guarding=guarding,
        )

    def report(self, out: GenerationOutput) -> None:
        """The counts into the output's drafted / kept / model_calls."""
        out.drafted, out.kept, out.model_calls = (
            torch.tensor(counts, dtype=torch.int64) for counts in (self.drafted, self.kept, self.model_calls)
        )
        if self.guarding is not None:
            out.rewinds = self.guarding.rewinds.clone()

    def _generation_runner(self) -> ModelRunner | None:
        return None if self._runner is None else self._runner()

    # ----------------------------------------------------------------- the loop
    def run(
        self, gen: Generation, runner: ModelRunner, logits: torch.Tensor, step: int, uncond: torch.Tensor | None = None
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Generation's steps from `logits` (the next position's, the cache holding every token so far) to the end,
        each step yielded as the plain loop yields it. With classifier-free guidance `runner` is a GuidedRunner and
        `uncond` the unconditional logits beside `logits`."""
        inner = runner.conditional if isinstance(runner, GuidedRunner) else runner
        self._runner = weakref.ref(inner)
        ragged = runner.per_row_truncate
        self.lengths.shape = "together" if not ragged else "padded" if runner.pads_rows else "rows"
        self.lengths.per_width = inner.stepped_widths
        if inner.stepped_widths:  # what a width costs is the model's: timed by its earlier generations too
            self.lengths.widths = width_prices(inner.model)
            self.lengths.kept = inner.kept_widths()  # ... and by earlier processes on the machine
        try:
            yield from self._run(gen, runner, logits, step, uncond)
        finally:  # none timed (a runner whose widths are not priced): nothing to keep
            inner.keep_widths(self.lengths.width_ratios())

    def _run(
        self, gen: Generation, runner: ModelRunner, logits: torch.Tensor, step: int, uncond: torch.Tensor | None
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        ragged = runner.per_row_truncate
        if self.guarding is not None and not ragged:
            raise ConfigError(
                f"guards= take a row's text back on its own, which the {runner.name} runner cannot (it cuts every "
                "row's cache to one length); generate without guards= on it"
            )
        self.stop_ids = stop_ids(gen)
        self._prompts = gen.prompt_lengths.tolist()  # fixed for the generation: read once, not per call
        limit = gen.setup.max_positions
        self._positions = None if limit is None else [limit - n for n in self._prompts]  # each row's, past its prompt
        unfinished = (~gen.finished).nonzero().flatten().tolist()
        self._fed = (gen.prompt_lengths.cpu() + gen._steps).tolist()  # real tokens each row's cache holds
        waiting = [b for b in unfinished if self.pending[b]]  # a resumed generation's tokens drawn past its step
        if waiting:
            self._refeed(gen, runner, waiting, ragged)
        elif step == 0:
            for b in unfinished:  # the prefill
                self.model_calls[b] += 1
        fresh = [b for b in unfinished if not self.pending[b]]
        if fresh and step > 0 and (ragged or not waiting):
            # a resume: the replay fed each row's newest token, which the uninterrupted run's next call fed with a
            # draft; cut it back so that call comes as it did (the draws of mode rejection depend on the draft)
            for b in fresh:
                self._fed[b] -= 1
            width, prompts = gen.attention_mask.shape[1], self._prompts
            cut = [width - prompts[b] + self._fed[b] for b in range(len(self._fed))]
            runner.truncate(cut if ragged else gen.input_ids.shape[1] - 1)
        elif fresh:
            self._draw(gen, fresh, logits[fresh], None if uncond is None else uncond[fresh])
            if self.guarding is not None and self.guarding.guard(gen, self, fresh):
                self._cut(gen, runner)
        while True:
            if self.guarding is not None:  # after each commit: a row a guard ended may have committed its last token
                self.guarding.finish(gen, self)
                if gen._all_finished:
                    return
            if self._ready(gen):
                step += 1
                yield self._commit(gen, step)
                if gen._all_finished:
                    return
                continue
            rows = self._callers(gen, ragged)
            if ragged:
                self._release(gen, runner)
            self._tell_finished(gen)
            drafts = self._propose(gen, rows, ragged)
            if self._plain(gen, rows, drafts):
                step += 1
                yield self._step(gen, runner, rows, step)
                if gen._all_finished:
                    return
            elif ragged:
                self._verify_rows(gen, runner, rows, drafts)
            else:
                self._verify_together(gen, runner, rows, drafts)

    def _plain(self, gen: Generation, rows: list[int], drafts: dict[int, torch.Tensor]) -> bool:
        """Whether the call is the plain loop's step: no row drafts, every unfinished row waits on it."""
        if self.guarding is not None or any(len(d) for d in drafts.values()):
            return False
        return len(rows) == int((~gen.finished).sum()) and not any(self.pending[b] for b in rows)

    def _step(
        self, gen: Generation, runner: ModelRunner, rows: list[int], step: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The plain loop's step (Generation._one_step): one token a row, drawn and committed; once a row has
        finished, the rows still going only."""
        started, untimed = time.perf_counter(), _untimed(runner)
        logits = gen.step_model(runner)
        started += _untimed(runner) - untimed
        uncond = unconditional_of(runner)
        if len(rows) < len(self.pending):  # a row has finished (released rows among them)
            # a released row's logits are zeros, which the chain must not sample (its samplers could mask every
            # token there), and a finished row reports -inf as it does from a check: the rows still going are drawn
            # as a check's positions are, the others get the pad
            self._draw(gen, rows, logits[rows], None if uncond is None else uncond[rows])
            out = self._commit(gen, step)
        else:
            out = gen._one_step(logits, step, uncond)
        fed = self.lengths.work([1] * len(rows), self.released.count(False))
        self.lengths.timed(fed, time.perf_counter() - started)
        for b in rows:
            self.model_calls[b], self._fed[b] = self.model_calls[b] + 1, self._fed[b] + 1
            self.lengths.undrafted(b)
        return out

    def _refeed(self, gen: Generation, runner: ModelRunner, rows: list[int], ragged: bool) -> None:
        """A resume: the cache (every committed token) takes each row's drawn tokens but the newest."""
        feeds = {b: torch.tensor([c.token for c in self.pending[b][:-1]], dtype=torch.int64) for b in rows}
        feeds = {b: t for b, t in feeds.items() if len(t)}
        if not feeds:
            return
        if ragged:
            runner.extend_rows(list(feeds), list(feeds.values()))
            for b, t in feeds.items():
                self._fed[b] += len(t)
            return
        block = torch.zeros((gen.input_ids.shape[0], len(next(iter(feeds.values())))), dtype=torch.int64)
        for b, t in feeds.items():
            block[b] = t
        runner.extend(block.to(gen.input_ids.device))

    # ----------------------------------------------------------------- checkpoints
    def checkpoint(self) -> dict[str, Any]:
        """Plain data: each row's drawn tokens past the last step (and their logprobs), the counts, the rows'
        acceptance and rests, and the rows whose drafter was switched off."""
        return {
            "pending": [[c.token for c in row] for row in self.pending],
            "pending_logprobs": [[float(c.logprob) for c in row] for row in self.pending],
            "pending_kept": [[c.kept for c in row] for row in self.pending],
            "drafted": list(self.drafted),
            "kept": list(self.kept),
            "model_calls": list(self.model_calls),
            "lengths": self.lengths.checkpoint(),
            "off": list(self.off),
            "guards": None if self.guarding is None else self.guarding.checkpoint(),
            "drafters": [drafter_state(d) for d in self._distinct()],
        }

    def restore(self, saved: Mapping[str, Any]) -> None:
        rows = len(self.pending)
        if any(len(saved[key]) != rows for key in ("pending", "pending_logprobs", "drafted", "off")):
            raise ConfigError(f"resume: the checkpoint's speculation is not for {rows} rows; the checkpoint is damaged")
        flags = saved.get("pending_kept") or [[False] * len(row) for row in saved["pending"]]
        self.pending = [
            [Drawn(int(t), torch.tensor(lp), None, None, None, bool(k)) for t, lp, k in zip(tokens, logprobs, kept)]
            for tokens, logprobs, kept in zip(saved["pending"], saved["pending_logprobs"], flags)
        ]
        for name in ("drafted", "kept", "model_calls"):
            setattr(self, name, [int(n) for n in saved[name]])
        self.lengths.restore(saved.get("lengths", {}))
        self.off = [bool(o) or d is None for o, d in zip(saved["off"], self.drafters)]
        guards = saved.get("guards")
        if (guards is None) != (self.guarding is None) and any(saved["pending"]):
            raise ConfigError(
                "resume: the checkpoint holds tokens drawn past its last step "
                f"{'with' if guards is not None else 'without'} guards; resume with guards= as the interrupted run "
                "had it"
            )
        if guards is not None and self.guarding is not None:
            self.guarding.restore(guards)
        states = saved.get("drafters") or []
        for drafter, state in zip(self._distinct(), states):
            if state is not None:
                try:
                    drafter.restore(state)
                except Exception as exc:  # noqa: BLE001 - a drafter's failure costs speed, never tokens
                    self._switch_off([b for b, d in enumerate(self.drafters) if d is drafter], drafter, exc)

    def _distinct(self) -> list[Drafter]:
        """The generation's drafters, each once, in the order of the rows that first use them."""
        return list({id(d): d for d in self.drafters if d is not None}.values())

    def _ready(self, gen: Generation) -> bool:
        """Whether every unfinished row has a drawn token waiting (that no guard may take back): the next step can
        be committed."""
        rows = (~gen.finished).nonzero().flatten().tolist()
        if self.guarding is not None:
            return all(self.guarding.ready(gen, self, b) for b in rows)
        return all(self.pending[b] for b in rows)

    def _cut(self, gen: Generation, runner: ModelRunner) -> None:
        """Each row's cache cut back to its tokens but the newest (after a guard took some back)."""
        width = gen.attention_mask.shape[1]
        for b in (~gen.finished).nonzero().flatten().tolist():  # a finished row's cache stays as it is
            self._fed[b] = int(gen.prompt_lengths[b]) + gen._steps + len(self.pending[b]) - 1
        runner.truncate([width - int(gen.prompt_lengths[b]) + self._fed[b] for b in range(len(self._fed))])

    def _commit(self, gen: Generation, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The next drawn token of every unfinished row appended as one step (Generation.commit)."""
        finished = gen.finished.tolist()
        column = [None if finished[b] else self.pending[b].pop(0) for b in range(len(finished))]
        live = next(c for c in column if c is not None)
        device = gen.input_ids.device
        tokens = torch.tensor([gen.pad_id if c is None else c.token for c in column], device=device)
        logprobs = torch.stack([live.logprob.new_zeros(()) if c is None else c.logprob for c in column])
        scores = tops = None
        if gen.output_scores:
            scores = _stacked([None if c is None else c.score for c in column], vocab_of(gen.model), float("-inf"))
        if gen.top_logprobs:
            top = [None if c is None else c.top for c in column]  # none: values -inf, ids 0
            values = _stacked([None if t is None else t[0] for t in top], gen.top_logprobs)
            tops = (values, _stacked([None if t is None else t[1] for t in top], gen.top_logprobs, 0).long())
        if gen.output_logits:  # a resume's drawn tokens carry none: -inf rows, as for finished rows
            gen.raw_logits.append(
                ordinary(_stacked([None if c is None else c.raw for c in column], vocab_of(gen.model)))
            )
        out = gen.commit(tokens, logprobs, step, scores, tops)
        if self.guarding is not None:
            for b, c in enumerate(column):
                if c is not None:
                    self.guarding.committed(b, step - 1)
        for b in gen.finished.nonzero().flatten().tolist():
            self.drop(b, 0)  # drawn past the row's stop: never emitted
        return out

    def drop(self, row: int, start: int) -> None:
        """Row `row`'s drawn tokens from index `start` on are taken back: they will not come out, nor count as
        kept."""
        gone = self.pending[row][start:]
        self.kept[row] -= sum(c.kept for c in gone)
        del self.pending[row][start:]

    def _callers(self, gen: Generation, ragged: bool) -> list[int]:
        """The rows the next model call runs: every unfinished row; on a runner that cuts rows on their own, not
        those already far enough ahead (an end-of-sequence among their drawn tokens, the length limit reached, or,
        where a row costs only its own tokens, a full queue: on a padded batch its columns run either way)."""
        rows = (~gen.finished).nonzero().flatten().tolist()
        guarding = self.guarding
        if guarding is not None:  # a row a guard ended draws no more
            rows = [b for b in rows if guarding.ending[b] is None]
        if not ragged:
            return rows
        eos, padded = self.stop_ids, self.lengths.shape == "padded"
        for b in rows:
            self.waiting[b] = self.waiting[b] and bool(self.pending[b])
        return [
            b
            for b in rows
            if not self.pending[b]
            or (guarding is not None and guarding.drawing(gen, self, b))
            or ((len(self.pending[b]) < _AHEAD or padded) and not self.waiting[b] and not self._drawn_all(gen, b, eos))
        ]

    def _release(self, gen: Generation, runner: ModelRunner) -> None:
        """Rows the model will not run again leave the runner's batch: finished rows and, without guards (which may
        take drawn tokens back), rows whose drawn tokens reach an end-of-sequence token or the length limit."""
        eos, finished = self.stop_ids, gen.finished.tolist()
        left = [b for b, gone in enumerate(self.released) if not gone]
        done = [b for b in left if finished[b] or (self.guarding is None and self._drawn_all(gen, b, eos))]
        if done and len(done) < len(left):  # the last rows stay: the generation ends with them
            runner.release(done)
            for b in done:
                self.released[b] = True

    def _tell_finished(self, gen: Generation) -> None:
        """Each drafter hears once of its rows that will not draft again (`Drafter.finish`)."""
        eos, finished = self.stop_ids, gen.finished.tolist()
        done = [b for b, d in enumerate(self.drafters) if d is not None and not self.told[b] and not self.off[b]]
        done = [b for b in done if finished[b] or (self.guarding is None and self._drawn_all(gen, b, eos))]
        for b in done:
            self.told[b] = True
        for drafter in {id(d): d for b in done if (d := self.drafters[b]) is not None}.values():
            try:
                drafter.finish([b for b in done if self.drafters[b] is drafter])
            except Exception as exc:  # noqa: BLE001 - a drafter's failure costs speed, never tokens
                self._switch_off([b for b, d in enumerate(self.drafters) if d is drafter], drafter, exc)

    # ----------------------------------------------------------------- drafting
    def _propose(self, gen: Generation, rows: list[int], ragged: bool) -> dict[int, torch.Tensor]:
        """Each row's draft (CPU int64, possibly empty); on a runner that feeds every row alike, all cut to the
        shortest (none if a row has none)."""
        drafts = {b: _EMPTY for b in rows}
        vocab = vocab_of(gen.model)
        asking = [b for b in rows if not self.off[b]]
        held = self.released.count(False)
        behind = self._behind(rows) if ragged and self.lengths.shape == "rows" else None
        if behind is not None:
            fixed, idle = self.lengths.fixed, self.lengths.idle
            asking = [b for b in asking if b in behind or fixed[b]]
            if any(idle[b] and not fixed[b] for b in behind):  # a row behind rests: none drafts, the rests go on
                asking = [b for b in asking if fixed[b] or idle[b]]
        tokens: dict[int, torch.Tensor] = {}  # each row's, once: a drafter may keep what it found for the tensor

        def row_tokens(b: int) -> torch.Tensor:
            if b not in tokens:  # a copy: what a drafter does to it cannot reach the generation's tokens
                tokens[b] = self._tokens(gen, b).clone()
            return tokens[b]

        # a draft fits under the length limits (the chain's draw past it is one more token) and in the model's
        # positions (each drafted token takes one; the row's tokens so far take theirs)
        free = self._positions
        rooms = [
            min(self._room(gen, b) - 1, (1 << 30) if free is None else free[b] - gen._steps - len(self.pending[b]))
            for b in asking
        ]
        wanted = self.lengths.limits(asking, rooms, len(rows), held, lambda b: self._expect(b, row_tokens(b)))
        groups: dict[int, list[int]] = {}
        for b in asking:
            if wanted[b] > 0 and not self.off[b]:
                groups.setdefault(id(self.drafters[b]), []).append(b)
        for members in groups.values():
            drafter = self.drafters[members[0]]
            assert drafter is not None  # rows without a drafter are off
            started = time.perf_counter()
            for b, proposal in self._ask(drafter, members, [row_tokens(b) for b in members], wanted).items():
                drafts[b] = self._checked(b, drafter, proposal, wanted[b], vocab)
            self.lengths.drafted(sum(len(drafts[b]) for b in members), time.perf_counter() - started)
        if not ragged and rows:
            k = min(len(d) for d in drafts.values())
            drafts = {b: d[:k] for b, d in drafts.items()}
        elif behind:
            k = min(len(drafts[b]) for b in behind)  # the rows behind advance together or not at all
            drafts = {b: d[:k] if b in behind else d for b, d in drafts.items()}
        return drafts

    def _behind(self, rows: list[int]) -> set[int] | None:
        """On a runner whose rows feed their own tokens (llama.cpp), the rows of a call of several that drafts may
        help: those with the most tokens still to draw. The batch calls until its last row is done, so only a call
        that advances every one of them by more than a token saves one; a draft of a row ahead costs the tokens it
        misses, and on llama.cpp a pass over the weights of its own (a decode runs a pass per number of tokens its
        rows feed), and saves none. None: every row may draft (a call of one row)."""
        if len(rows) < 2:
            return None
        least = min(len(self.pending[b]) for b in rows)
        behind = {b for b in rows if len(self.pending[b]) == least}
        if any(self.off[b] for b in behind):
            return set()
        return behind

    def _ask(
        self, drafter: Drafter, rows: list[int], tokens: list[torch.Tensor], wanted: Mapping[int, int]
    ) -> dict[int, Any]:
        """The drafter's proposals for `rows` in one call; where that call fails, row by row, so that only a row
        whose own call fails is switched off. -> the proposals of the rows that got one."""
        try:
            proposals = drafter.propose_rows(rows, tokens, [wanted[b] for b in rows])
            if len(proposals) != len(rows):
                raise ValueError(f"{len(proposals)} proposals for {len(rows)} rows")
            return dict(zip(rows, proposals))
        except Exception as exc:  # noqa: BLE001 - a drafter's failure costs speed, never tokens
            if len(rows) == 1:
                self._switch_off(rows, drafter, exc)
                return {}
        out: dict[int, Any] = {}
        for b, t in zip(rows, tokens):
            out.update(self._ask(drafter, [b], [t], wanted))
        return out

    def _checked(self, row: int, drafter: Drafter, proposal: Any, limit: int, vocab: int) -> torch.Tensor:
        """A proposal as (k <= limit,) int64 token ids; one that is not a row of token ids switches the drafter off
        for the row."""
        try:
            draft, self.q[row] = proposal_tensors(proposal, limit, vocab)
        except Exception as exc:  # noqa: BLE001 - a drafter's failure costs speed, never tokens
            self._switch_off([row], drafter, exc)
            return _EMPTY
        return draft

    def _expect(self, row: int, tokens: torch.Tensor) -> tuple[str, float] | None:
        """The row's drafter's kind of draft and prior for `tokens` (Drafter.expect); a failure switches it off."""
        drafter = self.drafters[row]
        try:
            return None if drafter is None else expected_kind(drafter.expect(row, tokens))
        except Exception as exc:  # noqa: BLE001 - a drafter's failure costs speed, never tokens
            self._switch_off([row], cast(Drafter, drafter), exc)
            return None

    def _switch_off(self, rows: list[int], drafter: Drafter, exc: Exception) -> None:
        for b in rows:
            self.off[b] = True
        which = f"row {rows[0]}" if len(rows) == 1 else f"rows {rows}"
        warnings.warn(
            f"drafter {drafter.qualified_name()} failed on {which} ({type(exc).__name__}: {exc}); the "
            f"{'row goes' if len(rows) == 1 else 'rows go'} on without speculation, the tokens unchanged",
            GenerationWarning,
            stacklevel=5,
        )

    # ----------------------------------------------------------------- verifying
    def _verify_rows(
        self, gen: Generation, runner: ModelRunner, rows: list[int], drafts: dict[int, torch.Tensor]
    ) -> None:
        """One call that feeds each row its newest token and its own draft, then draws each row's positions in
        order until its draw differs from its draft; each row's cache is cut back to its drawn tokens but the
        newest."""
        last = gen.input_ids[:, -1].tolist()
        newest = [torch.tensor([self.pending[b][-1].token if self.pending[b] else last[b]]) for b in rows]
        feeds = [torch.cat([t, drafts[b]]) if len(drafts[b]) else t for t, b in zip(newest, rows)]
        started, untimed = time.perf_counter(), _untimed(runner)
        logits = dict(zip(rows, runner.extend_rows(rows, feeds)))
        started += _untimed(runner) - untimed
        uncond = unconditional_of(runner)
        for b in rows:
            self.model_calls[b] += 1
        self._guard_cut = set()
        fed = self.lengths.work([len(f) for f in feeds], self.released.count(False))
        call = Checked(drafts, logits, None if uncond is None else dict(zip(rows, uncond)))
        drawn = self._draw_along(gen, rows, call, together=False, timing=(fed, started))
        if self._guard_cut:
            self._cut(gen, runner)
            return
        for b in rows:
            self._fed[b] += drawn[b]  # the fed newest token and the kept drafts
        if any(len(drafts[b]) > drawn[b] - 1 for b in rows):
            width, prompts = gen.attention_mask.shape[1], self._prompts
            runner.truncate([width - prompts[b] + self._fed[b] for b in range(len(self._fed))])

    def _verify_together(
        self, gen: Generation, runner: ModelRunner, rows: list[int], drafts: dict[int, torch.Tensor]
    ) -> None:
        """One call that feeds every row its newest token and the common-length drafts; the rows' draws go on
        together while every row draws its draft; the cache is cut back to the drawn tokens but the newest."""
        k = len(next(iter(drafts.values())))
        started, untimed = time.perf_counter(), _untimed(runner)
        block = torch.zeros((gen.input_ids.shape[0], k), dtype=torch.int64)  # k > 0: without drafts, `_step`
        for b, d in drafts.items():
            block[b] = d
        columns = runner.extend(torch.cat([gen.input_ids[:, -1:], block.to(gen.input_ids.device)], dim=1))
        started += _untimed(runner) - untimed
        uncond = unconditional_of(runner)
        for b in rows:
            self.model_calls[b] += 1
        timing = (self.lengths.work([k + 1] * len(rows), gen.input_ids.shape[0]), started)
        call = Checked(drafts, {b: columns[b] for b in rows}, None if uncond is None else {b: uncond[b] for b in rows})
        drawn = self._draw_along(gen, rows, call, together=True, timing=timing)
        n = drawn[rows[0]]
        if n - 1 < k:
            runner.truncate(gen.input_ids.shape[1] + n - 1)


def _untimed(runner: ModelRunner) -> float:
    """The seconds of one-time work the runner's calls have included so far (`ModelRunner.untimed`), both contexts'
    under classifier-free guidance."""
    parts = (runner.conditional, runner.guidance) if isinstance(runner, GuidedRunner) else (runner,)
    return sum(part.untimed for part in parts)


def _stacked(rows: list[torch.Tensor | None], width: int, fill: float = float("-inf")) -> torch.Tensor:
    """(B, V) of per-row vectors; rows without one (finished, or restored from a checkpoint) filled."""
    found = [r for r in rows if r is not None]
    blank = torch.full_like(found[0], fill) if found else torch.full((width,), fill)
    return torch.stack([blank if r is None else r for r in rows])


_EMPTY = torch.zeros(0, dtype=torch.int64)
_AHEAD = 64  # drawn tokens a row may have waiting before it skips model calls (where it costs its own tokens)
