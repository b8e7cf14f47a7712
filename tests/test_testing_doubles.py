"""The shipped test doubles work as a plugin author would use them."""

from __future__ import annotations

import attrs
import torch

import samplechain as sc
from samplechain.testing import RecordingBackend, ScriptedLogits, host_with, run_chain


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
    out = run_chain([_Add], {"samplers": [{"use": "add_for_test", "x": 1.0}, {"use": "test_argmax"}]}, logits,
                    params=[{"add": 2.0}, {}])
    assert torch.equal(out.scores, torch.tensor([[2.0] * 4, [1.0] * 4]))


def test_recording_backend_shows_that_truncation_happens_once_on_the_full_vocabulary():
    host = host_with()
    chain = sc.Chain.load({"backend": "recording", "samplers": [{"use": "top_k", "k": 5}, {"use": "top_p", "p": 0.9},
                                                                  {"use": "dist", "seed": 1}]}, host=host)
    chain.sample(torch.randn(3, 1000))
    backend = chain._backend_for("cpu")
    assert isinstance(backend, RecordingBackend)
    assert backend.calls == [("topk", (3, 1000)), ("gumbel", (3, 5))]


def test_scripted_logits_follow_each_request_script():
    script = ScriptedLogits({"a": [torch.tensor([0.0, 1.0]), torch.tensor([1.0, 0.0])], "b": [torch.tensor([5.0, 0.0])]})
    assert script(["a", "b"]).argmax(-1).tolist() == [1, 0]
    assert script(["a"]).argmax(-1).tolist() == [0]
