"""length_decay.v1 against transformers' ExponentialDecayLengthPenalty (probabilities within 1e-5, logits
allclose 1e-6); per-row start / factor equal rows alone; factor = 1 a no-op.

A masked (-inf) eos stays masked, as transformers >= 5.19 keeps it; before 5.19 transformers added
inf * (factor ** n - 1) to it, -inf + inf = NaN for factor > 1 (docs/semantics.md, "transformers versions")."""

from __future__ import annotations

import pytest
import torch
import transformers
from packaging.version import Version
from transformers.generation.logits_process import ExponentialDecayLengthPenalty

from samplechain import Chain
from samplechain.tools.testing import check_eos_ids_from_setup

EOS = [3, 77]
# transformers 5.19 leaves non-finite eos logits unchanged (`penalty.masked_fill(~torch.isfinite(...), 0.0)`)
MASKS_NON_FINITE_EOS = Version(transformers.__version__).release >= (5, 19)


def chain(**params):
    return Chain.load({"samplers": [{"use": "length_decay", "eos_ids": EOS, **params}, {"use": "greedy"}]})


@pytest.mark.parametrize("generated", (0, 3, 4, 9))
@pytest.mark.parametrize(("start", "factor"), [(3, 1.5), (0, 1.1), (5, 0.7)])
def test_matches_transformers(generated, start, factor):
    g = torch.Generator().manual_seed(generated)
    logits = torch.randn(3, 100, generator=g) * 3
    logits[0, 3] = float("-inf")  # a masked eos stays masked
    prompt = 6
    history = torch.randint(0, 100, (3, prompt + generated), generator=g)
    ref = ExponentialDecayLengthPenalty((start, factor), EOS, prompt)(history, logits.clone())
    masked = ~torch.isfinite(logits)
    if MASKS_NON_FINITE_EOS:
        assert torch.equal(ref[masked], logits[masked])
    else:  # the reference of transformers >= 5.19: a -inf eos the older code turns into NaN (factor > 1) stays -inf
        assert bool((ref[masked].isnan() | (ref[masked] == logits[masked])).all())
        assert bool(ref[masked].isnan().any()) == (factor > 1 and generated > start)
        ref = torch.where(masked, logits, ref)
    ours = chain(start=start, factor=factor).sample(
        logits, history=history, prompt_lengths=torch.full((3,), prompt), return_scores=True
    )
    torch.testing.assert_close(ours.scores, ref, rtol=1e-6, atol=1e-6)
    assert (torch.softmax(ours.scores, -1) - torch.softmax(ref, -1)).abs().max() < 1e-5


def test_per_row_equals_rows_alone_and_factor_one_is_a_no_op():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 100, generator=g)
    history = torch.randint(0, 100, (3, 12), generator=g)
    history[2, :4] = -1
    prompt_lengths = torch.tensor([4, 4, 2])
    rows = [
        {"length_decay_factor": 1.0},
        {"length_decay_start": 2, "length_decay_factor": 1.3},
        {"length_decay_start": 1, "length_decay_factor": 2.0},
    ]
    c = chain()
    store = c.new_store()
    for i, p in enumerate(rows):
        store.add(f"r{i}", p)
    batch = c.sample(
        logits, store, ["r0", "r1", "r2"], history=history, prompt_lengths=prompt_lengths, return_scores=True
    ).scores
    assert torch.equal(batch[0], logits[0])
    for b in (1, 2):
        row = history[b][history[b] >= 0][None, :]
        p = rows[b]
        ref = ExponentialDecayLengthPenalty(
            (p["length_decay_start"], p["length_decay_factor"]), EOS, int(prompt_lengths[b])
        )(row, logits[b : b + 1].clone())
        torch.testing.assert_close(batch[b : b + 1], ref, rtol=1e-6, atol=1e-6)


def test_eos_ids_default_to_the_generations():
    logits = torch.randn(3, 60, generator=torch.Generator().manual_seed(5))
    check_eos_ids_from_setup(
        {"use": "length_decay", "factor": 1.2},
        logits,
        EOS,
        history=torch.zeros(3, 8, dtype=torch.long),
        prompt_lengths=torch.full((3,), 2),
    )
