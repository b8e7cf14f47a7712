"""samplechain chains inside vLLM serving: a vLLM v1 logits processor (entry point group `vllm.logits_processors`).

Requests choose a chain and its parameters through `SamplingParams.extra_args` (the OpenAI server's `vllm_xargs`);
see `samplechain_vllm.requests` for the forms and docs/vllm.md for serving."""

from .processor import SamplechainLogitsProcessor, load_chain, request_params
from .requests import EXTRA_KEY, ChainSpec, RequestSpec, RequestSpecError, parse_request

__all__ = [
    "SamplechainLogitsProcessor",
    "load_chain",
    "request_params",
    "EXTRA_KEY",
    "ChainSpec",
    "RequestSpec",
    "RequestSpecError",
    "parse_request",
]
