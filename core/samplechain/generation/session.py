"""`Generation`: one prepared generation of a Hugging Face causal LM through a chain, the loop that runs it step by
step, and its checkpoints. `generate()` and `stream()` (loop.py) and beam search (beam.py) are built on it.

Per step: the model's last-position logits (B, V) -> `chain.sample` (each row its own request in the chain's
store, so per-request parameters and seeds hold) -> rows that already finished get the pad token -> the stopping
criteria answer per row -> the next forward pass runs on the KV cache. On the transformers runner the whole batch
keeps running through the model until every row has finished (as transformers does: the same batch gives the same
logits); a runner whose rows are sequences of their own (llama.cpp, `skips_inactive`) runs only the rows still
generating. A finished row no longer changes.

Checkpoints: `Generation.checkpoint()` between two steps returns plain JSON data (the prompts, the tokens so far,
finished rows, the step count, the request store's snapshot); `Generation(..., resume=checkpoint)` (and
`generate` / `stream` with `resume=`) continues it, in this process or another, with the tokens the uninterrupted
run gives. Resuming replays the model over the tokens so far one step at a time, the forward passes the original
run made, so the KV cache and every later logit are bit-identical (a single prefill of prompt + tokens would be
numerically close, not equal).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Generator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import torch

from ..contracts import StopContext, StopMatch, StopSetup
from ..engine import graphs
from ..engine.chain import Chain
from ..engine.discovery import PluginHost
from ..engine.mixed import MixedChains
from ..engine.stopping import cut_text, min_new_tokens_of
from ..errors import ConfigError, GenerationWarning, SamplingError
from ..params import params_label, sequence_seed
from ..runners import running_each_step
from ..tokens import eos_token_ids
from .checkpoints import Checkpoints, load_checkpoint
from .drawing import step_going
from .from_config import fit_to_generation, resolve_chain, with_settings
from .guided import guided
from .inputs import (
    PromptInputs,
    Prompts,
    checked_flags,
    checked_host,
    checked_params,
    checked_processor,
    checked_stop,
    checked_token_ids,
)
from .model import ModelRunner, runner_for
from .outputs import GenerationOutput, ordinary
from .speculative import Speculation

__all__ = ["Generation"]


def _refuse_with_resume(ckpt: Mapping[str, Any], num_return_sequences: int, **restored: Any) -> None:
    """resume= takes the prompts, parameters and seeds from the checkpoint: the same given again is an error."""
    given = [name for name, value in restored.items() if value is not None]
    if given:
        raise ConfigError(
            f"resume= restores {', '.join(given)} from the checkpoint: drop {', '.join(given)} "
            "(pass the same chain, criteria and model as the interrupted run)"
        )
    if num_return_sequences not in (1, ckpt["num_return_sequences"]):
        raise ConfigError(
            f"num_return_sequences = {num_return_sequences}, but the checkpoint was made with "
            f"{ckpt['num_return_sequences']}: drop num_return_sequences when resuming"
        )


class Generation(PromptInputs, Checkpoints):
    """One prepared generation: inputs, chain and store, criteria. `steps()` runs it; `output()` collects;
    `checkpoint()` saves it between two steps and `resume=` continues a saved one.

    Two ways in: `Generation.from_prompts(model, tokenizer, prompts, ...)` starts from prompts (or input_ids), and
    `Generation.from_checkpoint(model, tokenizer, checkpoint, ...)` continues a saved generation; the constructor
    takes either (`resume=` for the second). transformers' decoding keywords (`do_sample=True, temperature=0.7`,
    any GenerationConfig field a sampler carries) are set on a copy of the generation config, whose chain runs
    (`from_config.with_settings`), as model.generate takes them."""

    @classmethod
    def from_prompts(
        cls, model: Any, tokenizer: Any = None, prompts: Prompts | None = None, **kwargs: Any
    ) -> Generation:
        """A generation from prompts (or `input_ids=` / `attention_mask=`), with generate()'s keyword arguments."""
        if kwargs.get("resume") is not None:
            raise ConfigError(
                "Generation.from_prompts(resume=...): continue a checkpoint with Generation.from_checkpoint"
            )
        return cls(model, tokenizer, prompts, **kwargs)

    @classmethod
    def from_checkpoint(
        cls, model: Any, tokenizer: Any, checkpoint: Mapping[str, Any] | str | Path, **kwargs: Any
    ) -> Generation:
        """A saved generation continued (a checkpoint dict or its file): the same tokens as if it had not stopped.
        What the checkpoint holds (prompts, parameters, seeds) is not given again."""
        return cls(model, tokenizer, resume=checkpoint, **kwargs)

    def __init__(
        self,
        model: Any,
        tokenizer: Any = None,
        prompts: Prompts | None = None,
        *,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        chain: Chain | str | Path | Mapping[str, Any] | None = None,
        stop: Sequence[Any] = (),
        max_new_tokens: int | None = None,
        max_length: int | None = None,
        max_time: float | None = None,
        stop_strings: str | Sequence[str] | None = None,
        stop_regex: str | Sequence[str] | None = None,
        include_stop_str_in_output: bool | Sequence[bool] = False,
        eos_token_id: int | Sequence[int] | None = None,
        pad_token_id: int | None = None,
        ignore_eos: bool = False,
        params: Mapping[str, Any] | Sequence[Mapping[str, Any] | None] | None = None,
        seed: int | None = None,
        num_return_sequences: int = 1,
        output_scores: bool = False,
        output_logits: bool = False,
        top_logprobs: int = 0,
        logprobs_mode: str | Sequence[str] = "processed",
        generation_config: Any = None,
        host: PluginHost | None = None,
        logits_processor: Any = None,
        negative_prompt: str | Sequence[str] | None = None,
        negative_prompt_ids: torch.Tensor | None = None,
        negative_prompt_attention_mask: torch.Tensor | None = None,
        resume: Mapping[str, Any] | str | Path | None = None,
        cuda_graphs: bool | None = None,
        draft: Any = None,
        guards: Any = None,
        **settings: Any,
    ) -> None:
        ckpt = None if resume is None else load_checkpoint(resume)
        if ckpt is not None:  # what the checkpoint holds is not given again
            _refuse_with_resume(
                ckpt,
                num_return_sequences,
                prompts=prompts,
                input_ids=input_ids,
                attention_mask=attention_mask,
                params=params,
                seed=seed,
                negative_prompt=negative_prompt,
                negative_prompt_ids=negative_prompt_ids,
            )
            num_return_sequences = ckpt["num_return_sequences"]
            eos_token_id = ckpt["eos_token_id"] if eos_token_id is None else eos_token_id
            pad_token_id = ckpt["pad_token_id"] if pad_token_id is None else pad_token_id
        self._configure(model, tokenizer, generation_config, host, logits_processor, cuda_graphs, chain, settings)
        self._outputs(output_scores, output_logits, top_logprobs, logprobs_mode, num_return_sequences)
        self._token_ids(eos_token_id, pad_token_id)
        device = getattr(model, "device", torch.device("cpu"))
        check = generation_config is None  # else a caller's (the custom_generate adapter's) that dealt with it
        if ckpt is None:
            self._start(prompts, input_ids, attention_mask, chain, check, num_return_sequences, device)
            self._add_requests(params, seed)
            self.uncond_ids, self.uncond_mask = self._unconditional_inputs(
                negative_prompt, negative_prompt_ids, negative_prompt_attention_mask, device
            )
        else:
            self._resume(ckpt, chain, check, num_return_sequences, device)
            self._restore_requests(ckpt)
            self.uncond_ids, self.uncond_mask = self._restore_unconditional(ckpt, device)
        # the unconditional context's own width: the tokens after it are the generated ones (checkpoints)
        self._uncond_width = 0 if self.uncond_ids is None else self.uncond_ids.shape[1]
        checked_stop(stop)
        self.stopping = self._stopping(stop, max_new_tokens, max_length, max_time, stop_strings, ignore_eos, stop_regex)
        # vLLM's include_stop_str_in_output: a row stopped by a stop string / stop_regex keeps the match
        self.include_stop_str_in_output = self._include_rows(include_stop_str_in_output)
        self.speculation = Speculation.prepare(draft, self, guards)  # drafters and guards: the loop that draws ahead
        self._prepare()
        self._fresh_progress()
        if ckpt is not None:
            self._restore_progress(ckpt)

    # ----------------------------------------------------------------- construction
    def _configure(
        self, model, tokenizer, generation_config, host, logits_processor, cuda_graphs, chain, settings
    ) -> None:
        self.model = model
        # the sampling step captured in a CUDA graph (samplechain.engine.graphs): None where it can, True asks (a warning
        # says why not), False never; SAMPLECHAIN_CUDA_GRAPHS=0 turns it off too
        if cuda_graphs is not None:
            checked_flags(cuda_graphs=cuda_graphs)
        self._cuda_graphs, self._eager_steps = cuda_graphs, 0
        self._graphs: graphs.StepGraphs | Literal[False] | None = None  # None: not decided yet; False: eager steps
        # a transformers LogitsProcessorList (or any fn(input_ids, scores) -> scores) run before the chain
        self.logits_processor = checked_processor(logits_processor)
        self.tokenizer = tokenizer
        self.host = checked_host(host)
        if generation_config is not None and not hasattr(generation_config, "do_sample"):
            raise ConfigError(
                f"generation_config = {generation_config!r}: a transformers GenerationConfig (or leave it out for the "
                "model's own)"
            )
        # model.generate's decoding keywords (temperature=0.7, do_sample=True, ...): a copy of the config with them
        generation_config = with_settings(model, generation_config, chain, settings, Generation)
        self.generation_config = generation_config or getattr(model, "generation_config", None)

    def _outputs(self, output_scores, output_logits, top_logprobs, logprobs_mode, num_return_sequences) -> None:
        checked_flags(output_scores=output_scores, output_logits=output_logits)
        self.output_scores = output_scores
        self.output_logits = output_logits
        if not isinstance(top_logprobs, int) or top_logprobs < 0:
            raise ConfigError(f"top_logprobs = {top_logprobs!r}: must be an integer >= 0")
        self.top_logprobs = top_logprobs
        self.logprobs_mode = logprobs_mode  # Chain.sample's logprobs_at: one value, or one per prompt
        if not isinstance(num_return_sequences, int) or num_return_sequences < 1:
            raise ConfigError(f"num_return_sequences = {num_return_sequences!r}: must be an integer >= 1")

    def _token_ids(self, eos_token_id: Any, pad_token_id: int | None) -> None:
        self.eos_ids = (
            checked_token_ids("eos_token_id", eos_token_id, getattr(self.model.config, "vocab_size", None))
            if eos_token_id is not None
            else eos_token_ids(self.tokenizer, self.generation_config, self.model.config)
        )
        self._pad_note: str | None = None
        self.pad_id = self._pad_id(pad_token_id)

    def _start(self, prompts, input_ids, attention_mask, chain, check: bool, n: int, device) -> None:
        """Rows from the prompts (text or input_ids), left-padded, repeated for num_return_sequences."""
        ids, mask, self.prompt_lengths = self._inputs(prompts, input_ids, attention_mask, device)
        self.num_prompts = ids.shape[0]
        self._open(chain, check, n)
        if self.n > 1:
            ids = ids.repeat_interleave(self.n, dim=0)
            mask = mask.repeat_interleave(self.n, dim=0)
            self.prompt_lengths = self.prompt_lengths.repeat_interleave(self.n)
        self._rows(ids, mask)

    def _resume(self, ckpt: Mapping[str, Any], chain, check: bool, n: int, device) -> None:
        """Rows as the interrupted run had them: padded, repeated for num_return_sequences."""
        ids = self._checkpoint_tensor(ckpt, "input_ids", device)
        mask = self._checkpoint_tensor(ckpt, "attention_mask", device)
        self.prompt_lengths = mask.sum(dim=1).cpu()
        self.num_prompts = ids.shape[0] // n
        self._open(chain, check, n)
        self._rows(ids, mask)

    def _open(self, chain: Any, check: bool, n: int) -> None:
        """The chain (one per prompt for a mixed batch) and the number of sequences per prompt."""
        self.chain = resolve_chain(chain, self.generation_config, self.host, check=check)
        self._from_config = chain is None  # the generation config's chain: fit_to_generation in _prepare
        if isinstance(self.chain, MixedChains):
            rows = getattr(self.chain, "row_chains", None)
            if rows is None or len(rows) != self.num_prompts:
                raise ConfigError(
                    f"chain= lists {len(rows or [])} chains for {self.num_prompts} prompts: give one chain per prompt"
                )
        if n > 1 and self._is_greedy():
            raise ConfigError(
                f"num_return_sequences = {n} with a greedy chain would return the same sequence "
                f"{n} times: use a sampling chain (ending in dist) or beam search (num_beams)"
            )
        self.n = n

    def _rows(self, ids: torch.Tensor, mask: torch.Tensor) -> None:
        """The batch's rows, one request each in a new store."""
        self.input_ids, self.attention_mask = ids, mask
        self.request_ids = [
            f"{i}" if self.n == 1 else f"{i}.{j}" for i in range(self.num_prompts) for j in range(self.n)
        ]
        if self._pad_note and len(self.request_ids) > 1:  # a single row is never padded: nothing to say
            warnings.warn(self._pad_note, GenerationWarning, stacklevel=5)
        self._logprobs_at = self._logprobs_rows(self.logprobs_mode)
        self.store = self.chain.new_store(device=ids.device.type, capacity=len(self.request_ids))

    def _prepare(self) -> None:
        """The criteria's and the samplers' once-per-generation setup."""
        ids, model = self.input_ids, self.model
        self.setup = StopSetup(
            batch_size=ids.shape[0],
            prompt_length=ids.shape[1],
            prompt_lengths=self.prompt_lengths,
            device=ids.device,
            tokenizer=self.tokenizer,
            model_config=model.config,
            generation_config=self.generation_config,
            min_new_tokens=min_new_tokens_of(self.store, self.request_ids),
        )
        self.vocab_limit = self._vocab_limit()
        if self._from_config:
            bound = self.stopping.max_new_tokens(self.setup)
            width = self.setup.prompt_length
            fit_to_generation(self.chain, self.store, self.request_ids, self.prompt_lengths, width, bound)
        self.chain.prepare(
            tokenizer=self.tokenizer,
            model_config=model.config,
            generation_config=self.generation_config,
            vocab_size=getattr(model.config, "vocab_size", None),
            eos_token_ids=self.eos_ids,
        )

    def _fresh_progress(self) -> None:
        """No step run yet: no row finished, nothing recorded."""
        batch, device = self.input_ids.shape[0], self.input_ids.device
        self.finished = torch.zeros(batch, dtype=torch.bool, device=device)
        self.finish_reasons: list[str | None] = [None] * batch
        self.stop_matches: list[StopMatch | None] = [None] * batch  # what a text criterion matched
        self.num_generated = torch.zeros(batch, dtype=torch.int64)  # set when a row finishes
        self._all_rows = torch.ones(batch, dtype=torch.bool, device=device)
        self._any_finished = False
        self._all_finished = False
        self._steps = 0
        self.logprobs: list[torch.Tensor] = []
        self.scores: list[torch.Tensor] = []
        self.raw_logits: list[torch.Tensor] = []
        self.tops: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._replay = 0  # tokens at the end of input_ids that steps() feeds the model before sampling (resume)
        self._elapsed = 0.0  # seconds the interrupted run had taken (max_time goes on counting from there)

    # ----------------------------------------------------------------- preparation
    def _is_greedy(self) -> bool:
        return self.chain.is_greedy

    def _add_requests(self, params: Any, seed: int | None) -> None:
        listed = checked_params(params)
        if listed is None:
            per_prompt = [dict(params or {})] * self.num_prompts
        else:
            per_prompt = listed
            if len(per_prompt) != self.num_prompts:
                raise ConfigError(
                    f"params has {len(per_prompt)} entries for {self.num_prompts} prompts: give one "
                    "mapping per prompt, or one mapping for all"
                )
        if seed is not None:
            sequence_seed(seed, 0, "seed")
        mixed = isinstance(self.chain, MixedChains)
        for i, p in enumerate(per_prompt):
            key = self.chain.row_chains[i] if mixed else None
            seeded = self.store.seeded(key) if mixed else "seed" in self.store.layout.aliases
            for j in range(self.n):
                q = dict(p)
                base = q.get("seed", seed)
                if seeded and base is not None:
                    q["seed"] = sequence_seed(base, j, "seed" if "seed" not in p else params_label(params, i, "seed"))
                rid = self.request_ids[i * self.n + j]
                if mixed:
                    self.store.add(rid, q, chain=key)
                else:
                    self.store.add(rid, q)

    def steps(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Run to the end, yielding (token_ids (B,), active (B,) bool: rows that produced a real token)."""
        if self._all_finished:  # a resumed generation whose every row had finished
            return
        self.end_at_positions()
        width = self.input_ids.shape[1] - self._replay
        uwidth = 0 if self.uncond_ids is None else self.uncond_ids.shape[1] - self._replay
        runner_cls = runner_for(self.model, self.host)
        yield from running_each_step(runner_cls, self._run(runner_cls, width, uwidth))

    def _run(
        self, runner_cls: type[ModelRunner], width: int, uwidth: int
    ) -> Generator[tuple[torch.Tensor, torch.Tensor], None, None]:
        runner = runner_cls(self.model, self.input_ids[:, :width], self.attention_mask)
        guidance = (
            None if self.uncond_ids is None else runner_cls(self.model, self.uncond_ids[:, :uwidth], self.uncond_mask)
        )
        self.setup.start_time = time.monotonic() - self._elapsed
        self.stopping.prepare(self.setup)
        logits = runner.prefill()
        uncond = guidance.prefill() if guidance is not None else None
        if self.speculation is not None:  # a resume's replay may be cut back (a sliding window keeps what it needs)
            for each in (runner, guidance):
                if callable(keep := getattr(each, "keep_past", None)):
                    keep()
        for j in range(1, self._replay + 1):  # resume: the forward passes of the steps before the checkpoint
            logits = runner.step(self.input_ids[:, : width + j])
            if guidance is not None:
                assert self.uncond_ids is not None  # guidance runs on it
                uncond = guidance.step(self.uncond_ids[:, : uwidth + j])
        self._replay = 0
        if self.speculation is not None:
            if guidance is not None:  # one runner for both contexts: speculation feeds and cuts them alike
                assert self.uncond_ids is not None  # guidance runs on it
                runner = guided(
                    runner, guidance, self.uncond_ids[:, : self._uncond_width], self.attention_mask.shape[1]
                )
            yield from self.speculation.run(self, runner, logits, self._steps, uncond)
            return
        step = self._steps
        while True:
            step += 1
            token_ids, active = self._one_step(logits, step, uncond)
            yield token_ids, active
            if self._all_finished:
                break
            logits = self.step_model(runner)
            if guidance is not None:  # the unconditional context continues with the same tokens
                assert self.uncond_ids is not None  # guidance runs on it
                self.uncond_ids = torch.cat([self.uncond_ids, token_ids[:, None]], dim=-1)
                uncond = guidance.step(self.uncond_ids)

    def step_model(self, runner: ModelRunner) -> torch.Tensor:
        """The model's logits after the last step's tokens: every row, or on a runner that skips them, the rows still
        generating."""
        if self._any_finished and runner.skips_inactive:
            return runner.step(self.input_ids, active=~self.finished)
        return runner.step(self.input_ids)

    def _one_step(
        self, logits: torch.Tensor, step: int, uncond: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.output_logits:
            self.raw_logits.append(ordinary(logits, copy=True))
        if self.vocab_limit is not None:
            logits[:, self.vocab_limit :] = float("-inf")
            if uncond is not None:
                uncond[:, self.vocab_limit :] = float("-inf")
        if self.logits_processor is not None:
            logits = self.logits_processor(self.input_ids, logits)
        want_scores = self.output_scores
        history = self.history_args(self.input_ids)
        plain = not want_scores and uncond is None and not self.top_logprobs and self._logprobs_at == "processed"
        step_graphs = self._step_graphs(logits) if plain else None
        out = None
        if step_graphs is not None:
            try:
                out = step_graphs.sample(logits, **history)
            except Exception as exc:  # noqa: BLE001 - a capture the device refuses: the eager step (it raises the
                self._graphs = False  # chain's own errors again)
                warnings.warn(
                    f"the sampling step could not be captured in a CUDA graph ({type(exc).__name__}: "
                    f"{exc}); running it eagerly (cuda_graphs=False hides this)",
                    GenerationWarning,
                    stacklevel=4,
                )
        try:
            out = (
                self.sample_rows(logits, self.request_ids, history, self._logprobs_at, uncond)
                if out is None
                else out.check()
            )
        except SamplingError:
            if not self._any_finished:
                raise
            # a finished row runs on (its tokens become the pad) but is no row of the caller's to fail: its chain
            # may mask every token of its pad-fed position; the rows still going are drawn alone (an error of
            # theirs stands)
            return step_going(self, logits, step, history, uncond)
        return self.commit(out.token_ids, out.logprobs, step, out.scores, out.top_logprobs)

    def sample_rows(
        self,
        logits: torch.Tensor,
        request_ids: Sequence[str],
        history: Mapping[str, torch.Tensor],
        logprobs_at: str | list[str],
        uncond: torch.Tensor | None = None,
        *,
        accept: bool | torch.Tensor = True,
        scores: bool = False,
    ) -> Any:
        """One eager chain step for `request_ids` (all rows, or the rows a speculative call samples), checked;
        accept=False leaves the store for `chain.accept`, accept=token ids accepts those (teacher forcing: their
        logprobs), scores=True returns the processed logits whatever output_scores says."""
        out = self.chain.sample(
            logits,
            self.store,
            request_ids,
            accept=accept,
            return_scores=self.output_scores or scores,
            unconditional_logits=uncond,
            logprobs_at=logprobs_at,
            top_logprobs=self.top_logprobs,
            **history,
        )
        self._eager_steps += 1
        return out.check()

    def commit(
        self,
        tokens: torch.Tensor,
        logprobs: torch.Tensor,
        step: int,
        scores: torch.Tensor | None = None,
        tops: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A step's drawn tokens (B,) appended to every row (finished rows: the pad token), then the criteria; ->
        (the tokens appended, active: the rows that produced a real token)."""
        drawn = logprobs
        if self._any_finished:  # finished rows get the pad token (and a 0 logprob)
            active = ~self.finished
            tokens = torch.where(active, tokens, torch.full_like(tokens, self.pad_id))
            logprobs = torch.where(active, logprobs, torch.zeros_like(logprobs))
        else:
            active = self._all_rows
        self.input_ids = torch.cat([self.input_ids, tokens[:, None]], dim=-1)
        self.logprobs.append(logprobs)
        if self.output_scores:
            assert scores is not None  # asked for with return_scores
            self.scores.append(ordinary(scores))
        if self.top_logprobs:
            assert tops is not None  # asked for with top_logprobs
            self.tops.append((ordinary(tops[0]), ordinary(tops[1])))
        ctx = StopContext(self.input_ids, step, tokens, self.setup, drawn, scores)
        result = self.stopping.check(ctx)
        if result.any:
            newly = result.done & active
            rows = newly.nonzero().flatten().tolist()
            for b in rows:
                self.finish_reasons[b] = result.reasons[b]
                self.stop_matches[b] = result.matches.get(b)
                self.num_generated[b] = step
            if rows:
                self.finished |= newly
                self._any_finished = True
                self._all_finished = bool(self.finished.all())
        self._steps = step
        return tokens, active

    def end_rows(self, rows: Sequence[int], reasons: Sequence[str]) -> None:
        """Finish `rows` after the tokens they have, with these finish reasons (a guard ended them)."""
        for b, reason in zip(rows, reasons):
            self.finish_reasons[b] = reason
            self.num_generated[b] = self._steps
        self.finished[list(rows)] = True
        self._any_finished = True
        self._all_finished = bool(self.finished.all())

    def _logprobs_rows(self, mode: Any) -> str | list[str]:
        """logprobs_mode as Chain.sample's logprobs_at: one value, or one per row (given one per prompt); names are
        checked here, before the first forward."""
        if isinstance(mode, str):
            values: str | list[str] = mode
        elif isinstance(mode, Sequence) and len(mode) == self.num_prompts:
            values = [v for v in mode for _ in range(self.n)]
        else:
            raise ConfigError(
                f"logprobs_mode = {mode!r}: give one string (for example 'raw', 'processed', "
                f"'processed_logits' or a chain entry's id) or one per prompt ({self.num_prompts})"
            )
        for p in range(self.num_prompts):
            chain = self.chain.chains[self.chain.row_chains[p]] if isinstance(self.chain, MixedChains) else self.chain
            chain.logprobs_stage(mode if isinstance(mode, str) else mode[p])
        return values

    def _step_graphs(self, logits: torch.Tensor) -> graphs.StepGraphs | None:
        """The batch's captured step, from the second step on (the first, eager, compiles the kernels and fills the
        samplers' caches); None where the step runs eagerly."""
        if self._graphs is None and self._eager_steps and self._cuda_graphs is not False:
            reason = graphs.graphs_unavailable_reason(self.chain, logits.device, self.store, self.request_ids)
            if reason and self._cuda_graphs:
                warnings.warn(
                    f"cuda_graphs=True, but the sampling step runs eagerly: {reason}", GenerationWarning, stacklevel=5
                )
            self._graphs = False if reason else graphs.StepGraphs(self.chain, self.store, self.request_ids)
        return self._graphs or None

    def history_args(self, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """history= / prompt_lengths= for chains with history-reading samplers: the tokens so far, prompt padding
        as -1. `input_ids` may repeat each prompt's rows (beams): the padding pattern repeats with them."""
        if not self.chain.needs_history:
            return {}
        pad = self.attention_mask == 0
        reps = input_ids.shape[0] // pad.shape[0]
        if reps > 1:
            pad = pad.repeat_interleave(reps, dim=0)
        history = input_ids.clone()
        history[:, : pad.shape[1]].masked_fill_(pad, -1)
        lengths = self.prompt_lengths.repeat_interleave(reps) if reps > 1 else self.prompt_lengths
        return {"history": history, "prompt_lengths": lengths}

    def output(self) -> GenerationOutput:
        prompt_length = self.setup.prompt_length
        new = self.input_ids[:, prompt_length:]
        texts = None
        if self.tokenizer is not None:
            texts = [
                cut_text(self.tokenizer.decode(row[:n].tolist(), skip_special_tokens=True), match, include)
                for row, n, match, include in zip(
                    new.cpu(), self.num_generated.tolist(), self.stop_matches, self.include_stop_str_in_output
                )
            ]
        out = GenerationOutput(
            sequences=self.input_ids,
            scores=tuple(self.scores) if self.output_scores else None,
            logits=tuple(self.raw_logits) if self.output_logits else None,
            logprobs=torch.stack(self.logprobs, dim=1) if self.logprobs else None,
            top_logprobs=tuple(self.tops) if self.top_logprobs else None,
            finish_reasons=list(self.finish_reasons),
            stop_texts=[None if m is None else m.text for m in self.stop_matches],
            num_generated=torch.where(
                self.finished.cpu(), self.num_generated, torch.full_like(self.num_generated, self._steps)
            ),
            texts=texts,
            prompt_length=prompt_length,
        )
        if self.speculation is not None:
            self.speculation.report(out)
        return out
