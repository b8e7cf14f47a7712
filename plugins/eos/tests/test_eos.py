from __future__ import annotations

import pytest
import torch
from transformers import EosTokenCriteria, GenerationConfig, GPT2Config

import samplechain
from samplechain import StopContext, StopSetup
from samplechain.testing import byte_bpe_tokenizer


def make_setup(**kw):
    return StopSetup(batch_size=4, prompt_length=2, prompt_lengths=torch.full((4,), 2), device=torch.device("cpu"),
                     **kw)


def test_equals_transformers_eos_criteria_with_several_ids():
    crit = samplechain.Stopping.criterion("eos", {"ids": [3, 7]})
    s = make_setup()
    crit.prepare(s)
    ref = EosTokenCriteria([3, 7])
    for _ in range(20):
        ids = torch.randint(0, 10, (4, 5))
        assert crit.check(StopContext(ids, 3, ids[:, -1], s)).tolist() == ref(ids, None).tolist()


def test_ids_come_from_tokenizer_generation_config_and_model_config():
    crit = samplechain.Stopping.criterion("eos", {})
    tok = byte_bpe_tokenizer(300)
    crit.prepare(make_setup(tokenizer=tok, generation_config=GenerationConfig(eos_token_id=[5, 0]),
                            model_config=GPT2Config(eos_token_id=9)))
    assert crit.resolved_ids() == [tok.eos_token_id, 5, 9]


def test_no_eos_anywhere_warns_and_never_fires():
    crit = samplechain.Stopping.criterion("eos", {})
    with pytest.warns(UserWarning, match="no eos token id"):
        crit.prepare(make_setup(model_config=GPT2Config(eos_token_id=None)))
    ids = torch.randint(0, 10, (4, 3))
    assert not crit.check(StopContext(ids, 1, ids[:, -1], make_setup())).any()


def test_negative_ids_are_refused():
    with pytest.raises(samplechain.ConfigError, match=r"stop\[0\].ids = \[-1\]: token ids must be >= 0"):
        samplechain.load_config({"samplers": [{"use": "greedy"}], "stop": [{"use": "eos", "ids": [-1]}]})
