"""Generation with Hugging Face causal LMs: the decoding loop, beam search, streaming, outputs."""

from __future__ import annotations

from ..contracts import max_positions
from ..errors import GenerationWarning
from .checkpoints import CHECKPOINT_FORMAT, load_checkpoint
from .from_config import chain_from_generation_config
from .loop import StreamEvent, generate, stream
from .model import ModelRunner, TransformersRunner, runner_for
from .outputs import GenerationOutput
from .scoring import ScoreOutput, score
from .session import Generation
from .streaming import IncrementalDecoder

__all__ = [
    "CHECKPOINT_FORMAT",
    "Generation",
    "GenerationOutput",
    "GenerationWarning",
    "IncrementalDecoder",
    "ModelRunner",
    "ScoreOutput",
    "StreamEvent",
    "TransformersRunner",
    "chain_from_generation_config",
    "generate",
    "load_checkpoint",
    "runner_for",
    "score",
    "max_positions",
    "stream",
]
