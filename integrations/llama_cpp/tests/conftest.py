"""Shared fixtures of the llama.cpp integration's tests."""

from __future__ import annotations

import pytest

from samplechain.errors import ConfigError


@pytest.fixture(scope="session")
def llama_model():
    """(LlamaCppModel, tokenizer) of the default model's GGUF file, loaded once (n_ctx 1024: small caches)."""
    pytest.importorskip("llama_cpp")
    from samplechain.models import default_gguf_path
    from samplechain_llama_cpp import load_gguf

    try:
        path = default_gguf_path()
    except ConfigError as exc:
        pytest.skip(str(exc))
    model, tokenizer = load_gguf(path, n_ctx=1024)
    yield model, tokenizer
    model.close()
