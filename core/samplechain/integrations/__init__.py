"""Integrations: adapters that run chains and criteria inside other libraries (transformers' logits processors,
stopping criteria and `model.generate(custom_generate=...)`; `hub`: `custom_generate` repositories; `mindie`: the
MindIE facade) and the converters of other engines' settings (`convert`). Layer 4 of docs/architecture.md."""

from __future__ import annotations

from .custom_generate import as_custom_generate
from .transformers import ChainLogitsProcessor, ChainStoppingCriteria, as_logits_processor, as_stopping_criteria

__all__ = [
    "ChainLogitsProcessor",
    "ChainStoppingCriteria",
    "as_custom_generate",
    "as_logits_processor",
    "as_stopping_criteria",
]
