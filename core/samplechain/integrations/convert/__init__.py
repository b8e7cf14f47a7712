"""Importers and exporters: transformers GenerationConfig, llama.cpp sampling flags, vLLM / OpenAI sampling params.

Importers return a chain as a plain dict (`{"name": ..., "samplers": [...], "stop": [...]}`) that `Chain.load`
accepts and `to_toml` writes; exporters take a chain (a `Chain`, a `ChainConfig`, a chain dict, a TOML file or
"preset:NAME") and return the target's settings, or raise one ConfigError saying which sampler, parameter or
order the target cannot express. See docs/convert.md for the mapping tables. One module per engine
(`transformers`, `llama_cpp`, `vllm`); what they share is in `common`.

    from_transformers(config_or_path)  -> chain dict      to_transformers(chain) -> GenerationConfig kwargs
    from_llama_cpp(["--top-k", "20"])  -> chain dict      to_llama_cpp(chain)    -> list of flags
    from_vllm({"temperature": 0.7})    -> chain dict      to_vllm(chain)         -> SamplingParams kwargs
    to_toml(chain)                     -> TOML text that Chain.load reads
"""

from __future__ import annotations

from typing import Any

from ...errors import ConfigError
from .common import ConvertWarning, _hint, chain_to_dict, normalized, to_toml
from .llama_cpp import LLAMA_CPP_SAMPLER_CHARS, LLAMA_CPP_SAMPLER_NAMES, from_llama_cpp, to_llama_cpp
from .transformers import from_transformers, to_transformers
from .vllm import from_vllm, to_vllm

__all__ = [
    "ConvertWarning",
    "from_transformers",
    "from_llama_cpp",
    "from_vllm",
    "to_transformers",
    "to_llama_cpp",
    "to_vllm",
    "chain_to_dict",
    "to_toml",
    "normalized",
    "convert",
    "LLAMA_CPP_SAMPLER_NAMES",
    "LLAMA_CPP_SAMPLER_CHARS",
]


# --------------------------------------------------------------------------------------------------- facade
SOURCES = ("transformers", "llama.cpp", "vllm", "toml")
TARGETS = ("toml", "transformers", "llama.cpp", "vllm")


def import_chain(kind: str, source: Any) -> dict[str, Any]:
    """A chain dict from a source of the given kind (see SOURCES)."""
    if kind == "transformers":
        return from_transformers(source)
    if kind == "llama.cpp":
        return from_llama_cpp(source)
    if kind == "vllm":
        return from_vllm(source)
    if kind == "toml":
        return chain_to_dict(source)
    raise ConfigError(f"unknown source {kind!r}{_hint(kind, SOURCES)} (valid: {', '.join(SOURCES)})")


def export_chain(kind: str, chain: Any) -> Any:
    if kind == "toml":
        return to_toml(chain)
    if kind == "transformers":
        return to_transformers(chain)
    if kind == "llama.cpp":
        return to_llama_cpp(chain)
    if kind == "vllm":
        return to_vllm(chain)
    raise ConfigError(f"unknown target {kind!r}{_hint(kind, TARGETS)} (valid: {', '.join(TARGETS)})")


def convert(source: Any, *, from_: str, to: str) -> Any:
    """Import `source` as `from_` and export it as `to` (TOML text, a kwargs dict, or a list of flags)."""
    return export_chain(to, import_chain(from_, source))
