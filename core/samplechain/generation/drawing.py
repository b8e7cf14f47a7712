"""The draws at the positions of a model call: the chain's own (mode match, and past a draft) or the rejection
test of a drafted token (mode rejection), each queued as a row's drawn token (`Drawn`) with what its step
reports. Every draw sees what the plain loop's step at that position would: the row's tokens so far (committed and
drawn), `logits_processor=` the batch as the plain loop shows it, the store at the row's own position. And
`step_going`: the plain loop's step for the rows still going alone, where a finished row's chain fails."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs
import torch

from .rejection import noise_of, rejection_draw

if TYPE_CHECKING:
    from .draft_length import DraftLengths
    from .guarding import Guarding
    from .session import Generation

__all__ = ["Checked", "Drawing", "Drawn", "step_going"]


@attrs.frozen
class Checked:
    """What one model call gives its rows' draws: row b's draft `drafts[b]` and the logits after its fed tokens
    `logits[b]` (k_b + 1, V); under classifier-free guidance the unconditional logits of the same positions."""

    drafts: dict[int, torch.Tensor]
    logits: Mapping[int, torch.Tensor]
    uncond: Mapping[int, torch.Tensor] | None = None

    def at(self, rows: list[int], j: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Position j of `rows`: their logits (len(rows), V), and their unconditional logits or None."""
        uncond = self.uncond
        logits = torch.stack([self.logits[b][j] for b in rows])
        return logits, None if uncond is None else torch.stack([uncond[b][j] for b in rows])


@attrs.define
class Drawn:
    """A token the chain drew for a row, waiting to be committed as a step (with what the step reports)."""

    token: int
    logprob: torch.Tensor
    score: torch.Tensor | None
    top: tuple[torch.Tensor, torch.Tensor] | None  # (values, ids) of the top logprobs
    raw: torch.Tensor | None
    kept: bool = False  # a drafted token the chain drew (counted in `kept` while it may still come out)


class Drawing:
    """Speculation's draws (a mixin): the positions of a model call drawn in order while the rows keep their drafts
    (`_draw_along`); each row's drawn tokens wait in `pending`; `q` holds each row's current draft's probabilities
    (rejection mode), `rejection` which rows are in that mode."""

    pending: list[list[Drawn]]
    q: list[torch.Tensor | None]
    rejection: list[bool]
    guarding: Guarding | None
    waiting: list[bool]  # rows whose draw past their drawn tokens failed (_draw_or_wait)
    drafted: list[int]
    kept: list[int]
    lengths: DraftLengths
    stop_ids: set[int]
    _guard_cut: set[int]

    def _drawn_all(self, gen: Generation, row: int, eos: set[int]) -> bool:
        """Whether row `row`'s drawn tokens reach the length limit or an end-of-sequence token that stops it (`eos`:
        the ids the stopping criteria stop on, from the row's min_new_tokens on)."""
        if self._room(gen, row) <= 0:
            return True
        least = gen.setup.min_new_tokens
        first = 1 if least is None else int(least[row]) - gen._steps  # the first drawn token eos may stop at
        return any(c.token in eos for c in self.pending[row][max(first, 1) - 1 :])

    def _room(self, gen: Generation, row: int) -> int:
        """New tokens the length limits still allow row `row` past the tokens it has drawn."""
        bound = gen.stopping.max_new_tokens(gen.setup)
        return (1 << 30 if bound is None else bound) - gen._steps - len(self.pending[row])

    def _tokens(self, gen: Generation, row: int) -> torch.Tensor:
        """Row `row`'s prompt (without padding), its committed and its drawn tokens, on the CPU."""
        start = gen.attention_mask.shape[1] - int(gen.prompt_lengths[row])
        done = gen.input_ids[row, start:].cpu()
        if not self.pending[row]:
            return done
        return torch.cat([done, torch.tensor([c.token for c in self.pending[row]], dtype=done.dtype)])

    def _draw_along(
        self, gen: Generation, rows: list[int], call: Checked, together: bool, timing: tuple[int, float]
    ) -> dict[int, int]:
        """Draw position j = 0, 1, ... of the rows still going (`call.at`); a row goes on to j + 1 while its draw
        equals its draft's token j (together: while every row's does). -> tokens drawn per row. `timing`: the tokens
        the model call ran and when it started; the call's time is taken once its first position is drawn (on an
        accelerator, when its logits have arrived)."""
        drafts = call.drafts
        going, drawn = list(rows), dict.fromkeys(rows, 0)
        for b in rows:
            self.drafted[b] += len(drafts[b])
        eos = self.stop_ids if not together else set()
        j = 0
        while going:
            going, tokens = self._draw_or_wait(gen, going, call, j)
            if not going:
                break
            if j == 0:
                self.lengths.timed(timing[0], time.perf_counter() - timing[1], any(len(d) for d in drafts.values()))
            same = [j < len(drafts[b]) and tokens[i] == int(drafts[b][j]) for i, b in enumerate(going)]
            if self.guarding is not None:  # a row a guard took back goes no further
                cut = self.guarding.guard(gen, self, going)
                self._guard_cut |= cut
                same = [s and b not in cut for s, b in zip(same, going)]
            for i, b in enumerate(going):
                drawn[b] += 1
                if same[i]:  # the token just drawn (a row a guard cut is not `same`)
                    self.kept[b] += 1
                    self.pending[b][-1].kept = True
            for i, b in enumerate(going):
                if j < len(drafts[b]):
                    self.lengths.checked(b, same[i])
                elif j == 0:
                    self.lengths.undrafted(b)
            # a row goes on past a kept token, not past one that ends it (an id the criteria stop on)
            going = [b for i, b in enumerate(going) if same[i]] if not together or all(same) else []
            going = [b for b in going if not self._drawn_all(gen, b, eos)] if eos else going
            j += 1
        return drawn

    def _draw_or_wait(self, gen: Generation, rows: list[int], call: Checked, j: int) -> tuple[list[int], list[int]]:
        """The draws of `rows` at position j -> (the rows drawn, their tokens). A row whose position lies past tokens
        it drew before (waiting in `pending`) may lie past a stop its commit will find (a stop string), where the
        plain loop never draws: where its draw fails it waits until those tokens are committed (its guards take
        them as its final text) and then draws that position again, where a failure is the plain loop's. A failure
        is raised where it cannot come from such a row."""
        before = [len(self.pending[b]) for b in rows]
        try:
            return rows, self._draw_position(gen, rows, call, j)
        except Exception:
            # rows drawn before the failure (mode rejection tests its rows first) keep their draws
            done = {b: self.pending[b][-1].token for b, n in zip(rows, before) if len(self.pending[b]) > n}
            now = [b for b, n in zip(rows, before) if b not in done and not n]
            ahead = [b for b, n in zip(rows, before) if b not in done and n]
            if not ahead:
                raise
        if now:
            done.update(zip(now, self._draw_position(gen, now, call, j)))
        for b in ahead:
            self.waiting[b] = True
        drawn = [b for b in rows if b in done]
        return drawn, [done[b] for b in drawn]

    def _draw_position(self, gen: Generation, rows: list[int], call: Checked, j: int) -> list[int]:
        """The draws of `rows` at position j of their drafts: the chain's own (mode match, and after a whole draft),
        or the rejection test of the drafted token (mode rejection)."""
        tested = [b for b in rows if j < len(call.drafts[b]) and self.rejection[b]]
        if not tested:
            return self._draw(gen, rows, *call.at(rows, j))
        plain = [b for b in rows if b not in tested]  # past their drafts, or in mode match
        drawn = dict(zip(tested, self._test(gen, tested, *call.at(tested, j), call.drafts, j)))
        if plain:
            drawn.update(zip(plain, self._draw(gen, plain, *call.at(plain, j))))
        return [drawn[b] for b in rows]

    def _test(
        self,
        gen: Generation,
        rows: list[int],
        logits: torch.Tensor,
        uncond: torch.Tensor | None,
        drafts: dict[int, torch.Tensor],
        j: int,
    ) -> list[int]:
        """Mode rejection at position j: the chain's processed distribution p, the drafted token kept with
        probability min(1, p / q), else a draw from the residual max(p - q, 0); the store accepts the result."""
        logits, raw, history = self._inputs(gen, rows, logits)
        uncond = _limited(gen, uncond)
        rids = [gen.request_ids[b] for b in rows]
        at = _stages(gen, rows)
        out = gen.sample_rows(logits, rids, history, at, uncond, accept=False, scores=True)
        logp = torch.log_softmax(out.scores.to("cpu", torch.float64), dim=-1)
        draft = torch.tensor([int(drafts[b][j]) for b in rows])
        q = torch.zeros_like(logp).scatter_(1, draft[:, None], 1.0)
        for i, b in enumerate(rows):
            probs = self.q[b]
            if probs is not None:  # columns past the logits' are tokens p never draws: neither test nor residual
                width = min(probs.shape[1], q.shape[1])  # reads them; columns the drafter lacks it gives no mass
                q[i] = 0.0
                q[i, :width] = probs[j, :width]
        seed, position = noise_of(gen.store, rids)
        tokens = rejection_draw(logp, q, draft, seed, position)
        given = tokens.to(out.token_ids.device)
        if all(stage == "processed" for stage in ([at] if isinstance(at, str) else at)):
            gen.chain.accept(gen.store, rids, given)
            logprobs = logp.gather(1, tokens[:, None])[:, 0].to(out.logprobs.dtype).to(out.logprobs.device)
        else:  # the tokens' logprobs at the stages asked for: a teacher-forced step, which accepts them
            logprobs = gen.sample_rows(logits, rids, history, at, uncond, accept=given).logprobs
        self._queue(rows, tokens.tolist(), logprobs, out, raw, gen.output_scores)
        return tokens.tolist()

    def _draw(
        self, gen: Generation, rows: list[int], logits: torch.Tensor, uncond: torch.Tensor | None = None
    ) -> list[int]:
        """The chain's draw for `rows` at their next position (logits (len(rows), V); `uncond`: their unconditional
        logits under classifier-free guidance), queued as pending tokens; the store advances for these rows only."""
        logits, raw, history = self._inputs(gen, rows, logits)
        at = _stages(gen, rows)
        out = gen.sample_rows(logits, [gen.request_ids[b] for b in rows], history, at, _limited(gen, uncond))
        tokens = out.token_ids.tolist()
        self._queue(rows, tokens, out.logprobs, out, raw, out.scores is not None)
        return tokens

    def _inputs(
        self, gen: Generation, rows: list[int], logits: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None, dict[str, torch.Tensor]]:
        """What the plain loop's step does to `rows`' logits before the chain (the vocabulary limit, the guards'
        bans at the rows' positions, `logits_processor=`) -> (logits, the raw logits where they are reported, the
        chain's history)."""
        raw = logits.clone() if gen.output_logits else None
        if gen.vocab_limit is not None:
            logits[:, gen.vocab_limit :] = float("-inf")
        if self.guarding is not None:  # the rows' states saved and their bans applied at the positions drawn
            self.guarding.before_draw(gen, rows, [gen._steps + len(self.pending[b]) for b in rows], logits)
        if gen.logits_processor is not None:
            logits = self._processed(gen, rows, logits)
        return logits, raw, self._history(gen, rows) if gen.chain.needs_history else {}

    def _queue(
        self,
        rows: list[int],
        tokens: list[int],
        logprobs: torch.Tensor,
        out: Any,
        raw: torch.Tensor | None,
        scores: bool,
    ) -> None:
        """Each row's drawn token queued with what its step reports (`out`: the chain's SampleOutput)."""
        for i, b in enumerate(rows):
            self.pending[b].append(
                Drawn(
                    token=tokens[i],
                    logprob=logprobs[i],
                    score=out.scores[i] if scores else None,
                    top=None if out.top_logprobs is None else (out.top_logprobs[0][i], out.top_logprobs[1][i]),
                    raw=None if raw is None else raw[i],
                )
            )

    def _processed(self, gen: Generation, rows: list[int], logits: torch.Tensor) -> torch.Tensor:
        """`logits_processor=` on `rows`' logits, each row's call given the whole batch's input_ids as the plain loop
        has them at the step the row draws (tokens drawn past that step not shown; a row not that far yet, or
        finished, shows pad ids) and the logits of the other rows as zeros."""
        processor = gen.logits_processor
        assert processor is not None  # called where there is one
        width, steps, device = gen.attention_mask.shape[1], gen._steps, gen.input_ids.device
        at = [steps + len(self.pending[b]) for b in rows]  # the tokens before each row's draw
        out = logits.clone()
        for s in sorted(set(at)):
            group = [i for i, t in enumerate(at) if t == s]
            ids = torch.full((gen.input_ids.shape[0], width + s), gen.pad_id, dtype=torch.int64)
            ids[:, : width + steps] = gen.input_ids.cpu()
            for b, row in enumerate(self.pending):
                drawn = [c.token for c in row[: s - steps]]
                ids[b, width + steps : width + steps + len(drawn)] = torch.tensor(drawn, dtype=torch.int64)
            full = logits.new_zeros((ids.shape[0], logits.shape[1]))
            full[[rows[i] for i in group]] = logits[group]
            out[group] = processor(ids.to(device), full)[[rows[i] for i in group]]
        return out

    def _history(self, gen: Generation, rows: list[int]) -> dict[str, torch.Tensor]:
        """history= / prompt_lengths= for `rows`: each row's tokens (prompt, committed, drawn), left-padded with -1."""
        seqs = [self._tokens(gen, b) for b in rows]
        width = max(len(s) for s in seqs)
        history = torch.full((len(rows), width), -1, dtype=torch.int64)
        for i, s in enumerate(seqs):
            history[i, width - len(s) :] = s
        device = gen.input_ids.device
        return {"history": history.to(device), "prompt_lengths": gen.prompt_lengths[rows].to(device)}


def step_going(
    gen: Generation,
    logits: torch.Tensor,
    step: int,
    history: Mapping[str, torch.Tensor],
    uncond: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A step that draws the unfinished rows only; the finished rows get the pad token, a 0 logprob and -inf
    scores, as the rows a speculative call does not draw."""
    going = (~gen.finished).nonzero().flatten()
    rows = going.tolist()
    at = gen._logprobs_at if isinstance(gen._logprobs_at, str) else [gen._logprobs_at[b] for b in rows]
    out = gen.sample_rows(
        logits[going],
        [gen.request_ids[b] for b in rows],
        {key: value[going.to(value.device)] for key, value in history.items()},
        at,
        None if uncond is None else uncond[going],
    )
    index = going.to(out.token_ids.device)
    tokens = torch.full((logits.shape[0],), gen.pad_id, dtype=out.token_ids.dtype, device=index.device)
    tokens[index] = out.token_ids
    logprobs = out.logprobs.new_zeros((logits.shape[0],))
    logprobs[index] = out.logprobs
    scores = tops = None
    if out.scores is not None:
        scores = out.scores.new_full((logits.shape[0], out.scores.shape[1]), float("-inf"))
        scores[index] = out.scores
    if out.top_logprobs is not None:
        values, ids = out.top_logprobs
        tops = (
            values.new_full((logits.shape[0], values.shape[1]), float("-inf")),
            ids.new_zeros((logits.shape[0], ids.shape[1])),
        )
        tops[0][index], tops[1][index] = values, ids
    return gen.commit(tokens, logprobs, step, scores, tops)


def _limited(gen: Generation, uncond: torch.Tensor | None) -> torch.Tensor | None:
    """Unconditional logits with the tokens past the tokenizer's vocabulary masked, as the plain loop's step
    masks them."""
    if uncond is not None and gen.vocab_limit is not None:
        uncond[:, gen.vocab_limit :] = float("-inf")
    return uncond


def _stages(gen: Generation, rows: list[int]) -> str | list[str]:
    """The logprobs stage of `rows`' draws: the generation's one, or each row's."""
    return gen._logprobs_at if isinstance(gen._logprobs_at, str) else [gen._logprobs_at[b] for b in rows]
