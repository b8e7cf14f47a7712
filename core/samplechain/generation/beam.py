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
"""

from __future__ import annotations

from typing import Any

import torch

from ..contracts import StopContext, StopMatch, StopSetup
from ..engine.mixed import MixedChains
from ..engine.stopping import cut_text
from ..errors import ConfigError
from .model import ModelRunner
from .outputs import GenerationOutput
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
    if kwargs.get("top_logprobs"):
        raise ConfigError("top_logprobs is not available with beam search; use output_scores=True")
    if kwargs.get("logprobs_mode", "processed") not in ("processed", "processed_logprobs"):
        raise ConfigError(
            f"logprobs_mode = {kwargs['logprobs_mode']!r} is not available with beam search (its "
            "logprobs are the processed ones); use output_logits=True for the raw logits"
        )
    kwargs.pop("seed", None)  # beam search draws nothing
    gen = Generation(model, tokenizer, prompts, **kwargs)
    chain = gen.chain
    if isinstance(chain, MixedChains):
        raise ConfigError("beam search runs one chain over all beams: give one chain, not one per prompt")
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
    return _BeamSearch(gen, num_beams, float(length_penalty), early_stopping, num_return_sequences).run()


class _BeamSearch:
    def __init__(
        self, gen: Generation, num_beams: int, length_penalty: float, early_stopping: bool | str, n_return: int
    ) -> None:
        self.gen = gen
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
        import time

        g, nb, batch = self.gen, self.nb, self.batch
        ids = g.input_ids.repeat_interleave(nb, dim=0)
        mask = g.attention_mask.repeat_interleave(nb, dim=0)
        prompt_len = ids.shape[1]
        device = ids.device

        # criteria see the K candidate continuations of every prompt
        eos = next((c for c in g.stopping if c.name == "eos"), None)
        g.setup.start_time = time.monotonic()
        if eos is not None:
            eos.prepare(g.setup)  # its ids decide K before the candidates' setup exists
        n_eos = len(eos.resolved_ids()) if eos is not None and hasattr(eos, "resolved_ids") else 0
        k = max(2, 1 + n_eos) * nb
        cand_setup = self._candidates_setup(k)
        cand_setup.start_time = g.setup.start_time
        g.stopping.prepare(cand_setup)
        max_new = g.stopping.max_new_tokens(cand_setup)
        limit = max_new if max_new is not None else 1 << 16
        max_length = prompt_len + limit
        top_num_beam_mask = torch.cat([torch.ones(nb, dtype=torch.bool), torch.zeros(k - nb, dtype=torch.bool)]).to(
            device
        )

        # transformers' fill value for unused positions: (pad or first eos) when there is an eos
        eos_ids = eos.resolved_ids() if eos is not None and hasattr(eos, "resolved_ids") else []
        fill = (g.pad_id or eos_ids[0]) if eos_ids else g.pad_id
        running_sequences = torch.full((batch, nb, max_length), fill, dtype=torch.int64, device=device)
        running_sequences[:, :, :prompt_len] = ids.view(batch, nb, prompt_len)
        sequences = running_sequences.clone()
        running_beam_scores = torch.zeros((batch, nb), dtype=torch.float32, device=device)
        running_beam_scores[:, 1:] = _NEG
        beam_scores = torch.full((batch, nb), _NEG, dtype=torch.float32, device=device)
        is_sent_finished = torch.zeros((batch, nb), dtype=torch.bool, device=device)
        unsatisfied = torch.ones((batch, 1), dtype=torch.bool, device=device)
        hits = torch.zeros((batch, nb), dtype=torch.bool, device=device)
        running_beam_indices = torch.full((batch, nb, limit), -1, dtype=torch.int32, device=device)
        beam_indices = running_beam_indices.clone()
        running_lps = torch.zeros((batch, nb, limit), dtype=torch.float32, device=device)
        lps = running_lps.clone()
        # how each hypothesis ended, as a code into `endings`: (finish reason, the StopMatch of a text criterion)
        endings: list[tuple[str, StopMatch | None]] = []
        codes: dict[tuple[str, StopMatch | None], int] = {}
        running_reason = torch.full((batch, nb), -1, dtype=torch.int64, device=device)  # never set while running
        reason = running_reason.clone()

        processes = len(g.chain.samplers) > 1
        # every beam is a request of its own in the store (a batch holds an id once), with its prompt's parameters;
        # process() accepts nothing, so the beams' state never diverges and needs no reordering
        beam_rids = [f"{rid}.beam{j}" for rid in g.request_ids for j in range(nb)]
        if processes:
            for rid in g.request_ids:
                for j in range(nb):
                    g.store.clone(rid, f"{rid}.beam{j}")
        scores_out: list[torch.Tensor] = []
        logits_out: list[torch.Tensor] = []
        batch_offset = torch.arange(batch, device=device).view(-1, 1) * nb

        runner = ModelRunner(g.model, ids, mask)
        cur_len = prompt_len
        with torch.inference_mode():
            logits = runner.prefill()
            while True:
                if g.output_logits:
                    logits_out.append(logits.clone())
                if g.vocab_limit is not None:
                    logits[:, g.vocab_limit :] = float("-inf")
                log_probs = torch.nn.functional.log_softmax(logits, dim=-1)
                flat = running_sequences[:, :, :cur_len].reshape(batch * nb, cur_len)
                if g.logits_processor is not None:
                    log_probs = g.logits_processor(flat, log_probs)
                if processes:
                    log_probs = g.chain.process(log_probs, g.store, beam_rids, **g.history_args(flat))
                if g.output_scores:
                    scores_out.append(log_probs.clone())
                vocab = log_probs.shape[-1]
                per_beam = log_probs.view(batch, nb * vocab)
                acc = (log_probs.view(batch, nb, vocab) + running_beam_scores[:, :, None]).view(batch, nb * vocab)

                topk_log_probs, topk_indices = torch.topk(acc, k=k)
                topk_beam = topk_indices // vocab
                topk_running_beam_indices = _gather(running_beam_indices, topk_beam)
                topk_running_sequences = _gather(running_sequences, topk_beam)
                topk_running_lps = _gather(running_lps, topk_beam)
                step = cur_len - prompt_len
                topk_running_sequences[:, :, cur_len] = topk_indices % vocab
                topk_running_beam_indices[:, :, step] = (topk_beam + batch_offset).to(torch.int32)
                topk_running_lps[:, :, step] = per_beam.gather(1, topk_indices)

                candidates = topk_running_sequences[:, :, : cur_len + 1].reshape(batch * k, cur_len + 1)
                result = g.stopping.check(
                    StopContext(
                        candidates,
                        step + 1,
                        candidates[:, -1],
                        cand_setup,
                        topk_running_lps[:, :, step].reshape(-1),
                        None,
                    )
                )
                hits = result.done.view(batch, k)
                cand_reason = torch.full((batch * k,), -1, dtype=torch.int64, device=device)
                if result.any:
                    for row, r in enumerate(result.reasons):
                        if r is not None:
                            ending = (r, result.matches.get(row))
                            if ending not in codes:
                                codes[ending] = len(endings)
                                endings.append(ending)
                            cand_reason[row] = codes[ending]
                cand_reason = cand_reason.view(batch, k)

                # the best unfinished continuations run on
                topk_running_log_probs = topk_log_probs + hits.to(torch.float32) * _NEG
                nxt = torch.topk(topk_running_log_probs, k=nb)[1]
                running_sequences = _gather(topk_running_sequences, nxt)
                running_beam_scores = _gather(topk_running_log_probs, nxt)
                running_beam_indices = _gather(topk_running_beam_indices, nxt)
                running_lps = _gather(topk_running_lps, nxt)

                # finished hypotheses among the top num_beams enter the finished set if they score better
                did_finish = hits & top_num_beam_mask[None, :]
                finished_scores = topk_log_probs / ((cur_len + 1 - prompt_len) ** self.length_penalty)
                full = torch.all(is_sent_finished, dim=-1, keepdim=True) & (self.early_stopping is True)
                finished_scores = finished_scores + full.to(torch.float32) * _NEG
                finished_scores = finished_scores + (~unsatisfied).to(torch.float32) * _NEG
                finished_scores = finished_scores + (~did_finish) * _NEG
                merged = torch.topk(torch.cat((beam_scores, finished_scores), dim=1), k=nb)[1]
                sequences = _gather(torch.cat((sequences, topk_running_sequences), dim=1), merged)
                beam_scores = _gather(torch.cat((beam_scores, finished_scores), dim=1), merged)
                beam_indices = _gather(torch.cat((beam_indices, topk_running_beam_indices), dim=1), merged)
                lps = _gather(torch.cat((lps, topk_running_lps), dim=1), merged)
                reason = _gather(torch.cat((reason, cand_reason), dim=1), merged)
                is_sent_finished = _gather(torch.cat((is_sent_finished, did_finish), dim=1), merged)

                runner.reorder(running_beam_indices[..., step].reshape(-1).to(torch.int64))
                cur_len += 1
                unsatisfied = self._heuristic(
                    unsatisfied, running_beam_scores, beam_scores, is_sent_finished, cur_len, max_length, prompt_len
                )
                if not self._unfinished(unsatisfied, is_sent_finished, hits):
                    break
                logits = runner.step(running_sequences[:, :, :cur_len].reshape(batch * nb, cur_len))

        n = self.n_return
        seqs = sequences[:, :n].reshape(batch * n, -1)
        seq_scores = beam_scores[:, :n].reshape(-1)
        bidx = beam_indices[:, :n].reshape(batch * n, -1)
        generated = (bidx + 1).bool().sum(dim=1)
        width = int(generated.max())
        seqs = seqs[:, : prompt_len + width]
        bidx = bidx[:, :width]
        token_lps = torch.where(bidx >= 0, lps[:, :n].reshape(batch * n, -1)[:, :width], torch.zeros(()))
        ended = [endings[c] if c >= 0 else (None, None) for c in reason[:, :n].reshape(-1).tolist()]
        finish = [r for r, _ in ended]
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
            scores=tuple(scores_out) if g.output_scores else None,
            logits=tuple(logits_out) if g.output_logits else None,
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
