"""The Stopping combiner: OR per row, first reason wins, transformers-style validation, runtime callables."""

from __future__ import annotations

import pytest
import torch
from transformers import EosTokenCriteria, MaxLengthCriteria, StoppingCriteria

from samplechain import ConfigError, SamplingError, StopContext, Stopping, StopSetup, load_config
from samplechain.errors import UnknownPluginError


def crit(name, **params):
    return Stopping.criterion(name, params)


def ctx(ids, step=1):
    setup = StopSetup(
        batch_size=ids.shape[0],
        prompt_length=ids.shape[1] - step,
        prompt_lengths=torch.full((ids.shape[0],), ids.shape[1] - step),
        device=ids.device,
    )
    return StopContext(ids, step, ids[:, -1], setup)


def test_criteria_combine_by_or_and_the_first_names_the_reason():
    stopping = Stopping(
        [crit("eos", ids=[7]), crit("stop_sequences", sequences=[[7], [3]]), crit("max_new_tokens", n=5)]
    )
    ids = torch.tensor([[1, 7], [1, 3], [1, 2]])
    result = stopping.check(ctx(ids))
    assert result.done.tolist() == [True, True, False]
    assert result.reasons == ["eos", "stop_sequences", None]


def test_identical_duplicates_are_kept_once_and_conflicting_ones_refused():
    stopping = Stopping([crit("max_new_tokens", n=5), crit("max_new_tokens", n=5)])
    assert len(stopping) == 1
    with pytest.raises(
        ConfigError,
        match=r"max_new_tokens.v1 is given twice with different parameters: "
        r".*n=5.*n=6",
    ):
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
    with pytest.raises(
        SamplingError,
        match=r"stopping callable '<lambda>' returned shape \(3,\); a stopping "
        r"criterion must return one bool per row, shape \(2,\)",
    ):
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


def test_a_chain_stop_list_in_declared_order_with_runtime_extras_after_it():
    config = load_config(
        'samplers = [{ use = "greedy" }]\n'
        'stop = [{ use = "stop_sequences", sequences = [[3]] }, { use = "eos", ids = [3, 4] }, '
        '{ use = "max_new_tokens", n = 2 }]\n'
    )
    stopping = Stopping.from_entries(config.stop, [lambda c: c.token_ids == 5])
    assert [c.reason for c in stopping] == ["stop_sequences", "eos", "max_new_tokens", "<lambda>"]
    result = stopping.check(ctx(torch.tensor([[1, 3], [1, 4], [1, 5], [1, 6]])))
    assert result.reasons == ["stop_sequences", "eos", "<lambda>", None] and result.any
    result = stopping.check(ctx(torch.tensor([[1, 2, 3], [1, 2, 6]]), step=2))
    assert result.reasons == ["stop_sequences", "max_new_tokens"]  # the length limit stops what is left


def test_nothing_stops_is_a_cheap_answer():
    stopping = Stopping([crit("max_new_tokens", n=5), crit("eos", ids=[9])])
    result = stopping.check(ctx(torch.tensor([[1, 2], [1, 3]])))
    assert result.any is False and result.done.tolist() == [False, False] and result.reasons == [None, None]


def test_the_tightest_length_limit_sizes_the_generation():
    stopping = Stopping([crit("max_new_tokens", n=10), crit("max_length", n=8)])
    setup = StopSetup(batch_size=1, prompt_length=5, prompt_lengths=torch.tensor([5]), device=torch.device("cpu"))
    assert stopping.max_new_tokens(setup) == 3


def test_an_identical_criterion_from_the_config_and_from_the_arguments_is_kept_once():
    config = load_config(
        'samplers = [{ use = "greedy" }]\n'
        'stop = [{ use = "max_new_tokens", n = 4 }, { use = "stop_strings", strings = ["\\n"] }]\n'
    )
    stopping = Stopping.from_entries(config.stop, [crit("stop_strings", strings=["\n"])])
    assert len(stopping) == 2
    with pytest.raises(
        ConfigError,
        match=r"stop_strings.v1 is given twice with different parameters: "
        r".*strings=\('\\n',\).*strings=\('\\n\\n',\)",
    ):
        Stopping.from_entries(config.stop, [crit("stop_strings", strings=["\n\n"])])


def test_transformers_criteria_that_answer_one_bool_apply_to_every_row():
    class Everyone(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return bool(input_ids[0, -1] == 4)  # as ConfidenceCriteria: row 0 decides

    stopping = Stopping([Everyone(), crit("max_new_tokens", n=9)])
    assert stopping.check(ctx(torch.tensor([[1, 4], [1, 5]]))).reasons == ["Everyone", "Everyone"]
    assert not stopping.check(ctx(torch.tensor([[1, 5], [1, 4]]))).any


def test_transformers_eos_criteria_at_runtime_equals_the_eos_plugin():
    ids = torch.randint(0, 6, (16, 3), generator=torch.Generator().manual_seed(0))
    theirs = Stopping([EosTokenCriteria([2, 5])], require_length_limit=False).check(ctx(ids))
    ours = Stopping([crit("eos", ids=[2, 5])], require_length_limit=False).check(ctx(ids))
    assert theirs.done.tolist() == ours.done.tolist() and 0 < int(ours.done.sum()) < 16
    assert {r for r in theirs.reasons if r} == {"EosTokenCriteria"}


@pytest.mark.parametrize(
    "answer, shape",
    [
        (lambda b: torch.zeros((b, 1), dtype=torch.bool), r"\(2, 1\)"),
        (lambda b: torch.zeros((b + 1,), dtype=torch.bool), r"\(3,\)"),
        (lambda b: [True] * (b + 2), r"\(4,\)"),
    ],
)
def test_wrong_shapes_from_callables_are_sampling_errors(answer, shape):
    def bad(c):
        return answer(c.input_ids.shape[0])

    stopping = Stopping([bad, crit("max_new_tokens", n=3)])
    with pytest.raises(
        SamplingError,
        match=rf"stopping callable 'bad' returned shape {shape}; a stopping criterion "
        r"must return one bool per row, shape \(2,\)",
    ):
        stopping.check(ctx(torch.zeros((2, 2), dtype=torch.int64)))


def test_a_list_of_bools_is_one_answer_per_row():
    stopping = Stopping([lambda c: [False, True], crit("max_new_tokens", n=3)])
    assert stopping.check(ctx(torch.zeros((2, 2), dtype=torch.int64))).done.tolist() == [False, True]


@pytest.mark.parametrize(
    ("name", "params", "error", "message"),
    [
        (3, None, UnknownPluginError, r"stopping_criterion name = 3: expected a name as a string"),
        (None, {}, UnknownPluginError, r"stopping_criterion name = None: expected a name as a string"),
        ("max_new_tokens", 5, ConfigError, r"max_new_tokens = 5: expected a table of max_new_tokens's parameters"),
        ("stop_strings", "x", ConfigError, r"stop_strings = 'x': expected a table of stop_strings's parameters"),
    ],
)
def test_a_criterion_named_or_parameterised_with_no_such_thing_is_one_error(name, params, error, message):
    with pytest.raises(error, match=message):
        Stopping.criterion(name, params)
