"""Continuous-batching soak: 1,000 requests with random chains and parameters join and leave a running batch over
10,000 steps. Every request's tokens equal the tokens it gets alone, and the stores stay as large as the most
requests ever in flight at once, not as large as all the requests ever seen (a removed request leaves nothing)."""

from __future__ import annotations

import random

import attrs
import pytest
import torch

from samplechain import Chain, MixedChains, RequestStore

V = 64
REQUESTS, STEPS = 1000, 10_000
LENGTHS = (4, 56)  # tokens per request, uniform: about 30k request-steps in all
BURSTS = 25  # half of the requests arrive in bursts, so that 20-30 run at once at times

CHAINS = {
    "llama.cpp": "preset:llama.cpp",
    "mirostat": {"samplers": [{"use": "temperature", "t": 1.0}, {"use": "mirostat", "m": 20}]},
    "mirostat_v2": {"samplers": [{"use": "temperature", "t": 0.9}, {"use": "mirostat_v2"}]},
    "adaptive_p": {
        "samplers": [
            {"use": "penalties", "repeat": 1.2, "last_n": 8},
            {"use": "min_p", "p": 0.02},
            {"use": "adaptive_p", "target": 0.4},
        ]
    },
    "dry": {
        "samplers": [
            {"use": "dry", "multiplier": 0.8, "allowed_length": 1, "breakers": [], "breaker_ids": [[0]]},
            {"use": "top_p", "p": 0.9},
            {"use": "temperature", "t": 0.8},
            {"use": "dist"},
        ]
    },
}


def random_params(chain: str, rng: random.Random) -> dict:
    """Per-request parameters; a fifth of the requests leave the seed to the store (a fresh one is drawn)."""
    p: dict = {} if rng.random() < 0.2 else {"seed": rng.randrange(2**31)}
    if chain == "llama.cpp":
        p.update(
            temperature=rng.uniform(0.3, 1.5),
            top_k=rng.choice([0, 5, 20, 40]),
            top_p=rng.uniform(0.5, 1.0),
            min_p=rng.uniform(0.0, 0.2),
            repeat_penalty=rng.uniform(1.0, 1.5),
        )
    elif chain in ("mirostat", "mirostat_v2"):
        p.update(mirostat_tau=rng.uniform(1.0, 6.0), mirostat_eta=rng.uniform(0.05, 0.5))
    elif chain == "adaptive_p":
        p.update(adaptive_target=rng.uniform(0.05, 0.9), adaptive_decay=rng.uniform(0.5, 0.95))
    else:
        p.update(temperature=rng.uniform(0.5, 1.2), dry_multiplier=rng.uniform(0.0, 2.0))
    return p


@attrs.define
class Request:
    rid: str
    chain: str
    start: int
    length: int
    prompt: list[int]
    snapshot: dict = attrs.field(factory=dict)  # the store's row at join time: parameters and drawn seeds
    tokens: list[int] = attrs.field(factory=list)

    def logits(self) -> torch.Tensor:
        """(length, V): this request's logits at each of its steps, whoever else shares the batch."""
        g = torch.Generator().manual_seed(int(self.rid[1:]))
        return torch.randn(self.length, V, generator=g) * 2.5


def plan(seed: int = 0) -> list[Request]:
    rng = random.Random(seed)
    bursts = [rng.randrange(STEPS - 200) for _ in range(BURSTS)]
    out = []
    for i in range(REQUESTS):
        length = rng.randint(*LENGTHS)
        if i % 2:
            start = rng.randrange(STEPS - length)
        else:
            start = min(rng.choice(bursts) + rng.randrange(30), STEPS - length)
        out.append(
            Request(
                f"r{i}", rng.choice(list(CHAINS)), start, length, [rng.randrange(V) for _ in range(rng.randint(1, 6))]
            )
        )
    return out


def history_of(rows: list[list[int]], prompts: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens so far of each row, left-padded with -1, as the generation loop passes them."""
    width = max(map(len, rows))
    return torch.tensor([[-1] * (width - len(r)) + r for r in rows]), torch.tensor(prompts)


def capacity(store: RequestStore) -> int:
    """Rows every column of the store holds (all columns are kept at one capacity)."""
    sizes = {t.shape[0] for t in (*store._params.values(), *store._state.values(), store._positions)}
    assert len(sizes) == 1, sizes
    return sizes.pop()


@pytest.fixture
def one_thread():
    """Tiny tensors: worker threads only add overhead (and on shared cores, waiting)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.slow
def test_a_thousand_requests_joining_and_leaving_equal_each_alone(one_thread):
    chains = {k: Chain.load(c) for k, c in CHAINS.items()}
    for c in chains.values():
        c.prepare(vocab_size=V, eos_token_ids=[0])
    mixed = MixedChains(chains)
    store = mixed.new_store(capacity=1)
    rng = random.Random(1)
    requests = plan()
    arrivals: dict[int, list[Request]] = {}
    for r in requests:
        arrivals.setdefault(r.start, []).append(r)
    active: list[Request] = []
    peak = dict.fromkeys(chains, 0)  # the most requests in flight at once, per chain and in all
    most = 0
    logits_of: dict[str, torch.Tensor] = {}

    for step in range(STEPS):
        for r in arrivals.get(step, []):  # join
            store.add(r.rid, random_params(r.chain, rng), chain=r.chain)
            r.snapshot = store.stores[r.chain].snapshot([r.rid])
            logits_of[r.rid] = r.logits()
            active.append(r)
        if not active:
            continue
        rng.shuffle(active)  # rows change places from step to step
        most = max(most, len(active))
        for key in chains:
            peak[key] = max(peak[key], sum(r.chain == key for r in active))
        logits = torch.stack([logits_of[r.rid][len(r.tokens)] for r in active])
        history, lengths = history_of([r.prompt + r.tokens for r in active], [len(r.prompt) for r in active])
        out = mixed.sample(logits, store, [r.rid for r in active], history=history, prompt_lengths=lengths)
        for r, t in zip(active, out.token_ids.tolist()):
            r.tokens.append(t)
        for r in [r for r in active if len(r.tokens) == r.length]:  # leave
            store.remove(r.rid)
            del logits_of[r.rid]
            active.remove(r)
        if step % 1000 == 0:
            assert len(store) == len(active)

    # memory: each store is as large as its own peak of requests in flight (capacity doubles from 1), and empty
    assert not active and len(store) == 0 and not store.route
    assert most >= 20, most  # the bursts did fill the batch
    for key, sub in store.stores.items():
        assert len(sub) == 0 and not sub.request_ids
        assert capacity(sub) < 2 * max(peak[key], 1), (key, capacity(sub), peak[key])
        assert capacity(sub) < sum(r.chain == key for r in requests) // 4
        for name, (_dtype, _shape, init) in sub.layout.state.items():  # freed slots hold nothing of their requests
            assert bool((sub._state[name] == init).all()), (key, name)

    # every request alone: a store of its own, restored from its row at join time, one row per call
    for r in requests:
        chain = chains[r.chain]
        alone = chain.new_store(capacity=1)
        alone.restore(r.snapshot)
        logits, tokens = r.logits(), list(r.prompt)
        prompt = torch.tensor([len(r.prompt)])
        for i in range(r.length):
            extra = {"history": torch.tensor([tokens]), "prompt_lengths": prompt} if chain.needs_history else {}
            tokens.append(int(chain.sample(logits[i : i + 1], alone, [r.rid], **extra).token_ids))
        assert tokens[len(r.prompt) :] == r.tokens, (r.rid, r.chain, r.snapshot)
