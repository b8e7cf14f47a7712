"""vLLM serving with the samplechain plugin gives samplechain's own generate() tokens, request by request, with
many requests (several chains) in flight at once; a request with a bad chain gets HTTP 400 with samplechain's
message while the others complete."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import requests

from conftest import CHAIN_DIR, MODEL_NAME

from reference import reference_tokens

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

PROMPTS = [
    "In Python, a list is",
    "The dictionary",
    "A function returns",
    "import os",
    "The for statement",
    "Exceptions are raised when",
    "class Point:",
    "The standard library",
    "A tuple is an immutable",
    "def main():",
    "Strings can be",
    "The module",
    "When the interpreter",
    "x = [1, 2, 3]",
    "Iterators",
    "The with statement is used to",
]
MAX_TOKENS = 16
SEEDS = [1000 + i for i in range(len(PROMPTS))]
INLINE = {"samplers": [{"use": "top_k", "k": 8}, {"use": "temperature", "t": 1.3}, {"use": "dist"}]}

# (name, vllm_xargs, samplechain chain for generate(), seeds, generate() params)
CASES: list[tuple[str, dict[str, Any], Any, list[int | None], dict[str, Any] | None]] = [
    ("greedy", {"samplechain": "greedy"}, "preset:greedy", [None] * len(PROMPTS), None),
    ("llama.cpp seeded", {"samplechain": "llama.cpp"}, "preset:llama.cpp", SEEDS, None),
    (
        "llama.cpp seeded, inline params",
        {"samplechain": "llama.cpp", "samplechain.top_k": 5, "samplechain.temperature": 1.5},
        "preset:llama.cpp",
        SEEDS,
        {"top_k": 5, "temperature": 1.5},
    ),
    ("inline chain as JSON", {"samplechain": json.dumps({"chain": INLINE})}, INLINE, SEEDS, None),
    ("chain file", {"samplechain": "creative.toml"}, str(CHAIN_DIR / "creative.toml"), SEEDS, None),
]


def complete(
    url: str, prompt: str, xargs: dict[str, Any] | None, seed: int | None = None, **extra: Any
) -> requests.Response:
    body: dict[str, Any] = {
        "model": MODEL_NAME,
        "prompt": prompt,
        "max_tokens": MAX_TOKENS,
        "ignore_eos": True,
        "return_token_ids": True,
        "temperature": 1.0,
        **extra,
    }
    if xargs is not None:
        body["vllm_xargs"] = xargs
    if seed is not None:
        body["seed"] = seed
    return requests.post(f"{url}/v1/completions", json=body, timeout=300)


def run_all(url: str, jobs: list[tuple[str, dict[str, Any] | None, int | None]]) -> list[requests.Response]:
    """Every job at once: they share vLLM's running batch (joining, finishing and moving rows)."""
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        return list(pool.map(lambda job: complete(url, *job), jobs))


@pytest.fixture(scope="module")
def references() -> dict[str, dict[str, list[list[int]]]]:
    return {
        name: reference_tokens(chain, PROMPTS, seeds, MAX_TOKENS, params) for name, _, chain, seeds, params in CASES
    }


def test_serving_equals_generate_for_16_concurrent_prompts_per_chain(server: str, references) -> None:
    jobs = [(p, xargs, s) for _, xargs, _, seeds, _ in CASES for p, s in zip(PROMPTS, seeds)]
    responses = run_all(server, jobs)  # 80 requests, five chains, all in flight together
    k = 0
    for name, *_ in CASES:
        for i, prompt in enumerate(PROMPTS):
            r = responses[k]
            k += 1
            assert r.status_code == 200, f"{name} / {prompt!r}: {r.status_code} {r.text}"
            choice = r.json()["choices"][0]
            assert choice["prompt_token_ids"] == references[name]["prompt_tokens"][i], f"{name}: prompt {i}"
            assert choice["token_ids"] == references[name]["tokens"][i], f"{name}: prompt {i} {prompt!r}"


def test_seeded_requests_repeat_and_depend_on_the_seed(server: str, references) -> None:
    prompt, xargs = PROMPTS[0], {"samplechain": "llama.cpp"}
    a, b, c = run_all(server, [(prompt, xargs, 1), (prompt, xargs, 1), (prompt, xargs, 2)])
    assert a.json()["choices"][0]["token_ids"] == b.json()["choices"][0]["token_ids"]
    assert a.json()["choices"][0]["token_ids"] != c.json()["choices"][0]["token_ids"]


def test_requests_without_samplechain_run_vllms_own_sampling(server: str, references) -> None:
    r = complete(server, PROMPTS[0], None, temperature=0.0)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["token_ids"] == references["greedy"]["tokens"][0]  # vLLM's argmax, untouched


BAD = [
    ({"samplechain": "no-such-preset"}, ["no such preset", "no-such-preset"]),
    ({"samplechain": "llama.cp"}, ["did you mean", "llama.cpp"]),
    ({"samplechain": "llama.cpp", "samplechain.top_p": 1.5}, ["top_p", "1.5"]),
    ({"samplechain": "llama.cpp", "samplechain.top_q": 0.5}, ["unknown parameter", "top_q"]),
    ({"samplechain": "/etc/passwd.toml"}, ["outside", "SAMPLECHAIN_VLLM_CHAIN_DIR"]),
    ({"samplechain": json.dumps({"chain": {"samplers": [{"use": "top_k", "k": 5}]}})}, ["selector"]),
    ({"samplechain": "{not json"}, ["not valid JSON"]),
]


def test_bad_chain_gets_a_clear_error_while_other_requests_continue(server: str, references) -> None:
    good = [(p, {"samplechain": "llama.cpp"}, s) for p, s in zip(PROMPTS[:8], SEEDS)]
    bad = [(PROMPTS[0], xargs, 1) for xargs, _ in BAD]
    responses = run_all(server, good + bad)
    for i, r in enumerate(responses[: len(good)]):
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["token_ids"] == references["llama.cpp seeded"]["tokens"][i]
    for (xargs, words), r in zip(BAD, responses[len(good) :]):
        assert r.status_code == 400, f"{xargs}: {r.status_code} {r.text}"
        message = r.json()["error"]["message"]
        assert "samplechain" in message, message
        for word in words:
            assert word.lower() in message.lower(), f"{xargs}: {word!r} not in {message!r}"
    assert complete(server, PROMPTS[1], {"samplechain": "greedy"}).status_code == 200  # the server is fine
