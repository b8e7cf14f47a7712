from __future__ import annotations

import pytest
import torch
from transformers import GPT2Config, MaxLengthCriteria

import samplechain
from samplechain.stopping import as_rows
from samplechain import StopContext, StopSetup


def rows(answer, batch):
    return as_rows(answer, batch, torch.device("cpu"), "test").tolist()


def test_equals_transformers_max_length_criteria():
    crit = samplechain.Stopping.criterion("max_length", {"n": 7})
    ref = MaxLengthCriteria(max_length=7)
    s = StopSetup(batch_size=2, prompt_length=4, prompt_lengths=torch.tensor([4, 2]), device=torch.device("cpu"))
    crit.prepare(s)
    assert crit.max_new_tokens(s) == 3
    for length in range(5, 10):
        ids = torch.randint(0, 50, (2, length))
        ours = crit.check(StopContext(ids, length - 4, ids[:, -1], s))
        assert rows(ours, 2) == ref(ids, None).tolist()


def test_warns_past_the_model_positions():
    crit = samplechain.Stopping.criterion("max_length", {"n": 100})
    s = StopSetup(batch_size=1, prompt_length=4, prompt_lengths=torch.tensor([4]), device=torch.device("cpu"),
                  model_config=GPT2Config(n_positions=64))
    with pytest.warns(UserWarning, match="max_length = 100 is more than the model's 64 positions"):
        crit.prepare(s)
