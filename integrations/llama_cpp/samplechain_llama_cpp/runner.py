"""Placeholder until the llama.cpp runner lands in this package."""

from __future__ import annotations

from typing import Any

from samplechain.runners import ModelRunner

from .model import LlamaCppModel

__all__ = ["LlamaCppRunner"]


class LlamaCppRunner(ModelRunner):
    name = "llama_cpp"

    @classmethod
    def accepts(cls, model: Any) -> bool:
        return isinstance(model, LlamaCppModel)
