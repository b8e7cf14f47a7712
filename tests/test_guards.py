"""Guards that take text back (docs/guards.md): banned phrases drawn from what the model says without bans never
appear, in any case form asked for; a row gives the same text alone and in a batch, with and without a drafter; a
stream shows the final text and nothing a rewind took back; out of rewinds a row ends before the refused text; bad
guards are one error before generation, a guard that fails mid-generation ends only its row."""

from __future__ import annotations

import random
import re
import warnings

import pytest
import regex
import torch

from samplechain import ConfigError, SamplingError, UnknownPluginError
from samplechain.errors import GenerationWarning
from samplechain.generation import generate, stream
from samplechain.guards import Guard

transformers = pytest.importorskip("transformers")

PROMPTS = [
    "The list is: apple, pear, plum. Again: apple,",
    "In Python,",
    "A list is a list is a",
    "def add(a, b):\n    return a + b\n\ndef add(a, b):",
]
CHAINS = [
    "preset:greedy",
    {"samplers": [{"use": "temperature", "t": 0.8}, {"use": "top_k", "k": 40}, {"use": "dist"}]},
    {"samplers": [{"use": "penalties", "repeat": 1.2, "last_n": 32}, {"use": "min_p", "p": 0.05}, {"use": "dist"}]},
]


@pytest.fixture(scope="module")
def tiny(tiny_lm):
    return tiny_lm


def run(model, tok, prompts, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GenerationWarning)
        return generate(model, tok, prompts, pad_token_id=0, **kwargs)


def ban_list(rng: random.Random, texts: list[str]) -> list[str]:
    """Words and two-word phrases the texts hold, some capitalised, some upper-case."""
    words = [w for t in texts for w in re.findall(r"[A-Za-z]{2,}", t)]
    pairs = [" ".join(p) for t in texts for p in zip(t.split(), t.split()[1:]) if all(x.isalpha() for x in p)]
    chosen = rng.sample(words, min(len(words), rng.randint(1, 4))) + rng.sample(pairs, min(len(pairs), 2))
    forms = [str.lower, str.capitalize, str.upper, lambda s: s]
    return sorted({rng.choice(forms)(p) for p in chosen})


def occurs(phrase: str, text: str, ignore_case: bool, whole_words: bool) -> bool:
    pattern = re.escape(phrase)
    if whole_words:
        pattern = rf"(?<!\w){pattern}(?!\w)"
    flags = regex.IGNORECASE | regex.FULLCASE if ignore_case else 0
    return regex.search(pattern, text, flags) is not None


def test_guards_are_plugins(tiny):
    from samplechain.engine.discovery import get_host

    host = get_host()
    assert host.get("guard", "banned_strings").name == "banned_strings"
    assert host.get("guard", "banned_regex").name == "banned_regex"


@pytest.mark.parametrize("case", range(8))
def test_banned_phrases_from_the_models_own_text_never_appear(tiny, case):
    model, tok = tiny
    rng = random.Random(case)
    prompts = rng.sample(PROMPTS, 1 + case % 4)
    chain = CHAINS[case % len(CHAINS)]
    seeds = None if chain == "preset:greedy" else [{"seed": 40 + case + i} for i in range(len(prompts))]
    kwargs = {"chain": chain, "max_new_tokens": 32}
    plain = run(model, tok, prompts, params=seeds, **kwargs)
    phrases = ban_list(rng, plain.texts)
    ignore_case, whole_words = bool(case % 2), bool(case // 2 % 2)
    guard = {"use": "banned_strings", "phrases": phrases, "ignore_case": ignore_case, "whole_words": whole_words}
    out = run(model, tok, prompts, params=seeds, guards=[guard], **kwargs)
    assert int(out.rewinds.sum()) > 0, "the bans come from the text: the guard acts"
    for text in out.texts:
        for p in phrases:
            assert not occurs(p, text, ignore_case, whole_words), (p, text)
    for i, prompt in enumerate(prompts):  # each row alone: the same text
        alone = run(model, tok, [prompt], params=None if seeds is None else seeds[i : i + 1], guards=[guard], **kwargs)
        assert alone.texts[0] == out.texts[i]


def test_a_row_gives_the_same_text_alone_in_a_batch_and_with_a_drafter(tiny):
    model, tok = tiny
    kwargs = {"chain": CHAINS[1], "max_new_tokens": 40}
    params = [{"seed": 5}, {"seed": 6}, {"seed": 7}]
    plain = run(model, tok, PROMPTS[:3], params=params, **kwargs)
    phrases = ban_list(random.Random(3), plain.texts)
    guards = [{"use": "banned_strings", "phrases": phrases, "ignore_case": True}]
    batch = run(model, tok, PROMPTS[:3], params=params, guards=guards, **kwargs)
    drafted = run(model, tok, PROMPTS[:3], params=params, guards=guards, draft="prompt_lookup", **kwargs)
    assert int(batch.rewinds.sum()) > 0
    assert drafted.texts == batch.texts
    assert drafted.rewinds.tolist() == batch.rewinds.tolist()
    for i in range(3):
        alone = run(model, tok, PROMPTS[i : i + 1], params=params[i : i + 1], guards=guards, **kwargs)
        assert alone.texts[0] == batch.texts[i]
        assert (
            alone.sequences[0, alone.prompt_length :].tolist()
            == batch.sequences[i, batch.prompt_length :][: int(batch.num_generated[i])].tolist()[
                : int(alone.num_generated[0])
            ]
        )


def test_bans_hold_under_classifier_free_guidance(tiny):
    """A negative prompt per row: a row drawn again after a rewind is drawn with its unconditional context cut back
    with the model's, so it gives the text it gives alone, with or without a drafter."""
    model, tok = tiny
    chain = {"samplers": [{"use": "cfg", "scale": 2.0}, {"use": "top_k", "k": 40}, {"use": "dist"}]}
    negative = ["Bye.", "A list of fruit", "x = 1"]
    kwargs = {"chain": chain, "max_new_tokens": 32}
    params = [{"seed": 5}, {"seed": 6}, {"seed": 7}]
    plain = run(model, tok, PROMPTS[:3], params=params, negative_prompt=negative, **kwargs)
    phrases = ban_list(random.Random(4), plain.texts)
    guards = [{"use": "banned_strings", "phrases": phrases}]
    batch = run(model, tok, PROMPTS[:3], params=params, negative_prompt=negative, guards=guards, **kwargs)
    drafted = run(
        model, tok, PROMPTS[:3], params=params, negative_prompt=negative, guards=guards, draft="prompt_lookup", **kwargs
    )
    assert int(batch.rewinds.sum()) > 0
    assert drafted.texts == batch.texts
    for text in batch.texts:
        assert not any(occurs(p, text, False, False) for p in phrases), text
    for i in range(3):
        alone = run(
            model, tok, PROMPTS[i], params=params[i : i + 1], negative_prompt=negative[i], guards=guards, **kwargs
        )
        assert alone.texts[0] == batch.texts[i]
    unguided = run(model, tok, PROMPTS[:3], params=params, guards=guards, **kwargs)
    assert unguided.texts != batch.texts, "the negative prompts change the text"


def test_a_rewind_to_the_first_token_under_guidance_draws_it_as_a_bias_would(tiny):
    """A ban on each row's first word (greedy, a negative prompt per row): the row's first token is taken back and
    drawn again from the prompt's position, where the unconditional context must be fed its own prompt's last token;
    it is the token the same guided step gives with the banned token biased away."""
    model, tok = tiny
    guided = {"use": "cfg", "scale": 3.0}
    negative = ["x = 1", "A list of fruit"]
    prompts = PROMPTS[:2]
    plain = run(model, tok, prompts, chain={"samplers": [guided, {"use": "greedy"}]}, negative_prompt=negative)
    firsts = [int(plain.sequences[b, plain.prompt_length]) for b in range(2)]
    for b, first in enumerate(firsts):
        phrase = tok.decode([first]).strip()
        out = run(
            model,
            tok,
            prompts[b],
            chain={"samplers": [guided, {"use": "greedy"}]},
            negative_prompt=negative[b],
            guards=[{"use": "banned_strings", "phrases": [phrase], "whole_words": True}],
            max_new_tokens=1,
        )
        biased = {"samplers": [guided, {"use": "logit_bias", "bias": {str(first): -1000.0}}, {"use": "greedy"}]}
        expected = run(model, tok, prompts[b], chain=biased, negative_prompt=negative[b], max_new_tokens=1)
        assert int(out.rewinds[0]) == 1, phrase
        assert out.sequences[0, -1].item() == expected.sequences[0, -1].item() != first


def test_a_stream_shows_the_final_text_and_nothing_taken_back(tiny):
    model, tok = tiny
    plain = run(model, tok, PROMPTS[2:3], chain="preset:greedy", max_new_tokens=40)
    phrases = ban_list(random.Random(9), plain.texts)
    guards = [{"use": "banned_strings", "phrases": phrases}]
    final = run(model, tok, PROMPTS[2:3], chain="preset:greedy", max_new_tokens=40, guards=guards)
    pieces = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GenerationWarning)
        for event in stream(
            model, tok, PROMPTS[2], chain="preset:greedy", max_new_tokens=40, guards=guards, pad_token_id=0
        ):
            pieces.append(event.text)
    assert "".join(pieces) == final.texts[0]
    assert int(final.rewinds[0]) > 0


def test_out_of_rewinds_a_row_ends_before_the_refused_text(tiny):
    model, tok = tiny
    plain = run(model, tok, PROMPTS[2:3], chain="preset:greedy", max_new_tokens=30)
    word = re.findall(r"[a-z]{3,}", plain.texts[0])[0]
    guards = [{"use": "banned_strings", "phrases": [word], "max_rewinds": 0}]
    out = run(model, tok, PROMPTS[2:3], chain="preset:greedy", max_new_tokens=30, guards=guards)
    assert out.finish_reasons[0] == f"guard:banned_strings:{word}"
    assert word not in out.texts[0]
    assert plain.texts[0].startswith(out.texts[0])
    assert int(out.num_generated[0]) < 30


@pytest.mark.parametrize("draft", [None, "prompt_lookup"])
def test_rows_running_out_of_rewinds_one_after_another_all_end(tiny, draft):
    """Each row of the batch runs out of rewinds at its own step; a row ended so leaves once its tokens before the
    refused text are committed, even when no row is left to draw (the last ones waiting on a commit): every row
    ends before its refused text, with the text it has alone."""
    model, tok = tiny
    dry = {"use": "dry", "multiplier": 0.8, "base": 1.75, "allowed_length": 2}
    tail = [{"use": "top_n_sigma", "n": 1.5}, {"use": "top_k", "k": 40}, {"use": "dist"}]
    chain = {"samplers": [dry, {"use": "temperature", "t": 1.3}, *tail]}
    guards = [{"use": "banned_strings", "phrases": ["are ", "th", "c"], "max_rewinds": 2}]
    kwargs = {"chain": chain, "max_new_tokens": 31, "guards": guards, "draft": draft}
    seeds = [623, 19, 526, 442]
    out = run(model, tok, PROMPTS[2:3] * 4, params=[{"seed": s} for s in seeds], **kwargs)
    assert all(reason.startswith("guard:banned_strings:") for reason in out.finish_reasons), out.finish_reasons
    assert len(set(out.num_generated.tolist())) > 1, "the rows end at different steps"
    for b, seed in enumerate(seeds):
        assert not any(phrase in out.texts[b] for phrase in ("are ", "th", "c"))
        alone = run(model, tok, PROMPTS[2:3], params=[{"seed": seed}], **kwargs)
        assert alone.texts[0] == out.texts[b] and alone.finish_reasons[0] == out.finish_reasons[b]


@pytest.mark.parametrize("draft", [None, "prompt_lookup"])
def test_a_stream_ends_a_row_out_of_rewinds_with_its_held_text(tiny, draft):
    """A guard out of rewinds ends a row between steps: its stream still ends with the text it held back (stop
    strings hold some) and one event with the finish reason."""
    model, tok = tiny
    guards = [{"use": "banned_strings", "phrases": ["a"], "max_rewinds": 0}]
    kwargs = {"chain": "preset:greedy", "max_new_tokens": 30, "guards": guards, "stop_strings": ["zzzz"]}
    result: list = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GenerationWarning)
        events = list(stream(model, tok, PROMPTS[:2], pad_token_id=0, result=result, draft=draft, **kwargs))
    out = result[0]
    for b in range(2):
        assert out.finish_reasons[b] == "guard:banned_strings:a"
        assert "".join(e.text for e in events if e.index == b) == out.texts[b]
        assert [e.finish_reason for e in events if e.index == b and e.finish_reason] == [out.finish_reasons[b]]


@pytest.mark.parametrize("draft", [None, "prompt_lookup"])
def test_a_stop_inside_held_text_ends_the_row_where_the_chain_fails_past_it(tiny, draft):
    """A guard holds text that could begin a banned phrase; a stop string inside it ends the row, even where the
    chain fails at the position past the held text (a chain that masks every token after three): the row ends as
    without guards. Without the stop, the failure is raised as without guards."""
    model, tok = tiny
    chain = {"samplers": [{"use": "allowed_tokens", "ids": [3000, 3001, 3002]}, {"use": "no_repeat_ngram", "n": 1},
                          {"use": "greedy"}]}  # fmt: skip
    order = run(model, tok, PROMPTS[1], chain=chain, max_new_tokens=3)
    t1, t2, t3 = order.sequences[0, -3:].tolist()
    guards = [{"use": "banned_strings", "phrases": [tok.decode([t2, t3]) + "qqq"]}]  # held from t2 on, never banned
    kwargs = {"chain": chain, "max_new_tokens": 10, "draft": draft}
    reference = run(model, tok, PROMPTS[1], stop_strings=[tok.decode([t2])], **kwargs)
    assert reference.finish_reasons == ["stop_strings"]
    ours = run(model, tok, PROMPTS[1], stop_strings=[tok.decode([t2])], guards=guards, **kwargs)
    assert ours.sequences.tolist() == reference.sequences.tolist()
    assert ours.finish_reasons == ["stop_strings"]
    with pytest.raises(SamplingError, match=r"every token is masked"):
        run(model, tok, PROMPTS[1], guards=guards, **kwargs)


def test_banned_regex_takes_matches_back(tiny):
    model, tok = tiny
    plain = run(model, tok, PROMPTS[0:1], chain="preset:greedy", max_new_tokens=30)
    assert re.search(r"\b[a-z]+le\b", plain.texts[0]) or re.search(r"p[a-z]+", plain.texts[0])
    guards = [{"use": "banned_regex", "patterns": [r"p[a-z]+", r"\b[a-z]+le\b"]}]
    out = run(model, tok, PROMPTS[0:1], chain="preset:greedy", max_new_tokens=30, guards=guards)
    assert not re.search(r"p[a-z]+|\b[a-z]+le\b", out.texts[0]), out.texts[0]
    assert int(out.rewinds[0]) > 0


@pytest.mark.parametrize(
    ("guards", "message"),
    [
        ([{"use": "banned_strings", "phrases": [""]}], r"banned phrase 0 \(''\) is empty"),
        ([{"use": "banned_regex", "patterns": ["a("]}], r"banned_regex.*a\("),
        ([{"use": "banned_strings", "phrases": ["x"], "max_rewinds": -1}], r"max_rewinds = -1"),
        ([{"phrases": ["x"]}], r"names its guard with `use`"),
    ],
)
def test_bad_guards_are_one_error_before_generation(tiny, guards, message):
    model, tok = tiny
    with pytest.raises(ConfigError, match=message):
        run(model, tok, PROMPTS[:1], max_new_tokens=4, guards=guards)


def test_unknown_guards_and_no_tokenizer_are_refused(tiny):
    model, tok = tiny
    for beams in (1, 2):
        with pytest.raises(UnknownPluginError, match=r"banned_strngs"):
            run(model, tok, PROMPTS[:1], max_new_tokens=4, num_beams=beams, guards=["banned_strngs"])
    ids = tok(PROMPTS[:1], return_tensors="pt")["input_ids"]
    with pytest.raises(ConfigError, match=r"needs the tokenizer"):
        run(model, None, None, input_ids=ids, max_new_tokens=4, guards=[{"use": "banned_strings", "phrases": ["x"]}])


class Broken(Guard):
    name = "broken"

    def check(self, row, tokens, final):
        if len(tokens) >= 5:
            raise RuntimeError("boom")
        return None

    def hold(self, row, tokens):
        return len(tokens)


def test_a_guard_that_fails_ends_only_its_row_keeping_its_tokens(tiny):
    model, tok = tiny
    plain = run(model, tok, PROMPTS[:2], chain="preset:greedy", max_new_tokens=12)
    with pytest.warns(GenerationWarning, match=r"guard broken\.v1 failed on row 0 \(RuntimeError: boom\)"):
        out = generate(
            model, tok, PROMPTS[:2], chain="preset:greedy", max_new_tokens=12, pad_token_id=0, guards=[[Broken()], None]
        )
    assert out.finish_reasons[0] == "guard:broken:failed"
    assert out.finish_reasons[1] == plain.finish_reasons[1]
    assert out.texts[1] == plain.texts[1]
    assert plain.texts[0].startswith(out.texts[0]) and int(out.num_generated[0]) >= 5


class Misbehaving(Guard):
    """A guard whose `hold` raises or answers something that is no number, or whose `check` answers no Rewind."""

    name = "misbehaving"

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how

    def check(self, row, tokens, final):
        return "stop here" if self.how == "check-junk" and len(tokens) >= 5 else None

    def hold(self, row, tokens):
        if len(tokens) >= 5 and self.how == "hold-raises":
            raise RuntimeError("boom")
        return "all" if len(tokens) >= 5 and self.how == "hold-junk" else len(tokens)


@pytest.mark.parametrize(
    ("how", "message"),
    [
        ("hold-raises", r"\(RuntimeError: boom\)"),
        ("hold-junk", r"\(TypeError: hold\(\) returned 'all', not a number of tokens\)"),
        ("check-junk", r"\(TypeError: check\(\) returned 'stop here', not a Rewind or None\)"),
    ],
)
def test_a_guard_that_answers_wrongly_ends_only_its_row_keeping_its_tokens(tiny, how, message):
    model, tok = tiny
    kwargs = {"chain": "preset:greedy", "max_new_tokens": 12, "pad_token_id": 0}
    plain = generate(model, tok, PROMPTS[:2], **kwargs)
    with pytest.warns(GenerationWarning, match=rf"guard misbehaving\.v1 failed on row 0 {message}"):
        out = generate(model, tok, PROMPTS[:2], guards=[[Misbehaving(how)], None], **kwargs)
    assert out.finish_reasons[0] == "guard:misbehaving:failed"
    assert out.texts[1] == plain.texts[1] and out.finish_reasons[1] == plain.finish_reasons[1]
    assert plain.texts[0].startswith(out.texts[0]) and int(out.num_generated[0]) >= 4


# ----------------------------------------------------------------- llama.cpp: SmolLM2-135M-Instruct
CHATS = [
    [{"role": "user", "content": "Describe the sea in three sentences."}],
    [{"role": "user", "content": "Write a short story about a cat."}],
    [{"role": "user", "content": "What is Python? Answer briefly."}],
    [{"role": "user", "content": "Give me three tips for sleeping well."}],
]


@pytest.fixture(scope="module")
def smollm(open_gguf):
    return open_gguf(n_ctx=1024, flash_attn=True)


@pytest.mark.llama_cpp
@pytest.mark.slow
@pytest.mark.parametrize("case", range(6))
def test_on_llama_cpp_banned_phrases_never_appear_and_rows_equal_their_runs_alone(smollm, case):
    model, tok = smollm
    rng = random.Random(100 + case)
    prompts = rng.sample(CHATS, 1 + case % 4)
    chain = "preset:greedy" if case % 3 == 0 else "preset:llama.cpp"
    seeds = None if chain == "preset:greedy" else [{"seed": 7 + case + i} for i in range(len(prompts))]
    kwargs = {"chain": chain, "max_new_tokens": 48}
    plain = run(model, tok, prompts, params=seeds, **kwargs)
    phrases = ban_list(rng, plain.texts)
    ignore_case, whole_words = bool(case % 2), case >= 3
    guard = {"use": "banned_strings", "phrases": phrases, "ignore_case": ignore_case, "whole_words": whole_words}
    out = run(model, tok, prompts, params=seeds, guards=[guard], **kwargs)
    assert int(out.rewinds.sum()) > 0
    for text in out.texts:
        for p in phrases:
            assert not occurs(p, text, ignore_case, whole_words), (p, text)
    for i, prompt in enumerate(prompts):
        alone = run(model, tok, [prompt], params=None if seeds is None else seeds[i : i + 1], guards=[guard], **kwargs)
        assert alone.texts[0] == out.texts[i]


@pytest.mark.parametrize("stop_after", [3, 9, 17])
def test_a_resumed_guarded_generation_gives_the_uninterrupted_runs_tokens(tiny, stop_after):
    import json

    from samplechain.generation import Generation

    model, tok = tiny
    params = [{"seed": 21}, {"seed": 22}]
    kwargs = {"chain": CHAINS[1], "max_new_tokens": 36, "pad_token_id": 0}
    plain = run(model, tok, PROMPTS[1:3], params=params, chain=CHAINS[1], max_new_tokens=36)
    guards = [{"use": "banned_strings", "phrases": ban_list(random.Random(stop_after), plain.texts)}]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GenerationWarning)
        whole = Generation(model, tok, PROMPTS[1:3], params=params, guards=guards, **kwargs)
        for _ in whole.steps():
            pass
        gen = Generation(model, tok, PROMPTS[1:3], params=params, guards=guards, **kwargs)
        for i, _ in enumerate(gen.steps(), start=1):
            if i == stop_after:
                break
        saved = json.loads(json.dumps(gen.checkpoint()))
        again = Generation(model, tok, resume=saved, guards=guards, **kwargs)
        for _ in again.steps():
            pass
    expected, got = whole.output(), again.output()
    assert int(expected.rewinds.sum()) > 0
    assert got.sequences.tolist() == expected.sequences.tolist()
    assert got.texts == expected.texts
    assert got.rewinds.tolist() == expected.rewinds.tolist()


# ----------------------------------------------------------------- a chain's guards
GUARDED_TOML = """
[chain]
name = "no-slop"
samplers = [{use = "greedy"}]
guards = [{use = "banned_strings", phrases = ["PHRASE"], ignore_case = true, max_rewinds = 8}]
"""


def test_a_chains_guards_run_unless_turned_off_and_survive_conversion(tiny):
    from samplechain import Chain
    from samplechain.integrations.convert.common import chain_to_dict

    model, tok = tiny
    plain = run(model, tok, PROMPTS[2:3], chain="preset:greedy", max_new_tokens=30)
    word = re.findall(r"[a-z]{3,}", plain.texts[0])[0]
    chain = Chain.load(GUARDED_TOML.replace("PHRASE", word))
    assert chain.config.guards == ({"use": "banned_strings", "phrases": [word], "ignore_case": True, "max_rewinds": 8},)
    assert Chain.load(chain_to_dict(chain.config)).config.guards == chain.config.guards
    out = run(model, tok, PROMPTS[2:3], chain=chain, max_new_tokens=30)
    assert int(out.rewinds[0]) > 0 and not occurs(word, out.texts[0], True, False)
    off = run(model, tok, PROMPTS[2:3], chain=chain, max_new_tokens=30, guards=False)
    assert off.texts == plain.texts and off.rewinds is None


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('guards = [{use = "banned_strngs"}]', r"chain\.guards\[0\]\.use = 'banned_strngs': unknown guard"),
        ('guards = [{use = "banned_strings", phrases = [""]}]', r"chain\.guards\[0\]\.phrases = \[''\].*is empty"),
        ('guards = [{use = "banned_regex", patterns = ["(a"]}]', r"chain\.guards\[0\]"),
        ('guards = "banned_strings"', r"chain\.guards = 'banned_strings': expected a list of guard tables"),
    ],
)
def test_a_chains_bad_guards_name_their_key_path(line, message):
    from samplechain import Chain

    with pytest.raises(ConfigError, match=message):
        Chain.load('[chain]\nsamplers = [{use = "greedy"}]\n' + line + "\n")


def test_a_sampler_that_cannot_fork_its_state_is_refused_with_guards(tiny, monkeypatch):
    from samplechain import Chain

    model, tok = tiny
    chain = Chain.load({"samplers": [{"use": "top_k", "k": 5}, {"use": "dist"}]})
    monkeypatch.setattr(type(chain.samplers[0]), "forkable", False)
    ban = [{"use": "banned_strings", "phrases": ["the"]}]
    with pytest.raises(
        ConfigError, match=r"guards=: the chain's sampler top_k\.v1 cannot fork its state.*guards=False"
    ):
        generate(model, tok, ["Hi"], chain=chain, guards=ban, max_new_tokens=2, pad_token_id=0)


def test_as_a_logits_processor_a_chain_with_guards_is_refused(tiny):
    from samplechain import Chain
    from samplechain.integrations.transformers import as_logits_processor

    model, tok = tiny
    chain = Chain.load(GUARDED_TOML)
    with pytest.raises(ConfigError, match=r"its guards \(banned_strings\) take text back.*samplechain\.generation"):
        as_logits_processor(chain)


# ----------------------------------------------------------------- beam search
class BanEverySpelling:
    """A logits processor for transformers' beam search: -inf for every token whose text would complete a phrase,
    whatever tokens spell it (a brute-force reading of every token of the vocabulary)."""

    def __init__(self, tok, phrases: list[str], prompt_width: int) -> None:
        from samplechain.strings import byte_table

        self.pieces = byte_table(tok).pieces
        self.phrases = [p.encode() for p in phrases]
        self.width = prompt_width

    def __call__(self, input_ids, scores):
        longest = max(len(p) for p in self.phrases)
        for r, row in enumerate(input_ids[:, self.width :].tolist()):
            tail = b"".join(self.pieces[t] for t in row)[-longest:]
            for v in range(scores.shape[1]):
                text = tail + (self.pieces[v] if v < len(self.pieces) else b"")
                if any(p in text for p in self.phrases):
                    scores[r, v] = float("-inf")
        return scores


@pytest.mark.parametrize("case", range(3))
def test_beam_search_with_bans_equals_model_generate_masking_every_spelling(tiny, case):
    model, tok = tiny
    rng = random.Random(200 + case)
    prompt = PROMPTS[case]
    kwargs = {"num_beams": 4, "num_return_sequences": 2, "max_new_tokens": 16}
    plain = run(model, tok, [prompt], chain="preset:greedy", **kwargs)
    phrases = ban_list(rng, plain.texts)
    out = run(
        model, tok, [prompt], chain="preset:greedy", guards=[{"use": "banned_strings", "phrases": phrases}], **kwargs
    )
    ids = plain.sequences[:1, : plain.prompt_length]
    ban = BanEverySpelling(tok, phrases, ids.shape[1])
    with torch.inference_mode():
        ref = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            pad_token_id=0,
            logits_processor=transformers.LogitsProcessorList([ban]),
            output_scores=True,
            return_dict_in_generate=True,
            **kwargs,
        )
    assert out.texts != plain.texts, "the bans come from the text: the guard acts"
    assert out.sequences.tolist() == ref.sequences.tolist()
    torch.testing.assert_close(out.sequences_scores, ref.sequences_scores)
    for text in out.texts:
        assert not any(p in text for p in phrases), (phrases, text)


@pytest.mark.parametrize("case", range(4))
def test_beam_search_hypotheses_never_hold_a_banned_phrase_and_each_prompt_searches_alone(tiny, case):
    model, tok = tiny
    rng = random.Random(300 + case)
    prompts = rng.sample(PROMPTS, 2)
    kwargs = {"chain": "preset:greedy", "num_beams": 3, "num_return_sequences": 3, "max_new_tokens": 20}
    plain = run(model, tok, prompts, **kwargs)
    phrases = ban_list(rng, plain.texts)
    ignore_case, whole_words = bool(case % 2), bool(case // 2)
    guard = {"use": "banned_strings", "phrases": phrases, "ignore_case": ignore_case, "whole_words": whole_words}
    out = run(model, tok, prompts, guards=[guard], **kwargs)
    assert out.texts != plain.texts
    for text in out.texts:
        for p in phrases:
            assert not occurs(p, text, ignore_case, whole_words), (p, text)
    for i, prompt in enumerate(prompts):
        alone = run(model, tok, [prompt], guards=[guard], **kwargs)
        assert alone.texts == out.texts[3 * i : 3 * i + 3]


def test_a_chains_guards_run_in_beam_search(tiny):
    from samplechain import Chain

    model, tok = tiny
    kwargs = {"num_beams": 3, "max_new_tokens": 24}
    plain = run(model, tok, PROMPTS[2:3], chain="preset:greedy", **kwargs)
    word = re.findall(r"[a-z]{3,}", plain.texts[0])[0]
    chain = Chain.load(GUARDED_TOML.replace("PHRASE", word))
    out = run(model, tok, PROMPTS[2:3], chain=chain, **kwargs)
    assert not occurs(word, out.texts[0], True, False)
    assert run(model, tok, PROMPTS[2:3], chain=chain, guards=False, **kwargs).texts == plain.texts


def test_a_guard_that_fails_in_beam_search_ends_only_its_prompts_search(tiny):
    model, tok = tiny
    kwargs = {"chain": "preset:greedy", "num_beams": 3, "max_new_tokens": 12}
    plain = run(model, tok, PROMPTS[:2], **kwargs)
    with pytest.warns(GenerationWarning, match=r"guard broken\.v1 failed on prompt 0 \(RuntimeError: boom\)"):
        out = generate(model, tok, PROMPTS[:2], guards=[[Broken()], None], pad_token_id=0, **kwargs)
    assert out.finish_reasons[0] == "guard:broken:failed" and out.texts[0] == ""
    assert out.texts[1] == plain.texts[1] and out.finish_reasons[1] == plain.finish_reasons[1]
    with pytest.warns(GenerationWarning, match=r"failed on prompt 0 \(TypeError: check\(\) returned 'stop here'"):
        out = generate(model, tok, PROMPTS[:2], guards=[[Misbehaving("check-junk")], None], pad_token_id=0, **kwargs)
    assert out.finish_reasons[0] == "guard:misbehaving:failed" and out.texts[1] == plain.texts[1]
