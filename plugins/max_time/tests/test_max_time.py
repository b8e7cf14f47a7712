from __future__ import annotations

import time

import pytest
import torch

import samplechain
from samplechain.stopping import as_rows
from samplechain import ConfigError, StopContext, StopSetup


def rows(answer, batch):
    return as_rows(answer, batch, torch.device("cpu"), "test").tolist()


def test_stops_every_row_once_the_budget_is_spent():
    crit = samplechain.Stopping.criterion("max_time", {"seconds": 0.05})
    s = StopSetup(batch_size=2, prompt_length=1, prompt_lengths=torch.tensor([1, 1]), device=torch.device("cpu"),
                  start_time=time.monotonic())
    ids = torch.zeros((2, 2), dtype=torch.int64)
    assert rows(crit.check(StopContext(ids, 1, ids[:, -1], s)), 2) == [False, False]
    s.start_time -= 1.0  # as if the generation had started a second earlier
    assert rows(crit.check(StopContext(ids, 2, ids[:, -1], s)), 2) == [True, True]


@pytest.mark.parametrize("seconds", [0, -1.0, float("inf")])
def test_bad_budget(seconds):
    with pytest.raises(ConfigError, match="seconds"):
        samplechain.load_config({"samplers": [{"use": "greedy"}], "stop": [{"use": "max_time", "seconds": seconds}]})
