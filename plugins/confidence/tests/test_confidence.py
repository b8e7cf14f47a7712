from __future__ import annotations

import pytest
import torch
from transformers.generation.stopping_criteria import ConfidenceCriteria

import samplechain
from samplechain import ConfigError, StopContext, StopSetup


def test_per_row_where_transformers_answers_for_the_whole_batch_from_row_0():
    crit = samplechain.Stopping.criterion("confidence", {"threshold": 0.3})
    s = StopSetup(batch_size=3, prompt_length=1, prompt_lengths=torch.ones(3, dtype=torch.int64),
                  device=torch.device("cpu"))
    scores = torch.log(torch.tensor([[0.5, 0.4, 0.1], [0.2, 0.2, 0.6], [0.9, 0.05, 0.05]]))
    ids = torch.tensor([[0, 0], [0, 1], [0, 0]])  # chosen: p = 0.5, 0.2, 0.9
    chosen = ids[:, -1]
    logprobs = torch.log_softmax(scores, -1).gather(1, chosen[:, None]).squeeze(1)
    ours = crit.check(StopContext(ids, 1, chosen, s, logprobs=logprobs))
    assert ours.tolist() == [False, True, False]
    assert crit.check(StopContext(ids, 1, chosen, s, scores=scores)).tolist() == [False, True, False]
    theirs = ConfidenceCriteria(0.3)(ids, (scores,))
    assert bool(theirs) is False  # row 0 (p = 0.5) decides for everyone in transformers
    for row in range(3):  # row by row, transformers agrees with us
        assert bool(ConfidenceCriteria(0.3)(ids[row:row + 1], (scores[row:row + 1],))) == ours[row].item()


@pytest.mark.parametrize("threshold", [0.0, 1.0, 1.5])
def test_threshold_is_a_probability_strictly_between_0_and_1(threshold):
    with pytest.raises(ConfigError, match="threshold"):
        samplechain.load_config({"samplers": [{"use": "greedy"}], "stop": [{"use": "confidence", "threshold": threshold}]})
