"""Text stops in generate() and stream(): min_new_tokens holding back eos, stop strings, stop_regex and repetition
(vLLM's min_tokens), include_stop_str_in_output, and streams that never emit text a stop later removes.

The reference is vLLM's v1 detokenizer (vllm/v1/engine/detokenizer.py `update` and `check_stop_strings`, restated
in `vllm_stop` below) and its scheduler's check_stop for token criteria. Models are `ScriptedLM`s: greedy decoding
spells a scripted token sequence, so a test chooses where text splits into tokens."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

import samplechain
from samplechain import StopMatch
from samplechain.engine.stopping import cut_text
from samplechain.generation import Generation, generate, stream
from samplechain.tools.testing import ScriptedLM, piece_ids, pieces_tokenizer

GREEDY = {"chain": {"samplers": [{"use": "min_new_tokens"}, {"use": "greedy"}]}}
PIECES = ["Hel", "lo", " wor", "ld", "EN", "D", " and", " more", "\n", "\n\n", "ab", "ba", "a b", "é"]


@pytest.fixture(scope="module")
def tok():
    return pieces_tokenizer(PIECES)


def scripted(tok, *rows: list[str]) -> ScriptedLM:
    return ScriptedLM([piece_ids(tok, r) for r in rows], len(tok))


def run(tok, rows, prompts=None, **kw):
    kw.setdefault("max_new_tokens", 24)
    kw.setdefault("chain", GREEDY)
    kw.setdefault("pad_token_id", 0)
    return generate(scripted(tok, *rows), tok, prompts or ["Hi"] * len(rows), **kw)


def vllm_stop(pieces: list[str], stops: list[str], min_tokens: int, include: bool) -> tuple[int | None, str]:
    """vLLM's detokenizer: after each token, stop strings are looked for only once more than min_tokens tokens
    are out, ending in the new text (check_stop_strings); the text is cut before the stop string, or after it
    with include_stop_str_in_output. Returns (the step it stops at or None, the output text)."""
    text = ""
    for step, piece in enumerate(pieces, start=1):
        text += piece
        if step <= min_tokens:
            continue
        for s in stops:
            at = text.find(s, max(len(text) + 1 - len(piece) - len(s), 0))
            if at == -1:
                continue
            return step, text[: at + len(s)] if include else text[:at]
    return None, text


# ----------------------------------------------------------------- include_stop_str_in_output
@pytest.mark.parametrize("include, want", [(False, "Hello wor"), (True, "Hello world an")])
def test_stop_string_spanning_tokens_is_cut_from_the_text(tok, include, want):
    out = run(
        tok, [["Hel", "lo", " wor", "ld", " and", " more"]], stop_strings=["ld an"], include_stop_str_in_output=include
    )
    assert out.finish_reasons == ["stop_strings"] and out.stop_texts == ["ld an"]
    assert out.texts == [want]
    assert out.num_generated.tolist() == [5]  # the tokens stay as generated (vLLM cuts the text only)
    assert out.sequences.shape[1] - out.prompt_length == 5


@pytest.mark.parametrize("include, want", [(False, "Hello world and more"), (True, "Hello world and moreEND")])
def test_regex_stop_across_token_boundaries(tok, include, want):
    out = run(
        tok,
        [["Hel", "lo", " wor", "ld", " and", " more", "EN", "D", " and"]],
        stop_regex=["E.D", "x+"],
        include_stop_str_in_output=include,
    )
    assert out.finish_reasons == ["stop_regex:E.D"] and out.stop_texts == ["END"]
    assert out.texts == [want] and out.num_generated.tolist() == [8]


def test_text_after_the_match_in_the_last_token_is_dropped_either_way(tok):
    for include, want in ((False, "Hello "), (True, "Hello wo")):
        out = run(tok, [["Hel", "lo", " wor", "ld"]], stop_strings=["wo"], include_stop_str_in_output=include)
        assert out.texts == [want]


def test_rows_without_a_text_stop_keep_their_whole_text(tok):
    out = run(tok, [["Hel", "lo"], ["ab", "ba", "ab"]], stop_strings=["bb"])
    assert out.finish_reasons == ["eos", "stop_strings"]
    assert out.texts == ["Hello", "a"] and out.stop_texts == [None, "bb"]


def test_include_stop_str_in_output_per_prompt(tok):
    """vLLM sets include_stop_str_in_output per request: each prompt's rows are cut as a run with its value alone,
    its num_return_sequences copies included."""
    hello, abba = ["Hel", "lo", " wor", "ld", " and"], ["ab", "ba", "ab"]
    kw = dict(stop_strings=["bb"], stop_regex=["o w"])
    flags = [True, False, False]
    out = run(tok, [hello, abba, hello], include_stop_str_in_output=flags, **kw)
    assert out.texts == ["Hello w", "a", "Hell"] and out.stop_texts == ["o w", "bb", "o w"]
    assert out.texts == [
        run(tok, [row], include_stop_str_in_output=flag, **kw).texts[0]
        for row, flag in zip([hello, abba, hello], flags)
    ]
    sampled = {"chain": {"samplers": [{"use": "top_k", "k": 1}, {"use": "dist"}]}}  # copies with the same tokens
    out = run(
        tok,
        [hello, hello, abba, abba],
        ["Hi", "Hi"],
        chain=sampled,
        num_return_sequences=2,
        include_stop_str_in_output=(False, True),
        **kw,
    )
    assert out.texts == ["Hell", "Hell", "abb", "abb"] and out.stop_texts == ["o w", "o w", "bb", "bb"]


@pytest.mark.parametrize("value", [[True], [True, False, True], "yes", None, [True, "no"]])
def test_include_stop_str_in_output_of_the_wrong_shape_is_refused(tok, value):
    with pytest.raises(
        samplechain.ConfigError,
        match=r"include_stop_str_in_output = .*: give one bool, or a list of 2 "
        r"bools \(one per prompt\)",
    ):
        run(tok, [["ab"], ["ba"]], include_stop_str_in_output=value)


def test_cut_text_falls_back_to_the_last_occurrence():
    assert cut_text("xxENDyy", StopMatch("r", "END", 2)) == "xx"
    assert cut_text("xxENDyy", StopMatch("r", "END", 2), include=True) == "xxEND"
    assert cut_text("xxENDyyy", StopMatch("r", "END", 2)) == "xx"  # decode differs: found by its last occurrence
    assert cut_text("DE", StopMatch("r", "ENDE", 0)) == ""  # the match began in the prompt
    assert cut_text("DE", StopMatch("r", "ENDE", 0), include=True) == "DE"
    assert cut_text("abc", None) == "abc"


# ----------------------------------------------------------------- min_new_tokens (vLLM's min_tokens)
def test_random_stop_strings_and_min_tokens_agree_with_vllm(tok):
    rng = random.Random(0)
    alphabet = ["ab", "ba", "a b", "\n", " and", "D", "EN"]
    for trial in range(12):
        rows = [[rng.choice(alphabet) for _ in range(10)] for _ in range(4)]
        stops = [rng.choice(["b\nE", "ba", "a b", "ND", "\n a", "bb", "D a"]) for _ in range(2)]
        least = [rng.randrange(0, 6) for _ in rows]
        for include in (False, True):
            out = run(
                tok,
                rows,
                stop_strings=stops,
                params=[{"min_tokens": n} for n in least],
                include_stop_str_in_output=include,
                max_new_tokens=10,
            )
            for b, row in enumerate(rows):
                step, text = vllm_stop(row, stops, least[b], include)
                assert out.texts[b] == text, (trial, b, row, stops, least[b])
                assert out.num_generated[b] == (step or 10)
                assert out.finish_reasons[b] == ("stop_strings" if step else "max_new_tokens")


def test_min_new_tokens_holds_back_stop_strings_and_regex_per_row(tok):
    rows = [["ab", "ab", "ab", "ab", "ab"]] * 3
    out = run(
        tok,
        rows,
        stop_strings=["ba"],
        params=[{"min_tokens": 0}, {"min_tokens": 2}, {"min_tokens": 9}],
        max_new_tokens=5,
    )
    # vLLM: a stop string counts once more than min_tokens tokens are out ("ba" ends in tokens 2, 3, 4, 5)
    assert out.num_generated.tolist() == [2, 3, 5]
    assert out.finish_reasons == ["stop_strings", "stop_strings", "max_new_tokens"]
    out = run(
        tok,
        rows,
        stop_regex=["b+a"],
        params=[{"min_tokens": 0}, {"min_tokens": 2}, {"min_tokens": 9}],
        max_new_tokens=5,
    )
    assert out.num_generated.tolist() == [2, 3, 5]


def test_min_new_tokens_holds_back_eos_from_the_nth_token_on(tok):
    """vLLM's check_stop: an eos / stop id ends a request once num_output_tokens >= min_tokens."""
    stop_id = piece_ids(tok, ["D"])[0]
    chain = {
        "chain": {
            "samplers": [{"use": "min_new_tokens", "eos_ids": [0]}, {"use": "greedy"}],
            "stop": [{"use": "eos", "ids": [stop_id]}, {"use": "max_new_tokens", "n": 8}],
        }
    }
    rows = [["ab", "D", "D", "D", "ab"]] * 3
    out = run(
        tok, rows, chain=chain, params=[{"min_tokens": 0}, {"min_tokens": 3}, {"min_tokens": 7}], max_new_tokens=None
    )
    assert out.num_generated.tolist() == [2, 3, 8]  # the third row's stop ids all come before its 7th token
    assert out.finish_reasons == ["eos", "eos", "max_new_tokens"]


def test_min_new_tokens_holds_back_repetition(tok):
    chain = {
        "chain": {
            "samplers": [{"use": "min_new_tokens"}, {"use": "greedy"}],
            "stop": [{"use": "repetition", "max_pattern_size": 1, "min_count": 2}, {"use": "max_new_tokens", "n": 6}],
        }
    }
    rows = [["ab", "ab", "ab", "ab", "ab", "ab"]] * 2
    out = run(tok, rows, chain=chain, params=[{"min_tokens": 0}, {"min_tokens": 4}], max_new_tokens=None)
    assert out.num_generated.tolist() == [2, 4] and out.finish_reasons == ["repetition", "repetition"]


def test_length_limits_are_never_held_back(tok):
    out = run(tok, [["ab"] * 8], stop_strings=["zz"], params={"min_tokens": 6}, max_new_tokens=3)
    assert out.num_generated.tolist() == [3] and out.finish_reasons == ["max_new_tokens"]


def test_ignore_eos_entry_does_not_hold_back_stops(tok):
    chain = {"chain": {"samplers": [{"use": "min_new_tokens", "id": "ignore_eos", "n": 2**31 - 1}, {"use": "greedy"}]}}
    out = run(tok, [["ab", "ba", "ab"]], chain=chain, stop_strings=["bb"])
    assert out.finish_reasons == ["stop_strings"] and out.num_generated.tolist() == [2]


def test_without_a_min_new_tokens_sampler_nothing_is_held(tok):
    chain = {"chain": {"samplers": [{"use": "greedy"}]}}
    out = run(tok, [["ab", "ba"]], chain=chain, stop_strings=["bb"])
    assert out.num_generated.tolist() == [2]


# ----------------------------------------------------------------- streaming
STREAM_CASES = [
    ({"stop_strings": ["ld an"]}, [["Hel", "lo", " wor", "ld", " and", " more"]]),
    ({"stop_strings": ["\n\n", "a b"]}, [["ab", "\n", "\n", "ba"], ["ab", "a b", "ab"], ["Hel", "lo"]]),
    ({"stop_regex": ["E.D", "b{3}"]}, [["Hel", "lo", "EN", "D"], ["ab", "ba", "ba", "ab", "ba"], ["lo", " wor"]]),
    ({"stop_regex": ["w[a-z]+d a"]}, [["Hel", "lo", " wor", "ld", " and", " more"]]),
    ({"stop_strings": ["é a"]}, [["ab", "é", " and"]]),
]


@pytest.mark.parametrize("include", [False, True])
@pytest.mark.parametrize("stops, rows", STREAM_CASES)
def test_stream_deltas_concatenate_to_the_cut_text(tok, stops, rows, include):
    result: list = []
    kw = dict(max_new_tokens=24, chain=GREEDY, pad_token_id=0, include_stop_str_in_output=include, **stops)
    events = list(stream(scripted(tok, *rows), tok, ["Hi"] * len(rows), result=result, **kw))
    out = result[0]
    for b in range(len(rows)):
        deltas = [e.text for e in events if e.index == b]
        assert "".join(deltas) == out.texts[b]
        assert [e.finish_reason for e in events if e.index == b][-1] == out.finish_reasons[b]
    assert out.texts == run(tok, rows, **{k: v for k, v in kw.items() if k != "chain"}).texts


def test_stream_holds_back_only_for_requests_that_drop_the_stop(tok):
    """include_stop_str_in_output per prompt: a request that keeps its stop string streams each token's text at
    once, its neighbour keeps back the stop buffer; both concatenate to their cut texts."""
    rows = [["Hel", "lo", " wor", "ld", " and"]] * 2
    result: list = []
    events = list(
        stream(
            scripted(tok, *rows),
            tok,
            ["Hi", "Hi"],
            chain=GREEDY,
            pad_token_id=0,
            max_new_tokens=5,
            stop_strings=["xyz"],
            include_stop_str_in_output=[True, False],
            result=result,
        )
    )
    assert [e.text for e in events if e.index == 0] == ["Hel", "lo", " wor", "ld", " and"]
    assert [e.text for e in events if e.index == 1] == ["H", "el", "lo w", "or", "ld and"]
    events = list(
        stream(
            scripted(tok, *rows),
            tok,
            ["Hi", "Hi"],
            chain=GREEDY,
            pad_token_id=0,
            max_new_tokens=5,
            stop_strings=["d a"],
            include_stop_str_in_output=[True, False],
            result=result,
        )
    )
    for b, want in enumerate(["Hello world a", "Hello worl"]):
        assert "".join(e.text for e in events if e.index == b) == want == result[-1].texts[b]


def test_stream_holds_back_only_while_a_stop_could_cut(tok):
    rows = [["Hel", "lo", " wor", "ld", " and"]]
    events = list(
        stream(scripted(tok, *rows), tok, ["Hi"], chain=GREEDY, pad_token_id=0, max_new_tokens=5, stop_strings=["xyz"])
    )
    assert [e.text for e in events] == ["H", "el", "lo w", "or", "ld and"]  # two characters wait ("xyz" less one)
    events = list(
        stream(
            scripted(tok, *rows),
            tok,
            ["Hi"],
            chain=GREEDY,
            pad_token_id=0,
            max_new_tokens=5,
            stop_strings=["xyz"],
            include_stop_str_in_output=True,
        )
    )
    assert [e.text for e in events] == ["Hel", "lo", " wor", "ld", " and"]


# ----------------------------------------------------------------- checkpoints, the embedded model
def test_a_resumed_generation_cuts_as_the_uninterrupted_one(tok):
    rows = [["ab", "Hel", "lo", " wor", "ld", " and"], ["ab", "ba"]]
    kw = dict(chain=GREEDY, pad_token_id=0, max_new_tokens=12, stop_regex=["o w"], stop_strings=["bb"])
    gen = Generation(scripted(tok, *rows), tok, ["Hi", "Hi"], **kw)
    steps = gen.steps()
    for _ in range(2):
        next(steps)
    ckpt = gen.checkpoint()
    full = run(tok, rows, **{k: v for k, v in kw.items() if k != "chain"})
    out = generate(scripted(tok, *rows), tok, resume=ckpt, **kw)
    assert out.texts == full.texts == ["abHell", "a"]
    assert out.finish_reasons == full.finish_reasons == ["stop_regex:o w", "stop_strings"]


EMBEDDED = Path(samplechain.__file__).parent / "models" / "docs-gpt2"


def test_embedded_model_stop_string_and_regex_match_the_reference():
    if not (EMBEDDED / "tokenizer.json").exists():
        pytest.skip("the embedded docs-gpt2 model is not trained in this checkout")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(EMBEDDED))
    model = AutoModelForCausalLM.from_pretrained(str(EMBEDDED)).eval()
    chain = {"chain": {"samplers": [{"use": "greedy"}]}}
    free = generate(model, tok, ["The function returns"], chain=chain, max_new_tokens=24, ignore_eos=True)
    ids = free.sequences[0, free.prompt_length :].tolist()
    pieces = [tok.decode(ids[: i + 1])[len(tok.decode(ids[:i])) :] for i in range(len(ids))]
    text = free.texts[0]
    # a stop string spanning two tokens, taken from the text itself
    at = next(i for i in range(3, len(ids)) if len(pieces[i - 1]) > 1 and len(pieces[i]) > 1)
    stop = pieces[at - 1][-2:] + pieces[at][:2]
    for include in (False, True):
        step, want = vllm_stop(pieces, [stop], 0, include)
        out = generate(
            model,
            tok,
            ["The function returns"],
            chain=chain,
            max_new_tokens=24,
            ignore_eos=True,
            stop_strings=[stop],
            include_stop_str_in_output=include,
        )
        assert (out.texts[0], int(out.num_generated[0])) == (want, step)
        out = generate(
            model,
            tok,
            ["The function returns"],
            chain=chain,
            max_new_tokens=24,
            ignore_eos=True,
            stop_regex=[__import__("re").escape(stop)],
            include_stop_str_in_output=include,
        )
        assert (out.texts[0], int(out.num_generated[0])) == (want, step)
    assert text.startswith(want)


def test_a_mixed_batch_holds_back_the_rows_whose_chain_says_so(tok):
    with_min = {"chain": {"samplers": [{"use": "min_new_tokens", "n": 3}, {"use": "greedy"}]}}
    without = {"chain": {"samplers": [{"use": "greedy"}]}}
    rows = [["ab", "ba", "ab", "ba", "ab"]] * 3
    out = run(
        tok,
        rows,
        chain=[with_min, without, with_min],
        stop_strings=["ba"],
        params=[{"min_tokens": 3}, {}, {"min_tokens": 0}],
        max_new_tokens=5,
    )
    assert out.num_generated.tolist() == [4, 2, 2]


def test_only_criteria_that_declare_a_gate_are_held_back():
    import torch

    from samplechain import StopContext, Stopping, StopSetup

    def always(ctx):
        return True

    eos = Stopping.criterion("eos", {"ids": [7]})
    stopping = Stopping([eos, always, Stopping.criterion("max_new_tokens", {"n": 9})])
    setup = StopSetup(
        batch_size=2,
        prompt_length=1,
        prompt_lengths=torch.tensor([1, 1]),
        device=torch.device("cpu"),
        min_new_tokens=torch.tensor([0, 5]),
    )
    stopping.prepare(setup)
    ids = torch.tensor([[1, 7], [1, 7]])
    result = stopping.check(StopContext(ids, 1, ids[:, -1], setup))
    assert result.done.tolist() == [True, True] and result.reasons == ["eos", "always"]
