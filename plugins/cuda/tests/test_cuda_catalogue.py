"""Every preset and every registered sampler on the cuda backend draws the cpu backend's tokens: each chain over
several consecutive steps of the same seeded requests (the history growing by the drawn tokens), on float32 logits
and on logits rounded to bfloat16 (ties at every cut).

Without a GPU the cuda backend's sync-free logic runs on CPU tensors (`CudaBackend(device="cpu")` in place of the cpu
backend); with one (marked `gpu`) the chains run with
backend "cuda" on CUDA tensors, at a vocabulary above the wide-row switch.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import pytest
import torch

import samplechain_cuda as cuda
from samplechain import Chain, Stage, get_host
from samplechain.tools.tiny_models import byte_bpe_tokenizer

HAS_CUDA = torch.cuda.is_available()
BATCH, STEPS, PROMPT = 6, 3, 12
PRESETS = ("llama.cpp", "transformers", "vllm", "text-generation-webui")
ALLOWED = list(range(0, 40000, 3))

# one entry per registered sampler, with parameters that make it act (not its disabling defaults); filters and
# transforms run before a seeded dist, selectors alone
ENTRIES: dict[str, dict[str, Any]] = {
    "adaptive_p": {"target": 0.5},
    "allowed_tokens": {"ids": ALLOWED},
    "bad_words": {"ids": [[3], [7, 8], [11, 12, 13]]},
    "begin_suppress_tokens": {"ids": [0, 1, 2], "at": PROMPT},
    "cfg": {"scale": 1.5},
    "dist": {},
    "dry": {"multiplier": 0.8, "allowed_length": 2},
    "epsilon": {"epsilon": 3e-4},
    "eta": {"epsilon": 3e-4},
    "forced_bos": {"bos_id": 1},
    "forced_eos": {"eos_ids": [0], "max_length": PROMPT + 2},
    "grammar": {"regex": "[a-z ]{1,20}"},
    "greedy": {},
    "inf_nan_remove": {},
    "infill": {},
    "length_decay": {"eos_ids": [0], "start": 1, "factor": 1.5},
    "logit_bias": {"bias": {"5": 30.0, "9": -2.0}},
    "min_new_tokens": {"eos_ids": [0], "n": 5},
    "min_p": {"p": 0.05},
    "mirostat": {},
    "mirostat_v2": {},
    "no_repeat_ngram": {"n": 2},
    "p_less": {},
    "penalties": {"repeat": 1.3, "frequency": 0.2, "presence": 0.4, "last_n": 16},
    "quadratic": {"factor": 0.3},
    "reasoning_budget": {"budget": 1, "start_ids": [5], "end_ids": [6]},
    "renormalize": {},
    "sequence_bias": {"bias": [[[4], 2.5], [[9, 10], -3.0]]},
    "suppress_tokens": {"ids": [0, 1, 2]},
    "temp_ext": {"t": 0.8, "delta": 0.5},
    "temperature": {"t": 0.7},
    "tfs": {"z": 0.95},
    "top_a": {"a": 0.2},
    "top_h": {"top_h": 0.5},
    "top_k": {"k": 40},
    "top_n_sigma": {"n": 1.0},
    "top_p": {"p": 0.9},
    "typical": {"p": 0.9},
    "watermark": {"bias": 2.0},
    "xtc": {"probability": 0.5, "threshold": 0.1},
}
NEEDS_TOKENIZER = frozenset({"grammar", "infill"})  # they run on the byte-level tokenizer's vocabulary


@functools.cache
def registered() -> dict[str, type]:
    host = get_host()
    host.load_all()
    return {name: versions[max(versions)] for name, versions in host.registered("sampler").items()}


@functools.cache
def tokenizer() -> Any:
    return byte_bpe_tokenizer(300)


def chain_config(case: str) -> str | dict[str, Any]:
    if case.startswith("preset:"):
        return case
    entry = {"use": case, **ENTRIES[case]}
    if registered()[case].stage is Stage.SELECT:
        return {"samplers": [entry]}
    return {"samplers": [entry, {"use": "dist"}]}


CASES = [f"preset:{p}" for p in PRESETS] + sorted(ENTRIES)


def test_every_registered_sampler_has_a_case():
    assert set(registered()) == set(ENTRIES), "give each registered sampler an entry in ENTRIES"


def _chain(case: str, backend: str | None, vocab: int) -> Chain:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # order advice (a penalty after a truncation) is a warning
        chain = Chain.load(chain_config(case), backend=backend)
    tok = tokenizer() if case in NEEDS_TOKENIZER else None
    chain.prepare(tokenizer=tok, vocab_size=vocab, eos_token_ids=[0] if tok is None else None)
    return chain


def _steps(chain: Chain, logits: list[torch.Tensor], history: torch.Tensor, uncond: torch.Tensor, device: str):
    """Token ids of STEPS steps of BATCH seeded requests, each step's history the prompt and the tokens so far."""
    store = chain.new_store(device=device, capacity=BATCH)
    ids = [f"r{i}" for i in range(BATCH)]
    for i, rid in enumerate(ids):
        store.add(rid, {"seed": 100 + i} if "seed" in store.layout.aliases else None)
    history = history.to(device)
    lengths = torch.full((BATCH,), PROMPT, dtype=torch.int64, device=device)
    names = {spec.use for spec in chain.config.samplers}
    out = []
    for x in logits:
        kwargs: dict[str, Any] = {}
        if chain.needs_history:
            kwargs.update(history=history, prompt_lengths=lengths)
        if "cfg" in names:
            kwargs["unconditional_logits"] = uncond.to(device)
        tokens = chain.sample(x.to(device), store, ids, **kwargs).check().token_ids
        out.append(tokens.cpu())
        history = torch.cat([history, tokens[:, None]], dim=1)
    return out


def _inputs(case: str, vocab: int, bf16: bool) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor, int]:
    if case in NEEDS_TOKENIZER:
        vocab = len(tokenizer())
    g = torch.Generator().manual_seed(vocab + bf16)
    logits = [torch.randn(BATCH, vocab, generator=g) * 3 for _ in range(STEPS)]
    if bf16:
        logits = [x.bfloat16().float() for x in logits]
    history = torch.randint(0, min(vocab, 50), (BATCH, PROMPT), generator=g)  # repeats: penalties and DRY act
    uncond = torch.randn(BATCH, vocab, generator=g) * 3
    return logits, history, uncond, vocab


def _compare(case: str, vocab: int, bf16: bool, device: str, backend: str | None, swap_cpu: bool) -> None:
    logits, history, uncond, vocab = _inputs(case, vocab, bf16)
    ours = _chain(case, backend, vocab)
    if swap_cpu:
        # the cuda backend's sync-free step in torch ops on CPU tensors (its fused Triton kernels are held to the
        # cpu backend's tokens under triton's interpreter in test_fused_step.py)
        ours._backends["cpu"] = cuda.CudaBackend(device="cpu", triton=False)
    ref = _chain(case, "cpu", vocab)
    got = _steps(ours, logits, history, uncond, device)
    want = _steps(ref, logits, history, uncond, "cpu")
    for step, (a, b) in enumerate(zip(got, want, strict=True)):
        assert torch.equal(a, b), (case, "bf16" if bf16 else "float32", step, a, b)


@pytest.mark.parametrize("bf16", [False, True], ids=["float32", "bf16"])
@pytest.mark.parametrize("case", CASES)
def test_the_cuda_backends_logic_draws_the_cpu_backends_tokens(case, bf16):
    _compare(case, 3000, bf16, "cpu", None, swap_cpu=True)


# watermark draws its green lists with torch's generator on the history's device, as transformers does: on CUDA they
# are other lists than on the CPU (plugins/watermark/tests: the same as transformers' on CUDA)
DEVICE_BOUND = frozenset({"watermark"})


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("bf16", [False, True], ids=["float32", "bf16"])
@pytest.mark.parametrize("case", [case for case in CASES if case not in DEVICE_BOUND])
def test_gpu_every_preset_and_sampler_draws_the_cpu_backends_tokens(case, bf16):
    _compare(case, 32000, bf16, "cuda", "cuda", swap_cpu=False)
