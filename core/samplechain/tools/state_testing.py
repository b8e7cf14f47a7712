"""Shared tests of a sampler that keeps per-request state (a `state_spec`): mirostat's mu, adaptive_p's moving
average, or a third party's. Subclass `StatefulSamplerTests` in the plugin's test module under a name pytest
collects:

    from samplechain.tools.state_testing import StatefulSamplerTests

    class TestMirostatState(StatefulSamplerTests):
        sampler = {"use": "mirostat", "tau": 2.0, "eta": 0.2}
        request_params = [{"mirostat_tau": 1.0 + i} for i in range(5)]  # one request per entry
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import torch

from ..engine.chain import Chain
from ..engine.store import RequestStore

__all__ = ["StatefulSamplerTests"]


class StatefulSamplerTests:
    """A seeded request draws the same tokens and ends in the same state alone, in a batch and at any row, each
    request with its own parameters; its state survives `snapshot()` / `restore()` through JSON and goes on to the
    same tokens; requests join and leave a batch without disturbing another's tokens or state. Every test also
    checks that the state moved, so a sampler whose state never changes cannot pass them by accident.

    Set `sampler` (the chain entry), and optionally `request_params` (per-request parameters, one request each, at
    least two), `scale` (of the random logits) and `steps`.
    """

    sampler: ClassVar[Mapping[str, Any]]
    request_params: ClassVar[Sequence[Mapping[str, Any]]] = ({}, {}, {}, {}, {})
    scale: ClassVar[float] = 2.5
    steps: ClassVar[int] = 6
    vocab: ClassVar[int] = 300

    # ------------------------------------------------------------- helpers
    def chain(self) -> Chain:
        return Chain.load({"samplers": [dict(self.sampler)]})

    def logits(self, seed: int, *shape: int) -> torch.Tensor:
        return torch.randn(*shape, self.vocab, generator=torch.Generator().manual_seed(seed)) * self.scale

    @staticmethod
    def state_of(store: RequestStore, rid: str) -> dict[str, Any]:
        """A request's position and sampler state, as plain data."""
        row = store.snapshot([rid])[rid]
        return {"position": row["position"], "state": row["state"]}

    def assert_moved(self, chain: Chain, state: Mapping[str, Any], params: Mapping[str, Any]) -> None:
        """`state` (a `state_of`) differs from that of a new request with `params`."""
        fresh = chain.new_store()
        fresh.add("fresh", dict(params))
        assert state["state"] != self.state_of(fresh, "fresh")["state"], (
            f"{self.sampler['use']}: the state never moved from its start, so these tests check nothing"
        )

    @staticmethod
    def draw(chain: Chain, logits: torch.Tensor, store: RequestStore, ids: Sequence[str]) -> list[int]:
        return chain.sample(logits, store, list(ids)).token_ids.tolist()

    # ------------------------------------------------------------- tests
    def test_same_tokens_and_state_alone_and_in_any_batch(self) -> None:
        chain = self.chain()
        n = len(self.request_params)
        logits = self.logits(0, n, self.steps)  # (request, step, vocab)

        def run(order: list[int]) -> dict[int, tuple[list[int], dict[str, Any]]]:
            store = chain.new_store()
            for i in order:
                store.add(f"r{i}", {"seed": 1000 + i, **self.request_params[i]})
            ids = [f"r{i}" for i in order]
            steps = [self.draw(chain, logits[order, s], store, ids) for s in range(self.steps)]
            return {i: ([st[row] for st in steps], self.state_of(store, f"r{i}")) for row, i in enumerate(order)}

        together = run(list(range(n)))
        assert run([*range(1, n), 0]) == together  # every request at another row
        for i in range(n):
            assert run([i]) == {i: together[i]}
        self.assert_moved(chain, together[0][1], {"seed": 1000, **self.request_params[0]})

    def test_state_round_trips_through_snapshot_and_continues_identically(self) -> None:
        chain = self.chain()
        logits = self.logits(2, 2 * self.steps, 1)
        params = {"seed": 77, **self.request_params[0]}
        store = chain.new_store()
        store.add("a", params)
        for s in range(self.steps):
            self.draw(chain, logits[s], store, ["a"])
        self.assert_moved(chain, self.state_of(store, "a"), params)
        snap = json.loads(json.dumps(store.snapshot()))
        rest = [self.draw(chain, logits[s], store, ["a"]) for s in range(self.steps, 2 * self.steps)]
        restored = chain.new_store()
        restored.restore(snap)
        assert self.state_of(restored, "a") == {"position": snap["a"]["position"], "state": snap["a"]["state"]}
        assert [self.draw(chain, logits[s], restored, ["a"]) for s in range(self.steps, 2 * self.steps)] == rest
        assert self.state_of(restored, "a") == self.state_of(store, "a")

    def test_requests_join_and_leave_without_disturbing_others(self) -> None:
        chain = self.chain()
        logits = {rid: self.logits(3 + k, 8) for k, rid in enumerate("abc")}
        params = {
            rid: {"seed": 5 + k, **self.request_params[k % len(self.request_params)]} for k, rid in enumerate("abc")
        }
        alone = chain.new_store()
        alone.add("a", params["a"])
        expected = [self.draw(chain, logits["a"][s][None], alone, ["a"])[0] for s in range(8)]

        store = chain.new_store()
        store.add("a", params["a"])
        store.add("b", params["b"])
        got, step_of = [], dict.fromkeys("abc", 0)
        for s in range(8):
            if s == 3:
                store.add("c", params["c"])  # joins mid-way, perhaps in a freed slot
            if s == 5:
                store.remove("b")  # leaves; its slot is reset
            ids = [r for r in "abc" if r in store]
            tokens = self.draw(chain, torch.stack([logits[r][step_of[r]] for r in ids]), store, ids)
            for r in ids:
                step_of[r] += 1
            got.append(tokens[ids.index("a")])
        assert got == expected
        assert self.state_of(store, "a") == self.state_of(alone, "a")
        self.assert_moved(chain, self.state_of(alone, "a"), params["a"])
