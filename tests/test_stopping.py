"""The Stopping combiner: OR per row, first reason wins, transformers-style validation, runtime callables."""

from __future__ import annotations

import pytest
import torch
from transformers import MaxLengthCriteria, StoppingCriteria

from samplechain import ConfigError, SamplingError, StopContext, Stopping, StopSetup


def crit(name, **params):
    return Stopping.criterion(name, params)


def ctx(ids, step=1):
    setup = StopSetup(batch_size=ids.shape[0], prompt_length=ids.shape[1] - step,
                      prompt_lengths=torch.full((ids.shape[0],), ids.shape[1] - step), device=ids.device)
    return StopContext(ids, step, ids[:, -1], setup)


def test_criteria_combine_by_or_and_the_first_names_the_reason():
    stopping = Stopping([crit("eos", ids=[7]), crit("stop_sequences", sequences=[[7], [3]]),
                         crit("max_new_tokens", n=5)])
    ids = torch.tensor([[1, 7], [1, 3], [1, 2]])
    result = stopping.check(ctx(ids))
    assert result.done.tolist() == [True, True, False]
    assert result.reasons == ["eos", "stop_sequences", None]


def test_identical_duplicates_are_kept_once_and_conflicting_ones_refused():
    stopping = Stopping([crit("max_new_tokens", n=5), crit("max_new_tokens", n=5)])
    assert len(stopping) == 1
    with pytest.raises(ConfigError, match=r"max_new_tokens.v1 is given twice with different parameters: "
                                          r".*n=5.*n=6"):
        Stopping([crit("max_new_tokens", n=5), crit("max_new_tokens", n=6)])


def test_a_length_limit_is_required():
    with pytest.raises(ConfigError, match=r"no length limit.*max_new_tokens"):
        Stopping([crit("eos", ids=[1])])
    assert Stopping([crit("eos", ids=[1])], require_length_limit=False).has_length_limit is False


def test_a_plain_callable_and_a_transformers_criterion_at_runtime():
    def odd_last_token(c):
        return c.token_ids % 2 == 1

    class Row0(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return torch.tensor([True] + [False] * (input_ids.shape[0] - 1))

    stopping = Stopping([odd_last_token, Row0(), MaxLengthCriteria(max_length=10), crit("max_new_tokens", n=9)])
    result = stopping.check(ctx(torch.tensor([[2, 4], [2, 5], [2, 6]])))
    assert result.done.tolist() == [True, True, False]
    assert result.reasons == ["Row0", "odd_last_token", None]
    long = torch.zeros((3, 10), dtype=torch.int64)
    assert stopping.check(ctx(long)).reasons == ["Row0", "MaxLengthCriteria", "MaxLengthCriteria"]


def test_a_callable_with_the_wrong_shape_is_a_clear_error():
    stopping = Stopping([lambda c: torch.tensor([True, False, True]), crit("max_new_tokens", n=3)])
    with pytest.raises(SamplingError, match=r"stopping callable '<lambda>' returned shape \(3,\); a stopping "
                                            r"criterion must return one bool per row, shape \(2,\)"):
        stopping.check(ctx(torch.zeros((2, 2), dtype=torch.int64)))


def test_a_callable_that_raises_is_named():
    def broken(c):
        raise KeyError("boom")

    stopping = Stopping([broken, crit("max_new_tokens", n=3)])
    with pytest.raises(SamplingError, match=r"stopping callable 'broken' failed at step 1: KeyError"):
        stopping.check(ctx(torch.zeros((2, 2), dtype=torch.int64)))


def test_not_a_criterion():
    with pytest.raises(ConfigError, match="neither a StoppingCriterion"):
        Stopping([42])
