"""Counter-based seeded sampling: a seeded request's tokens do not depend on its batch, its row or threads."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from samplechain import Chain

LLAMA = "preset:llama.cpp"
FULL_VOCAB = {"samplers": [{"use": "temperature", "t": 1.0}, {"use": "top_p", "p": 0.9}, {"use": "dist"}]}


def tokens(chain, logits, batch_rows, position_of_target, target_seed=42, steps=5):
    """Run `steps` steps with the target request at a given row among random neighbours; return its tokens."""
    g = torch.Generator().manual_seed(1000 + batch_rows)
    store = chain.new_store()
    ids = []
    for i in range(batch_rows):
        rid = "target" if i == position_of_target else f"n{i}"
        store.add(rid, {"seed": target_seed} if rid == "target" else {"seed": 7 * i + 1, "temperature": 1.5})
        ids.append(rid)
    out = []
    for s in range(steps):
        batch = torch.randn(batch_rows, logits.shape[1], generator=g) * 4
        batch[position_of_target] = logits[s]
        out.append(int(chain.sample(batch, store, ids).token_ids[position_of_target]))
    return out


@pytest.mark.parametrize("config", [LLAMA, FULL_VOCAB], ids=["llama-preset", "top-p-full-vocab"])
def test_seeded_request_draws_the_same_tokens_alone_and_in_any_batch_at_any_row(config):
    chain = Chain.load(config)
    logits = torch.randn(5, 2000, generator=torch.Generator().manual_seed(3)) * 2
    alone = tokens(chain, logits, 1, 0)
    for size in (2, 3, 8, 17, 32, 64):
        for position in sorted({0, size // 2, size - 1}):
            assert tokens(chain, logits, size, position) == alone, (size, position)


def test_different_seeds_draw_differently():
    chain = Chain.load({"samplers": [{"use": "dist"}]})
    logits = torch.zeros(1, 1000)
    draws = set()
    for seed in range(20):
        store = chain.new_store()
        store.add("r", {"seed": seed})
        draws.add(int(chain.sample(logits, store, ["r"]).token_ids))
    assert len(draws) > 15


SCRIPT = textwrap.dedent("""
    import sys, torch
    torch.set_num_threads(int(sys.argv[1]))
    from samplechain import Chain
    chain = Chain.load({"samplers": [{"use": "temperature", "t": 0.7}, {"use": "top_p", "p": 0.95},
                                     {"use": "min_p", "p": 0.01}, {"use": "dist"}]})
    g = torch.Generator().manual_seed(0)
    store = chain.new_store()
    ids = [f"r{i}" for i in range(int(sys.argv[2]))]
    for i, rid in enumerate(ids):
        store.add(rid, {"seed": 1000 + i})
    toks = []
    for _ in range(4):
        logits = torch.randn(len(ids), 32000, generator=g) * 3
        toks.append(chain.sample(logits, store, ids).token_ids.tolist())
    print(toks)
""")


@pytest.mark.slow
def test_seeded_tokens_do_not_depend_on_the_thread_count():
    runs = {}
    for threads in (1, 2):
        done = subprocess.run(
            [sys.executable, "-c", SCRIPT, str(threads), "8"], capture_output=True, text=True, check=True
        )
        runs[threads] = done.stdout
    assert runs[1] == runs[2]
