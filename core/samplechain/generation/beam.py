"""Beam search, token for token what transformers' `model.generate(num_beams=N, do_sample=False)` returns.

The same vectorised algorithm as transformers (5.x): per prompt, the top K = max(2, 1 + #eos) * num_beams
continuations of all beams by accumulated log-probability; a continuation that hits a stopping criterion (eos,
the length limit, stop strings, any custom criterion) becomes a finished hypothesis scored
`sum_logprobs / generated_length ** length_penalty` (generated_length counted from the padded prompt width, as
transformers' `cur_len + 1 - decoder_prompt_len`); the best num_beams unfinished continuations run on; the
search ends when no running beam can beat the finished ones (the early-stopping heuristic: `early_stopping`
True / False / "never" as transformers defines them), or when every continuation hits a criterion.

The chain's transforms and filters run on the log-probabilities of every beam (as transformers runs its logits
processors there); the selector is not used: beam search picks by score, so a chain must end in `greedy` (one
ending in a sampling selector such as `dist` is refused). Each beam is a request of its own in the chain's store,
cloned from its prompt's request, so per-request parameters hold for every beam of a prompt.
One deliberate difference: where no eos id is set, transformers fills the positions past a shorter finished
hypothesis with -1; we fill them with the pad id (with an eos id both fill with pad, or eos when pad is 0).
Outputs: sequences, sequences_scores, beam_indices, per-step processed log-probabilities (output_scores), raw
logits (output_logits), per-token `logprobs` (the transition scores transformers' compute_transition_scores
gives), finish reasons, texts.

Stops as in sampling: a min_new_tokens sampler's per-request n (vLLM's min_tokens) holds back the criteria with a
`min_new_tokens_gate` for every candidate of its prompt, so a hypothesis does not end at an eos / stop string /
stop_regex before it (transformers masks eos instead, MinNewTokensLengthLogitsProcessor: the sampler does that in
the chain's processing); a hypothesis a stop string / stop_regex ended keeps its StopMatch, so its text is cut
there (before the match, or after it with its prompt's include_stop_str_in_output) and `stop_texts` names it.

Guards (`guards=`, a chain's `guards`): a continuation whose text a guard refuses is never a hypothesis
(beam_guards.py): its (beam, token) pair gets -inf and the top K are taken again.
"""

from __future__ import annotations

import math
import numbers
import time
from typing import Any

import torch

from ..contracts import StopContext, StopMatch, StopSetup
from ..engine.mixed import MixedChains
from ..engine.stopping import cut_text
from ..errors import ConfigError
from ..guards import Guard
from .beam_guards import BeamGuards
from .guarding import load_guards
from .model import runner_for
from .outputs import GenerationOutput, ordinary
from .session import Generation

__all__ = ["beam_generate"]

_NEG = -1.0e9


def _gather(tensor: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    while index.dim() < tensor.dim():
        index = index.unsqueeze(-1)
    return torch.take_along_dim(tensor, index, dim=1)


def beam_generate(
    model: Any,
    tokenizer: Any = None,
    prompts: Any = None,
    *,
    num_beams: int,
    length_penalty: float = 1.0,
    early_stopping: bool | str = False,
    num_return_sequences: int = 1,
    **kwargs: Any,
) -> GenerationOutput:
    if not isinstance(num_return_sequences, int) or not 1 <= num_return_sequences <= num_beams:
        raise ConfigError(
            f"num_return_sequences = {num_return_sequences!r}: beam search returns at most num_beams = "
            f"{num_beams} sequences per prompt; use num_return_sequences <= num_beams"
        )
    if early_stopping not in (True, False, "never"):
        raise ConfigError(f"early_stopping = {early_stopping!r}: must be True, False or 'never'")
    if (
        isinstance(length_penalty, bool)
        or not isinstance(length_penalty, numbers.Real)
        or not math.isfinite(length_penalty)
    ):
        raise ConfigError(
            f"length_penalty = {length_penalty!r}: a finite number, the exponent of the length a beam's score is "
            "divided by (1.0: the mean logprob; 0: the sum)"
        )
    if kwargs.get("top_logprobs"):
        raise ConfigError("top_logprobs is not available with beam search; use output_scores=True")
    if kwargs.get("logprobs_mode", "processed") not in ("processed", "processed_logprobs"):
        raise ConfigError(
            f"logprobs_mode = {kwargs['logprobs_mode']!r} is not available with beam search (its "
            "logprobs are the processed ones); use output_logits=True for the raw logits"
        )
    kwargs.pop("seed", None)  # beam search draws nothing
    kwargs["draft"] = False  # nor drafts: a chain's [draft] table is left unused
    guards = kwargs.pop("guards", None)
    gen = Generation(model, tokenizer, prompts, guards=False, **kwargs)
    chain = gen.chain
    if isinstance(chain, MixedChains):
        raise ConfigError("beam search runs one chain over all beams: give one chain, not one per prompt")
    per_prompt = load_guards(guards, gen)
    if chain.needs_unconditional_logits:
        raise ConfigError(
            "classifier-free guidance (cfg) is not supported with beam search here: use it with greedy "
            "or sampling (num_beams = 1)"
        )
    if chain.samplers[-1].name != "greedy":
        raise ConfigError(
            f"beam search picks continuations by score, so the chain must end in greedy, not "
            f"{chain.samplers[-1].qualified_name()}: drop the selector's sampling (e.g. preset:greedy), or use "
            "num_beams=1 to sample"
        )
    return _BeamSearch(gen, num_beams, float(length_penalty), early_stopping, num_return_sequences, per_prompt).run()


class _BeamSearch:
    # the running beams and the search's state, set by _start_hypotheses and updated by every step
    running_beam_indices: torch.Tensor
    unsatisfied: torch.Tensor
    hits: torch.Tensor

    def __init__(
        self,
        gen: Generation,
        num_beams: int,
        length_penalty: float,
        early_stopping: bool | str,
        n_return: int,
        guards: list[list[tuple[Guard, int]]] | None,
    ) -> None:
        self.gen = gen
        self.guard_specs = guards
        self.nb = num_beams
        self.length_penalty = length_penalty
        self.early_stopping = early_stopping
        self.n_return = n_return
        self.batch = gen.num_prompts

    def _candidates_setup(self, k: int) -> StopSetup:
        """The criteria see k candidates per prompt, each with its prompt's length and min_new_tokens."""
        g = self.gen
        least = g.setup.min_new_tokens
        return StopSetup(
            batch_size=self.batch * k,
            prompt_length=g.setup.prompt_length,
            prompt_lengths=g.prompt_lengths.repeat_interleave(k),
            device=g.input_ids.device,
            tokenizer=g.tokenizer,
            model_config=g.setup.model_config,
            generation_config=g.generation_config,
            min_new_tokens=None if least is None else least.repeat_interleave(k),
        )

    def run(self) -> GenerationOutput:
        g, nb = self.gen, self.nb
        ids = g.input_ids.repeat_interleave(nb, dim=0)
        mask = g.attention_mask.repeat_interleave(nb, dim=0)
        self.prompt_len, self.device = ids.shape[1], ids.device
        self.fill = self._prepare_criteria()
        self._start_hypotheses(ids, self.fill)
        self._beam_requests()
        self.guards = (
            None
            if self.guard_specs is None
            else BeamGuards(self.guard_specs, nb, self.prompt_len, g.tokenizer, self.beam_rids)
        )
        self.scores_out: list[torch.Tensor] = []
        self.logits_out: list[torch.Tensor] = []
        runner = runner_for(g.model, g.host)(g.model, ids, mask)
        self.cur_len = self.prompt_len
        with torch.inference_mode():
            logits = runner.prefill()
            while True:
                step = self.cur_len - self.prompt_len
                self._step(self._log_probs(logits), step)
                runner.reorder(self.running_beam_indices[..., step].reshape(-1).to(torch.int64))
                self.cur_len += 1
                self.unsatisfied = self._heuristic(
                    self.unsatisfied,
                    self.running_beam_scores,
                    self.beam_scores,
                    self.is_sent_finished,
                    self.cur_len,
                    self.max_length,
                    self.prompt_len,
                )
                if not self._unfinished(self.unsatisfied, self.is_sent_finished, self.hits):
                    break
                flat = self.running_sequences[:, :, : self.cur_len].reshape(self.batch * nb, self.cur_len)
                logits = runner.step(flat)
        return self._output()

    def _prepare_criteria(self) -> int:
        """Criteria see the K candidate continuations of every prompt; sets K and the length limit and returns the
        fill value of unused positions (transformers': pad, or the first eos when pad is 0, when there is an eos)."""
        g, nb = self.gen, self.nb
        g.end_at_positions()
        eos = next((c for c in g.stopping if c.name == "eos"), None)
        g.setup.start_time = time.monotonic()
        if eos is not None:
            eos.prepare(g.setup)  # its ids decide K before the candidates' setup exists
        eos_ids = eos.resolved_ids() if eos is not None and hasattr(eos, "resolved_ids") else []
        self.k = k = max(2, 1 + len(eos_ids)) * nb
        self.cand_setup = self._candidates_setup(k)
        self.cand_setup.start_time = g.setup.start_time
        g.stopping.prepare(self.cand_setup)
        max_new = g.stopping.max_new_tokens(self.cand_setup)
        self.limit = max_new if max_new is not None else 1 << 16
        self.max_length = self.prompt_len + self.limit
        self.top_num_beam_mask = torch.cat(
            [torch.ones(nb, dtype=torch.bool), torch.zeros(k - nb, dtype=torch.bool)]
        ).to(self.device)
        return (g.pad_id or eos_ids[0]) if eos_ids else g.pad_id

    def _start_hypotheses(self, ids: torch.Tensor, fill: int) -> None:
        """The running beams (only the first of a prompt live at first) and the empty finished set."""
        batch, nb, limit, device = self.batch, self.nb, self.limit, self.device
        self.running_sequences = torch.full((batch, nb, self.max_length), fill, dtype=torch.int64, device=device)
        self.running_sequences[:, :, : self.prompt_len] = ids.view(batch, nb, self.prompt_len)
        self.sequences = self.running_sequences.clone()
        self.running_beam_scores = torch.zeros((batch, nb), dtype=torch.float32, device=device)
        self.running_beam_scores[:, 1:] = _NEG
        self.beam_scores = torch.full((batch, nb), _NEG, dtype=torch.float32, device=device)
        self.is_sent_finished = torch.zeros((batch, nb), dtype=torch.bool, device=device)
        self.unsatisfied = torch.ones((batch, 1), dtype=torch.bool, device=device)
        self.hits = torch.zeros((batch, nb), dtype=torch.bool, device=device)
        self.running_beam_indices = torch.full((batch, nb, limit), -1, dtype=torch.int32, device=device)
        self.beam_indices = self.running_beam_indices.clone()
        self.running_lps = torch.zeros((batch, nb, limit), dtype=torch.float32, device=device)
        self.lps = self.running_lps.clone()
        # how each hypothesis ended, as a code into `endings`: (finish reason, the StopMatch of a text criterion)
        self.endings: list[tuple[str, StopMatch | None]] = []
        self.codes: dict[tuple[str, StopMatch | None], int] = {}
        self.reason = torch.full((batch, nb), -1, dtype=torch.int64, device=device)
        self.batch_offset = torch.arange(batch, device=device).view(-1, 1) * nb

    def _beam_requests(self) -> None:
        """Every beam is a request of its own in the store (a batch holds an id once), with its prompt's
        parameters; process() accepts nothing, so the beams' state never diverges and needs no reordering."""
        g, nb = self.gen, self.nb
        self.processes = len(g.chain.samplers) > 1
        self.beam_rids = [f"{rid}.beam{j}" for rid in g.request_ids for j in range(nb)]
        if self.processes:
            for rid in g.request_ids:
                for j in range(nb):
                    g.store.clone(rid, f"{rid}.beam{j}")

    def _log_probs(self, logits: torch.Tensor) -> torch.Tensor:
        """The beams' log-probabilities after the logits processor and the chain's processing."""
        g = self.gen
        if g.output_logits:
            self.logits_out.append(ordinary(logits, copy=True))
        if g.vocab_limit is not None:
            logits[:, g.vocab_limit :] = float("-inf")
        log_probs = torch.nn.functional.log_softmax(logits, dim=-1)
        flat = self.running_sequences[:, :, : self.cur_len].reshape(self.batch * self.nb, self.cur_len)
        if g.logits_processor is not None:  # transformers' may return a slice (repetition penalty does)
            log_probs = g.logits_processor(flat, log_probs).contiguous()
        if self.processes:
            log_probs = g.chain.process(log_probs, g.store, self.beam_rids, **g.history_args(flat))
        if g.output_scores:
            self.scores_out.append(ordinary(log_probs, copy=True))
        return log_probs

    def _step(self, log_probs: torch.Tensor, step: int) -> None:
        """The top K continuations, checked by the criteria; the unfinished run on, the finished are kept."""
        batch, nb, cur_len = self.batch, self.nb, self.cur_len
        vocab = log_probs.shape[-1]
        per_beam = log_probs.view(batch, nb * vocab)
        acc = (log_probs.view(batch, nb, vocab) + self.running_beam_scores[:, :, None]).view(batch, nb * vocab)
        topk_log_probs, topk_indices = self._top(acc, vocab)
        topk_beam = topk_indices // vocab
        topk_running_beam_indices = _gather(self.running_beam_indices, topk_beam)
        topk_running_sequences = _gather(self.running_sequences, topk_beam)
        topk_running_lps = _gather(self.running_lps, topk_beam)
        topk_running_sequences[:, :, cur_len] = topk_indices % vocab
        topk_running_beam_indices[:, :, step] = (topk_beam + self.batch_offset).to(torch.int32)
        topk_running_lps[:, :, step] = per_beam.gather(1, topk_indices)
        cand_reason = self._check(topk_running_sequences, topk_running_lps, step)
        if self.guards is not None:  # a hypothesis whose final text a guard refuses is dropped
            ends = self.guards.refused(self.running_sequences, topk_indices, topk_log_probs, vocab, cur_len, self.hits)
            for b, c in ends:
                topk_log_probs[b, c] = float("-inf")

        # the best unfinished continuations run on
        topk_running_log_probs = topk_log_probs + self.hits.to(torch.float32) * _NEG
        nxt = torch.topk(topk_running_log_probs, k=nb)[1]
        if self.guards is not None:
            self.guards.reorder(_gather(topk_beam, nxt))
        self.running_sequences = _gather(topk_running_sequences, nxt)
        self.running_beam_scores = _gather(topk_running_log_probs, nxt)
        self.running_beam_indices = _gather(topk_running_beam_indices, nxt)
        self.running_lps = _gather(topk_running_lps, nxt)
        self._keep_finished(
            topk_log_probs, topk_running_sequences, topk_running_beam_indices, topk_running_lps, cand_reason
        )

    def _top(self, acc: torch.Tensor, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The top K continuations of every prompt (accumulated scores, indices into beam * vocab + token); with
        guards, those they refuse are set to -inf (in the step's output scores too) and the top K taken again."""
        while True:
            if self.guards is not None:
                acc[self.guards.dead()] = float("-inf")
            topk_log_probs, topk_indices = torch.topk(acc, k=self.k)
            if self.guards is None:
                return topk_log_probs, topk_indices
            refused = self.guards.refused(self.running_sequences, topk_indices, topk_log_probs, vocab, self.cur_len)
            if not refused:
                return topk_log_probs, topk_indices
            prompts, indices = (list(x) for x in zip(*refused))
            acc[prompts, indices] = float("-inf")
            if self.gen.output_scores:
                self.scores_out[-1].view(self.batch, -1)[prompts, indices] = float("-inf")

    def _check(self, topk_running_sequences: torch.Tensor, topk_running_lps: torch.Tensor, step: int) -> torch.Tensor:
        """The criteria over the K candidates of every prompt: sets `hits` (batch, K) and returns each candidate's
        ending code (-1: none)."""
        batch, k, cur_len = self.batch, self.k, self.cur_len
        candidates = topk_running_sequences[:, :, : cur_len + 1].reshape(batch * k, cur_len + 1)
        result = self.gen.stopping.check(
            StopContext(
                candidates,
                step + 1,
                candidates[:, -1],
                self.cand_setup,
                topk_running_lps[:, :, step].reshape(-1),
                None,
            )
        )
        self.hits = result.done.view(batch, k)
        cand_reason = torch.full((batch * k,), -1, dtype=torch.int64, device=self.device)
        if result.any:
            for row, r in enumerate(result.reasons):
                if r is not None:
                    ending = (r, result.matches.get(row))
                    if ending not in self.codes:
                        self.codes[ending] = len(self.endings)
                        self.endings.append(ending)
                    cand_reason[row] = self.codes[ending]
        return cand_reason.view(batch, k)

    def _keep_finished(self, topk_log_probs, topk_running_sequences, topk_beam_indices, topk_lps, cand_reason) -> None:
        """Finished hypotheses among the top num_beams enter the finished set if they score better."""
        nb = self.nb
        did_finish = self.hits & self.top_num_beam_mask[None, :]
        finished_scores = topk_log_probs / ((self.cur_len + 1 - self.prompt_len) ** self.length_penalty)
        full = torch.all(self.is_sent_finished, dim=-1, keepdim=True) & (self.early_stopping is True)
        finished_scores = finished_scores + full.to(torch.float32) * _NEG
        finished_scores = finished_scores + (~self.unsatisfied).to(torch.float32) * _NEG
        finished_scores = finished_scores + (~did_finish) * _NEG
        merged = torch.topk(torch.cat((self.beam_scores, finished_scores), dim=1), k=nb)[1]
        self.sequences = _gather(torch.cat((self.sequences, topk_running_sequences), dim=1), merged)
        self.beam_scores = _gather(torch.cat((self.beam_scores, finished_scores), dim=1), merged)
        self.beam_indices = _gather(torch.cat((self.beam_indices, topk_beam_indices), dim=1), merged)
        self.lps = _gather(torch.cat((self.lps, topk_lps), dim=1), merged)
        self.reason = _gather(torch.cat((self.reason, cand_reason), dim=1), merged)
        self.is_sent_finished = _gather(torch.cat((self.is_sent_finished, did_finish), dim=1), merged)

    def _output(self) -> GenerationOutput:
        """The best n_return finished hypotheses of every prompt."""
        g, n, batch, prompt_len = self.gen, self.n_return, self.batch, self.prompt_len
        seqs = self.sequences[:, :n].reshape(batch * n, -1)
        seq_scores = self.beam_scores[:, :n].reshape(-1)
        bidx = self.beam_indices[:, :n].reshape(batch * n, -1)
        if self.guards is not None:  # a slot no hypothesis filled (the guards refused them all) is empty
            empty = ~self.is_sent_finished[:, :n].reshape(-1, 1)
            seqs = torch.where(empty & (torch.arange(seqs.shape[1], device=seqs.device) >= prompt_len), self.fill, seqs)
            bidx = torch.where(empty, -1, bidx)
        generated = (bidx + 1).bool().sum(dim=1)
        width = int(generated.max())
        seqs = seqs[:, : prompt_len + width]
        bidx = bidx[:, :width]
        token_lps = torch.where(bidx >= 0, self.lps[:, :n].reshape(batch * n, -1)[:, :width], torch.zeros(()))
        ended = [self.endings[c] if c >= 0 else (None, None) for c in self.reason[:, :n].reshape(-1).tolist()]
        finish = [r for r, _ in ended]
        if self.guards is not None:  # a prompt the guards left short of hypotheses: why
            finished = self.is_sent_finished[:, :n].reshape(-1).tolist()
            finish = [r if done else self.guards.refusal[i // n] for i, (r, done) in enumerate(zip(finish, finished))]
        matches = [m for _, m in ended]
        texts = None
        if g.tokenizer is not None:  # cut at the stop match as sampling's output() cuts (row b is prompt b // n's)
            texts = [
                cut_text(
                    g.tokenizer.decode(row[prompt_len : prompt_len + int(m)].tolist(), skip_special_tokens=True),
                    match,
                    g.include_stop_str_in_output[b // n],
                )
                for b, (row, m, match) in enumerate(zip(seqs.cpu(), generated.tolist(), matches))
            ]
        return GenerationOutput(
            sequences=seqs,
            scores=tuple(self.scores_out) if g.output_scores else None,
            logits=tuple(self.logits_out) if g.output_logits else None,
            sequences_scores=seq_scores,
            beam_indices=bidx,
            logprobs=token_lps,
            finish_reasons=finish,
            stop_texts=[None if m is None else m.text for m in matches],
            num_generated=generated.to(torch.int64).cpu(),
            texts=texts,
            prompt_length=prompt_len,
        )

    def _heuristic(
        self, unsatisfied, running_beam_scores, beam_scores, is_sent_finished, cur_len, max_length, prompt_len
    ):
        if self.early_stopping == "never" and self.length_penalty > 0.0:
            best_length = max_length - prompt_len
        else:
            best_length = cur_len - prompt_len
        best_running = running_beam_scores[:, :1] / (best_length**self.length_penalty)
        worst_finished = torch.where(is_sent_finished, torch.min(beam_scores, dim=1, keepdim=True)[0], _NEG)
        return unsatisfied & torch.any(best_running > worst_finished, dim=-1, keepdim=True)

    def _unfinished(self, unsatisfied, is_sent_finished, hits) -> bool:
        improvement = bool(torch.any(unsatisfied))
        open_beam = not (bool(torch.all(is_sent_finished)) and self.early_stopping is True)
        valid = not bool(torch.all(hits))
        return improvement and open_beam and valid
