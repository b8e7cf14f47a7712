"""The shipped test doubles work as a plugin author would use them."""

from __future__ import annotations

import attrs
import pytest
import torch
from transformers.generation.logits_process import EpsilonLogitsWarper, EtaLogitsWarper

import samplechain as sc
from samplechain.tools.testing import (
    CutoffWarperTests,
    RecordingBackend,
    ScriptedLogits,
    assert_bitwise_no_op,
    assert_kept_logits_bitwise,
    assert_probs_close,
    assert_rows_equal_alone,
    host_with,
    processed_scores,
    random_logits,
    request_store,
    run_chain,
    sampler_chain,
    top_k_only,
)


@attrs.frozen
class _AddParams:
    x: float


class _Add(sc.Sampler):
    name = "add_for_test"
    stage = sc.Stage.TRANSFORM
    Params = _AddParams
    request_aliases = {"add": "x"}

    def apply(self, cand, ctx):
        return cand.replace_logits(cand.logits + ctx.param("x")[:, None])


def test_run_chain_registers_an_uninstalled_sampler_and_applies_per_row_parameters():
    logits = torch.zeros(2, 4)
    out = run_chain(
        [_Add],
        {"samplers": [{"use": "add_for_test", "x": 1.0}, {"use": "test_argmax"}]},
        logits,
        params=[{"add": 2.0}, {}],
    )
    assert torch.equal(out.scores, torch.tensor([[2.0] * 4, [1.0] * 4]))


def test_recording_backend_shows_that_truncation_happens_once_on_the_full_vocabulary():
    host = host_with()
    chain = sc.Chain.load(
        {
            "backend": "recording",
            "samplers": [{"use": "top_k", "k": 5}, {"use": "top_p", "p": 0.9}, {"use": "dist", "seed": 1}],
        },
        host=host,
    )
    chain.sample(torch.randn(3, 1000))
    backend = chain._backend_for("cpu")
    assert isinstance(backend, RecordingBackend)
    assert backend.calls == [("ranked_topk", (3, 1000)), ("gumbel", (3, 5))]


def test_scripted_logits_follow_each_request_script():
    script = ScriptedLogits(
        {"a": [torch.tensor([0.0, 1.0]), torch.tensor([1.0, 0.0])], "b": [torch.tensor([5.0, 0.0])]}
    )
    assert script(["a", "b"]).argmax(-1).tolist() == [1, 0]
    assert script(["a"]).argmax(-1).tolist() == [0]


# ----------------------------------------------------------------- helpers for sampler tests
def test_random_logits_are_seeded_and_scaled():
    a = random_logits(3, 4, 50, 2.0)
    assert a.shape == (4, 50) and a.dtype == torch.float32
    assert torch.equal(a, random_logits(3, 4, 50, 2.0))
    assert torch.equal(a, random_logits(3, 4, 50) * 2.0)
    assert not torch.equal(a, random_logits(4, 4, 50, 2.0))


def test_top_k_only_keeps_each_rows_k_largest_of_by():
    values = torch.tensor([[1.0, 5.0, 3.0, 4.0], [9.0, 0.0, 2.0, 1.0]])
    inf = float("-inf")
    assert torch.equal(top_k_only(values, 2), torch.tensor([[inf, 5.0, inf, 4.0], [9.0, inf, 2.0, inf]]))
    by = torch.tensor([[4.0, 3.0, 2.0, 1.0], [1.0, 2.0, 3.0, 4.0]])
    assert torch.equal(top_k_only(values, 1, by=by), torch.tensor([[1.0, inf, inf, inf], [inf, inf, inf, 1.0]]))


def test_sampler_chain_puts_before_then_entry_then_the_selector():
    c = sampler_chain({"use": "top_k", "k": 3}, before=[{"use": "temperature", "t": 0.5}], selector="dist")
    assert [s.name for s in c.samplers] == ["temperature", "top_k", "dist"]
    assert [s.name for s in sampler_chain({"use": "top_k", "k": 3}).samplers] == ["top_k", "greedy"]


def test_request_store_adds_one_request_per_row_with_its_parameters():
    c = sampler_chain({"use": "top_k", "k": 3})
    store, ids = request_store(c, [{"top_k": 1}, {}])
    assert ids == ["r0", "r1"]
    out = c.process(torch.arange(8.0).expand(2, -1).clone(), store, ids)
    assert torch.isfinite(out).sum(dim=-1).tolist() == [1, 3]


def test_processed_scores_per_row_and_through_process_or_sample():
    logits = random_logits(0, 3, 40)
    c = sampler_chain({"use": "top_k", "k": 5})
    rows = [{"top_k": 1}, {"top_k": 0}, {}]
    counts = torch.isfinite(processed_scores(c, logits, rows)).sum(dim=-1).tolist()
    assert counts == [1, 40, 5]
    assert torch.equal(processed_scores(c, logits, rows, process=True), processed_scores(c, logits, rows))
    assert torch.isfinite(processed_scores(c, logits)).sum(dim=-1).tolist() == [5, 5, 5]
    history = torch.tensor([[1, 2, 1], [3, 3, 3], [0, 1, 2]])
    pen = sampler_chain({"use": "penalties", "repeat": 2.0})
    assert torch.equal(processed_scores(pen, logits, history=history), pen.process(logits, history=history))


def test_assert_rows_equal_alone_returns_the_batch_and_slices_row_tensors():
    logits = random_logits(1, 3, 30)
    history = torch.tensor([[1, 2], [3, 3], [5, 6]])
    c = sampler_chain({"use": "penalties"})
    rows = [{"repeat_penalty": 1.5}, {}, {"repeat_penalty": 3.0}]
    batch = assert_rows_equal_alone(c, logits, rows, history=history)
    assert torch.equal(batch, processed_scores(c, logits, rows, history=history))
    assert torch.equal(batch[1], logits[1]) and not torch.equal(batch[0], logits[0])


class _SubtractBatchMean(sc.Sampler):
    """A broken sampler for the check below: a row's output depends on the other rows of the batch."""

    name = "batch_mean_for_test"
    stage = sc.Stage.TRANSFORM

    def apply(self, cand, ctx):
        return cand.replace_logits(cand.logits - cand.logits.mean())


def test_assert_rows_equal_alone_fails_when_a_row_depends_on_the_batch():
    c = sc.Chain.load(
        {"backend": "recording", "samplers": [{"use": "batch_mean_for_test"}, {"use": "test_argmax"}]},
        host=host_with(_SubtractBatchMean),
    )
    logits = torch.tensor([[0.0, 1.0], [2.0, 5.0]])
    with pytest.raises(AssertionError, match="row 0"):
        assert_rows_equal_alone(c, logits, [{}, {}])


def test_assert_bitwise_no_op_and_kept_logits_checks():
    logits = random_logits(2, 2, 20)
    assert_bitwise_no_op(sampler_chain({"use": "top_k", "k": 0}), logits)
    with pytest.raises(AssertionError, match="unchanged"):
        assert_bitwise_no_op(sampler_chain({"use": "top_k", "k": 3}), logits)
    kept = assert_kept_logits_bitwise(top_k_only(logits, 3), logits)
    assert kept.sum(dim=-1).tolist() == [3, 3]
    moved = top_k_only(logits, 3)
    moved[torch.isfinite(moved)] += 1.0
    with pytest.raises(AssertionError, match="bitwise"):
        assert_kept_logits_bitwise(moved, logits)
    nan = logits.clone()
    nan[0, 0] = float("nan")
    with pytest.raises(AssertionError, match="-inf"):
        assert_kept_logits_bitwise(nan, logits)


def test_assert_probs_close_in_token_order_or_as_sorted_rows():
    a = torch.tensor([[0.0, 1.0, float("-inf")]])
    assert_probs_close(a, a.double() + 5.0)  # the same distribution
    with pytest.raises(AssertionError, match="max diff"):
        assert_probs_close(a, torch.tensor([[1.0, 0.0, float("-inf")]]))
    assert_probs_close(a, torch.tensor([[1.0, 0.0, float("-inf")]]), sort_rows=True)


class TestCutoffWarperTestsOnATransformersWarper(CutoffWarperTests):
    """The shared suite, run on epsilon as its plugin does (the suite must collect, parametrise and pass)."""

    sampler, field, alias, warper = "epsilon", "epsilon", "epsilon_cutoff", EpsilonLogitsWarper
    flat_rows_keep_only_the_top = True


def test_cutoff_warper_tests_fail_against_the_wrong_warper():
    class Wrong(CutoffWarperTests):
        sampler, field, alias, warper = "epsilon", "epsilon", "epsilon_cutoff", EtaLogitsWarper

    with pytest.raises(AssertionError):
        Wrong().test_matches_transformers_on_random_logits(1000, 0, 0.01)
