"""stop_sequences against a plain-Python reference: the row's generated tokens end with one of the sequences."""

from __future__ import annotations

import random

import pytest
import torch

import samplechain
from samplechain import ConfigError, StopContext, StopSetup


def criterion(sequences):
    return samplechain.Stopping.criterion("stop_sequences", {"sequences": sequences})


def check(crit, ids, prompt_length):
    batch = ids.shape[0]
    setup = StopSetup(
        batch_size=batch,
        prompt_length=prompt_length,
        prompt_lengths=torch.full((batch,), prompt_length),
        device=ids.device,
    )
    crit.prepare(setup)
    return crit.check(StopContext(ids, ids.shape[1] - prompt_length, ids[:, -1], setup)).tolist()


def reference(new_tokens: list[int], sequences) -> bool:
    return any(len(s) <= len(new_tokens) and new_tokens[len(new_tokens) - len(s) :] == list(s) for s in sequences)


def test_rows_stop_when_their_new_tokens_end_with_a_sequence():
    crit = criterion([[4, 5], [9]])
    ids = torch.tensor([[1, 4, 4, 5], [1, 2, 3, 9], [4, 5, 1, 2], [0, 4, 5, 6]])
    assert check(crit, ids, 2) == [True, True, False, False]


def test_a_sequence_straddling_the_prompt_does_not_count():
    crit = criterion([[4, 5]])
    assert check(crit, torch.tensor([[1, 4, 5]]), 2) == [False]  # 4 is the prompt's
    assert check(crit, torch.tensor([[1, 4, 5]]), 1) == [True]


def test_random_batches_equal_the_reference_row_by_row():
    rng = random.Random(0)
    hits = 0
    for _ in range(200):
        sequences = [[rng.randrange(4) for _ in range(rng.randint(1, 4))] for _ in range(rng.randint(1, 4))]
        prompt, step = rng.randint(0, 3), rng.randint(1, 6)
        ids = torch.randint(0, 4, (5, prompt + step), generator=torch.Generator().manual_seed(rng.randrange(10**6)))
        ours = check(criterion(sequences), ids, prompt)
        assert ours == [reference(row[prompt:], sequences) for row in ids.tolist()], (sequences, ids, prompt)
        hits += sum(ours)
    assert 100 < hits < 900  # both answers well represented


@pytest.mark.parametrize(
    "sequences, message",
    [
        ([], r"sequences = \[\]: give at least one sequence"),
        ([[1], []], r"sequences = \[\[1\], \[\]\]: sequence 1 is empty"),
        ([[1, "a"]], r"sequences\[0\]\[1\] = 'a': expected an integer"),
        ([[1, -2]], r"sequence 0 has a negative token id \(-2\)"),
        ([1, 2], r"sequences\[0\] = 1: expected an array"),
        ("13", r"sequences = '13': expected an array"),
    ],
)
def test_bad_sequences(sequences, message):
    with pytest.raises(ConfigError, match=message):
        samplechain.load_config(
            {"samplers": [{"use": "greedy"}], "stop": [{"use": "stop_sequences", "sequences": sequences}]}
        )


def test_from_toml():
    config = samplechain.load_config(
        'samplers = [{ use = "greedy" }]\n'
        'stop = [{ use = "max_new_tokens", n = 4 }, '
        '{ use = "stop_sequences", sequences = [[13, 13], [2]] }]\n'
    )
    assert config.stop[1].params.sequences == ((13, 13), (2,))
