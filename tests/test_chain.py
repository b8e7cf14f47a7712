"""The chain executor: heterogeneous batches, dtypes, outputs, and failures that leave state untouched."""

from __future__ import annotations

import pytest
import torch

import samplechain as sc
from samplechain import Chain, RequestError, SamplingError

LLAMA = {
    "samplers": [
        {"use": "top_k", "k": 40},
        {"use": "top_p", "p": 0.95},
        {"use": "min_p", "p": 0.05},
        {"use": "temperature", "t": 0.8},
        {"use": "dist"},
    ]
}
FULL = {
    "samplers": [
        {"use": "temperature", "t": 1.0},
        {"use": "top_k", "k": 0},
        {"use": "top_p", "p": 1.0},
        {"use": "min_p", "p": 0.0},
        {"use": "dist"},
    ]
}

ROW_PARAMS = [
    {"temperature": 0.7, "top_k": 5, "top_p": 0.9, "min_p": 0.0, "seed": 1},
    {"temperature": 1.3, "top_k": 0, "top_p": 0.5, "min_p": 0.1, "seed": 2},
    {"temperature": 0.0, "top_k": 50, "top_p": 1.0, "min_p": 0.0, "seed": 3},
    {"temperature": 1.0, "top_k": 1, "top_p": 0.2, "min_p": 0.5, "seed": 4},
    {"temperature": 0.9, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "seed": 5},
    {"temperature": 2.0, "top_k": 3, "top_p": 0.99, "min_p": 0.2, "min_keep": 2, "seed": 6},
]


def logits_for(batch: int, vocab: int = 300, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, vocab, generator=g) * 3


@pytest.mark.parametrize("config", [LLAMA, FULL], ids=["llama-order", "vllm-order"])
def test_heterogeneous_batch_gives_each_row_what_it_gets_alone(config):
    chain = Chain.load(config)
    logits = logits_for(len(ROW_PARAMS))
    store = chain.new_store()
    ids = [f"r{i}" for i in range(len(ROW_PARAMS))]
    for rid, params in zip(ids, ROW_PARAMS):
        store.add(rid, params)
    batched = chain.sample(logits, store, ids, return_scores=True)
    for i, params in enumerate(ROW_PARAMS):
        alone_store = chain.new_store()
        alone_store.add("alone", params)
        alone = chain.sample(logits[i : i + 1], alone_store, ["alone"], return_scores=True)
        assert batched.token_ids[i] == alone.token_ids[0]
        assert torch.equal(torch.isfinite(batched.scores[i]), torch.isfinite(alone.scores[0]))
        torch.testing.assert_close(
            batched.scores[i][torch.isfinite(batched.scores[i])], alone.scores[0][torch.isfinite(alone.scores[0])]
        )
        torch.testing.assert_close(batched.logprobs[i], alone.logprobs[0])


def test_per_row_temperature_zero_is_greedy_for_that_row_only():
    chain = Chain.load(FULL)
    logits = logits_for(2)
    store = chain.new_store()
    store.add("cold", {"temperature": 0.0, "seed": 1})
    store.add("hot", {"temperature": 1.0, "seed": 1})
    out = chain.sample(logits, store, ["cold", "hot"], return_scores=True)
    assert out.token_ids[0] == logits[0].argmax()
    assert torch.isfinite(out.scores[0]).sum() == 1
    assert torch.isfinite(out.scores[1]).sum() == logits.shape[1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_half_precision_logits_are_accepted(dtype):
    chain = Chain.load({"samplers": [{"use": "top_k", "k": 5}, {"use": "greedy"}]})
    logits = logits_for(4).to(dtype)
    out = chain.sample(logits)
    assert torch.equal(out.token_ids, logits.float().argmax(dim=-1))
    assert out.logprobs.dtype == torch.float32


def test_caller_logits_are_never_modified():
    chain = Chain.load(
        {
            "samplers": [
                {"use": "temperature", "t": 0.5},
                {"use": "top_k", "k": 3},
                {"use": "min_p", "p": 0.3},
                {"use": "dist"},
            ]
        }
    )
    logits = logits_for(3)
    before = logits.clone()
    chain.sample(logits)
    assert torch.equal(logits, before)


def test_non_contiguous_logits_are_accepted():
    chain = Chain.load({"samplers": [{"use": "greedy"}]})
    logits = logits_for(6, 50).t().contiguous().t()[:, :40]
    assert not logits.is_contiguous()
    assert torch.equal(chain.sample(logits).token_ids, logits.argmax(dim=-1))


def test_logprobs_are_those_of_the_processed_distribution():
    chain = Chain.load(
        {"samplers": [{"use": "top_k", "k": 4}, {"use": "temperature", "t": 0.5}, {"use": "dist", "seed": 9}]}
    )
    logits = logits_for(3, 20)
    out = chain.sample(logits, return_scores=True)
    expected = torch.log_softmax(out.scores, dim=-1).gather(1, out.token_ids[:, None]).squeeze(1)
    torch.testing.assert_close(out.logprobs, expected)


def test_scores_are_full_vocabulary_with_minus_inf_for_removed_tokens():
    chain = Chain.load({"samplers": [{"use": "top_k", "k": 3}, {"use": "greedy"}]})
    logits = logits_for(2, 10)
    scores = chain.sample(logits, return_scores=True).scores
    assert scores.shape == (2, 10)
    top3 = logits.topk(3).indices
    for row in range(2):
        kept = torch.isfinite(scores[row]).nonzero().flatten()
        assert set(kept.tolist()) == set(top3[row].tolist())
        assert torch.equal(scores[row, kept], logits[row, kept])


def test_truncation_compacts_the_candidate_set():
    """After top-k, later samplers see K = k columns, never the full vocabulary again."""
    seen = []

    class Probe(sc.Sampler):
        name = "probe_width"
        stage = sc.Stage.TRANSFORM

        def apply(self, cand, ctx):
            seen.append(cand.width)
            return cand

    class Plugin:
        @sc.hookimpl
        def register_samplers(self, register):
            register(Probe)

    host = sc.PluginHost(use_env=False)
    host.register_plugin(Plugin(), "probe-plugin")
    chain = Chain.load(
        {
            "samplers": [
                {"use": "probe_width"},
                {"use": "top_k", "k": 7},
                {"use": "probe_width", "id": "after"},
                {"use": "greedy"},
            ]
        },
        host=host,
    )
    chain.sample(logits_for(4, 1000))
    assert seen == [1000, 7]


class _Boom(sc.Sampler):
    name = "boom_mid_chain"
    stage = sc.Stage.FILTER

    def apply(self, cand, ctx):
        raise ValueError("kaboom")


class _BoomPlugin:
    @sc.hookimpl
    def register_samplers(self, register):
        register(_Boom)


def test_a_sampler_raising_mid_chain_names_the_plugin_and_step_and_changes_no_state():
    host = sc.PluginHost(use_env=False)
    host.register_plugin(_BoomPlugin(), "boom-plugin")
    ok = Chain.load({"samplers": [{"use": "dist"}]}, host=host)
    bad = Chain.load({"samplers": [{"use": "top_k", "k": 3}, {"use": "boom_mid_chain"}, {"use": "dist"}]}, host=host)
    store = bad.new_store()
    store.add("a", {"seed": 3})
    before = store.snapshot()
    with pytest.raises(SamplingError) as info:
        bad.sample(logits_for(1), store, ["a"])
    text = str(info.value)
    assert "boom_mid_chain.v1 at samplers[1]" in text and "ValueError: kaboom" in text
    assert "no request state was changed" in text
    assert store.snapshot() == before
    assert ok  # the host keeps working


def test_a_row_with_every_token_masked_is_an_error_naming_the_request():
    chain = Chain.load({"samplers": [{"use": "greedy"}]})
    store = chain.new_store()
    store.add_many(["fine", "dead"])
    logits = logits_for(2, 5)
    logits[1] = float("-inf")
    before = store.snapshot()
    with pytest.raises(SamplingError, match=r"every token is masked \(-inf\) for request\(s\) \['dead'\]"):
        chain.sample(logits, store, ["fine", "dead"])
    assert store.snapshot() == before


def test_nan_logits_are_an_error_naming_the_request():
    chain = Chain.load({"samplers": [{"use": "dist"}]})
    logits = logits_for(2, 5)
    logits[0, 2] = float("nan")
    with pytest.raises(SamplingError, match=r"NaN or \+inf for request\(s\) \['row0'\]"):
        chain.sample(logits)


@pytest.mark.parametrize(
    "logits, message",
    [
        (torch.zeros(5), r"shape \(batch, vocab\), got \(5,\); add a batch dimension"),
        (torch.zeros(2, 3, 4), r"got \(2, 3, 4\)"),
        (torch.zeros(2, 4, dtype=torch.int64), "dtype torch.int64 is not supported"),
        ([[0.0, 1.0]], "must be a torch.Tensor"),
        (torch.zeros(2, 0), "empty vocabulary"),
    ],
)
def test_malformed_logits_are_rejected_clearly(logits, message):
    with pytest.raises(SamplingError, match=message):
        Chain.load({"samplers": [{"use": "greedy"}]}).sample(logits)


def test_batch_size_mismatch_between_logits_and_request_ids():
    chain = Chain.load({"samplers": [{"use": "greedy"}]})
    store = chain.new_store()
    store.add_many(["a", "b"])
    with pytest.raises(RequestError, match="logits have 3 rows but 2 request ids"):
        chain.sample(logits_for(3), store, ["a", "b"])


def test_a_store_from_another_chain_is_refused():
    a = Chain.load({"samplers": [{"use": "greedy"}]})
    b = Chain.load({"samplers": [{"use": "greedy"}]})
    store = a.new_store()
    store.add("x")
    with pytest.raises(RequestError, match="belongs to another chain"):
        b.sample(logits_for(1), store, ["x"])


def test_a_string_of_request_ids_or_a_store_that_is_none_are_refused():
    """A string would be read as one-character ids: "ab" would sample rows 'a' and 'b'."""
    chain = Chain.load({"samplers": [{"use": "dist"}]})
    store = chain.new_store()
    store.add_many(["a", "b"])
    with pytest.raises(RequestError, match=r"request_ids = 'ab': a list of ids, one per row"):
        chain.sample(logits_for(2), store, "ab")
    with pytest.raises(RequestError, match=r"store = \{\}: a RequestStore from this chain's new_store\(\)"):
        chain.sample(logits_for(2), {}, ["a", "b"])
    with pytest.raises(sc.ConfigError, match=r"logprobs_at = 5: one stage for the batch"):
        chain.sample(logits_for(2), store, ["a", "b"], logprobs_at=5)
    assert store.positions(store.batch(["a", "b"])).tolist() == [0, 0]  # nothing moved


def test_an_explicit_backend_that_does_not_exist_is_an_error_not_a_fallback():
    with pytest.raises(sc.ConfigError, match="backend = 'tpu': unknown backend 'tpu'"):
        Chain.load({"samplers": [{"use": "greedy"}], "backend": "tpu"})
    with pytest.raises(sc.BackendError, match="unknown backend 'metal'"):
        Chain.load({"samplers": [{"use": "greedy"}]}, backend="metal")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_an_installed_backend_that_cannot_run_here_is_an_error_not_a_fallback():
    with pytest.raises(sc.BackendError, match="backend 'cuda' is installed but cannot run here: .*built without CUDA"):
        Chain.load({"samplers": [{"use": "greedy"}], "backend": "cuda"})


def test_accept_false_leaves_positions_for_an_explicit_accept():
    chain = Chain.load({"samplers": [{"use": "dist"}]})
    store = chain.new_store()
    store.add("a", {"seed": 5})
    logits = logits_for(1)
    first = chain.sample(logits, store, ["a"], accept=False)
    again = chain.sample(logits, store, ["a"], accept=False)
    assert first.token_ids == again.token_ids  # same position, same noise
    chain.accept(store, ["a"], first.token_ids)
    assert store.snapshot()["a"]["position"] == 1


def test_empty_batch():
    chain = Chain.load({"samplers": [{"use": "greedy"}]})
    out = chain.sample(torch.zeros(0, 10))
    assert out.token_ids.shape == (0,)


def test_history_reaches_samplers_that_declare_they_read_it():
    import attrs

    import samplechain as sc
    from samplechain.tools.testing import host_with

    seen = {}

    class LastTokenBan(sc.Sampler):
        name = "last_token_ban"
        stage = sc.Stage.TRANSFORM

        def needs_history(self):
            return True

        def apply(self, cand, ctx):
            seen["history"], seen["prompt_lengths"] = ctx.history, ctx.prompt_lengths
            logits = cand.logits.clone()
            last = ctx.history[:, -1]
            logits.scatter_(1, last[:, None], float("-inf"))
            return attrs.evolve(cand, logits=logits, writable=True)

    host = host_with(LastTokenBan)
    chain = Chain.load({"samplers": [{"use": "last_token_ban"}, {"use": "greedy"}]}, host=host)
    logits = torch.tensor([[0.0, 5.0, 1.0], [3.0, 0.0, 1.0]])
    with pytest.raises(SamplingError, match=r"last_token_ban.v1 reads the tokens so far: pass history="):
        chain.sample(logits)
    history = torch.tensor([[-1, 2, 1], [0, 1, 0]])
    out = chain.sample(logits, history=history)
    assert out.token_ids.tolist() == [2, 2]
    assert seen["prompt_lengths"].tolist() == [2, 3]  # known tokens minus the 0 accepted so far


def test_reads_history_says_whether_a_batch_needs_the_tokens_so_far():
    """Chain.reads_history: False for chains without a history-reading sampler, and for a batch on which every
    one of them is a no-op (the llama.cpp preset's penalties at repeat 1.0 and DRY at multiplier 0); True as soon
    as one row sets a penalty, and then sample() without history= names what is missing."""
    assert Chain.load("preset:greedy").reads_history(Chain.load("preset:greedy").new_store(), []) is False
    chain = Chain.load("preset:llama.cpp")
    store = chain.new_store()
    store.add("plain", {"seed": 1})
    store.add("dry", {"seed": 2, "dry_multiplier": 0.8})
    store.add("repeat", {"seed": 3, "repeat_penalty": 1.3})
    assert chain.needs_history
    assert chain.reads_history(store, ["plain"]) is False
    logits = torch.randn(1, 300, generator=torch.Generator().manual_seed(0))
    chain.sample(logits, store, ["plain"])  # no history needed
    for rid in ("dry", "repeat"):
        assert chain.reads_history(store, ["plain", rid]) is True
        with pytest.raises(SamplingError, match="pass history="):
            chain.sample(logits.expand(2, -1).clone(), store, ["plain", rid])


def test_the_layout_checks_request_parameters_without_a_store():
    """StoreLayout.resolve: what RequestStore.add checks, with no store (the vLLM frontend validates each request
    this way): every column's value, the seed None unless drawn, and the same RequestError as add() for a bad key
    or value."""
    from samplechain import RequestError

    chain = Chain.load("preset:llama.cpp")
    values = chain.layout.resolve("r", {"top_k": 3, "temperature": 0.5}, draw_seeds=False)
    named = {(chain.config.samplers[i].id, field): v for (i, field), v in values.items()}
    assert named[("top_k", "k")] == 3 and named[("temp_ext", "t")] == 0.5 and named[("dist", "seed")] is None
    assert chain.layout.resolve("r", {})[(len(chain.samplers) - 1, "seed")] is not None  # drawn
    store = chain.new_store()
    for bad in ({"top_kk": 3}, {"min_p": -1}):
        with pytest.raises(RequestError) as direct:
            chain.layout.resolve("r", bad)
        with pytest.raises(RequestError) as added:
            store.add("r", bad)
        assert str(direct.value) == str(added.value)
    assert store.request_ids == []


def test_a_deferred_step_changes_the_store_only_when_committed():
    chain = Chain.load({"samplers": [{"use": "top_k", "k": 20}, {"use": "mirostat"}]})  # state: mu, the RNG position
    eager, deferred = chain.new_store(), chain.new_store()
    for store in (eager, deferred):
        store.add("a", {"seed": 3})
        store.add("b", {"seed": 4})
    x = logits_for(2)
    want = chain.sample(x, eager, ["a", "b"])
    before = deferred.snapshot()
    step = chain.sample_deferred(x, deferred, ["a", "b"])
    assert torch.equal(step.output.token_ids, want.token_ids)
    assert eager.snapshot() != before  # the step moves positions and mirostat's mu
    assert deferred.snapshot() == before  # nothing written yet
    step.commit()
    assert deferred.snapshot() == eager.snapshot()


@pytest.mark.parametrize("made_in_inference_mode", [True, False])
def test_a_store_steps_in_and_outside_inference_mode_wherever_it_was_made(made_in_inference_mode):
    """A store made (and grown) under torch.inference_mode and stepped outside it, or the other way round, gives
    the tokens of a store that never saw the mode: its tensors, changed in place each step, are ordinary ones."""
    chain = Chain.load({"samplers": [{"use": "top_k", "k": 20}, {"use": "mirostat"}]})
    ids = [f"r{i}" for i in range(10)]  # more than the store's first capacity: it grows
    plain = chain.new_store()
    with torch.inference_mode(made_in_inference_mode):
        store = chain.new_store()
        for i, rid in enumerate(ids):
            store.add(rid, {"seed": i})
            plain.add(rid, {"seed": i})
    x = logits_for(len(ids))
    for step in range(3):
        with torch.inference_mode(not made_in_inference_mode and step % 2 == 0):
            got = chain.sample(x, store, ids)
        want = chain.sample(x, plain, ids)
        assert torch.equal(got.token_ids, want.token_ids)
    assert store.snapshot() == plain.snapshot()


def test_accept_takes_a_bool_and_points_to_sample_deferred():
    chain = Chain.load({"samplers": [{"use": "dist"}]})
    store = chain.new_store()
    store.add("a", {"seed": 3})
    before = store.snapshot()
    with pytest.raises(TypeError, match=r"accept='defer': pass True or False; .* chain.sample_deferred"):
        chain.sample(logits_for(1), store, ["a"], accept="defer")
    assert store.snapshot() == before
