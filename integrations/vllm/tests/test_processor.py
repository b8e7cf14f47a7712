"""The processor against vLLM's own BatchUpdate objects, without a server: requests added, removed and moved map
onto the chain stores; each row's token is the chain's (same seeds, positions and history as a direct
Chain.sample); a discarded sample does not move a request's position; a failing row is ended alone."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm", reason="needs vLLM: run `make test-vllm`")

from transformers import AutoConfig  # noqa: E402
from vllm import SamplingParams  # noqa: E402
from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality  # noqa: E402

from samplechain import Chain  # noqa: E402
from samplechain.models import tiny_model_path  # noqa: E402
from samplechain_vllm import RequestSpecError, SamplechainLogitsProcessor, parse_request  # noqa: E402

from processors import make_processor  # noqa: E402

pytestmark = pytest.mark.vllm
V = 4096


def params(xargs: dict | None, seed: int | None = None) -> SamplingParams:
    return SamplingParams(seed=seed, extra_args=xargs, max_tokens=8)


def update(batch_size: int, removed=(), added=(), moved=()) -> BatchUpdate:
    return BatchUpdate(batch_size=batch_size, removed=list(removed), added=list(added), moved=list(moved))


class Reference:
    """The same requests driven through Chain.sample directly, one row at a time."""

    def __init__(self, chain: str, seed: int | None, prompt: list[int]) -> None:
        self.chain = Chain.load(chain)
        self.chain.prepare(
            tokenizer=make_processor()._load_tokenizer(),
            model_config=AutoConfig.from_pretrained(tiny_model_path()),
            vocab_size=V,
        )
        self.store = self.chain.new_store()
        self.store.add("r", {"seed": seed} if seed is not None else {})
        self.prompt = prompt

    def step(self, logits: torch.Tensor, output: list[int]) -> int:
        hist = torch.tensor([self.prompt + output])
        kwargs = (
            {"history": hist, "prompt_lengths": torch.tensor([len(self.prompt)])} if self.chain.needs_history else {}
        )
        return int(self.chain.sample(logits[None].clone(), self.store, ["r"], **kwargs).token_ids[0])


def test_rows_follow_their_requests_through_add_move_remove() -> None:
    proc = make_processor()
    assert proc.is_argmax_invariant() is False
    prompts = [[5, 6, 7], [8, 9], [10], [11, 12]]
    outputs: list[list[int]] = [[], [], [], []]
    chains = [("preset:llama.cpp", 11), ("preset:greedy", None), (None, None), ("preset:llama.cpp", 12)]
    xargs = [{"samplechain": "llama.cpp"}, {"samplechain": "greedy"}, None, {"samplechain": "llama.cpp"}]
    refs = {k: Reference(c, s, prompts[k]) for k, (c, s) in enumerate(chains) if c is not None}
    proc.update_state(update(4, added=[(k, params(xargs[k], chains[k][1]), prompts[k], outputs[k]) for k in range(4)]))
    where = {0: 0, 1: 1, 2: 2, 3: 3}  # request -> batch row
    gen = torch.Generator().manual_seed(0)
    for step in range(6):
        if step == 2:  # request 1 finishes: vLLM removes it and condenses the batch (3 moves to 1)
            proc.update_state(update(3, removed=[1], moved=[(3, 1, MoveDirectionality.UNIDIRECTIONAL)]))
            del where[1]
            where[3] = 1
        if step == 4:  # a swap
            proc.update_state(update(3, moved=[(0, 2, MoveDirectionality.SWAP)]))
            where[0], where[2] = 2, 0
        rows = len(where)
        logits = torch.randn(rows, V, generator=gen) * 3
        raw = logits.clone()
        out = proc.apply(logits)
        for k, b in where.items():
            if k in refs:
                want = refs[k].step(raw[b], outputs[k])
                finite = torch.isfinite(out[b]).nonzero().flatten().tolist()
                assert finite == [want], f"step {step}: request {k} at row {b}"
                outputs[k].append(want)  # vLLM appends the sampled token to the live output list
            else:
                assert torch.equal(out[b], raw[b]), "a request without samplechain is left alone"
                outputs[k].append(int(raw[b].argmax()))


def test_the_frontend_hands_the_seed_to_the_chain() -> None:
    """validate_params moves SamplingParams.seed into extra_args (vLLM's own sample after the chain's needs no
    per-request generator then): the chain draws the tokens of the seed, the same as before the hand-over; a second
    validation (LLM.generate reuses params) changes nothing; n > 1 (vLLM seeds choice i with seed + i afterwards)
    and requests without samplechain keep their seed; a second, different seed is refused."""
    handed = params({"samplechain": "llama.cpp"}, 7)
    SamplechainLogitsProcessor.validate_params(handed)
    assert handed.seed is None and handed.extra_args == {"samplechain": "llama.cpp", "samplechain.vllm_seed": 7}
    SamplechainLogitsProcessor.validate_params(handed)
    assert handed.seed is None and handed.extra_args == {"samplechain": "llama.cpp", "samplechain.vllm_seed": 7}
    proc = make_processor()
    output: list[int] = []
    proc.update_state(update(1, added=[(0, handed, [5, 6], output)]))
    ref = Reference("preset:llama.cpp", 7, [5, 6])
    gen = torch.Generator().manual_seed(8)
    for _ in range(4):
        logits = torch.randn(1, V, generator=gen) * 3
        want = ref.step(logits[0], output)
        assert proc.apply(logits.clone()).isfinite().nonzero()[0, 1].item() == want
        output.append(want)
    greedy = params({"samplechain": "greedy"}, 3)  # a chain without a seed: handed over and ignored
    SamplechainLogitsProcessor.validate_params(greedy)
    assert greedy.seed is None
    many = SamplingParams(n=2, seed=7, extra_args={"samplechain": "llama.cpp"}, max_tokens=8)
    plain = params(None, 7)
    for kept in (many, plain):
        SamplechainLogitsProcessor.validate_params(kept)
        assert kept.seed == 7 and "samplechain.vllm_seed" not in (kept.extra_args or {})
    with pytest.raises(ValueError, match="two seeds"):
        SamplechainLogitsProcessor.validate_params(params({"samplechain": "llama.cpp", "samplechain.vllm_seed": 7}, 8))


def test_a_discarded_sample_does_not_move_the_position() -> None:
    proc = make_processor()
    output: list[int] = []
    proc.update_state(update(1, added=[(0, params({"samplechain": "llama.cpp"}, 3), [5, 6], output)]))
    logits = torch.randn(1, V, generator=torch.Generator().manual_seed(1)) * 3
    first = proc.apply(logits.clone()).isfinite().nonzero()[0, 1].item()
    again = proc.apply(logits.clone()).isfinite().nonzero()[0, 1].item()  # output did not grow: same draw
    assert first == again
    output.append(first)
    other = Reference("preset:llama.cpp", 3, [5, 6])
    other.step(logits[0], [])
    logits2 = torch.randn(1, V, generator=torch.Generator().manual_seed(2)) * 3
    got = proc.apply(logits2.clone()).isfinite().nonzero()[0, 1].item()
    assert got == other.step(logits2[0], [first])


def test_a_resumed_request_continues_at_its_position() -> None:
    ref = Reference("preset:llama.cpp", 9, [1, 2])
    gen = torch.Generator().manual_seed(3)
    steps = [torch.randn(V, generator=gen) * 3 for _ in range(3)]
    output: list[int] = []
    for logits in steps[:2]:
        output.append(ref.step(logits, output))
    proc = make_processor()  # preempted and re-added with 2 tokens generated
    proc.update_state(update(1, added=[(0, params({"samplechain": "llama.cpp"}, 9), [1, 2], output)]))
    got = proc.apply(steps[2][None].clone()).isfinite().nonzero()[0, 1].item()
    assert got == ref.step(steps[2], output)


def test_a_failing_row_is_ended_alone() -> None:
    proc = make_processor()
    proc.update_state(
        update(
            2,
            added=[
                (0, params({"samplechain": "llama.cpp"}, 1), [5], []),
                (1, params({"samplechain": "llama.cpp"}, 2), [6], []),
            ],
        )
    )
    logits = torch.randn(2, V, generator=torch.Generator().manual_seed(4))
    logits[1] = float("-inf")  # nothing left to choose for request 1 (vLLM's bad_words / allowed ids could do it)
    out = proc.apply(logits)
    assert torch.isfinite(out[0]).sum() == 1
    assert torch.isfinite(out[1]).nonzero().flatten().tolist() == [0]  # eos: vLLM finishes the request
    out = proc.apply(torch.randn(2, V))  # the next step: still ended, the other row still sampled
    assert torch.isfinite(out[1]).nonzero().flatten().tolist() == [0]
    assert torch.isfinite(out[0]).sum() == 1


@pytest.mark.parametrize(
    "xargs, words",
    [
        ({"samplechain": "no-such"}, ["no such preset"]),
        ({"samplechain": "llama.cpp", "samplechain.min_p": -1}, ["min_p"]),
        ({"samplechain": "x.toml"}, ["refused"]),
        ({"samplechain": {"preset": "greedy", "chain": "greedy"}}, ["either preset or chain"]),
        ({"samplechain.top_k": 3}, ["no chain named"]),
        ({"samplechain": "greedy", "samplechain.seed": 3}, ["unknown parameter", "seed"]),
        ({"samplechain": "llama.cpp", "samplechain.vllm_seed": "7"}, ["samplechain.vllm_seed", "integer"]),
    ],
)
def test_validate_params_names_the_problem(xargs, words) -> None:
    with pytest.raises(ValueError) as info:
        SamplechainLogitsProcessor.validate_params(params(xargs))
    for word in words:
        assert word in str(info.value)


def test_request_forms(tmp_path, monkeypatch) -> None:
    assert parse_request(None) is None
    assert parse_request({"samplechain": "off"}) is None
    spec = parse_request({"samplechain": {"preset": "llama.cpp", "params": {"top_k": 3}}}, seed=5)
    assert (spec.chain.key, dict(spec.params), spec.seed) == ("preset:llama.cpp", {"top_k": 3}, 5)
    flat = parse_request({"samplechain": "preset:llama.cpp", "samplechain.top_k": 3})
    assert flat.chain == spec.chain and dict(flat.params) == {"top_k": 3}
    (tmp_path / "mine.toml").write_text('[chain]\nsamplers = [{ use = "greedy" }]\n')
    monkeypatch.setenv("SAMPLECHAIN_VLLM_CHAIN_DIR", str(tmp_path))
    assert parse_request({"samplechain": "mine.toml"}).chain.source == tmp_path / "mine.toml"
    with pytest.raises(RequestSpecError, match="outside"):
        parse_request({"samplechain": "../etc/x.toml"})
    monkeypatch.setenv("SAMPLECHAIN_VLLM_CHAIN", "preset:greedy")
    assert parse_request(None).chain.key == "preset:greedy"  # the server default covers plain requests
    assert parse_request({"samplechain": "off"}) is None
    SamplechainLogitsProcessor.validate_params(params({"samplechain": "mine.toml"}))


def test_a_bad_value_past_the_frontend_ends_that_request_alone() -> None:
    """A joining request is checked by its group's store (no trial store of its own, as the frontend's validation
    has): a value the frontend would refuse, given to the engine directly, ends that request alone, with the
    parameter named in the log, and the group's other requests go on."""
    proc = make_processor()
    proc.update_state(
        update(
            3,
            added=[
                (0, params({"samplechain": "llama.cpp"}, 1), [5], []),
                (1, params({"samplechain": "llama.cpp", "samplechain.min_p": -1}, 2), [6], []),
                (2, params({"samplechain": "llama.cpp"}, 3), [7], []),
            ],
        )
    )
    assert proc._rows[1].failed is not None and "min_p" in proc._rows[1].failed
    out = proc.apply(torch.randn(3, V))
    assert torch.isfinite(out[1]).nonzero().flatten().tolist() == [0]  # ended with eos
    assert int(torch.isfinite(out[0]).sum()) == int(torch.isfinite(out[2]).sum()) == 1
    assert proc._groups["preset:llama.cpp"].store.batch([proc._rows[0].rid, proc._rows[2].rid]) is not None


def test_a_request_that_cannot_join_is_ended_and_the_engine_goes_on(monkeypatch) -> None:
    proc = make_processor()

    def broken(chain) -> None:
        raise RuntimeError("prepare exploded")

    monkeypatch.setattr(proc, "_prepare", broken)  # update_state must not raise: vLLM would stop the engine
    proc.update_state(
        update(2, added=[(0, params({"samplechain": "llama.cpp"}, 1), [5], []), (1, params(None), [6], [])])
    )
    logits = torch.randn(2, V)
    raw = logits.clone()
    out = proc.apply(logits)
    assert torch.isfinite(out[0]).nonzero().flatten().tolist() == [0]  # ended with eos
    assert torch.equal(out[1], raw[1])  # the plain request is untouched
    proc.update_state(update(1, removed=[0], moved=[(1, 0, MoveDirectionality.UNIDIRECTIONAL)]))
    assert torch.equal(proc.apply(raw[1:].clone()), raw[1:])


def test_the_history_is_built_only_for_steps_that_read_it(monkeypatch) -> None:
    """The llama.cpp preset's penalties and DRY are no-ops at their defaults: its steps build no history
    (Chain.reads_history). A request in the same group that sets a repeat penalty makes the group's steps read it,
    and each row's token is still the one a direct Chain.sample with the history gives."""
    import samplechain_vllm.processor as module

    built = []
    real = module._history
    monkeypatch.setattr(module, "_history", lambda rows, device: built.append(len(rows)) or real(rows, device))
    proc = make_processor()
    outputs: list[list[int]] = [[], []]
    proc.update_state(update(1, added=[(0, params({"samplechain": "llama.cpp"}, 1), [5, 6], outputs[0])]))
    gen = torch.Generator().manual_seed(3)
    for _ in range(2):
        out = proc.apply(torch.randn(1, V, generator=gen) * 3)
        outputs[0].append(int(torch.isfinite(out[0]).nonzero()[0, 0]))
    assert built == []
    penalised = Reference("preset:llama.cpp", 2, [7, 8, 9])
    penalised.store.remove("r")
    penalised.store.add("r", {"seed": 2, "repeat_penalty": 1.5})
    proc.update_state(
        update(
            2,
            added=[
                (1, params({"samplechain": "llama.cpp", "samplechain.repeat_penalty": 1.5}, 2), [7, 8, 9], outputs[1])
            ],
        )
    )
    for step in range(3):
        logits = torch.randn(2, V, generator=gen) * 3
        raw = logits.clone()
        out = proc.apply(logits)
        want = penalised.step(raw[1], outputs[1])
        assert torch.isfinite(out[1]).nonzero().flatten().tolist() == [want], step
        for k in range(2):
            outputs[k].append(int(torch.isfinite(out[k]).nonzero()[0, 0]))
    assert built == [2, 2, 2]


def test_the_kept_history_follows_vllms_output_lists() -> None:
    """_history keeps each row's ids from step to step: the same (B, L) tensor as rebuilding it from the prompt and
    vLLM's output list, through one token a step, several at once (speculative tokens), async scheduling's -1
    placeholders, growth past the buffer, and an output list vLLM replaced (a resumed request)."""
    from samplechain_vllm.processor import _generated, _history, _Row

    def rebuilt(rows: list[_Row]) -> torch.Tensor:
        seqs = [row.prompt + row.output[: _generated(row.output)] for row in rows]
        width = max(len(s) for s in seqs)
        return torch.tensor([[-1] * (width - len(s)) + s for s in seqs])

    rows = [_Row("a", None, [5, 6, 7], []), _Row("b", None, list(range(40)), [1]), _Row("c", None, [9], [2, 3])]
    edits = [
        lambda o: o.append(4),
        lambda o: o.extend([8, 8, 8]),
        lambda o: o.extend([6, -1]),
        lambda o: o.__setitem__(slice(-1, None), [7]),
        lambda o: o.extend(range(100)),
        lambda o: o.__setitem__(slice(None), [3, 1]),
        lambda o: o.__setitem__(slice(None), []),
    ]
    for step in range(12):
        for i, row in enumerate(rows):
            edits[(step + i) % len(edits)](row.output)
        got = _history(rows, torch.device("cpu"))
        assert torch.equal(got["history"], rebuilt(rows)), step
        assert got["prompt_lengths"].tolist() == [3, 40, 1]
