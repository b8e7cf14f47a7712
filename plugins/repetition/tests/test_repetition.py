"""repetition against vLLM's rule (vllm/v1/core/sched/utils.py, check_sequence_repetition, restated below in plain
Python): crafted sequences, random batches row by row, min_tokens, the parameter checks, and in generate() with
the finish reason "repetition"."""

from __future__ import annotations

import random

import pytest
import torch

import samplechain
from samplechain import Chain, ConfigError, StopContext, StopSetup
from samplechain.generation import generate
from samplechain.tools.testing import tiny_gpt2


def vllm_rule(tokens: list[int], max_size: int, min_size: int, min_count: int) -> bool:
    """vLLM's check_sequence_repetition on the output tokens."""
    min_size = max(min_size, 1)
    if max_size <= 0 or min_count < 2 or min_size > max_size:
        return False
    for size in range(min_size, max_size + 1):
        if size * min_count > len(tokens):
            return False
        if all(tokens[-(size * m + n)] == tokens[-n] for n in range(1, size + 1) for m in range(1, min_count)):
            return True
    return False


def criterion(**params):
    return samplechain.Stopping.criterion("repetition", params)


def check(crit, ids: torch.Tensor, prompt_length: int) -> list[bool]:
    batch = ids.shape[0]
    setup = StopSetup(
        batch_size=batch,
        prompt_length=prompt_length,
        prompt_lengths=torch.full((batch,), prompt_length),
        device=ids.device,
    )
    crit.prepare(setup)
    out = crit.check(StopContext(ids, ids.shape[1] - prompt_length, ids[:, -1], setup))
    return [out] * batch if isinstance(out, bool) else out.tolist()


@pytest.mark.parametrize(
    "new, params, want",
    [
        ([7, 7], {"max_pattern_size": 1, "min_count": 2}, True),
        ([7, 7], {"max_pattern_size": 1, "min_count": 3}, False),  # too few tokens for three
        ([1, 2, 1, 2, 1, 2], {"max_pattern_size": 2, "min_count": 3}, True),
        ([1, 2, 1, 2, 1, 3], {"max_pattern_size": 3, "min_count": 2}, False),
        ([5, 1, 2, 3, 1, 2, 3], {"max_pattern_size": 3, "min_count": 2}, True),
        ([5, 1, 2, 3, 1, 2, 3], {"max_pattern_size": 2, "min_count": 2}, False),  # the loop is 3 long
        ([4, 4, 4, 4], {"max_pattern_size": 2, "min_pattern_size": 2, "min_count": 2}, True),  # (4 4)(4 4)
        ([9, 4, 4, 4], {"max_pattern_size": 2, "min_pattern_size": 2, "min_count": 2}, False),  # size 1 not looked at
        ([1, 2, 1, 2], {"max_pattern_size": 0, "min_count": 0}, False),  # disabled
        ([3, 3, 3, 3], {"max_pattern_size": 1, "min_count": 4, "min_tokens": 5}, False),  # not before min_tokens
        ([3, 3, 3, 3, 3], {"max_pattern_size": 1, "min_count": 4, "min_tokens": 5}, True),
    ],
)
def test_crafted_sequences(new, params, want):
    ids = torch.tensor([[3, 3, 3] + new])  # the prompt repeats too: only generated tokens count
    assert check(criterion(**params), ids, 3) == [want]
    assert want == (
        vllm_rule(new, params["max_pattern_size"], params.get("min_pattern_size", 0), params["min_count"])
        and len(new) >= params.get("min_tokens", 0)
    )


def test_random_batches_equal_vllms_rule_row_by_row():
    rng = random.Random(0)
    hits = 0
    for _ in range(300):
        max_size = rng.randint(1, 5)
        params = {
            "max_pattern_size": max_size,
            "min_pattern_size": rng.randint(0, max_size),
            "min_count": rng.randint(2, 4),
        }
        prompt, step = rng.randint(0, 3), rng.randint(1, 14)
        vocab = rng.choice([2, 3, 5])
        ids = torch.randint(0, vocab, (6, prompt + step), generator=torch.Generator().manual_seed(rng.randrange(10**6)))
        ours = check(criterion(**params), ids, prompt)
        assert ours == [
            vllm_rule(row[prompt:], params["max_pattern_size"], params["min_pattern_size"], params["min_count"])
            for row in ids.tolist()
        ], (params, ids, prompt)
        hits += sum(ours)
    assert 100 < hits < 1700  # both answers well represented


@pytest.mark.parametrize(
    "stop, message",
    [
        ({"max_pattern_size": 3, "min_count": 1}, r"max_pattern_size = 3: min_count 1: a pattern must repeat at least"),
        ({"max_pattern_size": 2, "min_pattern_size": 3}, r"min_pattern_size 3 > max_pattern_size 2"),
        ({"max_pattern_size": -1}, r"max_pattern_size = -1: must be in \[0, inf\)"),
        ({"max_pattern_size": 2, "min_tokens": -3}, r"min_tokens = -3"),
    ],
)
def test_bad_parameters_name_the_key(stop, message):
    with pytest.raises(ConfigError, match=message):
        Chain.load({"samplers": [{"use": "greedy"}], "stop": [{"use": "repetition", **stop}]})


def test_generate_stops_a_looping_row_with_the_reason_repetition():
    """Greedy decoding of a small random model falls into a loop; the criterion ends it there, and a row ends with
    the same tokens as the unstopped run up to that point."""
    model = tiny_gpt2(300, seed=3, eos_token_id=None)
    ids = torch.tensor([[5, 6, 7], [8, 9, 10]])
    long = generate(
        model,
        input_ids=ids,
        chain=Chain.load({"samplers": [{"use": "greedy"}]}),
        max_new_tokens=40,
        ignore_eos=True,
        pad_token_id=0,
    )
    chain = Chain.load(
        {"samplers": [{"use": "greedy"}], "stop": [{"use": "repetition", "max_pattern_size": 4, "min_count": 3}]}
    )
    out = generate(model, input_ids=ids, chain=chain, max_new_tokens=40, ignore_eos=True, pad_token_id=0)
    for row in range(2):
        full = long.sequences[row, 3:].tolist()
        first = next((k for k in range(1, 41) if vllm_rule(full[:k], 4, 0, 3)), None)
        if first is None:
            assert out.finish_reasons[row] == "max_new_tokens"
        else:
            assert out.finish_reasons[row] == "repetition"
            assert out.num_generated[row] == first
            assert out.sequences[row, 3 : 3 + first].tolist() == full[:first]
    assert "repetition" in out.finish_reasons
