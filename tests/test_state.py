"""The per-request store: requests join and leave a running batch without disturbing the others."""

from __future__ import annotations

import pytest
import torch

from samplechain import Chain, RequestError

CHAIN = {"samplers": [{"use": "top_k", "k": 20}, {"use": "temperature", "t": 0.9}, {"use": "dist"}]}


def run_alone(chain, logits_seq, params):
    store = chain.new_store()
    store.add("solo", params)
    return [int(chain.sample(row[None], store, ["solo"]).token_ids[0]) for row in logits_seq]


def test_requests_joining_and_leaving_keep_their_own_streams():
    chain = Chain.load(CHAIN)
    g = torch.Generator().manual_seed(1)
    steps = 12
    # each request sees its own logits stream, indexed by its own step
    streams = {rid: torch.randn(steps, 100, generator=g) * 2 for rid in "abcdef"}
    params = {rid: {"seed": 100 + i, "temperature": 0.5 + 0.1 * i} for i, rid in enumerate("abcdef")}
    schedule = {0: ["a", "b"], 3: ["c"], 5: ["d", "e"], 8: ["f"]}  # joins
    leaves = {4: ["a"], 7: ["c", "b"], 10: ["d"]}
    store = chain.new_store(capacity=2)  # forces the store to grow while running
    got: dict[str, list[int]] = {rid: [] for rid in streams}
    active: list[str] = []
    for t in range(steps):
        for rid in leaves.get(t, []):
            store.remove(rid)
            active.remove(rid)
        for rid in schedule.get(t, []):
            store.add(rid, params[rid])
            active.append(rid)
        batch = torch.stack([streams[rid][len(got[rid])] for rid in active])
        out = chain.sample(batch, store, active)
        for rid, tok in zip(active, out.token_ids.tolist()):
            got[rid].append(tok)
    for rid, toks in got.items():
        assert toks == run_alone(chain, streams[rid][: len(toks)], params[rid]), rid


def test_a_reused_slot_starts_fresh():
    chain = Chain.load(CHAIN)
    store = chain.new_store(capacity=1)
    store.add("old", {"seed": 1})
    for _ in range(3):
        chain.sample(torch.randn(1, 50), store, ["old"])
    store.remove("old")
    store.add("new", {"seed": 1})
    assert store.snapshot()["new"]["position"] == 0


def test_reset_rewinds_position_and_keeps_parameters():
    chain = Chain.load(CHAIN)
    store = chain.new_store()
    store.add("a", {"seed": 7, "temperature": 0.3})
    logits = torch.randn(1, 50)
    first = [int(chain.sample(logits, store, ["a"]).token_ids) for _ in range(4)]
    store.reset("a")
    again = [int(chain.sample(logits, store, ["a"]).token_ids) for _ in range(4)]
    assert first == again
    assert store.snapshot()["a"]["params"]["temperature.t"] == pytest.approx(0.3)


def test_clone_copies_parameters_position_and_rng():
    chain = Chain.load(CHAIN)
    store = chain.new_store()
    store.add("parent", {"seed": 11, "top_k": 5})
    logits = torch.randn(1, 50)
    for _ in range(3):
        chain.sample(logits, store, ["parent"])
    store.clone("parent", "child")
    a = chain.sample(torch.cat([logits, logits]), store, ["parent", "child"]).token_ids
    assert a[0] == a[1]
    snap = store.snapshot()
    assert snap["child"]["position"] == snap["parent"]["position"] == 4


def test_set_position_moves_only_the_rng_position():
    chain = Chain.load(CHAIN)
    logits = torch.randn(6, 1, 60)
    store = chain.new_store()
    store.add("r", {"seed": 5, "temperature": 0.8})
    first = [int(chain.sample(logits[i], store, ["r"]).token_ids) for i in range(6)]
    store.set_position("r", 2)  # as a serving engine replaying steps 2.. after a discarded sample
    assert store.snapshot()["r"]["position"] == 2
    assert [int(chain.sample(logits[i], store, ["r"]).token_ids) for i in range(2, 6)] == first[2:]
    assert store.snapshot()["r"]["params"]["temperature.t"] == pytest.approx(0.8)


@pytest.mark.parametrize("position", [-1, 1.5, "3", True, None])
def test_set_position_refuses_a_bad_position_and_an_unknown_request(position):
    chain = Chain.load(CHAIN)
    store = chain.new_store()
    store.add("alpha")
    with pytest.raises(RequestError, match=r"request 'alpha': position must be an integer >= 0"):
        store.set_position("alpha", position)
    assert store.snapshot()["alpha"]["position"] == 0
    with pytest.raises(RequestError, match="unknown request 'alpah'; did you mean 'alpha'"):
        store.set_position("alpah", 1)


def test_snapshot_and_restore_continue_the_same_tokens():
    chain = Chain.load(CHAIN)
    logits = torch.randn(8, 1, 60)
    store = chain.new_store()
    store.add("r", {"seed": 123, "temperature": 1.1})
    first = [int(chain.sample(logits[i], store, ["r"]).token_ids) for i in range(4)]
    snap = store.snapshot()
    rest = [int(chain.sample(logits[i], store, ["r"]).token_ids) for i in range(4, 8)]
    restored = chain.new_store()
    restored.restore(snap)
    assert [int(chain.sample(logits[i], restored, ["r"]).token_ids) for i in range(4, 8)] == rest
    assert first  # the uninterrupted run produced tokens before the checkpoint


def test_a_restore_that_fails_adds_nothing():
    """An id already in the store, a row that is not a snapshot's, a state another chain has: one error each, and
    the requests of the snapshot restored before it are taken out again."""
    chain = Chain.load({"samplers": [{"use": "mirostat_v2", "tau": 3.0}]})
    store = chain.new_store()
    store.add("a", {"seed": 1})
    store.add("b", {"seed": 2})
    snap = store.snapshot()
    before = store.snapshot()
    with pytest.raises(RequestError, match=r"restore\(\): request id\(s\) \['a', 'b'\] already in the store"):
        store.restore(snap)
    target = chain.new_store()
    target.add("kept", {"seed": 3})
    kept = target.snapshot()
    bad_state = {"x": snap["a"], "y": {**snap["b"], "state": {"mirostat.mu": 1.0}}}
    with pytest.raises(RequestError, match=r"request 'y': 'mirostat.mu' is not a state of this chain .*mirostat_v2.mu"):
        target.restore(bad_state)
    with pytest.raises(RequestError, match=r"request 'y': expected a row of snapshot\(\) \(params, position, state\)"):
        target.restore({"x": snap["a"], "y": {"params": {}}})
    with pytest.raises(RequestError, match=r"request 'y': .*must be"):
        target.restore({"x": snap["a"], "y": {**snap["b"], "params": {"mirostat_v2.tau": -1.0}}})
    assert target.snapshot() == kept and store.snapshot() == before
    target.restore({"x": snap["a"]})  # the ids taken out are free again
    assert target.snapshot()["x"] == snap["a"]


def test_update_changes_parameters_and_a_bad_update_changes_nothing():
    chain = Chain.load(CHAIN)
    store = chain.new_store()
    store.add("a", {"seed": 1, "top_k": 5})
    store.update("a", {"top_k": 7})
    assert store.snapshot()["a"]["params"]["top_k.k"] == 7
    before = store.snapshot()
    with pytest.raises(RequestError, match=r"request 'a': temperature.t = -1.0: must be in \[0, inf\)"):
        store.update("a", {"top_k": 9, "temperature": -1.0})
    assert store.snapshot() == before


@pytest.mark.parametrize(
    "params, message",
    [
        ({"top_q": 0.5}, r"unknown parameter 'top_q' for this chain; did you mean"),
        ({"seed": -4}, r"dist.seed \(given as 'seed'\) = -4: must be an integer in \[0, 2\*\*63\)"),
        ({"top_k": "x"}, r"top_k.k = 'x': expected an integer"),
        ({"temperature": 1e400}, r"temperature.t = inf: must be a finite number"),
        ({"temperature": 1e39}, r"temperature.t = 1e\+39: too large for float32"),
        ({"top_k": 2**70}, r"top_k.k = 1180591620717411303424: out of the int64 range"),
    ],
)
def test_bad_per_request_parameters_are_refused_and_nothing_is_added(params, message):
    chain = Chain.load(CHAIN)
    store = chain.new_store()
    with pytest.raises(RequestError, match=message):
        store.add("bad", params)
    assert "bad" not in store and len(store) == 0


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda s: s.add("b", ["seed", 1]), r"request 'b': params = \['seed', 1\]: a mapping of parameter names"),
        (lambda s: s.add_many(["b"], "seed=1"), r"request 'b': params = 'seed=1': a mapping"),
        (lambda s: s.update("a", None), r"request 'a': params = None: a mapping"),
        (lambda s: s.add_many("bc"), r"add_many\('bc'\): a list of request ids \(e.g. \['bc'\]\), not a string"),
        (lambda s: s.batch("a"), r"batch\('a'\): a list of request ids"),
        (lambda s: s.snapshot("a"), r"snapshot\('a'\): a list of request ids"),
        (lambda s: s.restore(None), r"restore\(\): expected the dict snapshot\(\) returned, got NoneType"),
        (
            lambda s: s.load_row("a", (torch.tensor(3), {})),
            r"load_row\('a'\): expected what save_row\(\) of this store",
        ),
    ],
    ids=["add", "add_many-params", "update", "add_many-ids", "batch", "snapshot", "restore", "load_row"],
)
def test_a_store_call_with_the_wrong_kind_of_argument_is_one_error_and_changes_nothing(call, message):
    chain = Chain.load({"samplers": [{"use": "temperature", "t": 0.9}, {"use": "mirostat_v2", "tau": 5.0}]})
    store = chain.new_store()
    store.add("a", {"seed": 3})
    before = store.snapshot()
    with pytest.raises(RequestError, match=message):
        call(store)
    assert store.snapshot() == before


def test_a_bad_value_given_by_an_alias_names_the_alias_too():
    """`seed` sets xtc.seed and dist.seed in llama.cpp's chain, `temperature` sets temp_ext.t: the error says which
    name the caller wrote; a name that is the entry's own (top_k -> top_k.k) or its full path needs no note."""
    store = Chain.from_preset("llama.cpp").new_store()
    with pytest.raises(RequestError, match=r"request 'r': xtc.seed \(given as 'seed'\) = -1: must be an integer"):
        store.add("r", {"seed": -1})
    with pytest.raises(RequestError, match=r"temp_ext.t \(given as 'temperature'\) = 'hot': expected a number"):
        store.add("r", {"temperature": "hot"})
    with pytest.raises(RequestError, match=r"request 'r': top_k.k = 'x': expected an integer"):
        store.add("r", {"top_k": "x"})
    with pytest.raises(RequestError, match=r"request 'r': xtc.seed = -1: must be"):
        store.add("r", {"xtc.seed": -1})
    assert len(store) == 0


def test_unknown_and_duplicate_request_ids():
    chain = Chain.load(CHAIN)
    store = chain.new_store()
    store.add("alpha")
    with pytest.raises(RequestError, match="already in the store"):
        store.add("alpha")
    with pytest.raises(RequestError, match="unknown request 'alpah'; did you mean 'alpha'"):
        chain.sample(torch.randn(1, 10), store, ["alpah"])
    with pytest.raises(RequestError, match="appear more than once"):
        chain.sample(torch.randn(2, 10), store, ["alpha", "alpha"])


def test_unseeded_requests_draw_distinct_seeds():
    chain = Chain.load(CHAIN)
    store = chain.new_store()
    store.add_many([f"r{i}" for i in range(16)])
    seeds = {row["params"]["dist.seed"] for row in store.snapshot().values()}
    assert len(seeds) == 16


def test_removed_requests_free_their_slots():
    chain = Chain.load(CHAIN)
    store = chain.new_store(capacity=4)
    for round_ in range(50):
        ids = [f"{round_}-{i}" for i in range(4)]
        store.add_many(ids)
        chain.sample(torch.randn(4, 30), store, ids)
        for rid in ids:
            store.remove(rid)
    assert store._capacity == 4 and len(store) == 0


def test_a_chain_level_text_setting_cannot_be_overridden_per_request():
    """Text and structured settings (penalties' scope) are one value per chain: a per-request override is refused,
    never accepted and silently ignored, and nothing is added."""
    chain = Chain.load({"samplers": [{"use": "penalties", "repeat": 1.1}, {"use": "dist"}]})
    store = chain.new_store()
    with pytest.raises(RequestError, match=r"request 'r': penalties.scope = 'vllm': this setting is the chain's"):
        store.add("r", {"penalties.scope": "vllm"})
    assert "r" not in store and len(store) == 0


def test_a_parameter_at_the_edge_of_its_range_survives_snapshot_restore_and_update():
    """float32 columns are written back as the shortest decimal of their float32 value: decay = 0.99 (the top of
    [0, 0.99]) restores and updates, rather than failing as 0.9900000095367432."""
    chain = Chain.load({"samplers": [{"use": "adaptive_p", "target": 0.3, "decay": 0.99}]})
    store = chain.new_store()
    store.add("a", {"seed": 3})
    restored = chain.new_store()
    restored.restore(store.snapshot())
    assert restored.snapshot() == store.snapshot()
    store.update("a", {"adaptive_target": 0.5})
    assert store.snapshot()["a"]["params"] == {"adaptive_p.target": 0.5, "adaptive_p.decay": 0.99, "adaptive_p.seed": 3}


def test_a_mixed_store_clones_a_request_onto_its_own_chain():
    from samplechain import MixedChains

    mixed = MixedChains({"a": Chain.load(CHAIN), "b": Chain.load({"samplers": [{"use": "mirostat"}]})})
    store = mixed.new_store()
    store.add("r", {"seed": 5}, chain="b")
    store.clone("r", "r2")
    assert store.chain_of("r2") == "b"
    assert store.stores["b"].snapshot(["r2"])["r2"] == store.stores["b"].snapshot(["r"])["r"]
    with pytest.raises(RequestError, match="already exists"):
        store.clone("r", "r2")
