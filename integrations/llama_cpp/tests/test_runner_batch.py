"""The llama.cpp runner with several rows: each row its own llama.cpp sequence, as if it ran alone.

Tolerance: llama.cpp's CPU kernels give a row the same logits whatever else is in the batch (a prompt of fewer than
64 tokens) and whether its tokens come one per decode or several (fewer than 64 a decode, as the runner feeds them;
measured: equal bit for bit); the tests allow ATOL = 1e-4 on logits of magnitude
~10-30 so that a build whose batched kernels round differently still passes, and compare greedy tokens exactly
only where the top-2 gap exceeds 2 * ATOL.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from samplechain.errors import ConfigError
from samplechain.generation import generate

pytestmark = [pytest.mark.llama_cpp, pytest.mark.slow]

ATOL = 1e-4
PROMPTS = ["The capital of France is", "Hi", "Write a haiku about the sea and the"]


def padded(tok, texts):
    rows = [tok(t)["input_ids"] for t in texts]
    width = max(map(len, rows))
    ids = torch.tensor([[0] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    return ids, mask


def runner(model, ids, mask=None):
    from samplechain_llama_cpp import LlamaCppRunner

    return LlamaCppRunner(model, ids, mask)


def test_a_batch_of_three_gives_each_row_its_run_alone(llama_model):
    model, tok = llama_model
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        batch = generate(model, tok, PROMPTS, chain="preset:greedy", max_new_tokens=12, output_logits=True)
        for i, prompt in enumerate(PROMPTS):
            alone = generate(model, tok, prompt, chain="preset:greedy", max_new_tokens=12, output_logits=True)
            n = int(alone.num_generated[0])
            assert int(batch.num_generated[i]) == n
            ours = torch.stack([step[i] for step in batch.logits[:n]])
            theirs = torch.stack([step[0] for step in alone.logits[:n]])
            torch.testing.assert_close(ours, theirs, atol=ATOL, rtol=0)
            top2 = theirs.topk(2, dim=-1).values
            clear = (top2[:, 0] - top2[:, 1]) > 2 * ATOL
            mine = batch.sequences[i, batch.prompt_length :][:n]
            assert torch.equal(mine[clear], alone.sequences[0, alone.prompt_length :][:n][clear])
            assert batch.texts[i] == alone.texts[0]


def test_extend_then_truncate_matches_stepping_one_by_one(llama_model):
    model, tok = llama_model
    ids, mask = padded(tok, PROMPTS[:2])
    width = ids.shape[1]
    new = torch.tensor([[1797, 314, 253, 2155], [30, 198, 504, 3575]])
    stepped = runner(model, ids, mask)
    stepped.prefill()
    seq, one_by_one = ids, []
    for j in range(4):
        seq = torch.cat([seq, new[:, j : j + 1]], dim=1)
        one_by_one.append(stepped.step(seq))
    del stepped
    ext = runner(model, ids, mask)
    ext.prefill()
    extended = ext.extend(new)
    assert extended.shape == (2, 4, model.config.vocab_size)
    torch.testing.assert_close(extended, torch.stack(one_by_one, dim=1), atol=ATOL, rtol=0)
    ext.truncate(width + 2)  # keep the first two new tokens
    torch.testing.assert_close(ext.step(torch.cat([ids, new[:, :3]], 1)), one_by_one[2], atol=ATOL, rtol=0)
    ext.truncate([width + 1, width + 2])  # per row: row 0 back to one new token, row 1 keeps two
    again = ext.extend(torch.stack([new[0, 1:3], new[1, 2:4]]))
    torch.testing.assert_close(again[0], torch.stack([one_by_one[1][0], one_by_one[2][0]]), atol=ATOL, rtol=0)
    torch.testing.assert_close(again[1], torch.stack([one_by_one[2][1], one_by_one[3][1]]), atol=ATOL, rtol=0)


def test_feeds_of_64_tokens_or_more_a_row_match_stepping_one_by_one(llama_model):
    """With the float16 KV cache (llama.cpp's default) llama.cpp runs 64 or more queries of one sequence in one pass
    through another attention kernel (logits about 1.4 apart): the runner decodes such a feed in passes of at most
    63 tokens a row, so a long check or scoring pass still gives the steps' logits."""
    model, tok = llama_model
    ids, mask = padded(tok, PROMPTS[:2])
    new = (torch.arange(2 * 70).reshape(2, 70) * 37 + 400) % 20000
    stepped = runner(model, ids, mask)
    stepped.prefill()
    seq, one_by_one = ids, []
    for j in range(new.shape[1]):
        seq = torch.cat([seq, new[:, j : j + 1]], dim=1)
        one_by_one.append(stepped.step(seq))
    del stepped
    steps = torch.stack(one_by_one, dim=1)
    for k in (63, 64, 70):
        ext = runner(model, ids, mask)
        ext.prefill()
        torch.testing.assert_close(ext.extend(new[:, :k]), steps[:, :k], atol=ATOL, rtol=0)
        assert ext.n.tolist() == (mask.sum(1) + k).tolist()
    rows = runner(model, ids, mask)
    rows.prefill()
    first, second = rows.extend_rows([0, 1], [new[0, :66], new[1, :1]])  # one row past 64, one of one token
    torch.testing.assert_close(first, steps[0, :66], atol=ATOL, rtol=0)
    torch.testing.assert_close(second, steps[1, :1], atol=ATOL, rtol=0)
    (again,) = rows.extend_rows([1], [new[1, 1:70]])
    torch.testing.assert_close(again, steps[1, 1:70], atol=ATOL, rtol=0)


def test_truncate_refuses_cutting_into_a_rows_padding_or_past_its_end(llama_model):
    model, tok = llama_model
    ids, mask = padded(tok, PROMPTS[:2])
    r = runner(model, ids, mask)
    r.prefill()
    pad = int((mask[1] == 0).sum())
    with pytest.raises(ConfigError, match="row 1"):
        r.truncate(pad)  # row 1 would keep no token
    with pytest.raises(ConfigError, match="row 0"):
        r.truncate(ids.shape[1] + 1)


def test_reorder_makes_rows_follow_their_beams(llama_model):
    model, tok = llama_model
    ids, mask = padded(tok, PROMPTS[:2])
    plain = runner(model, ids, mask)
    plain.prefill()
    want = plain.step(torch.cat([ids, torch.tensor([[30], [30]])], 1))
    del plain
    r = runner(model, ids, mask)
    r.prefill()
    r.reorder(torch.tensor([1, 0]))  # a swap: each row reads the other's cache before it is overwritten
    got = r.step(torch.cat([ids[[1, 0]], torch.tensor([[30], [30]])], 1))
    torch.testing.assert_close(got, want[[1, 0]], atol=ATOL, rtol=0)
    r.reorder(torch.tensor([0, 0]))  # both rows follow beam 0 (old row 1 and its token 30)
    twins = r.step(torch.tensor([[11], [11]]))
    torch.testing.assert_close(twins[1], twins[0], atol=0, rtol=0)


def test_beam_search_runs_on_llama_cpp(llama_model):
    model, tok = llama_model
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = generate(model, tok, PROMPTS[0], num_beams=2, max_new_tokens=6)
    assert out.sequences.shape[0] == 1 and out.texts[0].strip()


def test_two_live_runners_keep_their_own_caches(llama_model):
    """Guidance runs a second runner beside the first: each holds a context of its own."""
    model, tok = llama_model
    ids, _ = padded(tok, PROMPTS[:1])
    a, b = runner(model, ids), runner(model, ids)
    assert a.ctx is not b.ctx
    la, lb = a.prefill(), b.prefill()
    torch.testing.assert_close(la, lb, atol=0, rtol=0)
    step = torch.cat([ids, torch.tensor([[30]])], 1)
    torch.testing.assert_close(a.step(step), b.step(step), atol=0, rtol=0)


def test_batches_longer_than_n_batch_split_and_a_full_cache_is_a_config_error(llama_model):
    from samplechain_llama_cpp import load_gguf

    model, tok = llama_model
    small, _ = load_gguf(model.path, n_ctx=64, n_batch=8, tokenizer=tok)
    try:
        ids, mask = padded(tok, [PROMPTS[2] * 2, PROMPTS[0]])  # 2 rows, ~30 tokens: several decodes of 8
        want = runner(model, ids, mask).prefill()
        r = runner(small, ids, mask)
        torch.testing.assert_close(r.prefill(), want, atol=ATOL, rtol=0)
        cells = r.ctx.n_ctx // r.ctx.n_seq_max  # a row's stream (llama.cpp rounds n_ctx up)
        with pytest.raises(ConfigError, match="KV cache is full"):
            r.extend(torch.full((2, cells - int(r.n.min()) + 1), 30))
    finally:
        small.close()


def test_released_rows_leave_the_rows_going_on_consecutive_sequences_with_their_logits(llama_model):
    """llama.cpp decodes several streams in one pass only where their sequence ids are consecutive: rows past a
    released row's sequence move into it, and their logits stay those of a batch that never released a row."""
    model, tok = llama_model
    prompts = [*PROMPTS, "One, two, three, four"]
    ids, mask = padded(tok, prompts)
    new = torch.tensor([[30, 198, 504], [1797, 314, 253], [11, 2155, 30], [198, 198, 11]])
    full, r = runner(model, ids, mask), runner(model, ids, mask)
    full.prefill()
    r.prefill()
    seq = torch.cat([ids, new[:, :1]], 1)
    torch.testing.assert_close(r.step(seq), full.step(seq), atol=ATOL, rtol=0)
    r.release([0, 2])  # rows 1 and 3 go on: one of them moves next to the other
    going = sorted(r.seq[[1, 3]].tolist())
    assert going[1] - going[0] == 1 and sorted(r.seq.tolist()) == [0, 1, 2, 3]
    seq = torch.cat([seq, new[:, 1:2]], 1)
    want = full.step(seq)
    got = r.step(seq)
    torch.testing.assert_close(got[[1, 3]], want[[1, 3]], atol=ATOL, rtol=0)
    assert not got[[0, 2]].any()  # a released row's logits are zeros
    three = r.extend_rows([3, 1], [new[3, 2:], new[1, 2:]])
    again = full.extend_rows([3, 1], [new[3, 2:], new[1, 2:]])
    for ours, theirs in zip(three, again):
        torch.testing.assert_close(ours, theirs, atol=ATOL, rtol=0)
    with pytest.raises(ConfigError, match="row 0 was released"):
        r.extend_rows([0], [new[0, 2:]])
    seq = torch.cat([seq, new[:, 2:3]], 1)
    active = torch.tensor([False, False, False, True])  # step(active=...) releases the rows left out
    torch.testing.assert_close(r.step(seq, active=active)[3], full.step(seq)[3], atol=ATOL, rtol=0)
    assert r.gone.tolist() == [True, True, True, False]
