"""max_length against transformers' MaxLengthCriteria: the padded sequence, prompt included, reaches n."""

from __future__ import annotations

import pytest
import torch
from transformers import GPT2Config, MaxLengthCriteria

import samplechain
from samplechain import ConfigError, StopContext, StopSetup
from samplechain.engine.stopping import as_rows


def rows(answer, batch):
    return as_rows(answer, batch, torch.device("cpu"), "test").tolist()


def setup(prompt_length, prompt_lengths, config=None):
    return StopSetup(
        batch_size=len(prompt_lengths),
        prompt_length=prompt_length,
        prompt_lengths=torch.tensor(prompt_lengths),
        device=torch.device("cpu"),
        model_config=config,
    )


@pytest.mark.parametrize("n", [5, 7, 12])
def test_equals_transformers_max_length_criteria(n):
    crit = samplechain.Stopping.criterion("max_length", {"n": n})
    ref = MaxLengthCriteria(max_length=n)
    s = setup(4, [4, 2, 1])  # left-padded rows: every row stops at the same step, as in transformers
    crit.prepare(s)
    assert crit.is_length_limit and crit.max_new_tokens(s) == n - 4
    for length in range(5, 14):
        ids = torch.randint(0, 50, (3, length))
        assert rows(crit.check(StopContext(ids, length - 4, ids[:, -1], s)), 3) == ref(ids, None).tolist()


def test_warns_past_the_model_positions():
    crit = samplechain.Stopping.criterion("max_length", {"n": 100})
    with pytest.warns(UserWarning, match="max_length = 100 is more than the model's 64 positions"):
        crit.prepare(setup(4, [4], GPT2Config(n_positions=64)))


def test_a_prompt_already_that_long_gets_one_token_and_a_warning():
    crit = samplechain.Stopping.criterion("max_length", {"n": 6})
    s = setup(8, [8, 3])
    with pytest.warns(UserWarning, match=r"max_length = 6 but the \(padded\) prompt already has 8 tokens"):
        crit.prepare(s)
    assert crit.max_new_tokens(s) == 1
    ids = torch.zeros((2, 9), dtype=torch.int64)
    assert rows(crit.check(StopContext(ids, 1, ids[:, -1], s)), 2) == [True, True]


def test_no_warning_within_the_limits(recwarn):
    samplechain.Stopping.criterion("max_length", {"n": 64}).prepare(setup(4, [4], GPT2Config(n_positions=64)))
    assert not recwarn.list


@pytest.mark.parametrize(
    "stop, message",
    [
        ({"n": 0}, r"stop\[0\].n = 0: must be in \[1, inf\)"),
        ({"n": 2.0}, r"stop\[0\].n = 2.0: expected an integer"),
        ({}, r"stop\[0\].n: required key missing"),
        ({"length": 5}, r"stop\[0\].length = 5: unknown parameter of max_length.v1"),
    ],
)
def test_bad_values(stop, message):
    with pytest.raises(ConfigError, match=message):
        samplechain.load_config({"samplers": [{"use": "greedy"}], "stop": [{"use": "max_length", **stop}]})
