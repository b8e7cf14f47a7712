"""confidence against transformers' ConfidenceCriteria, which answers for the whole batch from row 0.

Row by row (batches of one) the two agree; in a batch each row here answers for itself.
"""

from __future__ import annotations

import pytest
import torch
from transformers.generation.stopping_criteria import ConfidenceCriteria

import samplechain
from samplechain import ConfigError, StopContext, StopSetup


def make_setup(batch):
    return StopSetup(
        batch_size=batch,
        prompt_length=1,
        prompt_lengths=torch.ones(batch, dtype=torch.int64),
        device=torch.device("cpu"),
    )


def contexts(scores, chosen):
    """The same step seen with logprobs (what the loop passes) and with scores only."""
    ids = torch.cat([torch.zeros_like(chosen)[:, None], chosen[:, None]], dim=1)
    s = make_setup(len(chosen))
    logprobs = torch.log_softmax(scores, -1).gather(1, chosen[:, None]).squeeze(1)
    return ids, StopContext(ids, 1, chosen, s, logprobs=logprobs), StopContext(ids, 1, chosen, s, scores=scores)


def test_per_row_where_transformers_answers_for_the_whole_batch_from_row_0():
    crit = samplechain.Stopping.criterion("confidence", {"threshold": 0.3})
    scores = torch.log(torch.tensor([[0.5, 0.4, 0.1], [0.2, 0.2, 0.6], [0.9, 0.05, 0.05]]))
    ids, with_logprobs, with_scores = contexts(scores, torch.tensor([0, 1, 0]))  # p = 0.5, 0.2, 0.9
    assert crit.check(with_logprobs).tolist() == [False, True, False]
    assert crit.check(with_scores).tolist() == [False, True, False]
    assert ConfidenceCriteria(0.3)(ids, (scores,)) is False  # row 0 (p = 0.5) decides for everyone


@pytest.mark.parametrize("threshold", [0.05, 0.3, 0.7])
def test_equals_transformers_row_by_row_on_random_distributions(threshold):
    g = torch.Generator().manual_seed(int(threshold * 100))
    crit = samplechain.Stopping.criterion("confidence", {"threshold": threshold})
    scores = torch.randn(64, 20, generator=g) * 2
    chosen = torch.multinomial(torch.softmax(scores, -1), 1, generator=g).squeeze(1)
    ids, with_logprobs, with_scores = contexts(scores, chosen)
    ours = crit.check(with_logprobs).tolist()
    assert crit.check(with_scores).tolist() == ours
    theirs = [ConfidenceCriteria(threshold)(ids[r : r + 1], (scores[r : r + 1],)) for r in range(64)]
    assert ours == theirs
    assert 0 < sum(ours) < 64


def test_without_logprobs_or_scores_it_never_fires():
    crit = samplechain.Stopping.criterion("confidence", {"threshold": 0.5})
    ids = torch.zeros((2, 2), dtype=torch.int64)
    assert crit.check(StopContext(ids, 1, ids[:, -1], make_setup(2))).tolist() == [False, False]


@pytest.mark.parametrize(
    "threshold, message",
    [
        (0.0, r"threshold = 0.0: must be in \(0, 1\)"),
        (1.0, r"threshold = 1.0: must be in \(0, 1\)"),
        (1.5, r"threshold = 1.5: must be in \(0, 1\)"),
        (float("nan"), "threshold = nan: must be a finite number"),
        ("0.5", "threshold = '0.5': expected a number"),
    ],
)
def test_threshold_is_a_probability_strictly_between_0_and_1(threshold, message):
    with pytest.raises(ConfigError, match=message):
        samplechain.load_config(
            {"samplers": [{"use": "greedy"}], "stop": [{"use": "confidence", "threshold": threshold}]}
        )
