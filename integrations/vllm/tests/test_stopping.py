"""A chain's stopping criteria under vLLM: stop_regex (the chain's, or a request's `samplechain.stop_regex`) and
repetition end a request by forcing its end-of-sequence token at the step after the match; length limits and eos
stay vLLM's; min_tokens holds the criteria back; a row keeps its criteria's state through moves and preemption;
requests without criteria are not looked at. Then one live request on the server."""

from __future__ import annotations

import json
import re

import pytest
import torch

pytest.importorskip("vllm", reason="needs vLLM: run `make test-vllm`")

from vllm import SamplingParams  # noqa: E402
from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality  # noqa: E402

from samplechain_vllm import RequestSpecError, SamplechainLogitsProcessor  # noqa: E402

from processors import make_processor, tokenizer  # noqa: E402

pytestmark = pytest.mark.vllm
V = 4096
TEXT = " We are at the end of the day, and the end is near."
PATTERN = "(?i)the end"


@pytest.fixture(scope="module")
def tok():
    return tokenizer()


def chain(*stop: dict) -> str:
    return json.dumps({"chain": {"samplers": [{"use": "greedy"}], "stop": list(stop)}})


def request(xargs: dict, **kwargs) -> SamplingParams:
    params = SamplingParams(extra_args=xargs, max_tokens=64, **kwargs)
    SamplechainLogitsProcessor.validate_params(params)  # as vLLM's frontend does
    return params


def drive(proc, scripts: list[list[int]], outputs: list[list[int]], steps: int, rows: list[int] | None = None) -> None:
    """Steps where each row's logits peak at its script's next token (so the greedy chain follows the script);
    rows[b] is the batch row of request b. The sampled token (the only finite one) goes to the live output list."""
    rows = rows if rows is not None else list(range(len(scripts)))
    for _ in range(steps):
        logits = torch.full((len(scripts), V), -10.0)
        for b, script in enumerate(scripts):
            n = len(outputs[b])
            logits[rows[b], script[n] if n < len(script) else 1] = 10.0
        out = proc.apply(logits)
        for b in range(len(scripts)):
            finite = torch.isfinite(out[rows[b]]).nonzero().flatten().tolist()
            assert len(finite) == 1
            outputs[b].append(finite[0])


def regex_end(tok, script: list[int], pattern: str = PATTERN, after: int = 0) -> int:
    """The number of tokens after which the pattern first matches the decoded text, the match ending in a token
    past the first `after` (stated independently of the criterion: decode prefixes, search)."""
    for k in range(after + 1, len(script) + 1):
        before = len(tok.decode(script[: k - 1]))
        if any(m.end() > before for m in re.finditer(pattern, tok.decode(script[:k]))):
            return k
    raise AssertionError("no match")


def test_a_requests_stop_regex_ends_it_with_eos_one_step_after_the_match(tok) -> None:
    script, eos = tok.encode(TEXT), tok.eos_token_id
    k = regex_end(tok, script)
    outputs: list[list[int]] = [[], []]
    proc = make_processor()
    proc.update_state(
        BatchUpdate(
            batch_size=2,
            removed=[],
            moved=[],
            added=[
                (
                    0,
                    request({"samplechain": "greedy", "samplechain.stop_regex": [PATTERN, "never+"]}),
                    [5, 6],
                    outputs[0],
                ),
                (1, request({"samplechain": "greedy"}), [5, 6], outputs[1]),
            ],
        )
    )
    drive(proc, [script, script], outputs, k + 2)
    assert outputs[0] == script[:k] + [eos, eos]  # the match kept, then eos (vLLM ends the request at the first)
    assert outputs[1] == script[: k + 2]  # the other request is untouched
    assert proc._rows[0].stopped == f"stop_regex:{PATTERN}"


def test_a_chains_stop_list_is_enforced_but_its_length_limits_and_eos_are_vllms(tok) -> None:
    a, b, c = tok.encode(" a")[0], tok.encode(" b")[0], tok.encode(" c")[0]
    script = [c, a, b, a, b, a, b, c, c]  # " a b" said three times: after 7 tokens
    stops = chain(
        {"use": "max_new_tokens", "n": 2},
        {"use": "eos", "ids": [c]},
        {"use": "repetition", "max_pattern_size": 2, "min_count": 3},
        {"use": "stop_regex", "patterns": ["z"]},
    )
    outputs: list[list[int]] = [[]]
    proc = make_processor()
    proc.update_state(
        BatchUpdate(batch_size=1, removed=[], moved=[], added=[(0, request({"samplechain": stops}), [5], outputs[0])])
    )
    drive(proc, [script], outputs, 9)
    assert outputs[0] == script[:7] + [tok.eos_token_id] * 2  # not stopped at 2 tokens, nor at the c of eos ids
    assert proc._rows[0].stopped == "repetition"


@pytest.mark.parametrize(
    "entry,text",
    [
        ({"use": "stop_strings", "strings": ["at the"]}, " We are at the"),
        ({"use": "stop_sequences", "sequences": [[3, 4]]}, None),
    ],
)
def test_other_criteria_of_the_chain_are_enforced_the_same_way(tok, entry, text) -> None:
    script = tok.encode(TEXT) if text is not None else [7, 3, 4, 9, 9]
    k = len(tok.encode(text)) if text is not None else 3
    outputs: list[list[int]] = [[]]
    proc = make_processor()
    proc.update_state(
        BatchUpdate(
            batch_size=1, removed=[], moved=[], added=[(0, request({"samplechain": chain(entry)}), [5], outputs[0])]
        )
    )
    drive(proc, [script], outputs, k + 1)
    assert outputs[0] == script[:k] + [tok.eos_token_id]
    assert proc._rows[0].stopped == entry["use"]


def test_confidence_cannot_run_and_is_ignored_with_a_warning(tok, caplog) -> None:
    """confidence reads each chosen token's probability, which the processor does not compute."""
    outputs: list[list[int]] = [[]]
    proc = make_processor()
    with caplog.at_level("WARNING", logger="samplechain_vllm"):
        proc.update_state(
            BatchUpdate(
                batch_size=1,
                removed=[],
                moved=[],
                added=[(0, request({"samplechain": chain({"use": "confidence", "threshold": 0.99})}), [5], outputs[0])],
            )
        )
    assert "'confidence' stopping criterion" in caplog.text and "ignored" in caplog.text
    drive(proc, [[7] * 4], outputs, 3)
    assert outputs[0] == [7] * 3 and proc._watched == []


def test_requests_without_criteria_are_not_looked_at(tok) -> None:
    plain = chain({"use": "max_new_tokens", "n": 4}, {"use": "eos"})  # both vLLM's: nothing to watch
    outputs: list[list[int]] = [[], [], []]
    proc = make_processor()
    proc.update_state(
        BatchUpdate(
            batch_size=3,
            removed=[],
            moved=[],
            added=[
                (0, request({"samplechain": "greedy"}), [5], outputs[0]),
                (1, request({"samplechain": plain}), [5], outputs[1]),
                (2, request({"samplechain": "greedy", "samplechain.stop_regex": "x"}), [5], outputs[2]),
            ],
        )
    )
    drive(proc, [[7] * 4] * 3, outputs, 2)
    assert [i for i, row in proc._rows.items() if row.watch is not None] == [2] and proc._watched == [2]
    proc.update_state(BatchUpdate(batch_size=2, removed=[2], moved=[], added=[]))
    drive(proc, [[7] * 4] * 2, outputs[:2], 1)
    assert proc._watched == []


def test_min_tokens_holds_the_criteria_back(tok) -> None:
    """vLLM's min_tokens (and the chain's min_new_tokens): a match ending within the first n tokens does not count,
    as vLLM's stop strings; the next one does."""
    script = tok.encode(TEXT)
    first = regex_end(tok, script)
    second = regex_end(tok, script, after=first)
    with_min = json.dumps(
        {
            "chain": {
                "samplers": [{"use": "min_new_tokens", "n": first}, {"use": "greedy"}],
                "stop": [{"use": "stop_regex", "patterns": [PATTERN]}],
            }
        }
    )
    for xargs, kwargs in [
        ({"samplechain": "greedy", "samplechain.stop_regex": PATTERN}, {"min_tokens": first}),
        ({"samplechain": with_min}, {}),
    ]:
        outputs: list[list[int]] = [[]]
        proc = make_processor()
        proc.update_state(
            BatchUpdate(batch_size=1, removed=[], moved=[], added=[(0, request(xargs, **kwargs), [5], outputs[0])])
        )
        drive(proc, [script], outputs, second + 1)
        assert outputs[0] == script[:second] + [tok.eos_token_id], xargs


def test_criteria_follow_their_request_through_moves_and_preemption(tok) -> None:
    script, eos = tok.encode(TEXT), tok.eos_token_id
    late = script[2:]  # request 1's text: request 0's without its first two tokens
    k, k_late = regex_end(tok, script), regex_end(tok, late)
    assert 3 < k_late < k  # both match after the swap below, request 1 first
    xargs = {"samplechain": "greedy", "samplechain.stop_regex": PATTERN}
    outputs: list[list[int]] = [[], []]
    proc = make_processor()
    proc.update_state(
        BatchUpdate(
            batch_size=2,
            removed=[],
            moved=[],
            added=[(0, request(xargs), [5], outputs[0]), (1, request(xargs), [5], outputs[1])],
        )
    )
    drive(proc, [script, late], outputs, 3)
    proc.update_state(BatchUpdate(batch_size=2, removed=[], moved=[(0, 1, MoveDirectionality.SWAP)], added=[]))
    drive(proc, [script, late], outputs, k - 2, rows=[1, 0])
    assert outputs[0] == script[:k] + [eos]
    assert outputs[1] == late[:k_late] + [eos] * (k + 1 - k_late)
    # preempted right after its match and resumed: its newest token is checked at its first step back
    resumed = list(script[:k])
    proc = make_processor()
    proc.update_state(BatchUpdate(batch_size=1, removed=[], moved=[], added=[(0, request(xargs), [5], resumed)]))
    drive(proc, [script], [resumed], 1)
    assert resumed == script[:k] + [eos]
    resumed = list(script[: k - 1])  # resumed before the match: it is found when it completes
    proc = make_processor()
    proc.update_state(BatchUpdate(batch_size=1, removed=[], moved=[], added=[(0, request(xargs), [5], resumed)]))
    drive(proc, [script], [resumed], 2)
    assert resumed == script[:k] + [eos]


def test_the_requests_own_eos_token_ends_it(tok) -> None:
    params = request({"samplechain": "greedy", "samplechain.stop_regex": PATTERN})
    params.update_from_generation_config({}, eos_token_id=7)  # what vLLM's frontend sets from the tokenizer
    script = tok.encode(TEXT)
    k = regex_end(tok, script)
    outputs: list[list[int]] = [[]]
    proc = make_processor()
    proc.update_state(BatchUpdate(batch_size=1, removed=[], moved=[], added=[(0, params, [5], outputs[0])]))
    drive(proc, [script], outputs, k + 1)
    assert outputs[0] == script[:k] + [7]


BAD = [
    ({"samplechain": "greedy", "samplechain.stop_regex": "(unclosed"}, {}, ["pattern 0", "not a valid regular"]),
    ({"samplechain": "greedy", "samplechain.stop_regex": "a*"}, {}, ["empty text"]),
    ({"samplechain": "greedy", "samplechain.stop_regex": 5}, {}, ["must be a regular expression"]),
    ({"samplechain": "off", "samplechain.stop_regex": "x"}, {}, ["turns samplechain off", "samplechain.stop_regex"]),
    ({"samplechain.stop_regex": "x"}, {}, ["no chain named"]),  # it needs a chain (the server has no default)
    ({"samplechain": {"preset": "greedy", "stop_regex": "x"}, "samplechain.stop_regex": "y"}, {}, ["give it once"]),
    (
        {"samplechain": chain({"use": "stop_regex", "patterns": ["x"]}), "samplechain.stop_regex": "y"},
        {},
        ["stop_regex", "twice"],
    ),
    ({"samplechain": "greedy", "samplechain.stop_regex": "x"}, {"ignore_eos": True}, ["ignore_eos", "stop_regex"]),
    (
        {"samplechain": chain({"use": "repetition", "max_pattern_size": 2})},
        {"ignore_eos": True},
        ["ignore_eos", "repetition"],
    ),
]


@pytest.mark.parametrize("xargs,kwargs,words", BAD)
def test_bad_stop_requests_are_refused_with_the_problem_named(xargs, kwargs, words) -> None:
    with pytest.raises(RequestSpecError) as info:
        request(xargs, **kwargs)
    for word in words:
        assert word in str(info.value), str(info.value)


def test_the_nested_form_takes_stop_regex_too(tok) -> None:
    script = tok.encode(TEXT)
    k = regex_end(tok, script)
    outputs: list[list[int]] = [[]]
    proc = make_processor()
    params = request({"samplechain": {"preset": "greedy", "stop_regex": [PATTERN]}})
    proc.update_state(BatchUpdate(batch_size=1, removed=[], moved=[], added=[(0, params, [5], outputs[0])]))
    drive(proc, [script], outputs, k + 1)
    assert outputs[0] == script[:k] + [tok.eos_token_id]


@pytest.mark.slow
def test_serving_ends_a_request_on_its_stop_regex(server: str, tok) -> None:
    """Live: the greedy continuation up to the token that completes the match, then eos; finish_reason "stop"
    (vLLM's eos: stop_reason null); the text keeps the match (as include_stop_str_in_output=True)."""
    from test_serve import complete

    from reference import reference_tokens

    prompt = "In Python, a list is"
    free = reference_tokens("preset:greedy", [prompt], [None], 24)["tokens"][0]
    words = re.findall(r"[A-Za-z]{3,}", tok.decode(free[8:]))
    pattern = re.escape(words[0])  # a word the greedy text reaches after at least 8 tokens
    k = regex_end(tok, free, pattern)
    r = complete(
        server, prompt, {"samplechain": "greedy", "samplechain.stop_regex": pattern}, ignore_eos=False, max_tokens=24
    )
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["token_ids"] == free[:k] + [tok.eos_token_id]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] is None
    assert choice["text"] == tok.decode(free[:k]) and re.search(pattern + "$", choice["text"])
