"""Every way speculation is turned on outside the loop itself: a chain's `[draft]` table (checked when the chain
loads, kept through its round trips), `draft=` per prompt and over a chain's table, `--draft` on the command line,
and transformers' assisted generation around samplechain's logits processor and custom_generate adapter."""

from __future__ import annotations

import copy
import io
import json
import re
import warnings

import pytest
import torch

from samplechain import Chain, ConfigError, UnknownPluginError, load_config
from samplechain.cli import main
from samplechain.generation import Generation, generate
from samplechain.generation.speculative import Speculation
from samplechain.integrations.convert import chain_to_dict, to_toml
from samplechain.models import tiny_model_path

transformers = pytest.importorskip("transformers")

SAMPLERS = [{"use": "top_k", "k": 20}, {"use": "dist"}]
TOML = """[chain]
name = "lookup"
samplers = [{ use = "top_k", k = 20 }, { use = "dist" }]

[draft]
use = "prompt_lookup"
num_tokens = 4
"""
QUOTING = "The list is: apple, pear, plum. Again: apple, pear, plum. Again: apple,"
CODE = "def add(a, b):\n    return a + b\n\ndef add(a, b):"


@pytest.fixture(scope="module")
def tiny():
    path = tiny_model_path()
    model = transformers.AutoModelForCausalLM.from_pretrained(path, local_files_only=True).eval()
    return model, transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)


@pytest.fixture
def drafters(monkeypatch):
    """What Speculation.prepare hands the speculation: one drafter (or None) per row, in request order."""
    seen: dict = {}

    def record(self, drafters, gen, **kwargs):
        seen["drafters"], seen["rows"] = list(drafters), list(gen.request_ids)

    monkeypatch.setattr(Speculation, "__init__", record)
    return seen


# ----------------------------------------------------------------- the [draft] table
def test_the_draft_table_beside_the_chain_or_in_it(tmp_path):
    path = tmp_path / "lookup.toml"
    path.write_text(TOML, encoding="utf-8")
    assert load_config(path).draft == {"use": "prompt_lookup", "num_tokens": 4}
    assert Chain.load(path).config.draft == {"use": "prompt_lookup", "num_tokens": 4}
    flat = load_config({"samplers": SAMPLERS, "draft": {"use": "prompt_lookup.v1", "max_ngram": 2}})
    assert flat.draft == {"use": "prompt_lookup.v1", "max_ngram": 2}
    assert load_config({"chain": {"samplers": SAMPLERS, "draft": "prompt_lookup"}}).draft == {"use": "prompt_lookup"}
    assert load_config({"samplers": SAMPLERS}).draft is None


@pytest.mark.parametrize(
    ("draft", "message"),
    [
        ('use = "prompt_lookpu"', r"draft\.use = 'prompt_lookpu': unknown drafter.*did you mean 'prompt_lookup'"),
        ('use = "prompt_lookup"\nnum_tokens = 0', r"draft\.num_tokens = 0: must be in \[1, inf\)"),
        ('use = "prompt_lookup"\nnum_token = 4', r"draft\.num_token = 4: unknown parameter.*did you mean 'num_tokens'"),
        ('use = "prompt_lookup"\nnum_tokens = "8"', r"draft\.num_tokens = '8': expected an integer"),
        ('use = "prompt_lookup"\nmin_ngram = 4\nmax_ngram = 2', r"draft: drafter prompt_lookup: min_ngram \(= 4\)"),
        ("num_tokens = 4", r"draft\.use: required: the drafter's name, e\.g\. a \[draft\] table"),
        ('use = "prompt_lookup"\ncost = -1', r"draft\.cost = -1: a number >= 0, what checking one drafted token"),
        ('use = "prompt_lookup"\ncost = "low"', r"draft\.cost = 'low': a number >= 0"),
    ],
)
def test_a_bad_draft_table_is_one_error_naming_its_key(draft, message):
    text = TOML.split("[draft]")[0] + "[draft]\n" + draft + "\n"
    with pytest.raises(ConfigError, match=f"^chain.toml: {message}") as caught:
        load_config(text, name="chain.toml")
    assert "\n" not in str(caught.value)


def test_a_draft_that_is_no_table_or_given_twice_is_refused():
    with pytest.raises(ConfigError, match=r"chain\.draft = 3: expected a drafter's name or table"):
        load_config({"chain": {"samplers": SAMPLERS, "draft": 3}})
    with pytest.raises(ConfigError, match=r"draft: given twice, as \[draft\] and as chain\.draft; keep one"):
        load_config({"chain": {"samplers": SAMPLERS, "draft": "prompt_lookup"}, "draft": {"use": "prompt_lookup"}})
    with pytest.raises(ConfigError, match=r"drafts: unknown table; .*\[chain\] and optionally \[draft\].*'draft'"):
        load_config(TOML.replace("[draft]", "[drafts]"))


def test_a_rejection_table_on_a_chain_whose_selector_draws_its_own_way_is_refused_when_it_loads():
    chain = {"samplers": [{"use": "temperature", "t": 0.8}, {"use": "mirostat", "tau": 5.0}]}
    with pytest.raises(ConfigError, match=r"draft\.mode = 'rejection': the chain's selector mirostat\.v1 chooses"):
        load_config({"chain": chain, "draft": {"use": "prompt_lookup", "mode": "rejection"}})
    for selector in ({"use": "dist"}, {"use": "greedy"}):  # rejection's test, or the match it is on greedy
        load_config({"chain": {"samplers": [selector]}, "draft": {"use": "prompt_lookup", "mode": "rejection"}})


def test_the_draft_table_survives_dict_and_toml_round_trips():
    chain = Chain.load(TOML)
    as_dict = chain_to_dict(chain)
    assert as_dict["draft"] == {"use": "prompt_lookup", "num_tokens": 4}
    assert Chain.load(as_dict).config.draft == chain.config.draft
    assert Chain.load(to_toml(chain)).config.draft == chain.config.draft
    assert "draft" not in chain_to_dict(Chain.load({"samplers": SAMPLERS}))


# ----------------------------------------------------------------- which rows draft with what
def test_the_chain_table_drafts_unless_draft_is_given_or_false(tiny, drafters):
    model, tok = tiny
    Generation(model, tok, [QUOTING, CODE], chain=TOML, num_return_sequences=2, pad_token_id=0)
    rows = drafters["drafters"]
    assert len(rows) == 4 and all(d is rows[0] for d in rows), "one drafter shared by every row"
    assert rows[0].name == "prompt_lookup" and rows[0].params.num_tokens == 4
    Generation(model, tok, [QUOTING], chain=TOML, draft={"use": "prompt_lookup", "num_tokens": 7}, pad_token_id=0)
    assert drafters["drafters"][0].params.num_tokens == 7  # draft= wins over the chain's table
    assert Generation(model, tok, [QUOTING], chain=TOML, draft=False, pad_token_id=0).speculation is None
    assert Generation(model, tok, [QUOTING], chain={"samplers": SAMPLERS}, pad_token_id=0).speculation is None


def test_a_mixed_batch_drafts_with_each_prompts_chain(tiny, drafters):
    model, tok = tiny
    other = {"samplers": SAMPLERS, "draft": {"use": "prompt_lookup", "max_ngram": 2}}
    chains = [TOML, {"samplers": SAMPLERS}, other, TOML]
    Generation(model, tok, [QUOTING, CODE, "In Python,", CODE], chain=chains, pad_token_id=0)
    first, none, second, again = drafters["drafters"]
    assert none is None and first is again and first is not second
    assert (first.params.num_tokens, second.params.max_ngram) == (4, 2)


def test_draft_lists_one_drafter_per_prompt(tiny, drafters):
    model, tok = tiny
    prompts = [QUOTING, CODE, "In Python,"]
    draft = ["prompt_lookup", None, {"use": "prompt_lookup"}]
    Generation(model, tok, prompts, chain={"samplers": SAMPLERS}, draft=draft, num_return_sequences=2, pad_token_id=0)
    rows = drafters["drafters"]
    assert drafters["rows"] == ["0.0", "0.1", "1.0", "1.1", "2.0", "2.1"]
    assert rows[2] is None and rows[3] is None
    assert all(d is rows[0] for d in (rows[1], rows[4], rows[5])), "the same drafter and parameters: one object"
    assert Generation(model, tok, prompts, chain=TOML, draft=[None, False, None], pad_token_id=0).speculation is None


def test_a_bad_draft_list_names_the_prompt(tiny):
    model, tok = tiny
    with pytest.raises(ConfigError, match=r"draft= lists 1 drafters for 2 prompts: give one per prompt"):
        Generation(model, tok, [QUOTING, CODE], draft=["prompt_lookup"], pad_token_id=0)
    with pytest.raises(UnknownPluginError, match=r"^draft\[1\] \(prompt 1\): unknown drafter 'prompt_lookpu'"):
        Generation(model, tok, [QUOTING, CODE], draft=[None, "prompt_lookpu"], pad_token_id=0)


def test_the_chain_table_is_left_unused_by_beam_search_and_drafts_under_guidance(tiny):
    model, tok = tiny
    greedy = Chain.load({"samplers": [{"use": "greedy"}], "draft": "prompt_lookup"})
    beams = generate(model, tok, QUOTING, chain=greedy, num_beams=2, max_new_tokens=6, pad_token_id=0)
    assert beams.drafted is None
    guided = {"samplers": [{"use": "cfg", "scale": 1.5}, {"use": "greedy"}]}
    kwargs = {"negative_prompt": "Bye", "max_new_tokens": 16, "pad_token_id": 0}
    plain = generate(model, tok, QUOTING, chain=guided, **kwargs)
    table = generate(model, tok, QUOTING, chain=guided | {"draft": "prompt_lookup"}, **kwargs)
    assert table.drafted is not None and table.sequences.tolist() == plain.sequences.tolist()


def test_the_chain_table_and_draft_lists_keep_the_tokens(tiny):
    model, tok = tiny
    prompts = [QUOTING, CODE]
    kwargs = {"seed": 3, "max_new_tokens": 16, "pad_token_id": 0}
    plain = generate(model, tok, prompts, chain={"samplers": [{"use": "greedy"}]}, **kwargs)
    table = generate(model, tok, prompts, chain={"samplers": [{"use": "greedy"}], "draft": "prompt_lookup"}, **kwargs)
    listed = generate(
        model, tok, prompts, chain={"samplers": [{"use": "greedy"}]}, draft=[None, "prompt_lookup"], **kwargs
    )
    for out in (table, listed):
        assert out.sequences.tolist() == plain.sequences.tolist()
        assert out.drafted is not None and out.drafted.shape == (2,)
    assert int(table.drafted.sum()) > 0
    assert int(listed.drafted[0]) == 0


# ----------------------------------------------------------------- the command line
def cli(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_generate_with_draft_prints_the_same_text_and_the_counts(capsys, tmp_path):
    model = str(tiny_model_path())
    args = ("generate", QUOTING, "--model", model, "--max-new-tokens", "16", "--seed", "5", "--no-progress")
    code, plain, err = cli(capsys, *args)
    assert code == 0 and "drafted" not in err
    code, drafted, err = cli(capsys, *args, "--draft", "prompt_lookup")
    assert code == 0 and drafted == plain
    assert "drafted " in err and ", kept " in err and " model calls" in err
    code, table, _ = cli(capsys, *args, "--draft", '{"use": "prompt_lookup", "num_tokens": 3}')
    assert code == 0 and table == plain
    code, out, _ = cli(capsys, *args, "--draft", "prompt_lookup", "--json")
    row = json.loads(out)["outputs"][0]
    assert plain == QUOTING + row["text"] + "\n"
    assert row["model_calls"] <= 16 and row["kept"] <= row["drafted"]
    chain = tmp_path / "lookup.toml"
    chain.write_text(TOML, encoding="utf-8")
    code, _, err = cli(capsys, *args, "--chain", str(chain))
    assert code == 0 and "drafted " in err  # the chain's [draft] table
    code, _, err = cli(capsys, *args, "--chain", str(chain), "--no-draft")
    assert code == 0 and "drafted" not in err


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--draft", "prompt_lookpu"], r"--draft prompt_lookpu: unknown drafter 'prompt_lookpu'"),
        (
            ["--draft", '{"use": "prompt_lookup", "num_tokens": 0, "max_ngram": 0}'],
            r"^error: --draft \{.*\}: draft\[prompt_lookup\]\.num_tokens = 0: must be in \[1, inf\) \(the longest draft\)"
            r" draft\[prompt_lookup\]\.max_ngram = 0: must be",
        ),
        (["--draft", "[1,2]"], r"--draft \[1,2\]: '\[1,2\]' is not a valid drafter name: .* e\.g\. prompt_lookup or"),
        (["--draft", '{"use": "prompt_lookup",'], r"not valid JSON .*--draft prompt_lookup"),
        (["--draft", '{"use": "prompt_lookup", "mode": "rejecton"}'], r"--draft .*draft\.mode = 'rejecton'"),
        (["--draft", '{"use": "prompt_lookup", "cost": -1}'], r"--draft .*draft\.cost = -1"),
        (["--draft", "prompt_lookup", "--num-beams", "2"], r"--draft with --num-beams 2: beam search does not draft"),
        (["--num-beams", "0"], r"--num-beams 0: must be an integer >= 1"),
    ],
)
def test_a_bad_draft_option_is_one_error_before_the_model_loads(capsys, monkeypatch, options, message):
    import samplechain.cli.generate as cli_generate

    def no_model(*args):
        raise AssertionError("the model loads after the drafter is checked")

    monkeypatch.setattr(cli_generate, "load_cli_model", no_model)
    code, _, err = cli(capsys, "generate", "Hi", *options)
    assert code == 1 and err.startswith("error: ")
    assert re.search(message, " ".join(err.split()))


def test_chat_with_draft_answers_the_same(capsys, monkeypatch, tmp_path):
    folder = tmp_path / "tiny-chat"
    folder.mkdir()
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        (folder / name).symlink_to(tiny_model_path() / name)
    tok = transformers.AutoTokenizer.from_pretrained(tiny_model_path())
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    tok.save_pretrained(folder)
    answers = []
    for extra in ((), ("--draft", "prompt_lookup")):
        monkeypatch.setattr("sys.stdin", io.StringIO(QUOTING + "\n"))
        code, out, err = cli(capsys, "chat", "--model", str(folder), "--seed", "7", "--max-new-tokens", "12", *extra)
        assert code == 0
        answers.append(out)
    assert answers[0] == answers[1]
    assert "drafted " in err


# ----------------------------------------------------------------- inside transformers' model.generate
ASSISTED = "transformers' assisted generation.*samplechain\\.generation\\.generate\\(model, tokenizer, prompts"


@pytest.mark.transformers_parity
def test_the_logits_processor_refuses_transformers_assisted_generation(tiny):
    from samplechain.integrations import as_logits_processor

    model, tok = tiny
    enc = tok([QUOTING], return_tensors="pt")
    for assisted in ({"prompt_lookup_num_tokens": 3}, {"assistant_model": model}):
        processor = as_logits_processor("preset:llama.cpp", seed=1)
        with pytest.raises(ConfigError, match=ASSISTED):
            model.generate(**enc, logits_processor=processor, do_sample=False, max_new_tokens=8, **assisted)
        assert processor[0].store is None  # the next plain call starts a generation of its own
    processor = as_logits_processor("preset:llama.cpp", seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers' deprecation notes
        out = model.generate(**enc, logits_processor=processor, do_sample=False, max_new_tokens=8)
    assert out.shape[1] == enc["input_ids"].shape[1] + 8


@pytest.mark.transformers_parity
def test_refusing_assistant_early_exit_leaves_the_model_whole(tiny):
    """transformers' early-exit candidates cut the model to its first layers for the draft and set it back after;
    the refusal comes from the loop's call, not from inside the candidates, so the model keeps every layer."""
    from samplechain.integrations import as_logits_processor
    from samplechain.tools.tiny_models import tiny_llama

    model, tok = tiny_llama(), tiny[1]
    enc = tok([QUOTING], return_tensors="pt")
    kwargs = {"do_sample": False, "max_new_tokens": 8, "pad_token_id": 0}
    before = model.generate(**enc, **kwargs)
    processor = as_logits_processor("preset:llama.cpp", seed=1)
    with pytest.raises(ConfigError, match="assistant_early_exit=.*" + ASSISTED[ASSISTED.index("samplechain") :]):
        model.generate(**enc, logits_processor=processor, assistant_early_exit=1, **kwargs)
    assert model.config.num_hidden_layers == 3
    assert torch.equal(model.generate(**enc, **kwargs), before)


@pytest.mark.transformers_parity
def test_the_stopping_criteria_refuse_transformers_assisted_generation(tiny):
    """Assisted generation adds several tokens a call and first calls the criteria past the prompt: they would
    count from the wrong prompt and miss stops between the tokens, so they refuse, pointing to generate()."""
    from samplechain.integrations import as_stopping_criteria

    model, tok = tiny
    enc = tok([QUOTING], return_tensors="pt")
    for assisted in ({"prompt_lookup_num_tokens": 3}, {"assistant_model": model}):
        criteria = as_stopping_criteria([{"use": "max_new_tokens", "n": 6}], tokenizer=tok, model=model)
        with pytest.raises(ConfigError, match="stopping criteria inside " + ASSISTED[ASSISTED.index("transformers") :]):
            model.generate(**enc, stopping_criteria=criteria, do_sample=False, max_new_tokens=20, **assisted)
    criteria = as_stopping_criteria([{"use": "max_new_tokens", "n": 6}], tokenizer=tok, model=model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers' deprecation notes
        out = model.generate(**enc, stopping_criteria=criteria, do_sample=False, max_new_tokens=20, pad_token_id=0)
    assert out.shape[1] == enc["input_ids"].shape[1] + 6


def synthid(model):
    """transformers' SynthID watermark processor: it keeps the contexts it has seen from call to call."""
    config = transformers.SynthIDTextWatermarkingConfig(keys=[654, 400, 836, 123, 340, 443, 597, 160], ngram_len=3)
    return config.construct_processor(model.config.vocab_size, torch.device("cpu"))


@pytest.mark.transformers_parity
@pytest.mark.parametrize("given", ["draft", "guards"])
@pytest.mark.parametrize("stateful", ["chain", "synthid"])
def test_a_stateful_logits_processor_is_refused_with_a_drafter_or_guards(tiny, given, stateful):
    from samplechain.integrations import as_logits_processor

    model, tok = tiny
    # as_logits_processor gives a LogitsProcessorList holding one ChainLogitsProcessor
    processor = as_logits_processor("preset:llama.cpp", seed=1)[0] if stateful == "chain" else synthid(model)
    name = type(processor).__name__
    taking_back = {"draft": "prompt_lookup", "guards": [{"use": "banned_strings", "phrases": ["pear"]}]}[given]
    message = f"{given}= with logits_processor={name}: it keeps its own state from call to call"
    with pytest.raises(ConfigError, match=message):
        generate(model, tok, [QUOTING, CODE], logits_processor=processor, pad_token_id=0, **{given: taking_back})
    processors = transformers.LogitsProcessorList([transformers.TemperatureLogitsWarper(0.5), processor])
    with pytest.raises(ConfigError, match=f"{given}= with logits_processor={name}"):  # found in a list too
        generate(model, tok, [QUOTING], logits_processor=processors, pad_token_id=0, **{given: taking_back})


@pytest.mark.transformers_parity
def test_custom_generate_watermarks_as_model_generate_and_refuses_it_with_assisted_generation(tiny):
    """transformers' SynthID watermark keeps the contexts it has seen, which drafted positions taken back would
    move on (measured: other tokens with prompt lookup than without): it runs in the loop without speculation, and
    with assisted generation it is one error in model.generate's terms."""
    from samplechain.integrations import as_custom_generate

    model, tok = tiny
    tok = copy.deepcopy(tok)
    tok.pad_token_id, tok.padding_side = 0, "left"
    batch = tok([QUOTING, CODE], return_tensors="pt", padding=True)
    config = transformers.SynthIDTextWatermarkingConfig(keys=[654, 400, 836, 123, 340, 443, 597, 160], ngram_len=3)
    kwargs = {"max_new_tokens": 16, "do_sample": False, "pad_token_id": 0}
    decode = as_custom_generate("preset:greedy", tokenizer=tok)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers' deprecation notes
        theirs = model.generate(**batch, watermarking_config=config, **kwargs)
        ours = model.generate(**batch, custom_generate=decode, watermarking_config=config, **kwargs)
        unmarked = model.generate(**batch, custom_generate=decode, **kwargs)
        assert torch.equal(ours, theirs) and not torch.equal(ours, unmarked)
        with pytest.raises(ConfigError, match=r"assisted generation and transformers' SynthIDTextWatermarkLogitsProc"):
            model.generate(
                **batch, custom_generate=decode, watermarking_config=config, prompt_lookup_num_tokens=4, **kwargs
            )


@pytest.mark.transformers_parity
def test_custom_generate_speculates_where_model_generate_asks_for_assisted_generation(tiny):
    from samplechain.integrations import as_custom_generate

    model, tok = tiny
    enc = tok([QUOTING], return_tensors="pt")
    decode = as_custom_generate("preset:llama.cpp", tokenizer=tok)
    kwargs = {"custom_generate": decode, "max_new_tokens": 12, "return_dict_in_generate": True, "seed": 3}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers' deprecation notes
        plain = model.generate(**enc, **kwargs)
        assert plain.drafted is None
        for assisted in ({"prompt_lookup_num_tokens": 3}, {"assistant_model": model}, {"assistant_early_exit": 1}):
            out = model.generate(**enc, **assisted, **kwargs)
            assert torch.equal(out.sequences, plain.sequences), assisted
            assert out.drafted is not None, assisted  # the speculative loop ran
            # the toy model's text quotes nothing: prompt lookup finds one-token matches only, which rarely pay
            assert "prompt_lookup_num_tokens" in assisted or int(out.drafted[0]) > 0, assisted
        if hasattr(transformers.GenerationConfig(), "use_mtp"):  # transformers before 5.x has no use_mtp
            with pytest.raises(ConfigError, match=r"use_mtp=True\): samplechain has no multi-token-prediction drafter"):
                model.generate(**enc, use_mtp=True, **kwargs)


@pytest.mark.transformers_parity
@pytest.mark.parametrize("negative", [None, "Bye."], ids=["last-prompt-token", "negative-prompt-ids"])
def test_custom_generate_guides_as_model_generate_and_speculates_under_guidance(tiny, negative):
    """model.generate(guidance_scale=...) adds a processor that runs the unconditional context with a cache of its
    own, which speculation's cuts and a batch's rows drawing ahead would leave behind: the adapter runs it as cfg
    first in the chain and the loop's second context. At B = 1 the tokens are transformers' own; a batch gives the
    same tokens with prompt lookup as without."""
    from samplechain.integrations import as_custom_generate

    model, tok = tiny
    tok = copy.deepcopy(tok)
    tok.pad_token_id, tok.padding_side = 0, "left"
    guided: dict = {"guidance_scale": 1.5, "max_new_tokens": 16, "pad_token_id": 0, "do_sample": False}
    if negative is not None:
        guided["negative_prompt_ids"] = tok([negative], return_tensors="pt")["input_ids"]
    decode = as_custom_generate("preset:greedy", tokenizer=tok)
    one = tok([CODE], return_tensors="pt")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers' deprecation notes
        theirs = model.generate(**one, **guided)
        ours = model.generate(**one, custom_generate=decode, **guided)
        looked_up = model.generate(**one, custom_generate=decode, prompt_lookup_num_tokens=4, **guided)
        assert torch.equal(ours, theirs) and torch.equal(looked_up, theirs)
        if negative is not None:
            return  # one negative prompt: a batch of one
        batch = tok([QUOTING, CODE, "A list is a list is a"], return_tensors="pt", padding=True)
        kwargs = guided | {"return_dict_in_generate": True, "max_new_tokens": 24}
        plain = model.generate(**batch, custom_generate=decode, **kwargs)
        for n in (2, 4, 8):  # fixed draft lengths (the adapter's draft=): the same drafts on every machine
            fixed = as_custom_generate(
                "preset:greedy", tokenizer=tok, draft={"use": "prompt_lookup", "num_tokens": n, "adaptive": False}
            )
            out = model.generate(**batch, custom_generate=fixed, **kwargs)
            assert torch.equal(out.sequences, plain.sequences), n
            assert int(out.kept.sum()) > 0, n  # rows kept drafts: their unconditional context was cut back with them
        with pytest.raises(ConfigError, match=r"guidance_scale=1.5\) with a chain that has cfg: guidance would run"):
            model.generate(
                **one, **guided, custom_generate=as_custom_generate({"samplers": [{"use": "cfg"}, {"use": "greedy"}]})
            )


@pytest.mark.transformers_parity
def test_custom_generate_ends_an_assistants_drafts_at_its_confidence_threshold(tiny):
    """transformers' assistant_confidence_threshold (the assistant's generation config, 0.4 where unset; the call's
    for assistant_early_exit) is the drafter's p_min, which ends a draft after a token drafted with less."""
    from samplechain.integrations.custom_generate import _draft_of

    model, _ = tiny
    gc = transformers.GenerationConfig(assistant_early_exit=2, assistant_confidence_threshold=0.7)
    assert _draft_of(gc, {}) == {"use": "early_exit", "layers": 2, "p_min": 0.7}

    def generate(assistant_model):  # where the adapter finds model.generate's assistant_model
        return _draft_of(transformers.GenerationConfig(), {})

    assistant = copy.deepcopy(model)
    assistant.generation_config.assistant_confidence_threshold = None
    assert generate(assistant) == {"use": "draft_model", "model": assistant, "p_min": 0.4}
    assistant.generation_config.assistant_confidence_threshold = 0.25
    assert generate(assistant)["p_min"] == 0.25


@pytest.mark.transformers_parity
def test_custom_generate_drafts_as_many_tokens_as_the_assistants_num_assistant_tokens(tiny):
    """transformers' num_assistant_tokens is the longest draft and its "constant" schedule a fixed draft length (20
    where the number is unset), read where transformers reads them: the assistant's generation config, the model's
    own for assistant_early_exit. Unset, the loop's adaptive lengths stand."""
    from samplechain.integrations import as_custom_generate
    from samplechain.integrations.custom_generate import _draft_of

    model, tok = tiny
    assistant = copy.deepcopy(model)
    config = assistant.generation_config

    def generate(assistant_model):  # where the adapter finds model.generate's assistant_model
        return _draft_of(transformers.GenerationConfig(), {})

    for n, schedule, expected in [
        (None, None, {}),
        (3, "heuristic", {"num_tokens": 3}),
        (2, "constant", {"num_tokens": 2, "adaptive": False}),
        (None, "constant", {"num_tokens": 20, "adaptive": False}),
    ]:
        config.num_assistant_tokens, config.num_assistant_tokens_schedule = n, schedule
        assert generate(assistant) == {"use": "draft_model", "model": assistant, "p_min": 0.4} | expected
        early_exit = _draft_of(transformers.GenerationConfig(assistant_early_exit=2), {}, assistant)
        assert early_exit == {"use": "early_exit", "layers": 2, "p_min": 0.4} | expected
    config.num_assistant_tokens = 0
    with pytest.raises(ConfigError, match=r"assistant_model.generation_config.num_assistant_tokens = 0: "):
        generate(assistant)

    # end to end: the assistant is the model itself, greedy, so each draft is kept whole, two tokens a call
    tok = copy.deepcopy(tok)
    tok.pad_token_id, tok.padding_side = 0, "left"
    batch = tok([QUOTING, CODE], return_tensors="pt", padding=True)
    config.num_assistant_tokens, config.num_assistant_tokens_schedule = 2, "constant"
    config.assistant_confidence_threshold = 0.0
    kwargs = {"max_new_tokens": 20, "pad_token_id": 0, "return_dict_in_generate": True}
    decode = as_custom_generate("preset:greedy", tokenizer=tok)
    plain = model.generate(**batch, custom_generate=decode, **kwargs)
    out = model.generate(**batch, custom_generate=decode, assistant_model=assistant, **kwargs)
    assert torch.equal(out.sequences, plain.sequences)
    assert out.kept.tolist() == out.drafted.tolist() and bool((out.drafted > 0).all())
    # a call drafts at most two tokens and keeps them with one drawn: at most 3 tokens a call after the prefill
    assert bool((out.drafted <= 2 * (out.model_calls - 1)).all())
    assert out.num_generated.tolist() == (out.model_calls + out.kept).tolist()


def test_a_table_around_a_drafter_object_takes_only_the_loops_settings(tiny):
    from samplechain_prompt_lookup import PromptLookup

    model, tok = tiny
    with pytest.raises(ConfigError, match=r"a table whose `use` is a drafter object takes only .*not \['num_tokens'\]"):
        Generation(model, tok, [QUOTING], draft={"use": PromptLookup(), "num_tokens": 3}, pad_token_id=0)
    gen = Generation(model, tok, [QUOTING], draft={"use": PromptLookup(), "cost": 0.1}, pad_token_id=0)
    assert gen.speculation is not None and gen.speculation.lengths.cost == [0.1]
