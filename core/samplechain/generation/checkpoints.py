"""Checkpoints of a generation between two steps: `Generation.checkpoint()` writes one as plain JSON-able data,
`generate(resume=...)` reads it back (`load_checkpoint`) and continues with the same tokens."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ..contracts import StopMatch, StopSetup
from ..engine.chain import Chain
from ..engine.mixed import MixedChains
from ..errors import ConfigError

__all__ = ["CHECKPOINT_FORMAT", "Checkpoints", "chain_fingerprint", "load_checkpoint"]

CHECKPOINT_FORMAT = "samplechain.generation.checkpoint/1"


def load_checkpoint(source: Mapping[str, Any] | str | Path) -> dict[str, Any]:
    """A checkpoint from `Generation.checkpoint()`: the dict itself, or the path of a JSON file holding it."""
    if isinstance(source, (str, Path)):
        try:
            data = json.loads(Path(source).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise ConfigError(f"resume={str(source)!r}: cannot read a checkpoint JSON file ({exc})") from None
    elif isinstance(source, Mapping):
        data = dict(source)
    else:
        raise ConfigError(f"resume={source!r}: pass the dict from Generation.checkpoint() or the path of its JSON file")
    if data.get("format") != CHECKPOINT_FORMAT:
        raise ConfigError(
            f"resume: format {data.get('format')!r} is not {CHECKPOINT_FORMAT!r}; pass what "
            "Generation.checkpoint() returned (this version reads only its own format)"
        )
    return data


def chain_fingerprint(chain: Chain | MixedChains) -> Any:
    """What a checkpoint must be resumed with: every sampler's entry id and versioned name, in order."""
    if isinstance(chain, MixedChains):
        return {key: chain_fingerprint(c) for key, c in chain.chains.items()}
    return [f"{spec.id}={spec.cls.qualified_name()}" for spec in chain.config.samplers]


class Checkpoints:
    """Generation's checkpoint and the restore steps of a resume (the attributes are Generation's)."""

    model: Any
    chain: Chain | MixedChains
    store: Any  # a RequestStore, or a MixedStore for a mixed batch
    setup: StopSetup
    request_ids: list[str]
    n: int
    pad_id: int
    eos_ids: list[int]
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    uncond_ids: torch.Tensor | None
    uncond_mask: torch.Tensor | None
    _uncond_width: int
    logprobs: list[torch.Tensor]
    finished: torch.Tensor
    finish_reasons: list[str | None]
    stop_matches: list[StopMatch | None]
    num_generated: torch.Tensor
    _any_finished: bool
    _steps: int
    _elapsed: float
    speculation: Any  # a Speculation, or None

    def checkpoint(self) -> dict[str, Any]:
        """The whole generation between two steps as plain JSON-able data: prompts, the tokens so far and their
        logprobs, finished rows and reasons, the step count, and the request store's snapshot (parameters, seeds,
        RNG positions, sampler state: mirostat mu, adaptive-p EMA; penalties, DRY and grammar read the tokens so
        far). Pass it (or its JSON file) as `resume=` to continue with the same tokens. scores, logits and
        top_logprobs are not kept: after a resume they hold the steps run since."""
        width = self.setup.prompt_length
        started = self.setup.start_time
        elapsed = time.monotonic() - started if started else self._elapsed  # steps() started the clock at -elapsed
        uncond = None
        if self.uncond_ids is not None:
            assert self.uncond_mask is not None  # set with uncond_ids
            uncond = {
                "input_ids": self.uncond_ids[:, : self._uncond_width].tolist(),
                "attention_mask": self.uncond_mask.tolist(),
            }
        return {
            "format": CHECKPOINT_FORMAT,
            "chain": chain_fingerprint(self.chain),
            "request_ids": list(self.request_ids),
            "num_return_sequences": self.n,
            "input_ids": self.input_ids[:, :width].tolist(),
            "attention_mask": self.attention_mask.tolist(),
            "generated": self.input_ids[:, width:].tolist(),
            "logprobs": torch.stack(self.logprobs, dim=1).tolist() if self.logprobs else [[] for _ in self.request_ids],
            "step": self._steps,
            "finished": self.finished.tolist(),
            "finish_reasons": list(self.finish_reasons),
            "stop_matches": [None if m is None else [m.reason, m.text, m.trailing] for m in self.stop_matches],
            "num_generated": self.num_generated.tolist(),
            "pad_token_id": self.pad_id,
            "eos_token_id": list(self.eos_ids),
            "elapsed": elapsed,
            "unconditional": uncond,
            "store": self.store.snapshot(),
            # speculative decoding: tokens drawn past the last step (the store is past them too), the counts
            "speculation": None if self.speculation is None else self.speculation.checkpoint(),
        }

    @staticmethod
    def _checkpoint_tensor(ckpt: Mapping[str, Any], key: str, device: Any) -> torch.Tensor:
        t = torch.tensor(ckpt[key], dtype=torch.int64)
        if t.ndim != 2:
            raise ConfigError(
                f"resume: checkpoint[{key!r}] must be a (batch, length) list of lists, got shape "
                f"{tuple(t.shape)}; the checkpoint is damaged"
            )
        return t.to(device)

    def _restore_requests(self, ckpt: Mapping[str, Any]) -> None:
        if ckpt["chain"] != chain_fingerprint(self.chain):
            raise ConfigError(
                f"resume: the checkpoint was made with the chain {ckpt['chain']}, this generation has "
                f"{chain_fingerprint(self.chain)}: resume with the chain of the interrupted run"
            )
        if list(ckpt["request_ids"]) != self.request_ids:
            raise ConfigError(
                f"resume: the checkpoint's requests {ckpt['request_ids']} do not match its prompts; the "
                "checkpoint is damaged"
            )
        self.store.restore(ckpt["store"])

    def _restore_unconditional(self, ckpt: Mapping[str, Any], device: Any) -> tuple[Any, Any]:
        uncond = ckpt.get("unconditional")
        if (uncond is None) == self.chain.needs_unconditional_logits:
            has = "has no" if uncond is None else "has a"
            raise ConfigError(
                f"resume: the checkpoint {has} negative-prompt context but this chain "
                f"{'needs' if uncond is None else 'has no guidance sampler to use'} one: resume with the "
                "chain of the interrupted run"
            )
        if uncond is None:
            return None, None
        return self._checkpoint_tensor(uncond, "input_ids", device), self._checkpoint_tensor(
            uncond, "attention_mask", device
        )

    def _restore_progress(self, ckpt: Mapping[str, Any]) -> None:
        """Tokens so far, logprobs, finished rows and the step count; steps() replays the tokens through the model."""
        batch = self.input_ids.shape[0]
        generated = (
            self._checkpoint_tensor(ckpt, "generated", self.input_ids.device)
            if ckpt["step"]
            else torch.zeros((batch, 0), dtype=torch.int64, device=self.input_ids.device)
        )
        steps = int(ckpt["step"])
        if generated.shape != (batch, steps) or len(ckpt["finished"]) != batch:
            raise ConfigError(
                f"resume: the checkpoint has {tuple(generated.shape)} generated tokens for {batch} rows "
                f"and {steps} steps; the checkpoint is damaged"
            )
        vocab = getattr(self.model.config, "vocab_size", None)
        if steps and isinstance(vocab, int) and int(generated.max()) >= vocab:
            raise ConfigError(
                f"resume: the checkpoint holds token id {int(generated.max())} but the model has "
                f"{vocab} tokens: resume with the model of the interrupted run"
            )
        self.input_ids = torch.cat([self.input_ids, generated], dim=-1)
        if self.uncond_ids is not None:  # the unconditional context grows with the same tokens
            self.uncond_ids = torch.cat([self.uncond_ids, generated], dim=-1)
        self.logprobs = list(
            torch.tensor(ckpt["logprobs"], dtype=torch.float32)
            .reshape(batch, steps)
            .to(self.input_ids.device)
            .unbind(1)
        )
        self.finished = torch.tensor(ckpt["finished"], dtype=torch.bool, device=self.input_ids.device)
        self.finish_reasons = list(ckpt["finish_reasons"])
        self.stop_matches = [None if m is None else StopMatch(*m) for m in ckpt.get("stop_matches") or [None] * batch]
        self.num_generated = torch.tensor(ckpt["num_generated"], dtype=torch.int64)
        self._any_finished = bool(self.finished.any())
        self._all_finished = bool(self.finished.all()) and batch > 0
        self._steps = steps
        self._replay = steps
        self._elapsed = float(ckpt.get("elapsed", 0.0))
        self._restore_speculation(ckpt)

    def _restore_speculation(self, ckpt: Mapping[str, Any]) -> None:
        """A speculative generation's drawn tokens and counts; its drawn tokens need the same draft= again. A
        checkpoint of a generation without a drafter resumed with one: every token so far took a model call."""
        saved = ckpt.get("speculation")
        if saved is None:
            if self.speculation is not None:
                done = zip(self.finished.tolist(), self.num_generated.tolist())
                self.speculation.model_calls = [int(n) if f else self._steps for f, n in done]
            return
        _check_speculation(saved, self.input_ids.shape[0], getattr(self.model.config, "vocab_size", None))
        if self.speculation is None:
            if any(saved["pending"]):
                raise ConfigError(
                    "resume: the checkpoint was made with speculative decoding and holds tokens drawn past its last "
                    "step; resume with draft= as the interrupted run had it"
                )
            return
        try:
            self.speculation.restore(saved)
        except (TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:
            raise ConfigError(
                f"resume: the checkpoint's speculation is damaged ({type(exc).__name__}: {exc})"
            ) from None


def _check_speculation(saved: Any, rows: int, vocab: Any) -> None:
    """A ConfigError naming what is damaged unless `saved` is a speculation checkpoint for `rows` rows: its per-row
    lists, each row's drawn tokens (ids of the model) with a logprob (and a kept flag) each."""

    def damaged(what: str) -> ConfigError:
        return ConfigError(
            f"resume: the checkpoint's speculation is damaged ({what}); resume from an intact checkpoint"
        )

    if not isinstance(saved, Mapping):
        raise damaged(f"{type(saved).__name__} where a table is expected")
    keys = ["pending", "pending_logprobs", "drafted", "kept", "model_calls", "off"]
    for key in keys + [k for k in ("pending_kept",) if saved.get(k) is not None]:
        value = saved.get(key)
        if not isinstance(value, list) or len(value) != rows:
            raise damaged(f"{key!r} is not a list of {rows} rows")
    for b in range(rows):
        tokens = saved["pending"][b]
        parts = [saved[k][b] for k in ("pending_logprobs", "pending_kept") if saved.get(k) is not None]
        if not isinstance(tokens, list) or any(not isinstance(p, list) or len(p) != len(tokens) for p in parts):
            raise damaged(f"row {b}'s drawn tokens and their logprobs differ in number")
        if any(not isinstance(t, int) or t < 0 or (isinstance(vocab, int) and t >= vocab) for t in tokens):
            raise damaged(f"row {b} holds drawn tokens {tokens} that are not token ids of the model")
