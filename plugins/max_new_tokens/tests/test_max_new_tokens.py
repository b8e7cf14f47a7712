from __future__ import annotations

import pytest
import torch
from transformers import GPT2Config

import samplechain
from samplechain.stopping import as_rows
from samplechain import ConfigError, StopContext, StopSetup


def setup(prompt_length=4, batch=3, config=None):
    return StopSetup(batch_size=batch, prompt_length=prompt_length, prompt_lengths=torch.full((batch,), prompt_length),
                     device=torch.device("cpu"), model_config=config)


def rows(answer, batch):
    return as_rows(answer, batch, torch.device("cpu"), "test").tolist()


def test_stops_every_row_at_n_new_tokens_and_states_its_bound():
    crit = samplechain.Stopping.criterion("max_new_tokens", {"n": 3})
    s = setup()
    crit.prepare(s)
    assert crit.is_length_limit and crit.max_new_tokens(s) == 3
    answers = []
    for step in range(1, 5):
        ids = torch.zeros((3, 4 + step), dtype=torch.int64)
        answers.append(rows(crit.check(StopContext(ids, step, ids[:, -1], s)), 3))
    assert answers == [[False] * 3, [False] * 3, [True] * 3, [True] * 3]


def test_warns_past_the_model_positions():
    crit = samplechain.Stopping.criterion("max_new_tokens", {"n": 10})
    with pytest.warns(UserWarning, match="max_new_tokens = 10 after a 60-token prompt runs past the model's 64 "
                                         "positions.*lower max_new_tokens to 4"):
        crit.prepare(setup(60, config=GPT2Config(n_positions=64)))


@pytest.mark.parametrize("n, message", [(0, r"n = 0: must be in \[1, inf\)"), ("5", "expected an integer")])
def test_bad_values(n, message):
    with pytest.raises(ConfigError, match=message):
        samplechain.load_config({"samplers": [{"use": "greedy"}], "stop": [{"use": "max_new_tokens", "n": n}]})
