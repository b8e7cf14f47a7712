"""`samplechain.generation.score` and the engine's teacher forcing under it (`Chain.sample(accept=token_ids)`),
against references: a generation's own tokens and logprobs, raw model logits through transformers' processors,
the argmax of greedy chains, log_softmax of the model's logits, the rows scored alone, and mirostat's mu by hand."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from samplechain import Chain, ConfigError
from samplechain.errors import SamplingError
from samplechain.generation import ScoreOutput, generate, score
from samplechain.models import tiny_model_path

transformers = pytest.importorskip("transformers")

PROMPTS = ["The list is: apple, pear, plum. Again:", "In Python,", "A list is a list is a"]
SAMPLING = {
    "samplers": [
        {"use": "penalties", "repeat": 1.3, "frequency": 0.2, "presence": 0.1},
        {"use": "top_p", "p": 0.9},
        {"use": "min_p", "p": 0.05},
        {"use": "temperature", "t": 0.9, "id": "temp"},
        {"use": "dist"},
    ]
}
MIROSTAT = {
    "samplers": [
        {"use": "penalties", "repeat": 1.2},
        {"use": "temperature", "t": 0.9},
        {"use": "mirostat", "tau": 4.0, "eta": 0.3},
    ]
}
# the hand reference of transformers' processors: RepetitionPenalty over prompt + tokens, temperature, top-k
HAND = {
    "samplers": [
        {"use": "penalties", "repeat": 1.5, "scope": "transformers"},
        {"use": "temperature", "t": 0.7},
        {"use": "top_k", "k": 20},
        {"use": "dist"},
    ]
}


@pytest.fixture(scope="module")
def tiny():
    path = tiny_model_path()
    model = transformers.AutoModelForCausalLM.from_pretrained(path, local_files_only=True).eval()
    return model, transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)


def generated(out) -> list[list[int]]:
    """Each row's generated tokens, its finishing token included."""
    p = out.prompt_length
    return [out.sequences[b, p : p + int(n)].tolist() for b, n in enumerate(out.num_generated)]


def full_logits(model, ids: list[int]) -> torch.Tensor:
    """(L, V) float32 logits of one unpadded row in one forward pass."""
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


def hand_processed(model, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """(L, V) the processed logits of HAND at each position of `tokens` after `prompt`, by transformers."""
    from transformers import RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper, TopKLogitsWarper

    logits = full_logits(model, prompt + tokens)
    rows = []
    for t in range(len(tokens)):
        ids = torch.tensor([prompt + tokens[:t]])
        x = logits[len(prompt) - 1 + t][None].clone()
        for proc in (RepetitionPenaltyLogitsProcessor(1.5), TemperatureLogitsWarper(0.7), TopKLogitsWarper(20)):
            x = proc(ids, x)
        rows.append(x[0])
    return torch.stack(rows)


# ----------------------------------------------------------------- a generation's own tokens
@pytest.mark.parametrize(
    ("chain", "mode"),
    [(SAMPLING, "processed"), (SAMPLING, "raw"), (SAMPLING, "temp:logits"), (MIROSTAT, "processed")],
    ids=["sampling-processed", "sampling-raw", "sampling-temp-logits", "mirostat-processed"],
)
def test_a_generation_scores_kept_everywhere_with_its_own_logprobs(tiny, chain, mode):
    """A seeded generation's tokens: kept at every position, the generation's logprobs in that mode (one-token
    steps: bit for bit; one pass: within 1e-5), and stop_index where the generation stopped on eos."""
    model, tok = tiny
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = generate(model, tok, PROMPTS, chain=chain, seed=7, max_new_tokens=12, pad_token_id=0, logprobs_mode=mode)
        rows = generated(out)
        steps = score(model, tok, PROMPTS, rows, chain=chain, seed=7, pad_token_id=0, logprobs_at=mode, chunk_size=1)
        one_pass = score(model, tok, PROMPTS, rows, chain=chain, seed=7, pad_token_id=0, logprobs_at=mode)
    for b, row in enumerate(rows):
        want = out.logprobs[b, : len(row)]
        assert steps.token_ids[b].tolist() == row == one_pass.token_ids[b].tolist()
        assert bool(steps.kept[b].all()) and bool(one_pass.kept[b].all()), (b, one_pass.kept[b])
        assert torch.equal(steps.logprobs[b], want)
        torch.testing.assert_close(one_pass.logprobs[b], want, atol=1e-5, rtol=0)
        eos = len(row) - 1 if out.finish_reasons[b] == "eos" else None
        assert steps.stop_index[b] == eos and one_pass.stop_index[b] == eos
        assert steps.finish_reasons[b] == ("eos" if eos is not None else None)


@pytest.mark.parametrize("chunk_size", [1, None], ids=["steps", "one-pass"])
def test_under_classifier_free_guidance_a_generation_scores_kept_with_its_logprobs(tiny, chunk_size):
    """cfg with a negative prompt and a guidance scale per row: the generation's tokens score kept, with its
    processed logprobs (the unconditional context continuing with the given tokens, as in generate(); one-token
    steps: bit for bit; one pass: within 1e-4, the guidance scale of 3 tripling the two passes' summation-order
    difference); without the negative prompts the same tokens score otherwise."""
    model, tok = tiny
    chain = {"samplers": [{"use": "cfg"}, *SAMPLING["samplers"]]}
    kwargs = {
        "chain": chain,
        "params": [{"seed": 7 + b, "guidance_scale": scale} for b, scale in enumerate((1.5, 3.0, 0.5))],
        "negative_prompt": ["Bye.", "A list of fruit", "x = 1"],
        "pad_token_id": 0,
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = generate(model, tok, PROMPTS, max_new_tokens=12, **kwargs)
        rows = generated(out)
        scored = score(model, tok, PROMPTS, rows, chunk_size=chunk_size, **kwargs)
        unguided = score(model, tok, PROMPTS, rows, chunk_size=chunk_size, **(kwargs | {"negative_prompt": None}))
    for b, row in enumerate(rows):
        assert scored.token_ids[b].tolist() == row
        assert bool(scored.kept[b].all()), (b, scored.kept[b])
        want = out.logprobs[b, : len(row)]
        if chunk_size == 1:
            assert torch.equal(scored.logprobs[b], want)
        else:
            torch.testing.assert_close(scored.logprobs[b], want, atol=1e-4, rtol=0)
    assert any(not torch.allclose(u, s, atol=1e-3) for u, s in zip(unguided.logprobs, scored.logprobs))


# ----------------------------------------------------------------- a changed token
def test_a_changed_token_is_not_kept_and_every_position_scores_the_given_text(tiny):
    """One token of a seeded generation replaced by the next most likely one: kept up to it, not there, and at every
    position the logprob of the given text under transformers' processors (RepetitionPenalty over the prompt and
    the *given* tokens, temperature, top-k) on the raw logits."""
    model, tok = tiny
    prompt = tok(PROMPTS[0])["input_ids"]
    out = generate(model, tok, PROMPTS[0], chain=HAND, seed=3, max_new_tokens=10, ignore_eos=True)
    row = generated(out)[0]
    j = 4
    reference = hand_processed(model, prompt, row)
    order = reference[j].argsort(descending=True).tolist()
    changed = row[:j] + [next(t for t in order if t != row[j])] + row[j + 1 :]
    got = score(model, tok, PROMPTS[0], changed, chain=HAND, seed=3, ignore_eos=True)
    assert got.kept[0][:j].all() and not bool(got.kept[0][j])
    assert int(got.drawn[0][j]) == row[j]  # the chain's own draw there: the generation's token
    want = torch.log_softmax(hand_processed(model, prompt, changed), dim=-1)
    want = want.gather(1, torch.tensor(changed)[:, None])[:, 0]
    torch.testing.assert_close(got.logprobs[0], want, atol=1e-5, rtol=0)  # -inf where top-k removed a given token


# ----------------------------------------------------------------- greedy
@pytest.mark.transformers_parity
def test_greedy_keeps_exactly_the_argmax(tiny):
    """A greedy chain keeps a token exactly where it is the argmax of the processed logits (by hand)."""
    model, tok = tiny
    prompt = tok(PROMPTS[2])["input_ids"]
    sampled = generate(
        model,
        tok,
        PROMPTS[2],
        chain={"samplers": [{"use": "temperature", "t": 1.3}, {"use": "dist"}]},
        seed=5,
        max_new_tokens=16,
        ignore_eos=True,
    )
    row = generated(sampled)[0]
    greedy = {"samplers": [{"use": "penalties", "repeat": 1.5, "scope": "transformers"}, {"use": "greedy"}]}
    got = score(model, tok, PROMPTS[2], row, chain=greedy, ignore_eos=True)
    from transformers import RepetitionPenaltyLogitsProcessor

    logits = full_logits(model, prompt + row)
    argmax = [
        int(
            RepetitionPenaltyLogitsProcessor(1.5)(
                torch.tensor([prompt + row[:t]]), logits[len(prompt) - 1 + t][None]
            ).argmax()
        )
        for t in range(len(row))
    ]
    assert got.drawn[0].tolist() == argmax
    assert got.kept[0].tolist() == [a == t for a, t in zip(argmax, row)]
    assert 0 < int(got.kept[0].sum()) < len(row), "the sampled text agrees with the argmax at some places only"


# ----------------------------------------------------------------- raw logprobs
def test_raw_logprobs_are_the_models_log_softmax(tiny):
    """logprobs_at="raw" in a padded batch: log_softmax of the model's own logits over each unpadded row."""
    model, tok = tiny
    rows = [tok(" pear, plum, apple")["input_ids"], tok(" print(x)")["input_ids"]]
    got = score(model, tok, PROMPTS[:2], rows, chain="preset:greedy", logprobs_at="raw", pad_token_id=0)
    for b, row in enumerate(rows):
        prompt = tok(PROMPTS[b])["input_ids"]
        logits = full_logits(model, prompt + row)[len(prompt) - 1 : -1]
        want = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(row)[:, None])[:, 0]
        torch.testing.assert_close(got.logprobs[b], want, atol=1e-5, rtol=0)
        assert got.ranks[b].min() >= 1


# ----------------------------------------------------------------- batch invariance
def test_a_row_scores_the_same_alone_and_in_a_ragged_batch(tiny):
    model, tok = tiny
    rows = [tok(" pear, plum, apple, pear")["input_ids"], tok(" x")["input_ids"], tok(" list is a list")["input_ids"]]
    assert len({len(r) for r in rows}) == 3
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        batch = score(model, tok, PROMPTS, rows, chain=SAMPLING, seed=11, pad_token_id=0)
        for b, row in enumerate(rows):
            alone = score(model, tok, PROMPTS[b], row, chain=SAMPLING, seed=11, pad_token_id=0)
            assert batch.token_ids[b].tolist() == row
            assert torch.equal(batch.drawn[b], alone.drawn[0]) and torch.equal(batch.kept[b], alone.kept[0])
            torch.testing.assert_close(batch.logprobs[b], alone.logprobs[0], atol=1e-5, rtol=0)
            assert batch.stop_index[b] == alone.stop_index[0]
    assert batch.lengths.tolist() == [len(r) for r in rows]
    padded = batch.padded("logprobs", float("nan"))
    assert padded.shape == (3, max(len(r) for r in rows)) and math.isnan(float(padded[1, -1]))


def test_rows_that_fit_the_positions_alone_score_as_alone_where_the_batch_would_not(tiny, recwarn):
    """A pass feeds every row the batch's longest continuation: rows that fit the model's 256 positions alone but
    not with the others' continuations are scored in batches that fit, as they score alone."""
    model, tok = tiny
    prompts = [PROMPTS[0], PROMPTS[1], PROMPTS[0]]
    short = len(tok(PROMPTS[1])["input_ids"])
    rows = [[5, 6, 7], [9] * (256 - short), [8, 9]]  # the second fills the positions exactly
    batch = score(model, tok, prompts, rows, chain=SAMPLING, seed=3, pad_token_id=0)
    for b in range(3):
        alone = score(model, tok, prompts[b], rows[b], chain=SAMPLING, seed=3, pad_token_id=0)
        assert torch.equal(batch.drawn[b], alone.drawn[0]) and batch.stop_index[b] == alone.stop_index[0]
        torch.testing.assert_close(batch.logprobs[b], alone.logprobs[0], atol=1e-5, rtol=0)
    assert batch.lengths.tolist() == [3, 256 - short, 2]
    per_prompt = score(model, tok, prompts, rows, chain=[SAMPLING, "preset:greedy", SAMPLING], seed=3, pad_token_id=0)
    assert torch.equal(per_prompt.drawn[0], batch.drawn[0]) and per_prompt.stop_index == batch.stop_index
    assert not [w for w in recwarn.list if "positions" in str(w.message)]  # every row fits: nothing to warn of


def test_rows_scored_in_groups_count_the_whole_batchs_width(tiny):
    """A max_length counts the padded batch, as generate() counts it, also where the rows are scored in groups."""
    model, tok = tiny
    prompts = [" ".join(["one two three"] * 60), PROMPTS[1]]
    width = max(len(tok(p)["input_ids"]) for p in prompts)
    chain = {"samplers": [{"use": "greedy"}], "stop": [{"use": "max_length", "n": width + 5}]}
    out = generate(model, tok, prompts, chain=chain, ignore_eos=True, pad_token_id=0)
    assert out.num_generated.tolist() == [5, 5]
    rows = [[7, 8], generated(out)[1] + [9] * (250 - 5)]  # together they would pass the 256 positions
    got = score(model, tok, prompts, rows, chain=chain, ignore_eos=True, pad_token_id=0)
    assert got.stop_index == [None, 4] and got.finish_reasons == [None, "max_length"]
    assert bool(got.kept[1][:5].all())


def test_a_chains_own_length_limit_reports_its_stop(tiny):
    model, tok = tiny
    chain = {"samplers": SAMPLING["samplers"], "stop": [{"use": "max_new_tokens", "n": 6}]}
    out = generate(model, tok, PROMPTS, chain=chain, seed=5, ignore_eos=True, pad_token_id=0)
    assert out.finish_reasons == ["max_new_tokens"] * 3
    got = score(model, tok, PROMPTS, generated(out), chain=chain, seed=5, ignore_eos=True, pad_token_id=0)
    assert all(bool(k.all()) for k in got.kept)
    assert got.stop_index == [5, 5, 5] and got.finish_reasons == ["max_new_tokens"] * 3
    shorter = score(model, tok, PROMPTS, [r[:3] for r in generated(out)], chain=chain, seed=5, pad_token_id=0)
    assert shorter.stop_index == [None] * 3  # and no clash with a length limit of score()'s own


def test_a_token_the_chain_removed_ranks_with_every_removed_token(tiny):
    """All tokens a stage removed tie at -inf, below every candidate: each ranks V (it ranked as the last kept)."""
    model, tok = tiny
    vocab = model.config.vocab_size
    chain = {"samplers": [{"use": "top_k", "k": 5}, {"use": "dist"}]}
    with torch.no_grad():
        logits = model(torch.tensor([tok(PROMPTS[1])["input_ids"]])).logits[0, -1]
    ranked = torch.argsort(logits, descending=True).tolist()
    rows = [[ranked[4]], [ranked[5]], [ranked[100]]]
    got = score(model, tok, [PROMPTS[1]] * 3, rows, chain=chain, seed=1, pad_token_id=0)
    assert [r.tolist() for r in got.ranks] == [[5], [vocab], [vocab]]
    assert math.isfinite(float(got.logprobs[0][0])) and math.isinf(float(got.logprobs[1][0]))
    raw = score(model, tok, [PROMPTS[1]] * 3, rows, chain=chain, logprobs_at="raw", seed=1, pad_token_id=0)
    assert [r.tolist() for r in raw.ranks] == [[5], [6], [101]]


def test_a_padded_prompt_tensor_scores_with_its_attention_mask(tiny):
    model, tok = tiny
    out = generate(model, tok, PROMPTS, chain=SAMPLING, seed=7, max_new_tokens=6, pad_token_id=0)
    width = out.prompt_length
    block = out.sequences[:, :width]
    lengths = torch.tensor([[len(tok(p)["input_ids"])] for p in PROMPTS])
    mask = (torch.arange(width) >= width - lengths).to(torch.int64)
    by_text = score(model, tok, PROMPTS, generated(out), chain=SAMPLING, seed=7, pad_token_id=0)
    by_ids = score(model, tok, block, generated(out), attention_mask=mask, chain=SAMPLING, seed=7, pad_token_id=0)
    for b in range(3):
        assert bool(by_ids.kept[b].all()) and torch.equal(by_ids.logprobs[b], by_text.logprobs[b])
    with pytest.raises(ConfigError, match="attention_mask is for prompts given as one"):
        score(model, tok, PROMPTS, generated(out), attention_mask=mask, chain=SAMPLING, pad_token_id=0)


def test_one_chain_per_prompt_scores_each_row_as_its_own_chain(tiny):
    model, tok = tiny
    rows = [tok(" pear, plum")["input_ids"], tok(" x = 1")["input_ids"]]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mixed = score(
            model,
            tok,
            PROMPTS[:2],
            rows,
            chain=[SAMPLING, "preset:greedy"],
            seed=4,
            pad_token_id=0,
            logprobs_at=["temp", "raw"],
        )
        for b, (chain, mode) in enumerate([(SAMPLING, "temp"), ("preset:greedy", "raw")]):
            alone = score(model, tok, PROMPTS[b], rows[b], chain=chain, seed=4, pad_token_id=0, logprobs_at=mode)
            assert torch.equal(mixed.drawn[b], alone.drawn[0])
            torch.testing.assert_close(mixed.logprobs[b], alone.logprobs[0], atol=1e-5, rtol=0)


# ----------------------------------------------------------------- stateful samplers
def mu_of(store, rid: str) -> float:
    state = store.snapshot([rid])[rid]["state"]
    (key,) = [k for k in state if k.endswith(".mu")]
    return state[key]


def mirostat_step(row: torch.Tensor, mu: float, tau: float, eta: float, token: int) -> tuple[list[int], float]:
    """llama.cpp's mirostat (v1, m = 100) with `token` accepted: the kept top k and mu moved by the token's
    surprise (unchanged for a token outside the top k); k through the plugin's own llama.cpp formula."""
    from samplechain_mirostat import mirostat_k

    k = int(mirostat_k(row[None], torch.tensor([mu]), torch.tensor([100]), row.shape[0])[0])
    top = torch.topk(row.double(), k).indices.tolist()
    if token in top:
        p = torch.softmax(row.double()[top], dim=-1)[top.index(token)]
        mu = mu - eta * (-math.log2(float(p)) - tau)
    return top, mu


def test_mirostat_mu_moves_with_the_given_token(tiny):
    """Teacher forcing moves mu by the given token's surprise, as though mirostat had drawn it (by hand at each step
    of a generated text with one token changed); score()'s draws are those of that store."""
    model, tok = tiny
    tau, eta = 3.0, 0.5
    chain_table = {"samplers": [{"use": "mirostat", "tau": tau, "eta": eta}]}
    prompt = tok(PROMPTS[1])["input_ids"]
    out = generate(model, tok, PROMPTS[1], chain=chain_table, seed=9, max_new_tokens=10, ignore_eos=True)
    row = generated(out)[0]
    logits = full_logits(model, prompt + row)
    top, _ = mirostat_step(logits[len(prompt) - 1 + 2], 2.0 * tau, tau, eta, row[2])
    changed = row[:2] + [next(t for t in top if t != row[2])] + row[3:]  # another token mirostat keeps there
    logits = full_logits(model, prompt + changed)
    chain = Chain.load(chain_table)
    store = chain.new_store()
    store.add("r", {"seed": 9})
    mu, draws = 2.0 * tau, []
    for t, token in enumerate(changed):
        x = logits[len(prompt) - 1 + t][None]
        draws.append(int(chain.sample(x, store, ["r"], accept=torch.tensor([token])).token_ids[0]))
        kept, mu = mirostat_step(x[0], mu, tau, eta, token)  # a token outside the kept set leaves mu
        assert token in kept or t > 2
        assert mu_of(store, "r") == pytest.approx(mu, abs=1e-4)
    got = score(model, tok, PROMPTS[1], changed, chain=chain_table, seed=9, ignore_eos=True)
    assert got.drawn[0].tolist() == draws
    assert not bool(got.kept[0][2]) and bool(got.kept[0][:2].all())


@pytest.mark.parametrize("name", ["mirostat", "mirostat_v2"])
def test_mirostat_a_token_outside_the_kept_set_leaves_mu(name):
    chain = Chain.load({"samplers": [{"use": name, "tau": 2.0, "eta": 0.5}]})
    store = chain.new_store()
    store.add("a", {"seed": 1})
    x = torch.arange(50, dtype=torch.float32)[None] * 0.8  # a steep row: the least likely token is never kept
    out = chain.sample(x, store, ["a"], accept=torch.tensor([0]))
    assert int(out.token_ids[0]) != 0 and out.logprobs[0] < -30
    assert mu_of(store, "a") == pytest.approx(4.0)  # 2 * tau, unchanged
    assert store.snapshot(["a"])["a"]["position"] == 1


# ----------------------------------------------------------------- Chain.sample(accept=token_ids)
def test_teacher_forcing_draws_as_usual_and_reports_the_given_tokens():
    chain = Chain.load(SAMPLING | {"samplers": SAMPLING["samplers"][1:]})  # top_p, min_p, temp, dist
    x = torch.randn(3, 40, generator=torch.Generator().manual_seed(2)) * 3
    plain, forced = chain.new_store(), chain.new_store()
    for store in (plain, forced):
        for i, rid in enumerate("abc"):
            store.add(rid, {"seed": i})
    drawn = chain.sample(x, plain, ["a", "b", "c"], logprobs_at="raw")
    given = torch.tensor([int(x[0].argmax()), int(x[1].argmin()), int(drawn.token_ids[2])])
    out = chain.sample(x, forced, ["a", "b", "c"], accept=given, logprobs_at="raw")
    assert torch.equal(out.token_ids, drawn.token_ids)
    torch.testing.assert_close(out.logprobs, torch.log_softmax(x, dim=-1).gather(1, given[:, None])[:, 0])
    processed = chain.sample(x, accept=given)
    scores = chain.process(x)
    want = torch.log_softmax(scores, dim=-1).gather(1, given[:, None])[:, 0]
    assert processed.logprobs[1] == float("-inf")  # top_p removed it
    torch.testing.assert_close(processed.logprobs[[0, 2]], want[[0, 2]], atol=1e-6, rtol=0)
    assert processed.ranks is not None and int(processed.ranks[0]) == 1
    assert forced.snapshot() == plain.snapshot()  # positions moved alike


def test_teacher_forcing_on_a_sync_free_backend_equals_the_cpu_backend():
    """The cuda backend's sync-free step (run on CPU tensors): the same draws, logprobs and state as the cpu one."""
    pytest.importorskip("samplechain_cuda")
    from samplechain_cuda import CudaBackend

    table = {"samplers": [{"use": "penalties", "repeat": 1.3}, {"use": "top_k", "k": 8}, {"use": "dist"}]}
    x = torch.randn(2, 30, generator=torch.Generator().manual_seed(6)) * 2
    history = torch.tensor([[1, 2, 3], [-1, 4, 4]])
    given = torch.tensor([int(x[0].argmin()), int(x[1].argmax())])
    runs = []
    for sync_free in (False, True):
        chain = Chain.load(table)
        if sync_free:
            chain._backends["cpu"] = CudaBackend(device="cpu")
        store = chain.new_store()
        store.add("a", {"seed": 1})
        store.add("b", {"seed": 2})
        out = chain.sample(x, store, ["a", "b"], accept=given, history=history).check()
        runs.append((out.token_ids.tolist(), out.logprobs.tolist(), store.snapshot()))
    assert runs[0] == runs[1]
    assert runs[0][1][0] == float("-inf")  # top_k removed the given token of row a


def test_teacher_forcing_refuses_bad_tokens():
    chain = Chain.load({"samplers": [{"use": "dist"}]})
    store = chain.new_store()
    store.add("a")
    before = store.snapshot()
    with pytest.raises(SamplingError, match=r"not all in the vocabulary \[0, 10\)"):
        chain.sample(torch.zeros(1, 10), store, ["a"], accept=torch.tensor([10]))
    with pytest.raises(SamplingError, match=r"a \(B=1,\) int64 or int32 tensor"):
        chain.sample(torch.zeros(1, 10), store, ["a"], accept=torch.tensor([[1]]))
    assert store.snapshot() == before


# ----------------------------------------------------------------- generate()'s other arguments
def test_return_sequences_score_kept_with_each_sequences_seed(tiny):
    """generate(..., num_return_sequences=3)'s rows score kept everywhere with the same n: return sequence j of a
    prompt draws with seed + j, as the same rows given one by one with those seeds do."""
    model, tok = tiny
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = generate(
            model, tok, PROMPTS[:2], chain=SAMPLING, seed=7, max_new_tokens=10, pad_token_id=0, num_return_sequences=3
        )
        rows = generated(out)
        got = score(
            model, tok, PROMPTS[:2], rows, chain=SAMPLING, seed=7, pad_token_id=0, num_return_sequences=3, chunk_size=1
        )
        one_by_one = [p for p in PROMPTS[:2] for _ in range(3)]
        seeds = [{"seed": 7 + j} for _ in range(2) for j in range(3)]
        alone = score(model, tok, one_by_one, rows, chain=SAMPLING, params=seeds, pad_token_id=0, chunk_size=1)
        same_seed = score(model, tok, one_by_one, rows, chain=SAMPLING, seed=7, pad_token_id=0, chunk_size=1)
    assert len(rows) == 6 and len({tuple(r) for r in rows}) > 1
    for b, row in enumerate(rows):
        assert bool(got.kept[b].all()) and bool(alone.kept[b].all()), b
        assert torch.equal(got.logprobs[b], out.logprobs[b, : len(row)])
        assert torch.equal(got.drawn[b], alone.drawn[b])
    # every row drawing with seed 7 is the first return sequence's stream, not the others'
    assert not all(bool(k.all()) for k in same_seed.kept)


@pytest.mark.transformers_parity
def test_a_logits_processor_scores_as_generate_ran_it(tiny):
    """generate()'s logits_processor= (transformers' repetition penalty, over the whole batch's tokens) applies to
    scoring at each position: the generation's tokens are kept with its logprobs; without it they are not."""
    model, tok = tiny
    procs = transformers.LogitsProcessorList([transformers.RepetitionPenaltyLogitsProcessor(1.8)])
    chain = {"samplers": [{"use": "top_k", "k": 8}, {"use": "dist"}]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = generate(
            model, tok, PROMPTS, chain=chain, seed=3, max_new_tokens=12, pad_token_id=0, logits_processor=procs
        )
        rows = generated(out)
        got = score(model, tok, PROMPTS, rows, chain=chain, seed=3, pad_token_id=0, logits_processor=procs)
        plain = score(model, tok, PROMPTS, rows, chain=chain, seed=3, pad_token_id=0)
    for b, row in enumerate(rows):
        assert bool(got.kept[b].all()), (b, got.kept[b])
        torch.testing.assert_close(got.logprobs[b], out.logprobs[b, : len(row)], atol=1e-5, rtol=0)
    assert any(not torch.allclose(g, p) for g, p in zip(got.logprobs, plain.logprobs))


def test_length_limits_and_stop_regex_report_where_they_would_end_a_row(tiny):
    """max_new_tokens, max_length and stop_regex report their stop as generate() would end the row there; every
    given token is still scored."""
    model, tok = tiny
    rows = [tok(" one two three four five", add_special_tokens=False)["input_ids"]] * 2
    prompts = PROMPTS[:2]
    limit = score(model, tok, prompts, rows, chain="preset:greedy", pad_token_id=0, max_new_tokens=3, ignore_eos=True)
    assert limit.stop_index == [2, 2] and limit.finish_reasons == ["max_new_tokens"] * 2
    assert [len(t) for t in limit.token_ids] == [len(r) for r in rows]
    widest = max(len(tok(p)["input_ids"]) for p in prompts)
    whole = score(model, tok, prompts, rows, chain="preset:greedy", pad_token_id=0, max_length=widest + 2)
    assert whole.stop_index == [1, 1] and whole.finish_reasons == ["max_length"] * 2
    regex = score(model, tok, prompts, rows, chain="preset:greedy", pad_token_id=0, stop_regex="thre+e")
    three = next(t for t in range(len(rows[0])) if tok.decode(rows[0][: t + 1]).endswith("three"))
    assert regex.stop_index == [three, three] and regex.finish_reasons == ["stop_regex:thre+e"] * 2


# ----------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"prompts": PROMPTS[:2], "continuations": [" a"]}, r"2 prompts but 1 continuations: give one continuation"),
        ({"continuations": [" a", []]}, r"continuations\[1\] is empty: give at least one token"),
        ({"continuations": [[5, 10**7], " b"]}, r"continuations\[0\]\[1\] = 10000000: not a token id of the model"),
        ({"logprobs_at": "nope"}, r"logprobs_at = 'nope': the chain has no entry of that name"),
        ({"logprobs_at": ["raw"]}, r"logprobs_at lists 1 stages for 2 prompts"),
        ({"logprobs_at": 5}, r"logprobs_at = 5: one stage \(for example 'raw', 'processed'"),
        ({"num_return_sequences": 0}, r"num_return_sequences = 0: must be an integer >= 1"),
        (
            {"num_return_sequences": 2, "continuations": [" a"] * 3, "chain": SAMPLING},
            r"2 prompts with num_return_sequences = 2 but 3 continuations: give 2 continuations per prompt \(4\)",
        ),
        ({"continuations": [" a", 3.5]}, r"continuations\[1\] is a float: give text or token ids"),
        ({"chunk_size": 0}, r"chunk_size = 0: give a number of tokens >= 1"),
        ({"continuations": [" a"] * 3, "logprobs_at": ["raw"] * 3}, r"2 prompts but 3 continuations"),
        ({"continuations": [" a"] * 3, "chain": ["preset:greedy"] * 3}, r"2 prompts but 3 continuations"),
        ({"prompts": [[], [1, 2]]}, r"prompts\[0\] is empty: give at least one token"),
        ({"prompts": [], "continuations": []}, r"continuations is missing"),
        ({"continuations": [torch.tensor([True, False]), " b"]}, r"continuations\[0\] is a Tensor: give text or"),
        ({"prompts": [[1, 10**6], [2]]}, r"prompt 0 has token id 1000000 at position 1: not a token of the model"),
    ],
)
def test_bad_input_is_one_config_error(tiny, kwargs, message):
    model, tok = tiny
    args = {"prompts": PROMPTS[:2], "continuations": [" a", " b"], "chain": "preset:greedy"} | kwargs
    with pytest.raises(ConfigError, match=message):
        score(model, tok, **args)


def test_prompts_as_token_ids_score_as_text(tiny):
    model, tok = tiny
    ids = [tok(p)["input_ids"] for p in PROMPTS[:2]]
    rows = [[11, 12, 13], torch.tensor([7, 8])]
    by_text = score(model, tok, PROMPTS[:2], rows, chain="preset:greedy", pad_token_id=0)
    by_ids = score(model, tok, ids, rows, chain="preset:greedy", pad_token_id=0)
    assert isinstance(by_ids, ScoreOutput)
    for b in range(2):
        assert torch.equal(by_text.logprobs[b], by_ids.logprobs[b])


# ----------------------------------------------------------------- llama.cpp
@pytest.fixture(scope="module")
def smollm(open_gguf):
    """SmolLM2 on llama.cpp with flash attention: a multi-token decode gives one-token steps' logits bit for bit."""
    return open_gguf(n_ctx=512, flash_attn=True)


@pytest.mark.llama_cpp
@pytest.mark.slow
@pytest.mark.parametrize("guided", [False, True], ids=["plain", "cfg"])
def test_on_llama_cpp_a_generation_scores_kept_with_its_logprobs(smollm, guided):
    """Also under classifier-free guidance (a negative prompt per row: a second llama.cpp context beside the
    prompts')."""
    model, tok = smollm
    prompts = ["The capital of France is", "def add(a, b):"]
    kwargs: dict = {"chain": SAMPLING, "seed": 5}
    if guided:
        kwargs = {"chain": {"samplers": [{"use": "cfg", "scale": 2.0}, *SAMPLING["samplers"]]}, "seed": 5}
        kwargs["negative_prompt"] = ["The capital of Spain is", "x = 1"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = generate(model, tok, prompts, max_new_tokens=10, **kwargs)
        rows = generated(out)
        got = score(model, tok, prompts, rows, **kwargs)
    for b, row in enumerate(rows):
        assert bool(got.kept[b].all()), got.kept[b]
        assert torch.equal(got.logprobs[b], out.logprobs[b, : len(row)])


@pytest.mark.llama_cpp
@pytest.mark.slow
def test_on_llama_cpp_a_continuation_of_64_tokens_or_more_scores_in_one_pass_as_generated(smollm):
    """A continuation past 64 tokens, scored in one pass, which llama.cpp's float16 KV cache would run through
    another attention kernel than the generation's steps: the runner's passes keep the steps' logits."""
    model, tok = smollm
    prompts, kwargs = ["Tell me a long story."], {"chain": SAMPLING, "seed": 8, "ignore_eos": True}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = generate(model, tok, prompts, max_new_tokens=90, **kwargs)
        rows = generated(out)
        got = score(model, tok, prompts, rows, **kwargs)
    assert len(rows[0]) == 90
    assert bool(got.kept[0].all()), got.kept[0]
    assert torch.equal(got.logprobs[0], out.logprobs[0, :90])


def test_a_chains_draft_table_and_guards_do_not_touch_scoring(tiny):
    """score() checks given tokens: a chain's [draft] (mode rejection, which refuses raw logprobs in generation)
    and its guards (which read text, so need a tokenizer) are left unused."""
    model, tok = tiny
    chain = Chain.load(
        {
            "samplers": [{"use": "top_k", "k": 20}, {"use": "dist"}],
            "draft": {"use": "prompt_lookup", "mode": "rejection"},
            "guards": [{"use": "banned_strings", "phrases": ["zzz"]}],
        }
    )
    out = generate(model, tok, PROMPTS[:2], chain=chain, seed=3, max_new_tokens=8, pad_token_id=0, draft=False)
    rows = generated(out)
    raw = score(model, tok, PROMPTS[:2], rows, chain=chain, seed=3, pad_token_id=0, logprobs_at="raw")
    assert [bool(k.all()) for k in raw.kept] == [True, True]
    ids = [tok.encode(p) for p in PROMPTS[:2]]
    no_tokenizer = score(model, None, ids, rows, chain=chain, seed=3, pad_token_id=0, eos_token_id=0)
    assert [bool(k.all()) for k in no_tokenizer.kept] == [True, True]
