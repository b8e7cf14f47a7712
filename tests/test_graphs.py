"""The sampling step recorded once and replayed (samplechain.engine.graphs): replays draw the eager step's tokens, step after
step, for the presets and the hot chains, across history-width buckets; a failing replay still names the request and
changes nothing; generate() uses it where it can and says why not. Without a GPU a `ReplayGraph` replays the
recorded aten ops on CPU tensors as a CUDA graph replays its kernels (the cuda backend's step on CPU tensors, the
torch ops path); the `gpu` test captures real CUDA graphs."""

from __future__ import annotations

import warnings

import pytest
import torch

import samplechain_cuda as cuda
from samplechain import Chain, ConfigError, MixedChains, SamplingError
from samplechain.engine import graphs
from samplechain.errors import GenerationWarning
from samplechain.tools.testing import ReplayGraph

VOCAB = 2000
CHAINS = {
    "llama.cpp": "preset:llama.cpp",
    "transformers": "preset:transformers",
    "vllm": "preset:vllm",
    "text-generation-webui": "preset:text-generation-webui",
    "penalties top_k top_p": {
        "samplers": [
            {"use": "penalties", "repeat": 1.3, "presence": 0.4, "last_n": 8, "scope": "llama.cpp"},
            {"use": "temperature", "t": 0.8},
            {"use": "top_k", "k": 40},
            {"use": "top_p", "p": 0.9},
            {"use": "dist", "seed": 3},
        ]
    },
    "min_p": {"samplers": [{"use": "min_p", "p": 0.05}, {"use": "dist", "seed": 4}]},
    "top_p flat": {"samplers": [{"use": "top_p", "p": 0.95}, {"use": "dist", "seed": 5}]},
    "logit_bias greedy": {"samplers": [{"use": "logit_bias", "bias": {"5": 30.0}}, {"use": "greedy"}]},
}
PER_ROW = [{"temperature": 0.7, "top_k": 20}, {"temperature": 1.2}, {"top_p": 0.5}, {}, {"temperature": 0.0}, {}]


def _chain(config) -> Chain:
    chain = Chain.load(config)
    chain._backends["cpu"] = cuda.CudaBackend(device="cpu")  # the sync-free step on CPU tensors
    return chain


def _store(chain: Chain, per_row: bool):
    store = chain.new_store(capacity=len(PER_ROW))
    ids = [f"r{i}" for i in range(len(PER_ROW))]
    for i, rid in enumerate(ids):
        params = {k: v for k, v in PER_ROW[i].items() if k in store.layout.aliases} if per_row else {}
        store.add(rid, {**params, "seed": 100 + i} if "seed" in store.layout.aliases else params)
    return store, ids


def _steps(config, *, graphed: bool, per_row: bool, steps: int = 6, prompt: int = 5):
    """Tokens and logprobs of `steps` steps (the first eager, as generate() does), each with the history so far."""
    chain = _chain(config)
    store, ids = _store(chain, per_row)
    step_graphs = graphs.StepGraphs(chain, store, ids, make_graph=ReplayGraph) if graphed else None
    g = torch.Generator().manual_seed(9)
    history = torch.randint(0, VOCAB, (len(ids), prompt), generator=g)
    lengths = torch.full((len(ids),), prompt)
    out = []
    for step in range(steps):
        logits = torch.randn(len(ids), VOCAB, generator=g) * 3
        logits[1] = logits[1].bfloat16().float()  # ties at the cuts
        kwargs = {"history": history, "prompt_lengths": lengths} if chain.needs_history else {}
        if step_graphs is not None and step:
            result = step_graphs.sample(logits, **kwargs).check()
        else:
            result = chain.sample(logits, store, ids, **kwargs).check()
        out.append((result.token_ids.clone(), result.logprobs.clone()))
        history = torch.cat([history, result.token_ids[:, None]], dim=1)
    return out, store


@pytest.mark.parametrize("per_row", [False, True], ids=["shared", "per-row"])
@pytest.mark.parametrize("name", list(CHAINS))
def test_replays_draw_the_eager_steps_tokens(name, per_row, monkeypatch):
    monkeypatch.setattr(graphs, "HISTORY_BUCKET", 8)  # a new width bucket (a new recording) within the steps
    want, eager_store = _steps(CHAINS[name], graphed=False, per_row=per_row)
    got, graphed_store = _steps(CHAINS[name], graphed=True, per_row=per_row)
    for step, ((tokens, logprobs), (ref_tokens, ref_logprobs)) in enumerate(zip(got, want)):
        assert torch.equal(tokens, ref_tokens), (name, step, tokens, ref_tokens)
        assert torch.equal(logprobs, ref_logprobs), (name, step)
    assert eager_store.snapshot() == graphed_store.snapshot()  # positions and sampler state advanced alike


def test_a_graph_is_recorded_once_per_bucket(monkeypatch):
    monkeypatch.setattr(graphs, "HISTORY_BUCKET", 4)
    chain = _chain(CHAINS["penalties top_k top_p"])
    store, ids = _store(chain, False)
    recorded = []

    class Counting(ReplayGraph):
        def capture(self, step):
            recorded.append(1)
            return super().capture(step)

    step_graphs = graphs.StepGraphs(chain, store, ids, make_graph=Counting)
    history = torch.zeros(len(ids), 3, dtype=torch.int64)
    for width in range(3, 11):  # widths 3-4, 5-8, 9-10 (rounded up to 4, 8, 12)
        step_graphs.sample(
            torch.randn(len(ids), VOCAB),
            history=history[:, :1].expand(-1, width).contiguous(),
            prompt_lengths=torch.full((len(ids),), 3),
        ).check()
    assert len(recorded) == 3


def test_a_failing_replay_names_the_request_and_changes_nothing():
    chain = _chain(CHAINS["min_p"])
    store, ids = _store(chain, False)
    step_graphs = graphs.StepGraphs(chain, store, ids, make_graph=ReplayGraph)
    step_graphs.sample(torch.randn(len(ids), VOCAB)).check()  # recorded
    before = store.snapshot()
    bad = torch.randn(len(ids), VOCAB)
    bad[2, 7] = float("nan")
    with pytest.raises(SamplingError, match=r"'r2'.*NaN"):
        step_graphs.sample(bad).check()
    assert store.snapshot() == before
    step_graphs.sample(torch.randn(len(ids), VOCAB)).check()  # and the graph goes on
    assert [row["position"] for row in store.snapshot().values()] == [p["position"] + 1 for p in before.values()]


def test_history_needs_prompt_lengths():
    chain = _chain(CHAINS["penalties top_k top_p"])
    store, ids = _store(chain, False)
    with pytest.raises(ConfigError, match="prompt_lengths"):
        graphs.StepGraphs(chain, store, ids, make_graph=ReplayGraph).sample(
            torch.randn(len(ids), VOCAB), history=torch.zeros(len(ids), 3, dtype=torch.int64)
        )


def test_why_a_step_cannot_be_captured(monkeypatch):
    cuda_device = torch.device("cuda")

    def reason(config, **kw):
        chain = Chain.load(config)
        chain._backends["cuda"] = cuda.CudaBackend(device="cpu")  # a sync-free backend for the device type
        store, ids = _store(chain, False)
        return graphs.graphs_unavailable_reason(chain, cuda_device, store, ids)

    monkeypatch.delenv(graphs.ENV_GRAPHS, raising=False)
    for name in ("llama.cpp", "transformers", "vllm", "text-generation-webui"):  # host-bound entries are no-ops
        assert reason(CHAINS[name]) == "", name
    assert "mirostat.v1" in reason({"samplers": [{"use": "mirostat", "tau": 5.0}]})
    assert "on cpu" in graphs.graphs_unavailable_reason(_chain(CHAINS["min_p"]), torch.device("cpu"))
    mixed = MixedChains({"a": Chain.load(CHAINS["min_p"])})
    assert "MixedChains" in graphs.graphs_unavailable_reason(mixed, cuda_device)
    monkeypatch.setenv(graphs.ENV_GRAPHS, "0")
    assert reason(CHAINS["min_p"]) == "SAMPLECHAIN_CUDA_GRAPHS=0"
    monkeypatch.setenv(graphs.ENV_GRAPHS, "perhaps")
    with pytest.raises(ConfigError, match=r"SAMPLECHAIN_CUDA_GRAPHS='perhaps': expected 1 .* or 0"):
        reason(CHAINS["min_p"])


@pytest.fixture
def tiny_model():
    from samplechain.tools.testing import byte_bpe_tokenizer, tiny_gpt2

    return tiny_gpt2(), byte_bpe_tokenizer()


def _generate(model, tokenizer, **kwargs):
    from samplechain.generation import generate

    chain = _chain(
        {
            "samplers": [
                {"use": "penalties", "repeat": 1.2},
                {"use": "top_k", "k": 20},
                {"use": "top_p", "p": 0.9},
                {"use": "dist", "seed": 7},
            ]
        }
    )
    return generate(model, tokenizer, ["hello there", "a b"], chain=chain, max_new_tokens=12, pad_token_id=0, **kwargs)


def test_generate_replays_the_step_where_it_can(tiny_model, monkeypatch):
    """generate() records the step after its first (eager) one and replays it: the same tokens as eager; a capture
    that fails falls back to the eager step with a warning; cuda_graphs=True says why it cannot."""
    model, tokenizer = tiny_model
    eager = _generate(model, tokenizer)
    made = []
    monkeypatch.setattr(graphs, "graphs_unavailable_reason", lambda *a: "")  # as on a CUDA device
    monkeypatch.setattr(graphs, "CudaGraph", lambda: made.append(ReplayGraph()) or made[-1])
    replayed = _generate(model, tokenizer)
    assert made and all(graph.ops for graph in made)
    assert torch.equal(replayed.sequences, eager.sequences) and torch.equal(replayed.logprobs, eager.logprobs)

    def refuse(self, step):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(ReplayGraph, "capture", refuse)
    with pytest.warns(GenerationWarning, match="could not be captured in a CUDA graph .*operation not permitted"):
        fallback = _generate(model, tokenizer)
    assert torch.equal(fallback.sequences, eager.sequences)


def test_generate_says_why_the_step_is_not_captured(tiny_model):
    model, tokenizer = tiny_model
    with pytest.warns(
        GenerationWarning, match="cuda_graphs=True, but the sampling step runs eagerly: CUDA graphs need a CUDA device"
    ):
        _generate(model, tokenizer, cuda_graphs=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", GenerationWarning)
        _generate(model, tokenizer, cuda_graphs=False)
        _generate(model, tokenizer)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", list(CHAINS))
def test_gpu_cuda_graph_replays_draw_the_eager_tokens(name):
    """Real CUDA graphs: capture, then replays equal to the eager steps on the same device."""

    def run(graphed: bool):
        chain = Chain.load(CHAINS[name])
        store = chain.new_store(device="cuda", capacity=len(PER_ROW))
        ids = [f"r{i}" for i in range(len(PER_ROW))]
        for i, rid in enumerate(ids):
            store.add(rid, {"seed": 100 + i} if "seed" in store.layout.aliases else {})
        step_graphs = graphs.StepGraphs(chain, store, ids) if graphed else None
        g = torch.Generator().manual_seed(9)
        history = torch.randint(0, 32000, (len(ids), 5), generator=g).cuda()
        lengths = torch.full((len(ids),), 5, device="cuda")
        out = []
        for step in range(5):
            logits = (torch.randn(len(ids), 32000, generator=g) * 3).cuda()
            kwargs = {"history": history, "prompt_lengths": lengths} if chain.needs_history else {}
            result = (
                step_graphs.sample(logits, **kwargs)
                if step_graphs is not None and step
                else chain.sample(logits, store, ids, **kwargs)
            ).check()
            out.append(result.token_ids.cpu())
            history = torch.cat([history, result.token_ids[:, None]], dim=1)
        return out

    for step, (got, want) in enumerate(zip(run(True), run(False))):
        assert torch.equal(got, want), (name, step)
