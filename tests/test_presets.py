"""The engine presets of registry.toml: each runs end to end through generate() on the embedded model, with its
off-by-default samplers switched on per request by their usual names; the transformers preset processes logits
exactly as transformers' own pipeline for the same settings."""

from __future__ import annotations

import warnings

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

import samplechain
from samplechain import Chain, ChainWarning
from samplechain.generation import generate
from samplechain.models import tiny_model_path

PRESETS = sorted(samplechain.get_host().registry.presets)

# per preset: request settings that switch on the samplers that are off by default
SWITCH_ON = {
    "llama.cpp": {
        "repeat_penalty": 1.1,
        "presence_penalty": 0.2,
        "dry_multiplier": 0.8,
        "top_n_sigma": 2.0,
        "typical_p": 0.95,
        "xtc_probability": 0.5,
        "xtc_threshold": 0.1,
        "dynatemp_range": 0.3,
    },
    "llama.cpp-mirostat": {"mirostat_tau": 1.0},
    "llama.cpp-mirostat-v2": {"mirostat_tau": 1.0},
    "transformers": {
        "repetition_penalty": 1.2,
        "no_repeat_ngram_size": 3,
        "min_new_tokens": 4,
        "top_p": 0.9,
        "typical_p": 0.95,
        "epsilon_cutoff": 1e-4,
        "eta_cutoff": 1e-4,
        "temperature": 0.8,
    },
    "vllm": {
        "repetition_penalty": 1.1,
        "frequency_penalty": 0.3,
        "presence_penalty": 0.2,
        "min_tokens": 3,
        "top_k": 50,
        "top_p": 0.9,
        "min_p": 0.02,
        "temperature": 0.7,
    },
    "text-generation-webui": {
        "repetition_penalty": 1.15,
        "dry_multiplier": 0.8,
        "top_k": 50,
        "top_p": 0.9,
        "tfs": 0.95,
        "top_a": 0.2,
        "smoothing_factor": 0.3,
        "xtc_probability": 0.3,
        "temperature": 0.9,
    },
    "text-generation-webui-temperature-last": {"min_p": 0.05, "temperature": 1.5, "top_a": 0.1},
    "greedy": {},
    # the embedded model never opens a thinking block by itself: the budget changes nothing here (the plugin's tests
    # run these presets on prompts that open one)
    "reasoning-think": {"reasoning_budget": 2},
    "reasoning-seed-think": {"thinking_token_budget": 2},
    "reasoning-think-brackets": {"reasoning_budget": 0},
}


@pytest.fixture(scope="module")
def lm():
    path = tiny_model_path()
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


def test_every_preset_has_settings_here():
    assert set(PRESETS) == set(SWITCH_ON)


@pytest.mark.parametrize("name", PRESETS)
def test_preset_loads_without_pitfall_warnings(name):
    with warnings.catch_warnings():
        warnings.simplefilter("error", ChainWarning)
        Chain.load(f"preset:{name}")


@pytest.mark.parametrize("name", PRESETS)
def test_preset_runs_end_to_end_through_generate(lm, name):
    model, tok = lm
    prompts = ["In Python, a list is", "The dictionary"]
    chain = Chain.load(f"preset:{name}")
    kwargs = dict(chain=chain, max_new_tokens=12, ignore_eos=True, seed=3, pad_token_id=tok.eos_token_id)
    plain = generate(model, tok, prompts, **kwargs)
    on = generate(model, tok, prompts, params=SWITCH_ON[name], **kwargs)
    again = generate(model, tok, prompts, params=SWITCH_ON[name], **kwargs)
    assert on.sequences.shape == (2, plain.sequences.shape[1])
    assert torch.equal(on.sequences, again.sequences), "seeded generation must be reproducible"
    assert bool(torch.isfinite(on.logprobs).all()) and bool((on.logprobs <= 0).all())
    if SWITCH_ON[name] and not name.startswith("reasoning-"):
        assert not torch.equal(on.sequences, plain.sequences), "switching samplers on should change the text"


def test_transformers_preset_processes_as_transformers_pipeline(lm):
    """Our generation with the transformers preset and per-request settings, replayed through the processors
    model.generate builds for the same GenerationConfig: the same candidate sets and probabilities at every step."""
    model, tok = lm
    settings = {
        "repetition_penalty": 1.2,
        "no_repeat_ngram_size": 2,
        "temperature": 0.8,
        "top_k": 30,
        "top_p": 0.9,
        "typical_p": 0.95,
        "epsilon_cutoff": 3e-4,
        "eta_cutoff": 3e-4,
    }
    out = generate(
        model,
        tok,
        "In Python, a list is",
        chain="preset:transformers",
        params=settings,
        max_new_tokens=16,
        ignore_eos=True,
        seed=1,
        output_scores=True,
    )
    cfg = GenerationConfig(do_sample=True, **settings)
    model._prepare_special_tokens(cfg, kwargs_has_attention_mask=False, device="cpu")
    prompt_len = out.sequences.shape[1] - len(out.scores)
    processors = model._get_logits_processor(
        generation_config=cfg,
        input_ids_seq_length=prompt_len,
        encoder_input_ids=out.sequences[:, :prompt_len],
        prefix_allowed_tokens_fn=None,
        logits_processor=None,
        device="cpu",
    )
    with torch.no_grad():
        all_logits = model(out.sequences).logits[:, prompt_len - 1 : -1, :]
    for step, ours in enumerate(out.scores):
        ids = out.sequences[:, : prompt_len + step]
        ref = processors(ids, all_logits[:, step, :].clone())
        assert torch.equal(torch.isfinite(ours), torch.isfinite(ref)), step
        assert torch.allclose(torch.softmax(ours, -1), torch.softmax(ref, -1), atol=1e-5), step
