"""Generation with Hugging Face causal LMs: the decoding loop, beam search, streaming, outputs."""

from __future__ import annotations

from ..contracts import max_positions
from .loop import (
    CHECKPOINT_FORMAT,
    Generation,
    GenerationWarning,
    StreamEvent,
    chain_from_generation_config,
    generate,
    load_checkpoint,
    stream,
)
from .model import ModelRunner
from .outputs import GenerationOutput
from .streaming import IncrementalDecoder

__all__ = [
    "CHECKPOINT_FORMAT",
    "Generation",
    "GenerationOutput",
    "GenerationWarning",
    "IncrementalDecoder",
    "ModelRunner",
    "StreamEvent",
    "chain_from_generation_config",
    "generate",
    "load_checkpoint",
    "max_positions",
    "stream",
]
