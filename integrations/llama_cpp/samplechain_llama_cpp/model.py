"""Placeholder until the llama.cpp model wrapper lands in this package."""

from __future__ import annotations

from typing import Any

__all__ = ["LlamaCppModel", "load_gguf"]


class LlamaCppModel:
    pass


def load_gguf(path: Any, **kwargs: Any) -> tuple[Any, Any]:
    raise NotImplementedError("the llama.cpp engine is not available yet")
