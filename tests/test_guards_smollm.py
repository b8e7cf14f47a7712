"""Guards on the default model (docs/guards.md), as properties over hundreds of seeded generations of
SmolLM2-135M-Instruct on the transformers runner: each batch is generated without bans, a random ban list is drawn
from what the model said (words, two- and three-word phrases, pieces that start inside one word and end inside the
next, in lower-case, capitalised, upper-case, title-case and as-said forms), and the batch is generated again with
those phrases banned (ignore_case and whole_words varied per batch). Checked: no banned phrase occurs in any output,
in any case form asked for; the guards acted (the bans come from the text, many span token boundaries); the
streamed text of every row equals its final text and what `generate` gives; a row gives the same text alone as in
its batch; a guarded generation stopped after some steps, checkpointed through JSON and resumed gives the
uninterrupted run's tokens."""

from __future__ import annotations

import json
import random
import re
import warnings
from collections import Counter
from dataclasses import dataclass
from typing import Any

import pytest
import regex

from samplechain.errors import ConfigError, GenerationWarning
from samplechain.generation import Generation, generate, stream

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.slow

REQUESTS = [
    "Describe the sea in three sentences.",
    "Write a short story about a cat.",
    "What is Python? Answer briefly.",
    "Give me three tips for sleeping well.",
    "Describe a busy city market in the morning.",
    "Tell a story about a dragon who is afraid of fire.",
    "List five fruits and say what colour each one is.",
    "Explain how a rainbow forms.",
    "Write a poem about autumn leaves.",
    "Why is exercise good for you?",
    "Describe your ideal weekend.",
    "Explain what a computer does, for a child.",
    "Write a letter to a friend about a trip to the mountains.",
    "Give me a recipe for pancakes.",
    "What are the planets of the solar system?",
    "Tell me a story about a lost key.",
    "Describe a forest at night.",
    "Explain why the sky is blue.",
    "List four ways to save water at home.",
    "Write a short speech for a school sports day.",
    "What makes a good friend?",
    "Describe the taste of chocolate.",
    "Explain how bees make honey.",
    "Write a story about a robot learning to paint.",
]
CHAINS: list[Any] = [
    "preset:llama.cpp",
    {
        "samplers": [
            {"use": "top_k", "k": 50},
            {"use": "top_p", "p": 0.95},
            {"use": "temperature", "t": 0.9},
            {"use": "dist"},
        ]
    },
    {
        "samplers": [
            {"use": "penalties", "repeat": 1.15, "last_n": 64},
            {"use": "min_p", "p": 0.05},
            {"use": "temperature", "t": 0.8},
            {"use": "dist"},
        ]
    },
    {"samplers": [{"use": "top_k", "k": 40}, {"use": "min_p", "p": 0.08}, {"use": "dist"}]},
]
BATCHES = 8  # ignore_case x whole_words, each twice
ROWS = 28  # generations per batch: 224 seeded guarded generations (and as many without bans)
MAX_NEW_TOKENS = 40
ALONE_PER_BATCH = 1  # rows of each batch generated again alone (one with rewinds where the guard rewound any)
FORMS = [str.lower, str.capitalize, str.upper, str.title, lambda s: s]


@dataclass
class Batch:
    case: int
    prompts: list[list[dict[str, str]]]
    params: list[dict[str, int]]
    chain: Any
    guard: dict[str, Any]
    plain: Any  # the output without bans
    out: Any  # the output with the guard
    streamed: list[str]  # per row, the stream's events joined


def quiet(call, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GenerationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        return call(*args, **kwargs)


def occurs(phrase: str, text: str, ignore_case: bool, whole_words: bool) -> bool:
    """Whether `text` holds `phrase` as the guard must refuse it: every case form (full case folding) with
    ignore_case, only where no word character precedes or follows it with whole_words."""
    pattern = re.escape(phrase)
    if whole_words:
        pattern = rf"(?<!\w){pattern}(?!\w)"
    flags = regex.IGNORECASE | regex.FULLCASE if ignore_case else 0
    return regex.search(pattern, text, flags) is not None


def said_in_two_rows(items_per_row: list[list[str]]) -> list[str]:
    """The items at least two rows hold (so that the guard meets them in more than one row), else all of them."""
    counts = Counter(x for items in items_per_row for x in set(items))
    shared = sorted(x for x, n in counts.items() if n >= 2)
    return shared or sorted(counts)


def ban_list(rng: random.Random, texts: list[str], ignore_case: bool) -> list[str]:
    """Words, two- and three-word phrases and pieces spanning two words (from inside the first to inside the
    second) that the texts hold: each in a random case form with ignore_case, else as said and often in a second
    form too (lower-case, capitalised, upper-case, title-case)."""

    def pick(items: list[str], low: int, high: int) -> list[str]:
        return rng.sample(items, min(len(items), rng.randint(low, high)))

    splits = [t.split() for t in texts]
    words = said_in_two_rows([re.findall(r"[A-Za-z]{3,}", t) for t in texts])
    pairs = said_in_two_rows([[f"{a} {b}" for a, b in zip(s, s[1:]) if a.isalpha() and b.isalpha()] for s in splits])
    triples = said_in_two_rows(
        [[" ".join(p) for p in zip(s, s[1:], s[2:]) if all(map(str.isalpha, p))] for s in splits]
    )
    chosen = pick(words, 2, 4) + pick(pairs, 1, 2) + pick(triples, 0, 1)
    for pair in pick([p for p in pairs if len(p.split()[0]) >= 3], 1, 2):
        a, b = pair.split()
        chosen.append(a[-rng.randint(1, len(a) - 1) :] + " " + b[: rng.randint(1, len(b))])
    phrases = set()
    for p in chosen:
        phrases.add(rng.choice(FORMS)(p) if ignore_case else p)
        if not ignore_case and rng.random() < 0.5:
            phrases.add(rng.choice(FORMS)(p))
    return sorted(phrases)


def spans_tokens(tok, phrase: str) -> bool:
    """Whether no single token spells the phrase (with or without a leading space)."""
    return all(len(tok(t, add_special_tokens=False)["input_ids"]) > 1 for t in (phrase, " " + phrase))


@pytest.fixture(scope="module")
def smollm2():
    from samplechain.models import default_gguf_path, load_model

    try:
        default_gguf_path()
    except ConfigError as exc:
        pytest.skip(str(exc))
    return quiet(load_model)


def run_batch(model, tok, case: int) -> Batch:
    rng = random.Random(1000 + case)
    prompts = [[{"role": "user", "content": rng.choice(REQUESTS)}] for _ in range(ROWS)]
    params = [{"seed": 1000 * case + i} for i in range(ROWS)]
    chain = CHAINS[(case + case // 4) % len(CHAINS)]  # every chain with two different option pairs
    kwargs = {"chain": chain, "max_new_tokens": MAX_NEW_TOKENS}
    plain = quiet(generate, model, tok, prompts, params=params, **kwargs)
    ignore_case, whole_words = bool(case % 2), bool(case // 2 % 2)
    phrases = ban_list(rng, plain.texts, ignore_case)
    guard = {"use": "banned_strings", "phrases": phrases, "ignore_case": ignore_case, "whole_words": whole_words}
    result: list[Any] = []
    streamed = [""] * ROWS
    for event in quiet(list, stream(model, tok, prompts, params=params, guards=[guard], result=result, **kwargs)):
        streamed[event.index] += event.text
    return Batch(case, prompts, params, chain, guard, plain, result[0], streamed)


@pytest.fixture(scope="module")
def batches(smollm2) -> list[Batch]:
    model, tok = smollm2
    return [run_batch(model, tok, case) for case in range(BATCHES)]


def test_no_banned_phrase_appears_in_any_case_form_asked_for(batches):
    assert sum(len(b.out.texts) for b in batches) >= 200
    for b in batches:
        g = b.guard
        for row, text in enumerate(b.out.texts):
            for p in g["phrases"]:
                assert not occurs(p, text, g["ignore_case"], g["whole_words"]), (b.case, row, p, g, text)


def test_the_guards_act_on_phrases_the_model_says(batches, smollm2):
    _, tok = smollm2
    said = spanning = 0
    for b in batches:
        g = b.guard
        hits = [p for p in g["phrases"] if any(occurs(p, t, g["ignore_case"], g["whole_words"]) for t in b.plain.texts)]
        assert hits, f"batch {b.case}: no banned phrase occurs in the text without bans ({g})"
        said += len(hits)
        spanning += sum(spans_tokens(tok, p) for p in hits)
    rewinds = [int(b.out.rewinds.sum()) for b in batches]
    assert sum(r > 0 for r in rewinds) >= BATCHES * 3 // 4, rewinds
    assert sum(rewinds) >= 2 * BATCHES, rewinds
    assert spanning >= BATCHES, (spanning, said)  # phrases no single token spells, which the guards had to catch


def test_the_streamed_text_equals_the_final_text(batches, smollm2):
    for b in batches:
        assert b.streamed == b.out.texts, b.case
    model, tok = smollm2
    b = batches[1]
    again = quiet(
        generate, model, tok, b.prompts, params=b.params, chain=b.chain, guards=[b.guard], max_new_tokens=MAX_NEW_TOKENS
    )
    assert again.texts == b.streamed
    assert again.rewinds.tolist() == b.out.rewinds.tolist()
    assert again.sequences.tolist() == b.out.sequences.tolist()


def test_a_row_gives_the_same_text_alone_as_in_its_batch(batches, smollm2):
    model, tok = smollm2
    rng = random.Random(7)
    for b in batches:
        rewound = [i for i in range(ROWS) if int(b.out.rewinds[i]) > 0] or list(range(ROWS))
        for i in rng.sample(rewound, ALONE_PER_BATCH):
            alone = quiet(
                generate,
                model,
                tok,
                b.prompts[i : i + 1],
                params=b.params[i : i + 1],
                chain=b.chain,
                guards=[b.guard],
                max_new_tokens=MAX_NEW_TOKENS,
            )
            assert alone.texts[0] == b.out.texts[i], (b.case, i, b.params[i], b.guard)
            assert int(alone.rewinds[0]) == int(b.out.rewinds[i])
            assert alone.finish_reasons[0] == b.out.finish_reasons[i]


def generated(out, row: int) -> list[int]:
    return out.sequences[row, out.prompt_length :][: int(out.num_generated[row])].tolist()


def in_flight(ckpt: dict[str, Any]) -> bool:
    """Whether a checkpoint holds guarded work past its last step: tokens drawn ahead and a ban in place."""
    spec = ckpt["speculation"]
    return any(spec["pending"]) and any(spec["guards"]["bans"])


@pytest.mark.parametrize("first_stop", [1, 20])
def test_a_resumed_guarded_generation_gives_the_uninterrupted_runs_tokens(batches, smollm2, first_stop):
    model, tok = smollm2
    # the row with the most rewinds of two batches of the same chain, each with its own batch's guard
    picked = [(b, max(range(ROWS), key=lambda r: int(b.out.rewinds[r]))) for b in (batches[0], batches[7])]
    assert picked[0][0].chain == picked[1][0].chain
    prompts = [b.prompts[i] for b, i in picked]
    params = [b.params[i] for b, i in picked]
    guards = [[b.guard] for b, _ in picked]
    kwargs = {"chain": picked[0][0].chain, "max_new_tokens": MAX_NEW_TOKENS}

    whole = quiet(generate, model, tok, prompts, params=params, guards=guards, **kwargs)
    gen = quiet(Generation, model, tok, prompts, params=params, guards=guards, **kwargs)
    saved = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GenerationWarning)
        for step, _ in enumerate(gen.steps(), start=1):  # stopped where a rewind's ban and drawn tokens are kept
            if step >= first_stop and in_flight(ckpt := gen.checkpoint()):
                saved = json.loads(json.dumps(ckpt))
                break
        assert saved is not None, "no step left guarded work in flight"
        again = Generation(model, tok, resume=saved, guards=guards, **kwargs)
        for _ in again.steps():
            pass
    got = again.output()
    assert int(whole.rewinds.sum()) > 0
    assert got.sequences.tolist() == whole.sequences.tolist()
    assert got.texts == whole.texts
    assert got.rewinds.tolist() == whole.rewinds.tolist()
    for row, (b, i) in enumerate(picked):  # and each row the tokens it had in its batch
        assert generated(whole, row) == generated(b.out, i)
