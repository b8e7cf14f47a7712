"""Adapters that let chains and criteria run inside other libraries' generation loops."""

from __future__ import annotations

from .transformers import (
    ChainLogitsProcessor,
    ChainStoppingCriteria,
    as_custom_generate,
    as_logits_processor,
    as_stopping_criteria,
)

__all__ = [
    "ChainLogitsProcessor",
    "ChainStoppingCriteria",
    "as_custom_generate",
    "as_logits_processor",
    "as_stopping_criteria",
]
