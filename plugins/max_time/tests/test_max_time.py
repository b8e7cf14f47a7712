"""max_time against transformers' MaxTimeCriteria: every row stops once more than `seconds` have passed."""

from __future__ import annotations

import time

import pytest
import torch
from transformers import MaxTimeCriteria

import samplechain
from samplechain import ConfigError, StopContext, StopSetup
from samplechain.engine.stopping import as_rows


def rows(answer, batch):
    return as_rows(answer, batch, torch.device("cpu"), "test").tolist()


def setup(started_ago: float, batch: int = 3) -> StopSetup:
    return StopSetup(
        batch_size=batch,
        prompt_length=1,
        prompt_lengths=torch.ones(batch, dtype=torch.int64),
        device=torch.device("cpu"),
        start_time=time.monotonic() - started_ago,
    )


@pytest.mark.parametrize("started_ago", [0.0, 0.2, 0.9, 2.0, 60.0])
def test_equals_transformers_max_time_criteria(started_ago):
    crit = samplechain.Stopping.criterion("max_time", {"seconds": 0.5})
    ref = MaxTimeCriteria(max_time=0.5, initial_timestamp=time.time() - started_ago)
    s = setup(started_ago)
    crit.prepare(s)
    ids = torch.zeros((3, 2), dtype=torch.int64)
    assert rows(crit.check(StopContext(ids, 1, ids[:, -1], s)), 3) == ref(ids, None).tolist()
    assert crit.reason == "max_time" and not crit.is_length_limit


def test_stops_every_row_once_the_budget_is_spent():
    crit = samplechain.Stopping.criterion("max_time", {"seconds": 0.05})
    s = setup(0.0, batch=2)
    crit.prepare(s)
    ids = torch.zeros((2, 2), dtype=torch.int64)
    assert rows(crit.check(StopContext(ids, 1, ids[:, -1], s)), 2) == [False, False]
    s.start_time -= 1.0  # as if the generation had started a second earlier
    assert rows(crit.check(StopContext(ids, 2, ids[:, -1], s)), 2) == [True, True]


def test_a_setup_without_a_start_time_starts_the_clock_at_prepare():
    crit = samplechain.Stopping.criterion("max_time", {"seconds": 0.05})
    s = StopSetup(
        batch_size=1, prompt_length=1, prompt_lengths=torch.ones(1, dtype=torch.int64), device=torch.device("cpu")
    )  # start_time left at 0.0
    crit.prepare(s)
    ids = torch.zeros((1, 2), dtype=torch.int64)
    assert rows(crit.check(StopContext(ids, 1, ids[:, -1], s)), 1) == [False]  # not "since boot"
    time.sleep(0.06)
    assert rows(crit.check(StopContext(ids, 2, ids[:, -1], s)), 1) == [True]


@pytest.mark.parametrize(
    "seconds, message",
    [
        (0, r"seconds = 0: must be in \(0, inf\)"),
        (-1.0, r"seconds = -1.0: must be in \(0, inf\)"),
        (float("inf"), "seconds = inf: must be a finite number"),
        (float("nan"), "seconds = nan: must be a finite number"),
        ("1", "seconds = '1': expected a number"),
    ],
)
def test_bad_budget(seconds, message):
    with pytest.raises(ConfigError, match=message):
        samplechain.load_config({"samplers": [{"use": "greedy"}], "stop": [{"use": "max_time", "seconds": seconds}]})


def test_an_integer_budget_from_toml():
    config = samplechain.load_config(
        'samplers = [{ use = "greedy" }]\n'
        'stop = [{ use = "max_new_tokens", n = 4 }, { use = "max_time", seconds = 2 }]\n'
    )
    assert config.stop[1].params.seconds == 2
