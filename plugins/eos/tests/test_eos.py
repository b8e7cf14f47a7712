"""eos against transformers' EosTokenCriteria; ids resolved from the tokenizer and the configs when not given."""

from __future__ import annotations

import pytest
import torch
from transformers import EosTokenCriteria, GenerationConfig, GPT2Config

import samplechain
from samplechain import ConfigError, StopContext, StopSetup
from samplechain.tools.testing import byte_bpe_tokenizer


def make_setup(batch=4, **kw):
    return StopSetup(
        batch_size=batch, prompt_length=2, prompt_lengths=torch.full((batch,), 2), device=torch.device("cpu"), **kw
    )


def check(crit, ids, s=None):
    return crit.check(StopContext(ids, ids.shape[1] - 2, ids[:, -1], s or make_setup(ids.shape[0]))).tolist()


@pytest.mark.parametrize("ids", [[3], [3, 7], [0, 9, 4]])
def test_equals_transformers_eos_criteria_row_by_row(ids):
    crit = samplechain.Stopping.criterion("eos", {"ids": ids})
    crit.prepare(make_setup(8))
    ref = EosTokenCriteria(ids)
    stopped = 0
    for seed in range(30):
        x = torch.randint(0, 10, (8, 5), generator=torch.Generator().manual_seed(seed))
        ours = check(crit, x)
        assert ours == ref(x, None).tolist()
        stopped += sum(ours)
    assert 0 < stopped < 240


def test_ids_come_from_tokenizer_generation_config_and_model_config_in_that_order_once_each():
    crit = samplechain.Stopping.criterion("eos", {})
    tok = byte_bpe_tokenizer(300)
    crit.prepare(
        make_setup(
            tokenizer=tok,
            generation_config=GenerationConfig(eos_token_id=[5, tok.eos_token_id]),
            model_config=GPT2Config(eos_token_id=9),
        )
    )
    assert crit.resolved_ids() == [tok.eos_token_id, 5, 9]
    x = torch.tensor([[1, 1, 5], [1, 1, 9], [1, 1, tok.eos_token_id], [1, 1, 6]])
    assert check(crit, x) == [True, True, True, False]


@pytest.mark.parametrize(
    "sources, expected",
    [
        ({"generation_config": GenerationConfig(eos_token_id=4)}, [4]),
        ({"model_config": GPT2Config(eos_token_id=2)}, [2]),
        (
            {"generation_config": GenerationConfig(eos_token_id=[7, 8]), "model_config": GPT2Config(eos_token_id=8)},
            [7, 8],
        ),
    ],
)
def test_any_one_source_is_enough(sources, expected):
    crit = samplechain.Stopping.criterion("eos", {})
    crit.prepare(make_setup(**sources))
    assert crit.resolved_ids() == expected


def test_given_ids_win_over_the_tokenizer_and_configs():
    crit = samplechain.Stopping.criterion("eos", {"ids": [11]})
    crit.prepare(make_setup(tokenizer=byte_bpe_tokenizer(300), model_config=GPT2Config(eos_token_id=9)))
    assert crit.resolved_ids() == [11]


def test_no_eos_anywhere_warns_and_never_fires():
    crit = samplechain.Stopping.criterion("eos", {})
    with pytest.warns(
        UserWarning,
        match=r"eos: no eos token id in the tokenizer, the generation config or the model "
        r"config; this criterion never fires \(give ids = \[...\]",
    ):
        crit.prepare(make_setup(model_config=GPT2Config(eos_token_id=None)))
    assert not any(any(check(crit, torch.randint(0, 10, (4, 3)))) for _ in range(5))


@pytest.mark.parametrize(
    "ids, message",
    [
        ([-1], r"stop\[0\].ids = \[-1\]: token ids must be >= 0 \(got -1\)"),
        (5, r"stop\[0\].ids = 5: expected an array"),
        (["a"], r"stop\[0\].ids\[0\] = 'a': expected an integer"),
        ([1.5], r"stop\[0\].ids\[0\] = 1.5: expected an integer"),
        ([True], r"stop\[0\].ids\[0\] = True: expected an integer"),
    ],
)
def test_bad_ids(ids, message):
    with pytest.raises(ConfigError, match=message):
        samplechain.load_config({"samplers": [{"use": "greedy"}], "stop": [{"use": "eos", "ids": ids}]})


def test_from_toml():
    config = samplechain.load_config(
        'samplers = [{ use = "greedy" }]\n'
        'stop = [{ use = "max_new_tokens", n = 4 }, { use = "eos" }, '
        '{ use = "eos", ids = [2, 32000] }]\n'
    )
    assert [e.params.ids for e in config.stop[1:]] == [(), (2, 32000)]
