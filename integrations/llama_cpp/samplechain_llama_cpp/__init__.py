"""samplechain on llama.cpp, through llama-cpp-python.

Two ways in (docs/llama_cpp.md):

- samplechain's loop on a GGUF model: `load_gguf(path)` gives a `LlamaCppModel` and its tokenizer, and `generate()`,
  `stream()`, the chains, stopping criteria, logprobs, checkpoints and traces run on it through `LlamaCppRunner`
  (registered as the `llama_cpp` runner; `samplechain generate --model FILE.gguf`);
- a chain as llama-cpp-python's sampler: `SamplechainLogitsProcessor` in `Llama.create_completion` /
  `create_chat_completion`'s `logits_processor`, leaving llama.cpp's own sampler only the chain's token to pick.

llama-cpp-python is imported when a model is loaded, not when this plugin registers its runner.
"""

from __future__ import annotations

from collections.abc import Callable

from samplechain.hookspecs import hookimpl

from .model import LlamaCppModel, load_gguf
from .processor import SamplechainLogitsProcessor
from .runner import LlamaCppRunner

__all__ = ["LlamaCppModel", "LlamaCppRunner", "SamplechainLogitsProcessor", "load_gguf"]


@hookimpl
def register_runners(register: Callable[[type], None]) -> None:
    register(LlamaCppRunner)
