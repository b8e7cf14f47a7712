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

__all__ = ["CHECKPOINT_FORMAT", "CHECKPOINT_KEYS", "Checkpoints", "chain_fingerprint", "load_checkpoint"]

CHECKPOINT_FORMAT = "samplechain.generation.checkpoint/1"
# what Generation.checkpoint() writes: a checkpoint without one of them is damaged
CHECKPOINT_KEYS = (
    "format",
    "chain",
    "request_ids",
    "num_return_sequences",
    "input_ids",
    "attention_mask",
    "generated",
    "logprobs",
    "step",
    "finished",
    "finish_reasons",
    "stop_matches",
    "num_generated",
    "pad_token_id",
    "eos_token_id",
    "elapsed",
    "unconditional",
    "store",
    "speculation",
)
_OPTIONAL: dict[str, Any] = {"stop_matches": None, "elapsed": 0.0, "unconditional": None, "speculation": None}


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
    missing = [key for key in CHECKPOINT_KEYS if key not in data and key not in _OPTIONAL]
    if missing:
        raise ConfigError(
            f"resume: the checkpoint has no {', '.join(missing)}; the checkpoint is damaged (pass what "
            "Generation.checkpoint() returned, or its JSON file, unchanged)"
        )
    for key, default in _OPTIONAL.items():  # what checkpoints of this format did not always hold
        data.setdefault(key, default)
    if data["stop_matches"] is None and isinstance(data["request_ids"], list):
        data["stop_matches"] = [None] * len(data["request_ids"])
    _check_layout(data)
    return data


def _is_int(x: Any, least: int = 0) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and least <= x < 2**63


def _is_real(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _rows(data: Mapping[str, Any], key: str, batch: int, width: int | None, item: Any, expected: str) -> None:
    """checkpoint[key] is `batch` lists (of `width` items each, when given, else of one length) whose items pass
    `item`; else one ConfigError naming the first wrong place."""
    rows = data[key]
    if not isinstance(rows, list) or len(rows) != batch:
        raise _damaged(f"[{key!r}]", rows, f"a list of {batch} rows")
    for b, row in enumerate(rows):
        want = width if width is not None else len(rows[0]) if isinstance(rows[0], list) else 0
        _items(f"[{key!r}][{b}]", row, want, item, expected)


def _items(where: str, values: Any, count: int, item: Any, expected: str) -> None:
    if not isinstance(values, list) or len(values) != count:
        raise _damaged(where, values, f"a list of {count} {expected}")
    for j, x in enumerate(values):
        if not item(x):
            raise _damaged(f"{where}[{j}]", x, expected)


def _damaged(where: str, value: Any, expected: str) -> ConfigError:
    shown = repr(value)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return ConfigError(f"resume: checkpoint{where} = {shown}: expected {expected}; the checkpoint is damaged")


def _check_layout(data: Mapping[str, Any]) -> None:
    """The types and shapes of what Generation.checkpoint() writes, each wrong one named by its key path: the
    restore then never meets a value it cannot take (the store's and the speculation's parts check themselves)."""
    ids = data["request_ids"]
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise _damaged("['request_ids']", ids, "a list of request ids (strings)")
    batch = len(ids)
    step = data["step"]
    if not _is_int(step):
        raise _damaged("['step']", step, "the number of steps run (an integer >= 0)")
    _rows(data, "input_ids", batch, None, _is_int, "token ids (integers >= 0)")
    _rows(data, "attention_mask", batch, len(data["input_ids"][0]) if batch else 0, lambda x: x in (0, 1), "0 or 1")
    _rows(data, "generated", batch, step, _is_int, "token ids (integers >= 0)")
    _rows(data, "logprobs", batch, step, _is_real, "logprobs (numbers)")
    for key, ok, expected in (
        ("finished", lambda x: isinstance(x, bool), "true or false"),
        ("finish_reasons", lambda x: x is None or isinstance(x, str), "a finish reason (a string) or null"),
        ("num_generated", lambda x: _is_int(x) and x <= step, f"a token count in [0, {step}]"),
        ("stop_matches", _is_stop_match, "null or [reason, text, trailing characters]"),
    ):
        _items(f"[{key!r}]", data[key], batch, ok, expected)
    if not _is_int(data["pad_token_id"]):
        raise _damaged("['pad_token_id']", data["pad_token_id"], "a token id (an integer >= 0)")
    eos = data["eos_token_id"]
    if not (isinstance(eos, list) and all(_is_int(t) for t in eos)):
        raise _damaged("['eos_token_id']", eos, "a token id (an integer >= 0), in a list")
    if not (_is_real(data["elapsed"]) and data["elapsed"] >= 0):
        raise _damaged("['elapsed']", data["elapsed"], "the seconds run so far (a number >= 0)")
    for key in ("unconditional", "store", "speculation"):
        if not (isinstance(data[key], dict) or (data[key] is None and key != "store")):
            raise _damaged(f"[{key!r}]", data[key], "a table" + (" or null" if key != "store" else ""))


def _is_stop_match(x: Any) -> bool:
    return x is None or (
        isinstance(x, list) and len(x) == 3 and isinstance(x[0], str) and isinstance(x[1], str) and _is_int(x[2])
    )


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
        try:
            t = torch.tensor(ckpt[key], dtype=torch.int64)
        except (TypeError, ValueError, RuntimeError, OverflowError) as exc:
            raise ConfigError(
                f"resume: checkpoint[{key!r}] is not a (batch, length) list of lists of integers ({exc}); the "
                "checkpoint is damaged"
            ) from None
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
    for key in ("drafted", "kept", "model_calls"):
        if not all(_is_int(n) for n in saved[key]):
            raise damaged(f"{key!r} = {saved[key]} is not a count (an integer >= 0) per row")
