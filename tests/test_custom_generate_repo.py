"""The contrib custom_generate repo runs through model.generate only with trust_remote_code=True."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

from samplechain import Chain
from samplechain.generation import generate
from samplechain.tools.testing import byte_bpe_tokenizer, tiny_gpt2

REPO = Path(__file__).resolve().parents[1] / "contrib" / "custom-generate-example"


def test_refused_without_trust_remote_code():
    model = tiny_gpt2(300)
    with pytest.raises(ValueError, match="trust_remote_code"):
        model.generate(input_ids=torch.tensor([[1, 2, 3]]), custom_generate=str(REPO), max_new_tokens=3)


def test_runs_the_repo_chain_with_trust_remote_code():
    model = tiny_gpt2(300, seed=2)
    tok = byte_bpe_tokenizer(300)
    ids = torch.tensor([tok("The quick")["input_ids"]])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = model.generate(
            input_ids=ids,
            custom_generate=str(REPO),
            trust_remote_code=True,
            tokenizer=tok,
            max_new_tokens=8,
            seed=7,
            pad_token_id=0,
            eos_token_id=None,
        )
    import importlib.util

    spec = importlib.util.spec_from_file_location("repo_generate", REPO / "custom_generate" / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    chain = Chain.load(module.CHAIN)
    ours = generate(
        model, tok, input_ids=ids, chain=chain, seed=7, max_length=ids.shape[1] + 8, pad_token_id=0, ignore_eos=True
    )
    assert torch.equal(out, ours.sequences)


def test_a_chain_argument_replaces_the_repo_chain_for_one_call():
    model = tiny_gpt2(300, seed=2)
    ids = torch.tensor([[5, 6, 7]])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = model.generate(
            input_ids=ids,
            custom_generate=str(REPO),
            trust_remote_code=True,
            chain="preset:greedy",
            max_new_tokens=6,
            pad_token_id=0,
            eos_token_id=None,
        )
        greedy = model.generate(input_ids=ids, do_sample=False, max_new_tokens=6, pad_token_id=0, eos_token_id=None)
    assert torch.equal(out, greedy)
