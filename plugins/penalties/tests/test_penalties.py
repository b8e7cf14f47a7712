"""penalties.v1 against llama.cpp's expected probabilities, transformers' RepetitionPenaltyLogitsProcessor and
vLLM's penalty semantics.

- llama.cpp: tests/test-sampling.cpp `test_penalties` (commit 07e4038f): candidates logit = logf(p), the
  sampler accepts `last_tokens` with penalty_last_n = len(last_tokens), then dist's softmax; |p - expected| < 1e-5
  in token-id order (the penalties sampler does not sort).
- transformers: RepetitionPenaltyLogitsProcessor(penalty) on prompt + output: scope "transformers" and scope
  "llama.cpp" with last_n = -1 give the same logits (allclose 1e-6, probabilities within 1e-5).
- vLLM (docs: SamplingParams; v1 sampler `apply_penalties`): repetition over prompt + output tokens
  (logits > 0 divided, others multiplied), then `logits -= frequency * output_counts` and
  `logits -= presence * (output_counts > 0)`, counting generated tokens only. Transcribed below as a reference.
"""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

from samplechain import Chain, ConfigError
from samplechain.tools.testing import assert_bitwise_no_op, assert_rows_equal_alone, processed_scores, sampler_chain

TOL = 1e-5


def chain(**params) -> Chain:
    return sampler_chain({"use": "penalties", **params})


def scores(c: Chain, logits, history, prompt_lengths=None, per_row=None):
    return processed_scores(c, logits, per_row, history=history, prompt_lengths=prompt_lengths)


# (probs, last_tokens, expected, repeat, frequency, presence) -- test-sampling.cpp verbatim
LLAMA_CPP = [
    ([0.2] * 5, [0], [0, 0.25, 0.25, 0.25, 0.25], 50.0, 0.0, 0.0),
    ([0.2] * 5, [0, 1, 2], [0, 0, 0, 0.5, 0.5], 50.0, 0.0, 0.0),
    ([0.2] * 5, [0, 1, 2, 0, 0], [0, 0, 0, 0.5, 0.5], 50.0, 0.0, 0.0),
    ([0.2] * 5, [0], [0.000011, 0.249997, 0.249997, 0.249997, 0.249997], 1.0, 5.0, 5.0),
    ([0.2] * 5, [0, 1, 2], [0.000023, 0.000023, 0.000023, 0.499966, 0.499966], 1.0, 5.0, 5.0),
    ([0.2] * 5, [0, 1, 2, 0, 0], [0.000000, 0.000023, 0.000023, 0.499977, 0.499977], 1.0, 5.0, 5.0),
]


@pytest.mark.parametrize(("probs", "last", "expected", "rep", "freq", "pres"), LLAMA_CPP)
def test_llama_cpp_expected_probabilities(probs, last, expected, rep, freq, pres):
    logits = torch.log(torch.tensor([probs], dtype=torch.float32))
    c = chain(repeat=rep, frequency=freq, presence=pres, last_n=len(last))
    out = scores(c, logits, torch.tensor([last]))
    got = torch.softmax(out[0], dim=-1)
    assert (got - torch.tensor(expected)).abs().max() < TOL


def random_case(seed, B=6, V=500, L=40, span=60):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, V, generator=g) * 3
    history = torch.randint(0, span, (B, L), generator=g)  # small span: many repeats; logits of both signs
    return logits, history


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("penalty", (0.5, 1.3, 2.0))
def test_matches_transformers_repetition_penalty(seed, penalty):
    logits, history = random_case(seed)
    ref = RepetitionPenaltyLogitsProcessor(penalty)(history, logits.clone())
    for params in ({"scope": "transformers"}, {"scope": "llama.cpp", "last_n": -1}):
        ours = scores(chain(repeat=penalty, **params), logits, history)
        torch.testing.assert_close(ours, ref, rtol=1e-6, atol=1e-6)
        assert (torch.softmax(ours, -1) - torch.softmax(ref, -1)).abs().max() < TOL


def test_left_padding_is_not_a_token():
    """-1 padding is never penalised; each padded row equals transformers on its unpadded tokens."""
    logits, history = random_case(7, B=3)
    history[0, :15] = -1
    history[2, :30] = -1
    ours = scores(chain(repeat=1.5, scope="transformers"), logits, history)
    for b in range(3):
        row = history[b : b + 1][history[b : b + 1] >= 0][None, :]
        ref = RepetitionPenaltyLogitsProcessor(1.5)(row, logits[b : b + 1].clone())
        torch.testing.assert_close(ours[b : b + 1], ref, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("last_n", (1, 5, 17, 40, 100))
def test_window_counts_only_the_last_n_tokens(last_n):
    logits, history = random_case(3)
    c = dict(repeat=1.7, frequency=0.3, presence=0.4)
    ours = scores(chain(last_n=last_n, **c), logits, history)
    cut = history[:, -last_n:]
    assert torch.equal(ours, scores(chain(last_n=-1, **c), logits, cut))


def llama_cpp_reference(logits, history, rep, freq, pres, last_n):
    """llama_sampler_penalties_apply, transcribed (one row at a time, plain Python)."""
    out = logits.clone()
    for b in range(logits.shape[0]):
        toks = [t for t in history[b].tolist() if t >= 0]
        toks = toks if last_n < 0 else toks[len(toks) - last_n :] if last_n else []
        counts = {}
        for t in toks:
            counts[t] = counts.get(t, 0) + 1
        for t, n in counts.items():
            x = float(out[b, t])
            x = x * rep if x <= 0 else x / rep
            out[b, t] = torch.tensor(x, dtype=torch.float32) - torch.tensor(n * freq + pres, dtype=torch.float32)
    return out


@pytest.mark.parametrize("seed", range(3))
def test_frequency_and_presence_match_llama_cpp_formula(seed):
    logits, history = random_case(seed)
    ours = scores(chain(repeat=1.2, frequency=0.25, presence=0.5, last_n=25), logits, history)
    ref = llama_cpp_reference(logits, history, 1.2, 0.25, 0.5, 25)
    torch.testing.assert_close(ours, ref, rtol=1e-6, atol=1e-5)


def vllm_reference(logits, history, prompt_lengths, rep, freq, pres):
    """vLLM's apply_penalties: repetition over prompt | output mask, frequency / presence over output counts."""
    V = logits.shape[1]
    out = logits.clone()
    for b in range(logits.shape[0]):
        toks = [t for t in history[b].tolist() if t >= 0]
        prompt, output = toks[: int(prompt_lengths[b])], toks[int(prompt_lengths[b]) :]
        counts = torch.bincount(torch.tensor(output, dtype=torch.long), minlength=V).float()
        mask = counts > 0
        mask[torch.tensor(prompt, dtype=torch.long)] = True
        x = out[b]
        x = torch.where(mask, torch.where(x > 0, x / rep, x * rep), x)
        x = x - freq * counts
        x = x - pres * (counts > 0).float()
        out[b] = x
    return out


@pytest.mark.parametrize("seed", range(3))
def test_vllm_scope_counts_frequency_and_presence_over_output_only(seed):
    logits, history = random_case(seed)
    prompt_lengths = torch.tensor([40, 0, 10, 25, 39, 20])
    ours = scores(chain(repeat=1.4, frequency=0.7, presence=-0.3, scope="vllm"), logits, history, prompt_lengths)
    ref = vllm_reference(logits, history, prompt_lengths, 1.4, 0.7, -0.3)
    torch.testing.assert_close(ours, ref, rtol=1e-6, atol=1e-5)


def test_per_row_parameters_equal_rows_alone_and_disabled_rows_are_untouched():
    logits, history = random_case(11)
    rows = [
        {"repeat_penalty": 1.0},
        {"repeat_penalty": 1.3, "penalty_last_n": 8},
        {"frequency_penalty": 0.5, "presence_penalty": 0.2, "penalty_last_n": -1},
        {"repeat_penalty": 2.0, "penalty_last_n": 0},
        {"repeat_penalty": 0.8, "frequency_penalty": -0.4},
        {"presence_penalty": 1.0, "penalty_last_n": 3},
    ]
    c = chain()
    batch = assert_rows_equal_alone(c, logits, rows, history=history)
    assert torch.equal(batch[0], logits[0]) and torch.equal(batch[3], logits[3])


def test_defaults_are_a_bitwise_no_op():
    logits, history = random_case(5)
    assert_bitwise_no_op(chain(), logits, history=history)
    assert_bitwise_no_op(chain(repeat=1.5, last_n=0), logits, history=history)


def test_after_top_k_equals_penalties_then_top_k():
    logits, history = random_case(2)
    compact = Chain.load(
        {
            "samplers": [
                {"use": "top_k", "k": 30},
                {"use": "penalties", "repeat": 1.5, "frequency": 0.2, "last_n": -1},
                {"use": "greedy"},
            ]
        }
    )
    full = scores(chain(repeat=1.5, frequency=0.2, last_n=-1), logits, history)
    ref = torch.full_like(logits, float("-inf"))
    idx = logits.topk(30, dim=-1).indices
    ref.scatter_(1, idx, full.gather(1, idx))
    assert torch.equal(scores(compact, logits, history), ref)


def test_bad_values_are_configuration_errors():
    with pytest.raises(ConfigError, match="repeat"):
        chain(repeat=0.0)
    with pytest.raises(ConfigError, match="scope"):
        chain(scope="openai")
    with pytest.raises(ConfigError, match="last_n"):
        chain(last_n=-2)


@pytest.mark.parametrize("scope", ["llama.cpp", "transformers", "vllm"])
def test_numpy_changes_equal_the_torch_changes_bitwise(scope, monkeypatch):
    """Small CPU batches compute the sparse changes with numpy: the same ids, new logits, targets and first
    positions, bit for bit, as the torch path (per-row parameters, -1 padding, -inf logits, repeats)."""
    import samplechain_penalties as penalties
    from samplechain import Candidates
    from samplechain.engine.step import Step

    g = torch.Generator().manual_seed(5)
    for trial in range(10):
        batch, length, vocab = 3, int(torch.randint(1, 200, (1,), generator=g)), 500
        logits = torch.randn(batch, vocab, generator=g) * 4
        logits[0, ::7] = float("-inf")
        history = torch.randint(-1, vocab, (batch, length), generator=g)
        history[:, : min(3, length)] = -1
        chain = Chain.load(
            {
                "samplers": [
                    {
                        "use": "penalties",
                        "repeat": 1.3,
                        "frequency": 0.4,
                        "presence": -0.2,
                        "last_n": 17,
                        "scope": scope,
                    },
                    {"use": "greedy"},
                ]
            }
        )
        store = chain.new_store()
        ids = [f"r{i}" for i in range(batch)]
        for i, rid in enumerate(ids):
            store.add(rid, {"repeat_penalty": [1.3, 1.0, 0.8][i], "frequency_penalty": [0.4, 0.0, 0.1][i]})
        view = store.batch(ids)
        step = Step(
            store, view, store.positions(view), chain._backend_for("cpu"), (history, torch.full((batch,), length // 2))
        )
        ctx = chain._context(step, 0)
        sampler, cand = chain.samplers[0], Candidates(logits, None, vocab, False, False)
        windows = sampler._windows(ctx)
        fast = sampler._changes(cand, *windows)
        monkeypatch.setattr(penalties, "_NP_SMALL", -1)
        slow = sampler._changes(cand, *windows)
        monkeypatch.undo()
        for a, b in zip(fast, slow):
            assert torch.equal(a, b), trial
