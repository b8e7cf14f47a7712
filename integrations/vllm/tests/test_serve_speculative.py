"""A server with vLLM's speculative decoding (n-gram) builds no entry-point logits processor, so no chain can run
there: a samplechain request gets HTTP 400 saying so and what to do instead; requests without a chain run as usual."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from test_serve import MAX_TOKENS, complete

from conftest import serving

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}


@pytest.fixture(scope="module")
def speculative_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with serving(tmp_path_factory, ["--speculative-config", json.dumps(NGRAM)], max_num_seqs=4) as url:
        yield url


def test_samplechain_requests_are_refused_under_vllms_speculative_decoding(speculative_server: str) -> None:
    refused = complete(speculative_server, "In Python, a list is", {"samplechain": "llama.cpp"}, seed=7)
    assert refused.status_code == 400, refused.text
    message = refused.json()["error"]["message"]
    for words in [
        "samplechain",
        "speculative decoding",
        "ngram",
        "without speculative_config",
        'draft="prompt_lookup"',
    ]:
        assert words in message, f"{words!r} not in {message!r}"
    for xargs in (None, {"samplechain": "off"}):  # no chain: vLLM's own sampling, speculation included
        plain = complete(speculative_server, "In Python, a list is", xargs, temperature=0.0)
        assert plain.status_code == 200, plain.text
        assert len(plain.json()["choices"][0]["token_ids"]) == MAX_TOKENS
