"""The processor as vLLM builds it, on the embedded model, for the processor-level tests (no server)."""

from __future__ import annotations

import functools
import types
from typing import Any

import torch
from transformers import AutoConfig, AutoTokenizer

from samplechain.models import tiny_model_path
from samplechain_vllm import SamplechainLogitsProcessor


def make_processor(logprobs_mode: str | None = None) -> SamplechainLogitsProcessor:
    """A SamplechainLogitsProcessor with the vLLM config fields it reads (logprobs_mode: vLLM's --logprobs-mode)."""
    path = str(tiny_model_path())
    model_config = types.SimpleNamespace(
        tokenizer=path, tokenizer_revision=None, trust_remote_code=False, hf_config=AutoConfig.from_pretrained(path)
    )
    if logprobs_mode is not None:
        model_config.logprobs_mode = logprobs_mode
    return SamplechainLogitsProcessor(types.SimpleNamespace(model_config=model_config), torch.device("cpu"), False)


@functools.cache
def tokenizer() -> Any:
    return AutoTokenizer.from_pretrained(tiny_model_path())
