"""max_new_tokens as transformers implements it: MaxLengthCriteria(max_length = padded prompt length + n)."""

from __future__ import annotations

import pytest
import torch
from transformers import GPT2Config, MaxLengthCriteria

import samplechain
from samplechain import ConfigError, StopContext, StopSetup
from samplechain.engine.stopping import as_rows


def setup(prompt_length=4, batch=3, config=None, prompt_lengths=None):
    lengths = torch.tensor(prompt_lengths) if prompt_lengths else torch.full((batch,), prompt_length)
    return StopSetup(
        batch_size=batch,
        prompt_length=prompt_length,
        prompt_lengths=lengths,
        device=torch.device("cpu"),
        model_config=config,
    )


def rows(answer, batch):
    return as_rows(answer, batch, torch.device("cpu"), "test").tolist()


@pytest.mark.parametrize("n", [1, 3, 7])
def test_equals_transformers_max_length_criteria_at_prompt_plus_n(n):
    # rows with prompts of 4, 2 and 1 real tokens, left-padded to 4: transformers counts the padded length
    crit = samplechain.Stopping.criterion("max_new_tokens", {"n": n})
    s = setup(4, prompt_lengths=[4, 2, 1])
    crit.prepare(s)
    assert crit.is_length_limit and crit.max_new_tokens(s) == n
    ref = MaxLengthCriteria(max_length=4 + n)
    for step in range(1, 10):
        ids = torch.randint(0, 50, (3, 4 + step))
        assert rows(crit.check(StopContext(ids, step, ids[:, -1], s)), 3) == ref(ids, None).tolist(), step


def test_warns_past_the_model_positions():
    crit = samplechain.Stopping.criterion("max_new_tokens", {"n": 10})
    with pytest.warns(
        UserWarning,
        match="max_new_tokens = 10 after a 60-token prompt runs past the model's 64 "
        "positions.*lower max_new_tokens to 4",
    ):
        crit.prepare(setup(60, config=GPT2Config(n_positions=64)))


def test_no_warning_within_the_model_positions(recwarn):
    crit = samplechain.Stopping.criterion("max_new_tokens", {"n": 4})
    crit.prepare(setup(60, config=GPT2Config(n_positions=64)))
    crit.prepare(setup(60, config=None))  # a model that states no limit
    assert not recwarn.list


@pytest.mark.parametrize(
    "stop, message",
    [
        ({"n": 0}, r"stop\[0\].n = 0: must be in \[1, inf\)"),
        ({"n": -3}, r"stop\[0\].n = -3: must be in \[1, inf\)"),
        ({"n": "5"}, r"stop\[0\].n = '5': expected an integer"),
        ({"n": 1.5}, r"stop\[0\].n = 1.5: expected an integer"),
        ({"n": True}, r"stop\[0\].n = True: expected an integer"),
        ({}, r"stop\[0\].n: required key missing"),
        ({"n": 5, "m": 1}, r"stop\[0\].m = 1: unknown parameter of max_new_tokens.v1 \(valid: n\)"),
    ],
)
def test_bad_values(stop, message):
    with pytest.raises(ConfigError, match=message):
        samplechain.load_config({"samplers": [{"use": "greedy"}], "stop": [{"use": "max_new_tokens", **stop}]})


def test_from_toml():
    config = samplechain.load_config('samplers = [{ use = "greedy" }]\nstop = [{ use = "max_new_tokens", n = 128 }]\n')
    assert config.stop[0].params.n == 128
