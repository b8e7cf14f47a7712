"""samplechain.integrations.mindie: MindIE-LLM's sample(), SamplingData and SamplingParam on the chain executor."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers.generation.logits_process import (
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from samplechain.integrations.mindie import MindIEArgumentError, MindIESampler, SamplingData, SamplingParam

V = 64
T = torch.from_numpy


def f32(*xs):
    return np.array(xs, dtype=np.float32)


def i64(*xs):
    return np.array(xs, dtype=np.int64)


def logits_for(batch, seed=0, vocab=V):
    return torch.randn(batch, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def np_penalised(logits, all_ids, out_ids, rep, freq, pres):
    """MindIE's documented formulas on one row: repetition (divide positive / multiply negative logits) over the
    tokens of all_input_ids, then frequency (count * f) and presence ((count > 0) * p) over output_ids."""
    x = np.asarray(logits, dtype=np.float64).copy()
    vocab = len(x)
    seen = {int(t) for t in all_ids if 0 <= t < vocab}
    for t in seen:
        x[t] = x[t] * rep if x[t] < 0 else x[t] / rep
    counts = np.zeros(vocab)
    for t in out_ids:
        if 0 <= t < vocab:
            counts[t] += 1
    return x - freq * counts - pres * (counts > 0)


def log_softmax_np(x):
    x = np.asarray(x, dtype=np.float64)
    finite = np.isfinite(x)
    m = x[finite].max()
    return x - (m + np.log(np.exp(x[finite] - m).sum()))


# ------------------------------------------------------------------------------------------ output contract
def test_shapes_dtypes_and_all_greedy_returns_none():
    lg = logits_for(4)
    tokens, values = MindIESampler().sample(lg, None, None)
    assert isinstance(tokens, np.ndarray) and tokens.dtype == np.int64 and tokens.shape == (4,)
    assert values is None  # every row greedy
    assert tokens.tolist() == lg.argmax(dim=1).tolist()

    param = SamplingParam.from_numpy(do_sample=np.array([True, False, True, False]), to_tensor=T)
    tokens, values = MindIESampler().sample(lg, None, param)
    assert tokens.dtype == np.int64 and tokens.shape == (4,)
    assert isinstance(values, np.ndarray) and values.dtype == np.float32 and values.shape == (4,)


def test_greedy_rows_return_logits_and_sampled_rows_logprobs():
    lg = logits_for(3, seed=1)
    param = SamplingParam.from_numpy(do_sample=np.array([False, True, False]), seed=i64(1, 2, 3), to_tensor=T)
    tokens, values = MindIESampler().sample(lg, None, param)
    for b in (0, 2):
        assert tokens[b] == int(lg[b].argmax())
        assert values[b] == pytest.approx(float(lg[b, tokens[b]]), abs=1e-6)  # the logit itself
    logprob = torch.log_softmax(lg[1].double(), dim=0)[tokens[1]].item()
    assert values[1] == pytest.approx(logprob, abs=1e-5) and values[1] <= 0


def test_inner_call_order_is_logits_then_tokens():
    lg = logits_for(2)
    param = SamplingParam.from_numpy(do_sample=np.array([True, True]), seed=i64(5, 6), to_tensor=T)
    tokens, values = MindIESampler().sample(lg, None, param)
    values2, tokens2 = MindIESampler()(lg, None, param)  # MindIE's `self.sampler(...)` returns this order
    assert tokens2.tolist() == tokens.tolist() and np.array_equal(values2, values)


def test_half_precision_logits():
    lg = logits_for(2, seed=3)
    tokens, _ = MindIESampler().sample(lg.to(torch.bfloat16), None, None)
    assert tokens.tolist() == lg.to(torch.bfloat16).float().argmax(dim=1).tolist()


# ------------------------------------------------------------------------------------------ do_sample rule
def test_do_sample_false_with_sampling_parameters_becomes_true():
    p = SamplingParam.from_numpy(
        temperature=f32(0.7, 1.0, 1.0, 1.0, 1.0, 0.0, 1.0),
        top_k=i64(0, 5, 0, 0, 0, 5, 0),
        top_p=f32(1.0, 1.0, 0.9, 1.0, 1.0, 0.9, 1.0),
        do_sample=np.array([False, False, False, False, True, True, False]),
        seed=i64(1, 2, 3, 4, 5, 6, 7),
        to_tensor=T,
    )
    # rows 0-2: one non-neutral sampling parameter each; row 3: all neutral (a seed alone does not promote);
    # row 4: do_sample True; row 5: temperature 0 is greedy whatever else is set; row 6: neutral
    assert p.effective_do_sample(7).tolist() == [True, True, True, False, True, False, False]
    lg = logits_for(7, seed=2)
    tokens, values = MindIESampler().sample(lg, None, p)
    for b in (3, 5, 6):  # greedy rows: argmax and its logit
        assert tokens[b] == int(lg[b].argmax()) and values[b] == pytest.approx(float(lg[b, tokens[b]]), abs=1e-6)
    row0 = torch.log_softmax(lg[0].double() / 0.7, dim=0)[tokens[0]].item()
    assert values[0] == pytest.approx(row0, abs=1e-5)

    # do_sample None (False for every row) with a top_p: promoted as well
    p = SamplingParam.from_numpy(top_p=f32(0.5, 1.0), to_tensor=T)
    assert p.effective_do_sample(2).tolist() == [True, False]
    assert MindIESampler().sample(logits_for(2), None, p)[1] is not None
    # only neutral values: the whole batch is greedy, second value None
    p = SamplingParam.from_numpy(
        temperature=f32(1.0, 1.0), top_k=i64(0, 0), top_p=f32(1.0, 1.0), do_sample=np.array([False, False]), to_tensor=T
    )
    assert MindIESampler().sample(logits_for(2), None, p)[1] is None


def test_caller_arrays_are_not_modified():
    temperature, do_sample = f32(0.0, 0.5), np.array([True, False])
    p = SamplingParam.from_numpy(temperature=temperature, do_sample=do_sample, to_tensor=T)
    MindIESampler().sample(logits_for(2), None, p)
    assert temperature.tolist() == [0.0, 0.5] and do_sample.tolist() == [True, False]


# ------------------------------------------------------------------------------------------ penalties
def _random_case(rng, batch, vocab=V):
    all_ids = rng.integers(0, vocab, size=(batch, 12))
    all_ids[:, :3] = -1  # left padding
    all_ids[0, -1] = vocab  # pad_token_id = vocab_size
    out_ids = all_ids[:, -5:].copy()
    out_ids[:, 0] = -1
    out_ids[1, 2] = out_ids[1, 3]  # a repeated output token: frequency counts it twice
    return all_ids, out_ids


def test_penalties_match_the_documented_formulas_greedy_rows():
    rng = np.random.default_rng(0)
    batch = 16
    lg = logits_for(batch, seed=4)
    lg[:, :8] += 6  # make the penalised tokens the contenders so the penalties decide the argmax
    all_ids, out_ids = _random_case(rng, batch)
    all_ids[:, 3:6] = rng.integers(0, 8, size=(batch, 3))
    rep = rng.uniform(0.5, 2.0, batch).astype(np.float32)
    freq = rng.uniform(-1.0, 2.0, batch).astype(np.float32)
    pres = rng.uniform(-1.0, 2.0, batch).astype(np.float32)
    rep[0], freq[1], pres[2] = 1.0, 0.0, 0.0
    data = SamplingData.from_numpy(all_ids, out_ids, to_tensor=T)
    param = SamplingParam.from_numpy(
        repetition_penalty=rep,
        frequency_penalty=freq,
        presence_penalty=pres,
        do_sample=np.zeros(batch, bool),
        to_tensor=T,
    )
    param_mixed = SamplingParam.from_numpy(
        repetition_penalty=rep,
        frequency_penalty=freq,
        presence_penalty=pres,
        do_sample=np.arange(batch) == 0,
        to_tensor=T,
    )
    tokens, values = MindIESampler().sample(lg, data, param)
    assert values is None
    _, values = MindIESampler().sample(lg, data, param_mixed)  # row 0 samples: the others report their logits
    changed = 0
    for b in range(batch):
        ref = np_penalised(lg[b].numpy(), all_ids[b], out_ids[b], rep[b], freq[b], pres[b])
        assert tokens[b] == int(np.argmax(ref))
        changed += tokens[b] != int(lg[b].argmax())
        if b:
            assert values[b] == pytest.approx(ref[tokens[b]], abs=1e-5)
    assert changed >= 3  # the test exercises the penalties, not just the raw argmax


def test_penalties_then_temperature_topk_topp_match_transformers():
    """Sampled rows: logprob = log_softmax of transformers' warpers (temperature, top_k, top_p in MindIE's order)
    applied to the penalised logits; every drawn token lies in the warpers' support."""
    rng = np.random.default_rng(1)
    batch = 6
    base = logits_for(1, seed=5)[0]
    lg = base.expand(batch, -1).clone()
    all_ids, out_ids = _random_case(rng, batch)
    all_ids[:] = all_ids[0]
    out_ids[:] = out_ids[0]
    settings = [(0.7, 0, 1.0), (1.3, 10, 1.0), (1.0, 0, 0.8), (0.5, 20, 0.9), (1.0, 3, 0.5), (2.0, 70, 0.95)]
    rep, freq, pres = 1.3, 0.4, 0.6
    data = SamplingData.from_numpy(all_ids, out_ids, to_tensor=T)
    supports = []
    refs = []
    for t, k, p in settings:
        x = torch.from_numpy(np_penalised(base.numpy(), all_ids[0], out_ids[0], rep, freq, pres)).float()[None]
        x = TemperatureLogitsWarper(t)(None, x)
        if k:
            x = TopKLogitsWarper(k)(None, x)
        if p < 1.0:
            x = TopPLogitsWarper(p)(None, x)
        refs.append(log_softmax_np(x[0].numpy()))
        supports.append(set(np.flatnonzero(np.isfinite(x[0].numpy())).tolist()))
    sampler = MindIESampler()  # no request_ids: every call is a batch of fresh requests
    for seed in range(25):
        param = SamplingParam.from_numpy(
            repetition_penalty=np.full(batch, rep, np.float32),
            frequency_penalty=np.full(batch, freq, np.float32),
            presence_penalty=np.full(batch, pres, np.float32),
            temperature=np.array([s[0] for s in settings], np.float32),
            top_k=np.array([s[1] for s in settings]),
            top_p=np.array([s[2] for s in settings], np.float32),
            do_sample=np.ones(batch, bool),
            seed=np.arange(batch) + 100 * seed,
            to_tensor=T,
        )
        tokens, values = sampler.sample(lg, data, param)
        for b in range(batch):
            assert tokens[b] in supports[b], (b, settings[b])
            assert values[b] == pytest.approx(refs[b][tokens[b]], abs=1e-5)


# ------------------------------------------------------------------------------------------ request state
def test_seeded_row_gives_the_same_token_alone_and_in_a_batch():
    lg = logits_for(5, seed=6)
    param = SamplingParam.from_numpy(
        temperature=f32(0.8, 1.2, 1.0, 0.6, 1.0),
        top_k=i64(0, 20, 0, 5, 0),
        top_p=f32(0.9, 1.0, 1.0, 0.95, 1.0),
        do_sample=np.array([True, True, True, False, False]),
        seed=i64(11, 22, 33, 44, 55),
        to_tensor=T,
    )
    tokens, values = MindIESampler().sample(lg, None, param)
    for b in range(5):
        alone = SamplingParam.from_numpy(
            temperature=param.temperature[b : b + 1],
            top_k=param.top_k[b : b + 1],
            top_p=param.top_p[b : b + 1],
            do_sample=param.do_sample[b : b + 1],
            seed=param.seed[b : b + 1],
            to_tensor=T,
        )
        t1, v1 = MindIESampler().sample(lg[b : b + 1], None, alone)
        assert t1[0] == tokens[b]
        if b == 4:  # a greedy row alone is an all-greedy batch: None; in the batch, its logit
            assert v1 is None and values[b] == pytest.approx(float(lg[b, tokens[b]]), abs=1e-6)
        else:
            assert v1[0] == pytest.approx(values[b], abs=1e-6)


def _flat_param(n, seeds):
    return SamplingParam.from_numpy(do_sample=np.ones(n, bool), seed=np.asarray(seeds, np.int64), to_tensor=T)


def test_prefill_starts_fresh_and_continuation_moves_the_seed_position():
    lg = torch.zeros(2, 1000)  # uniform: only the RNG decides
    ids = i64(7, 8)
    sampler = MindIESampler()
    first = sampler.sample(lg, SamplingData.from_numpy(request_ids=ids, is_prefill=True), _flat_param(2, [1, 2]))[0]
    seq = [first.tolist()]
    for _ in range(4):
        seq.append(
            sampler.sample(lg, SamplingData.from_numpy(request_ids=ids, is_prefill=False), _flat_param(2, [1, 2]))[
                0
            ].tolist()
        )
    assert sampler.position(7) == 5
    assert len({s[0] for s in seq}) > 1  # the draw moves on: not the position-0 token every step
    # a new prefill of the same ids restarts them: the same token sequence again
    again = [
        sampler.sample(lg, SamplingData.from_numpy(request_ids=ids, is_prefill=True), _flat_param(2, [1, 2]))[
            0
        ].tolist()
    ]
    for _ in range(4):
        again.append(
            sampler.sample(lg, SamplingData.from_numpy(request_ids=ids, is_prefill=False), _flat_param(2, [1, 2]))[
                0
            ].tolist()
        )
    assert again == seq
    # a request's sequence does not depend on its batch: request 8 alone gives its column
    solo = MindIESampler()
    alone = [
        solo.sample(lg[:1], SamplingData.from_numpy(request_ids=i64(8), is_prefill=True), _flat_param(1, [2]))[0][0]
    ]
    for _ in range(4):
        alone.append(
            solo.sample(lg[:1], SamplingData.from_numpy(request_ids=i64(8), is_prefill=False), _flat_param(1, [2]))[0][
                0
            ]
        )
    assert alone == [s[1] for s in seq]
    # without request_ids every call is a fresh request: the position-0 token each time
    anon = MindIESampler()
    assert [anon.sample(lg, None, _flat_param(2, [1, 2]))[0].tolist() for _ in range(3)] == [seq[0]] * 3
    assert len(anon) == 0


def test_continuation_reuses_penalty_history_when_ids_are_omitted():
    lg = logits_for(1, seed=8)
    prompt = np.array([[3, 4, 5]])
    rep = SamplingParam.from_numpy(repetition_penalty=f32(1.8), frequency_penalty=f32(0.7), to_tensor=T)
    cached = MindIESampler()
    explicit = MindIESampler()
    out: list[int] = []
    for step in range(4):
        prefill = step == 0
        if prefill:
            d1 = SamplingData.from_numpy(prompt, to_tensor=T, is_prefill=True, request_ids=i64(1))
        else:
            d1 = SamplingData.from_numpy(is_prefill=False, request_ids=i64(1))  # ids omitted: cached history
        all_ids = np.concatenate([prompt, np.array([out], dtype=np.int64).reshape(1, -1)], axis=1)
        out_ids = np.array([out], dtype=np.int64).reshape(1, -1)
        d2 = SamplingData.from_numpy(all_ids, out_ids, to_tensor=T)
        t1, _ = cached.sample(lg, d1, rep)
        t2, _ = explicit.sample(lg, d2, rep)
        assert t1.tolist() == t2.tolist()
        out.append(int(t1[0]))
    assert len(set(out)) > 1  # the penalised history changed the greedy choice


def test_parameters_of_each_call_apply_and_a_switch_keeps_the_position():
    lg = logits_for(1, seed=9)
    sampler = MindIESampler()
    rid = i64(5)
    greedy = SamplingParam.from_numpy(do_sample=np.array([False]), to_tensor=T)
    assert sampler.sample(lg, SamplingData.from_numpy(request_ids=rid), greedy)[1] is None
    hot = SamplingParam.from_numpy(temperature=f32(0.5), seed=i64(3), to_tensor=T)  # promoted to sampling
    tokens, values = sampler.sample(lg, SamplingData.from_numpy(request_ids=rid, is_prefill=False), hot)
    assert sampler.position(5) == 2
    assert values[0] == pytest.approx(torch.log_softmax(lg[0].double() / 0.5, 0)[tokens[0]].item(), abs=1e-5)
    sampler.clear([5])
    assert 5 not in sampler and len(sampler) == 0


# ------------------------------------------------------------------------------------------ errors
@pytest.mark.parametrize(
    "kwargs, argument",
    [
        (dict(temperature=f32(1.0, 1.0), top_p=f32(0.9, 0.9, 0.9)), "top_p"),
        (dict(repetition_penalty=np.array([[1.0]])), "repetition_penalty"),
        (dict(repetition_penalty=f32(0.0)), "repetition_penalty"),
        (dict(temperature=f32(-0.1)), "temperature"),
        (dict(temperature=f32(np.nan)), "temperature"),
        (dict(top_p=f32(0.0)), "top_p"),
        (dict(top_p=f32(1.5)), "top_p"),
        (dict(top_k=f32(3.0)), "top_k"),
        (dict(top_k=i64(-1)), "top_k"),
        (dict(seed=i64(-5)), "seed"),
        (dict(do_sample=f32(1.0)), "do_sample"),
        (dict(seed=[1, 2]), "seed"),
    ],
)
def test_sampling_param_errors_name_the_argument(kwargs, argument):
    with pytest.raises(MindIEArgumentError, match=f"^{argument}:") as info:
        SamplingParam.from_numpy(**kwargs, to_tensor=T)
    assert info.value.argument == argument


def test_sampling_data_and_sample_errors_name_the_argument():
    with pytest.raises(MindIEArgumentError, match="^all_input_ids:"):
        SamplingData.from_numpy(np.array([1, 2, 3]), to_tensor=T)
    with pytest.raises(MindIEArgumentError, match="^output_ids:"):
        SamplingData.from_numpy(np.zeros((2, 3), np.int64), np.zeros((3, 1), np.int64), to_tensor=T)
    with pytest.raises(MindIEArgumentError, match="^all_input_ids:"):
        SamplingData.from_numpy(np.zeros((2, 3), np.int64), to_tensor=T, request_ids=i64(1, 2, 3))
    with pytest.raises(MindIEArgumentError, match="^all_input_ids:"):
        SamplingData.from_numpy(np.zeros((2, 3), np.float32), to_tensor=T)
    with pytest.raises(MindIEArgumentError, match="^to_tensor:"):
        SamplingData.from_numpy(np.zeros((2, 3), np.int64))
    with pytest.raises(MindIEArgumentError, match="^to_tensor:"):
        SamplingParam.from_numpy(temperature=f32(0.5))
    with pytest.raises(MindIEArgumentError, match="^is_prefill:"):
        SamplingData.from_numpy(is_prefill=1)
    with pytest.raises(MindIEArgumentError, match="^request_ids:"):
        SamplingData.from_numpy(request_ids=i64(4, 4))
    sampler = MindIESampler()
    with pytest.raises(MindIEArgumentError, match="^temperature:.*logits"):
        sampler.sample(logits_for(3), None, SamplingParam.from_numpy(temperature=f32(0.5, 0.5), to_tensor=T))
    with pytest.raises(MindIEArgumentError, match="^all_input_ids:.*logits"):
        sampler.sample(logits_for(3), SamplingData.from_numpy(np.zeros((2, 4), np.int64), to_tensor=T), None)
    with pytest.raises(MindIEArgumentError, match="^request_ids:.*logits"):
        sampler.sample(logits_for(3), SamplingData.from_numpy(request_ids=i64(1, 2)), None)
    with pytest.raises(MindIEArgumentError, match="^logits:"):
        sampler.sample(logits_for(3)[0], None, None)
    with pytest.raises(MindIEArgumentError, match="^sampling_param:"):
        sampler.sample(logits_for(3), None, {"temperature": 0.5})
    assert len(sampler) == 0  # nothing was added by a failed call
