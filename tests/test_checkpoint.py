"""Sampler-state checkpoints: a generation stopped at step k, saved as JSON, restored in a new process and continued
gives exactly the tokens of the uninterrupted run, for every kind of per-request state (penalty windows, DRY
history, mirostat mu, adaptive-p EMA, RNG positions, grammar matchers). And a cloned request keeps all of its state
(llama.cpp's mirostat, penalties and adaptive-p clones lose theirs)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

from samplechain import Chain, ConfigError, RequestError
from samplechain.generation import CHECKPOINT_FORMAT, Generation, generate, stream
from samplechain.generation.checkpoints import CHECKPOINT_KEYS
from samplechain.models import tiny_model_path

PROMPTS = ["The function", "A list is a", "In Python,"]
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}},
    "required": ["name"],
    "additionalProperties": False,
}

# every kind of per-request state; row 2 has no seed: its fresh seed must travel in the checkpoint
CASES: dict[str, dict] = {
    "penalties": {
        "chain": {
            "samplers": [
                {"use": "penalties", "repeat": 1.5, "frequency": 0.4, "presence": 0.3, "last_n": 6},
                {"use": "temperature", "t": 0.9},
                {"use": "dist"},
            ]
        }
    },
    "dry": {
        "chain": {
            "samplers": [
                {"use": "dry", "multiplier": 2.0, "allowed_length": 1, "penalty_last_n": 24},
                {"use": "top_k", "k": 30},
                {"use": "dist"},
            ]
        }
    },
    "mirostat": {
        "chain": {"samplers": [{"use": "temperature", "t": 0.9}, {"use": "mirostat", "tau": 3.0, "eta": 0.3}]}
    },
    "mirostat_v2": {"chain": {"samplers": [{"use": "mirostat_v2", "tau": 3.0, "eta": 0.3}]}},
    "adaptive_p": {
        "chain": {"samplers": [{"use": "min_p", "p": 0.01}, {"use": "adaptive_p", "target": 0.3, "decay": 0.8}]}
    },
    "grammar": {"chain": {"samplers": [{"use": "grammar", "json_schema": json.dumps(SCHEMA)}, {"use": "dist"}]}},
    "dist": {
        "chain": {
            "samplers": [
                {"use": "top_k", "k": 40},
                {"use": "top_p", "p": 0.9},
                {"use": "temperature", "t": 0.8},
                {"use": "dist"},
            ]
        },
        "kwargs": {"num_return_sequences": 2},
    },
    "llama.cpp": {"chain": "preset:llama.cpp", "kwargs": {"stop_strings": ["."]}},
    "cfg": {
        "chain": {"samplers": [{"use": "cfg", "scale": 1.5}, {"use": "top_k", "k": 20}, {"use": "dist"}]},
        "kwargs": {"negative_prompt": "Error"},
    },
}
STEPS, STOP_AT = 12, 5  # max_new_tokens, the step the checkpoint is taken after


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_path())


@pytest.fixture(scope="module")
def model():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_path()).eval()


def prepared(model, tok, chain, **kwargs) -> Generation:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Generation(model, tok, PROMPTS, chain=chain, max_new_tokens=STEPS, **kwargs)


def run_to(gen: Generation, k: int):
    """Advance a generation by k steps (the generator stays open, so it can go on afterwards)."""
    it = gen.steps()
    for _ in range(k):
        next(it)
    return it


def resume(model, tok, ckpt, chain, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return generate(model, tok, resume=ckpt, chain=chain, max_new_tokens=STEPS, **kwargs)


# ----------------------------------------------------------------- the new-process round trip
RESUME_SCRIPT = textwrap.dedent("""
    import json, sys, warnings
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from samplechain.generation import generate
    from samplechain.models import tiny_model_path

    warnings.simplefilter("ignore")
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path()).eval()
    tok = AutoTokenizer.from_pretrained(tiny_model_path())
    results = {}
    for job in json.loads(open(sys.argv[1]).read()):
        out = generate(model, tok, resume=job["checkpoint"], chain=job["chain"], max_new_tokens=job["steps"],
                       **job["kwargs"])
        results[job["name"]] = {"sequences": out.sequences.tolist(), "finish_reasons": out.finish_reasons,
                                "logprobs": out.logprobs.tolist(), "num_generated": out.num_generated.tolist()}
    print(json.dumps(results))
""")


@pytest.mark.slow
def test_resumed_in_a_new_process_gives_the_uninterrupted_tokens(model, tok, tmp_path):
    jobs, expected = [], {}
    for name, case in CASES.items():
        kwargs = dict(case.get("kwargs", {}))
        kwargs.setdefault("params", [{"seed": 11}, {"seed": 12}, {}])
        gen = prepared(model, tok, case["chain"], **kwargs)
        it = run_to(gen, STOP_AT)
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(gen.checkpoint(), allow_nan=False))
        assert not all(gen.finished.tolist()), f"{name}: every row finished before the checkpoint; nothing to resume"
        for _ in it:  # the same run, uninterrupted
            pass
        out = gen.output()
        assert out.sequences.shape[1] > gen.setup.prompt_length + STOP_AT, f"{name}: nothing after the checkpoint"
        expected[name] = {
            "sequences": out.sequences.tolist(),
            "finish_reasons": out.finish_reasons,
            "logprobs": out.logprobs.tolist(),
            "num_generated": out.num_generated.tolist(),
        }
        # what the original run is given again on resume: the chain and criteria, not prompts / params / seeds
        again = {k: v for k, v in case.get("kwargs", {}).items() if k in ("stop_strings",)}
        jobs.append({"name": name, "chain": case["chain"], "checkpoint": str(path), "steps": STEPS, "kwargs": again})
    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    (tmp_path / "resume.py").write_text(RESUME_SCRIPT)
    done = subprocess.run(
        [sys.executable, str(tmp_path / "resume.py"), str(tmp_path / "jobs.json")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    for name in CASES:
        assert got[name] == expected[name], name


def test_checkpoint_holds_sampler_state_and_unseeded_rows_their_drawn_seed(model, tok):
    gen = prepared(model, tok, CASES["mirostat"]["chain"], params=[{"seed": 1}, {"seed": 2}, {}])
    run_to(gen, 3)
    ckpt = json.loads(json.dumps(gen.checkpoint(), allow_nan=False))
    assert ckpt["format"] == CHECKPOINT_FORMAT and ckpt["step"] == 3
    rows = ckpt["store"]
    assert [rows[r]["position"] for r in ckpt["request_ids"]] == [3, 3, 3]
    assert all(rows[r]["state"]["mirostat.started"] for r in rows)  # mu has moved off its initial value
    assert rows["2"]["params"]["mirostat.seed"] == gen.store.snapshot()["2"]["params"]["mirostat.seed"] is not None
    assert len(ckpt["generated"][0]) == 3 and ckpt["input_ids"] == gen.input_ids[:, : gen.setup.prompt_length].tolist()


@pytest.mark.parametrize("name", ["penalties", "adaptive_p", "cfg"])
def test_checkpoint_of_a_resumed_run_equals_the_uninterrupted_one(model, tok, name):
    case = CASES[name]
    kwargs = {"params": [{"seed": 1}, {"seed": 2}, {"seed": 3}], **case.get("kwargs", {})}
    gen = prepared(model, tok, case["chain"], **kwargs)
    it = run_to(gen, 3)
    early = gen.checkpoint()
    for _ in range(4):
        next(it)
    direct = gen.checkpoint()
    again = {k: v for k, v in kwargs.items() if k not in ("params", "negative_prompt")}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        resumed = Generation(model, tok, resume=early, chain=case["chain"], max_new_tokens=STEPS, **again)
    run_to(resumed, 4)
    later = resumed.checkpoint()
    for ckpt in (direct, later):
        del ckpt["elapsed"]
    assert later == direct


@pytest.mark.parametrize(
    "chain",
    ["preset:llama.cpp", ["preset:llama.cpp", CASES["mirostat"]["chain"], "preset:llama.cpp"]],
    ids=["one chain", "mixed chains"],
)
def test_resume_in_process_continues_every_row(model, tok, chain):
    gen = prepared(model, tok, chain, seed=5)
    it = run_to(gen, STOP_AT)
    ckpt = gen.checkpoint()
    for _ in it:
        pass
    full = gen.output()
    out = resume(model, tok, ckpt, chain)
    assert torch.equal(out.sequences, full.sequences)
    assert torch.equal(out.logprobs, full.logprobs)
    assert out.texts == full.texts and out.finish_reasons == full.finish_reasons


def test_resumed_stream_continues_the_text(model, tok):
    chain = CASES["dist"]["chain"]
    gen = prepared(model, tok, chain, seed=9)
    run_to(gen, 4)
    ckpt = gen.checkpoint()
    head = [tok.decode(row, skip_special_tokens=True) for row in ckpt["generated"]]
    result: list = []
    tails = ["" for _ in PROMPTS]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for event in stream(model, tok, resume=ckpt, chain=chain, max_new_tokens=STEPS, result=result):
            tails[event.index] += event.text
    assert [h + t for h, t in zip(head, tails)] == result[0].texts


def test_a_checkpoint_before_the_first_step_starts_the_same_run(model, tok):
    chain = CASES["adaptive_p"]["chain"]
    gen = prepared(model, tok, chain, params=[{"seed": 1}, {}, {"seed": 3}])
    ckpt = gen.checkpoint()
    assert ckpt["step"] == 0 and ckpt["generated"] == [[], [], []]
    for _ in gen.steps():
        pass
    assert torch.equal(resume(model, tok, ckpt, chain).sequences, gen.output().sequences)


def test_resuming_a_finished_generation_returns_it_without_running_the_model(model, tok):
    gen = prepared(model, tok, CASES["dist"]["chain"], seed=1)
    for _ in gen.steps():
        pass
    ckpt = gen.checkpoint()

    class NoForward:  # the model must not be called again
        config, device = model.config, model.device

        def __call__(self, *args, **kwargs):
            raise AssertionError("a finished generation ran the model")

    out = resume(NoForward(), tok, ckpt, CASES["dist"]["chain"])
    assert torch.equal(out.sequences, gen.output().sequences) and out.finish_reasons == gen.finish_reasons


def test_resume_with_another_chain_names_both(model, tok):
    gen = prepared(model, tok, CASES["mirostat"]["chain"], seed=1)
    run_to(gen, 2)
    with pytest.raises(ConfigError, match="chain of the interrupted run"):
        resume(model, tok, gen.checkpoint(), CASES["mirostat_v2"]["chain"])


def test_resume_refuses_prompts_params_and_foreign_data(model, tok, tmp_path):
    gen = prepared(model, tok, CASES["dist"]["chain"], seed=1)
    ckpt = gen.checkpoint()
    with pytest.raises(ConfigError, match="drop prompts, seed"):
        Generation(model, tok, "x", resume=ckpt, seed=3, chain=CASES["dist"]["chain"])
    with pytest.raises(ConfigError, match="format"):
        Generation(model, tok, resume={**ckpt, "format": "other/9"}, chain=CASES["dist"]["chain"])
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="cannot read a checkpoint"):
        Generation(model, tok, resume=bad, chain=CASES["dist"]["chain"])
    with pytest.raises(ConfigError, match="beam search"):
        generate(model, tok, resume=ckpt, num_beams=2)


def test_the_checkpoint_holds_the_keys_resume_reads_and_the_optional_ones_may_be_missing(model, tok):
    chain = CASES["dist"]["chain"]
    gen = prepared(model, tok, chain, seed=1)
    run_to(gen, 2)
    ckpt = gen.checkpoint()
    assert tuple(ckpt) == CHECKPOINT_KEYS
    older = {k: v for k, v in ckpt.items() if k not in ("stop_matches", "elapsed", "unconditional", "speculation")}
    assert torch.equal(resume(model, tok, older, chain).sequences, resume(model, tok, ckpt, chain).sequences)


@pytest.mark.parametrize(
    ("where", "value", "message"),
    [
        (("step",), None, r"checkpoint\['step'\] = None: expected the number of steps run"),
        (("elapsed",), -1, r"checkpoint\['elapsed'\] = -1: expected the seconds run so far"),
        (("input_ids", 1, 0), "x", r"checkpoint\['input_ids'\]\[1\]\[0\] = 'x': expected token ids"),
        (("attention_mask", 0, 0), 2, r"checkpoint\['attention_mask'\]\[0\]\[0\] = 2: expected 0 or 1"),
        (("generated", 2), [1], r"checkpoint\['generated'\]\[2\] = \[1\]: expected a list of 2 token ids"),
        (("logprobs", 0, 1), None, r"checkpoint\['logprobs'\]\[0\]\[1\] = None: expected logprobs"),
        (("num_generated", 1), 9, r"checkpoint\['num_generated'\]\[1\] = 9: expected a token count in \[0, 2\]"),
        (("stop_matches", 0), ["stop_strings"], r"expected null or \[reason, text, trailing characters\]"),
        (("eos_token_id",), 10**20, r"checkpoint\['eos_token_id'\] = 100000000000000000000: expected a token id"),
        (("store", "1", "position"), "x", r"request '1': position = 'x': expected the request's RNG position"),
        (("store", "0", "state"), 3, r"request '0': state = 3: expected a table of states"),
    ],
)
def test_a_damaged_checkpoint_is_one_error_naming_the_damaged_place(model, tok, where, value, message):
    chain = CASES["dist"]["chain"]
    gen = prepared(model, tok, chain, seed=1)
    run_to(gen, 2)
    ckpt = json.loads(json.dumps(gen.checkpoint()))
    place = ckpt
    for key in where[:-1]:
        place = place[key]
    place[where[-1]] = value
    with pytest.raises((ConfigError, RequestError), match=message):
        resume(model, tok, ckpt, chain)
    missing = {k: v for k, v in ckpt.items() if k != "finished"}
    with pytest.raises(ConfigError, match=r"the checkpoint has no finished; the checkpoint is damaged"):
        resume(model, tok, missing, chain)


def test_randomly_damaged_checkpoints_resume_or_raise_one_samplechain_error(model, tok):
    """Any one value of a speculative, guarded checkpoint replaced by junk (or a key dropped): the resume either
    runs or raises ConfigError / RequestError, never an exception from deep inside the restore or the first step."""
    chain = "preset:llama.cpp"
    kwargs = {"draft": "prompt_lookup", "guards": [{"use": "banned_strings", "phrases": ["zzz"]}]}
    gen = prepared(model, tok, chain, seed=3, **kwargs)
    run_to(gen, 3)
    ckpt = json.loads(json.dumps(gen.checkpoint()))
    places: list[tuple] = []

    def walk(x, path):
        places.append(path)
        items = x.items() if isinstance(x, dict) else enumerate(x[:3]) if isinstance(x, list) else ()
        for k, v in items:
            walk(v, (*path, k))

    walk(ckpt, ())
    rng = random.Random(0)
    junk = [None, -1, "x", [1, 2], 10**20, 1.5, {}]
    for _ in range(150):
        damaged = json.loads(json.dumps(ckpt))
        path = rng.choice(places[1:])
        place = damaged
        for key in path[:-1]:
            place = place[key]
        if isinstance(place, dict) and rng.random() < 0.2:
            del place[path[-1]]
        else:
            place[path[-1]] = rng.choice(junk)
        try:
            resume(model, tok, damaged, chain, **kwargs)
        except (ConfigError, RequestError):
            pass


def test_resume_reads_a_json_file(model, tok, tmp_path):
    chain = CASES["mirostat_v2"]["chain"]
    gen = prepared(model, tok, chain, seed=4)
    it = run_to(gen, 2)
    path = tmp_path / "ckpt.json"
    path.write_text(json.dumps(gen.checkpoint()))
    for _ in it:
        pass
    assert torch.equal(resume(model, tok, path, chain).sequences, gen.output().sequences)


# ----------------------------------------------------------------- clones keep everything
CLONE_CHAINS = {
    "mirostat": [{"use": "mirostat", "tau": 3.0, "eta": 0.5, "m": 20, "seed": 3}],
    "mirostat_v2": [{"use": "mirostat_v2", "tau": 3.0, "eta": 0.5, "seed": 3}],
    "penalties": [
        {"use": "penalties", "repeat": 2.0, "frequency": 1.0, "presence": 1.0, "last_n": 16},
        {"use": "dist", "seed": 3},
    ],
    "adaptive_p": [{"use": "adaptive_p", "target": 0.2, "decay": 0.7, "seed": 3}],
    "dry": [
        {"use": "dry", "multiplier": 3.0, "allowed_length": 1, "breakers": [], "breaker_ids": [[0]]},
        {"use": "dist", "seed": 3},
    ],
}
V = 48


def step_logits(step: int) -> torch.Tensor:
    return torch.randn(1, V, generator=torch.Generator().manual_seed(1000 + step))


def continue_rows(chain: Chain, store, rows: dict[str, list[int]], steps: range) -> None:
    """Every row in one batch, each on the same logits per step, its own history; tokens appended to rows."""
    ids = list(rows)
    for step in steps:
        logits = step_logits(step).expand(len(ids), V).contiguous()
        history = torch.tensor([rows[r] for r in ids])
        out = chain.sample(logits, store, ids, history=history, prompt_lengths=torch.full((len(ids),), 3))
        for r, t in zip(ids, out.token_ids.tolist()):
            rows[r].append(t)


@pytest.mark.parametrize("name", list(CLONE_CHAINS))
def test_clone_keeps_all_state_and_continues_as_the_parent(name):
    chain = Chain.load({"samplers": CLONE_CHAINS[name]})
    store = chain.new_store()
    store.add("parent")
    rows = {"parent": [5, 6, 7]}
    continue_rows(chain, store, rows, range(6))
    initial = chain.new_store()
    initial.add("fresh")
    parent = store.snapshot(["parent"])["parent"]
    if parent["state"]:  # a state-column sampler: its state has moved off the initial value
        assert parent["state"] != initial.snapshot()["fresh"]["state"]
    store.clone("parent", "child")
    assert store.snapshot(["child"])["child"] == parent  # params, RNG position and every state value

    # the reference: the parent alone, never cloned
    ref_store = chain.new_store()
    ref_store.add("parent")
    ref = {"parent": [5, 6, 7]}
    continue_rows(chain, ref_store, ref, range(14))
    rows["child"] = list(rows["parent"])
    continue_rows(chain, store, rows, range(6, 14))
    assert rows["child"] == rows["parent"] == ref["parent"]
    assert store.snapshot(["child"])["child"] == store.snapshot(["parent"])["parent"]

    # a clone that loses its state as llama.cpp's do (initial mu / EMA, an empty penalty window) goes elsewhere,
    # so the equalities above are the state's doing
    if parent["state"]:
        lost_store = chain.new_store()
        lost_store.restore({"lost": {**parent, "state": initial.snapshot()["fresh"]["state"]}})
        lost = {"lost": [5, 6, 7]}
        continue_rows(chain, lost_store, lost, range(6, 14))
        assert lost["lost"][3:] != ref["parent"][9:]
    else:  # the state is the token history: without it, the penalties of the clone's next step change

        def scores(history: list[int]) -> torch.Tensor:
            return chain.process(
                step_logits(6), ref_store, ["parent"], history=torch.tensor([history]), prompt_lengths=torch.tensor([3])
            )

        assert not torch.equal(scores(ref["parent"][:9]), scores(ref["parent"][:3]))


def test_the_two_constructors_start_from_prompts_and_continue_a_checkpoint(model, tok):
    chain = CASES["dist"]["chain"]
    params = [{"seed": 1}, {"seed": 2}, {"seed": 3}]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gen = Generation.from_prompts(model, tok, PROMPTS, chain=chain, max_new_tokens=STEPS, params=params)
        it = run_to(gen, 2)
        ckpt = gen.checkpoint()
        for _ in it:
            pass
        resumed = Generation.from_checkpoint(model, tok, ckpt, chain=chain, max_new_tokens=STEPS)
        for _ in resumed.steps():
            pass
    assert torch.equal(resumed.output().sequences, gen.output().sequences)
    with pytest.raises(ConfigError, match=r"from_prompts\(resume=...\): continue a checkpoint with"):
        Generation.from_prompts(model, tok, PROMPTS, chain=chain, resume=ckpt)
