"""benchmarks/requantize.py's comparison of two GGUF files on the speculative benchmark's prompts (never how fast)."""

from __future__ import annotations

import math

import pytest

from samplechain.errors import ConfigError

BENCH = "requantize"  # the `bench` fixture loads benchmarks/requantize.py

pytest.importorskip("llama_cpp")


@pytest.fixture(scope="module")
def gguf():
    from samplechain.models import default_gguf_path

    try:
        return str(default_gguf_path())
    except ConfigError as exc:
        pytest.skip(str(exc))


def test_a_file_compared_with_itself_agrees_everywhere(bench, gguf):
    c = bench.compare(gguf, gguf, count=9)  # the eight `code` prompts and the first `list` one, chat-rendered
    assert c["positions"] > 1500
    assert c["kl"] == 0.0 and c["agree"] == 1.0
    assert c["perplexity_source"] == c["perplexity_written"]
    assert 1.0 < c["perplexity_source"] < 100.0 and math.isfinite(c["perplexity_source"])


def test_a_quantization_that_fails_says_which_call_and_returns_one(bench, gguf, tmp_path, capsys):
    out = tmp_path / "missing" / "q8_0.gguf"  # a folder that does not exist: llama.cpp cannot write there
    assert bench.main(["Q8_0", str(out)]) == 1
    err = capsys.readouterr().err
    assert "llama_model_quantize" in err and str(out) in err and "Q8_0" in err
