from __future__ import annotations

import pytest
import torch

import samplechain
from samplechain import ConfigError, StopContext, StopSetup


def test_rows_stop_when_their_new_tokens_end_with_a_sequence():
    crit = samplechain.Stopping.criterion("stop_sequences", {"sequences": [[4, 5], [9]]})
    s = StopSetup(batch_size=4, prompt_length=2, prompt_lengths=torch.full((4,), 2), device=torch.device("cpu"))
    ids = torch.tensor([[1, 4, 4, 5], [1, 2, 3, 9], [4, 5, 1, 2], [0, 4, 5, 6]])
    assert crit.check(StopContext(ids, 2, ids[:, -1], s)).tolist() == [True, True, False, False]
    # a sequence straddling the prompt and the first new token does not count
    ids = torch.tensor([[1, 4, 5]])
    s1 = StopSetup(batch_size=1, prompt_length=2, prompt_lengths=torch.tensor([2]), device=torch.device("cpu"))
    assert crit.check(StopContext(ids, 1, ids[:, -1], s1)).tolist() == [False]


@pytest.mark.parametrize("sequences, message", [
    ([], "give at least one sequence"), ([[1], []], "sequence 1 is empty"), ([[1, "a"]], "expected an integer"),
])
def test_bad_sequences(sequences, message):
    with pytest.raises(ConfigError, match=message):
        samplechain.load_config({"samplers": [{"use": "greedy"}],
                                 "stop": [{"use": "stop_sequences", "sequences": sequences}]})
