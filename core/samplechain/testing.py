"""Test doubles for plugin authors: a recording backend, a scripted-logits source, and a one-call runner.

    from samplechain.testing import run_chain
    out = run_chain([MySampler], {"samplers": [{"use": "mine", "x": 0.5}, {"use": "greedy"}]}, logits)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from . import rng
from .chain import Chain, SampleOutput
from .contracts import Backend, Candidates, Sampler, Stage, StepContext
from .hookspecs import hookimpl
from .plugins import PluginHost

__all__ = [
    "RecordingBackend", "ScriptedLogits", "ArgmaxSelector", "host_with", "run_chain", "byte_bpe_tokenizer", "tiny_gpt2",
    "check_eos_ids_from_setup",
]


class RecordingBackend(Backend):
    """The reference primitives in plain torch, recording every call as (primitive, input shape)."""

    name = "recording"
    device_type = "cpu"
    equivalence = "bitwise"

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[int, ...]]] = []

    def topk(self, logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.calls.append(("topk", tuple(logits.shape)))
        return torch.topk(logits, k, dim=-1)

    def sort_desc(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.calls.append(("sort_desc", tuple(logits.shape)))
        return torch.sort(logits, dim=-1, descending=True, stable=True)

    def gumbel(self, seed: torch.Tensor, position: torch.Tensor, ids: torch.Tensor, stream: int) -> torch.Tensor:
        self.calls.append(("gumbel", tuple(ids.shape)))
        return rng.gumbel(seed, position, ids, stream)

    def uniform(self, seed: torch.Tensor, position: torch.Tensor, ids: torch.Tensor, stream: int) -> torch.Tensor:
        self.calls.append(("uniform", tuple(ids.shape)))
        return rng.uniform(seed, position, ids, stream)


class ArgmaxSelector(Sampler):
    """A selector for tests that must not depend on the greedy plugin being installed."""

    name = "test_argmax"
    stage = Stage.SELECT

    def select(self, cand: Candidates, ctx: StepContext) -> torch.Tensor:
        return cand.logits.argmax(dim=-1)


class ScriptedLogits:
    """Logits from a script instead of a model: step t of request r returns script[r][t] (a 1-D tensor)."""

    def __init__(self, script: Mapping[str, Sequence[torch.Tensor]]) -> None:
        self.script = {rid: list(rows) for rid, rows in script.items()}
        self.steps = {rid: 0 for rid in self.script}

    def __call__(self, request_ids: Sequence[str]) -> torch.Tensor:
        rows = []
        for rid in request_ids:
            rows.append(self.script[rid][self.steps[rid]])
            self.steps[rid] += 1
        return torch.stack(rows)


def host_with(*classes: type, backend: type[Backend] = RecordingBackend) -> PluginHost:
    """A plugin host with the installed plugins plus `classes` (samplers, criteria, backends) registered
    in-process, and the test backend and ArgmaxSelector."""
    host = PluginHost(use_env=False)

    class _Plugin:
        @hookimpl
        def register_samplers(self, register: Any) -> None:
            register(ArgmaxSelector)
            for cls in classes:
                if issubclass(cls, Sampler):
                    register(cls)

        @hookimpl
        def register_backends(self, register: Any) -> None:
            register(backend)

    host.register_plugin(_Plugin(), name="samplechain-testing")
    return host


def run_chain(
    classes: Sequence[type],
    config: Mapping[str, Any],
    logits: torch.Tensor,
    params: Sequence[Mapping[str, Any]] | None = None,
) -> SampleOutput:
    """One step of `config` over `logits` with `classes` registered; params: one dict per row (optional)."""
    host = host_with(*classes)
    chain = Chain.load({"backend": "recording", **config}, host=host)
    store = chain.new_store()
    ids = [f"row{i}" for i in range(logits.shape[0])]
    for rid, row in zip(ids, params or [{}] * len(ids)):
        store.add(rid, row)
    return chain.sample(logits, store, ids, return_scores=True)


# ----------------------------------------------------------------- real small models for generation tests
_SAMPLE_TEXT = (
    "The quick brown fox jumps over the lazy dog. A list is a mutable sequence; a tuple is not. "
    "Naïve café owners in Zürich serve crème brûlée — 日本語のテキスト, emoji 🎉 and ümlauts. "
    "Functions return values; generators yield them one at a time. Stop here.\n\nNew paragraph.\n"
)


def byte_bpe_tokenizer(vocab_size: int = 300, text: str | None = None) -> Any:
    """A real byte-level BPE tokenizer (GPT-2 style, trained in-process with `tokenizers`) wrapped as a
    transformers PreTrainedTokenizerFast, with `<|endoftext|>` as bos and eos and no pad token (as GPT-2).
    Multi-byte characters outside the merges are split across several tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([text or _SAMPLE_TEXT] * 4, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>")


def tiny_gpt2(vocab_size: int = 300, *, seed: int = 0, n_positions: int = 128, eos_token_id: int | None = 0,
              bos_token_id: int | None = 0, init: float = 0.5) -> Any:
    """A real, random-weight transformers GPT2LMHeadModel small enough for unit tests. `init` (the initializer
    range) is large so that greedy decoding does not just repeat the prompt's last token."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=vocab_size, n_positions=n_positions,
                        bos_token_id=bos_token_id, eos_token_id=eos_token_id, initializer_range=init)
    return GPT2LMHeadModel(config).eval()


def check_eos_ids_from_setup(entry: Mapping[str, Any], logits: torch.Tensor, eos: Sequence[int],
                             **sample_args: Any) -> None:
    """Contract test for samplers with an `eos_ids` parameter (contracts.EosIds): without ids and without
    `chain.prepare` a step fails naming eos_ids; after `chain.prepare(eos_token_ids=eos)` the chain behaves exactly
    as with `eos_ids = eos` given; negative ids are refused at load naming the key. `entry` is the sampler's chain
    entry without eos_ids; sample_args go to `chain.sample` (history=, prompt_lengths=)."""
    import pytest

    from .errors import ConfigError, SamplingError

    def load(extra: Mapping[str, Any]) -> Chain:
        return Chain.load({"samplers": [{**entry, **extra}, {"use": "greedy"}]})

    bare = load({})
    with pytest.raises(SamplingError, match="eos_ids"):
        bare.sample(logits.clone(), **sample_args)
    bare.prepare(eos_token_ids=list(eos))
    got = bare.sample(logits.clone(), return_scores=True, **sample_args).scores
    want = load({"eos_ids": list(eos)}).sample(logits.clone(), return_scores=True, **sample_args).scores
    assert torch.equal(got, want)
    assert not torch.equal(got, logits), "the sampler must act in this case for the check to mean anything"
    with pytest.raises(ConfigError, match="eos_ids"):
        load({"eos_ids": [-1]})
