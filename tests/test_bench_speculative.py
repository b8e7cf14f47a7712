"""benchmarks/bench_speculative.py's bounds on drafting (section 5): the drafter that knows each row's text proposes
what it claims, on the tiny model (never how fast anything is)."""

from __future__ import annotations

import pytest
import torch

from samplechain.generation import generate

pytest.importorskip("transformers")

BENCH = "bench_speculative"  # the `bench` fixture loads benchmarks/bench_speculative.py


def test_the_copying_bound_proposes_the_longest_next_run_that_occurs_earlier(bench):
    text = torch.tensor([5, 6, 7, 8, 9, 5, 6, 7, 3, 5, 6, 7, 8, 1])
    knows = bench.Knows([text], copying=True)
    # after 9 tokens (..., 5, 6, 7, 3) the text goes on 5, 6, 7, 8, 1: "5 6 7 8" occurs earlier, "5 6 7 8 1" does not
    assert knows.propose(0, text[:9], 10).tolist() == [5, 6, 7, 8]
    assert knows.propose(0, text[:9], 2).tolist() == [5, 6]  # the limit holds
    assert knows.propose(0, text[:13], 10).tolist() == []  # 1 never occurred: nothing to copy
    assert knows.expect(0, text[:13]) is None and knows.expect(0, text[:9]) == ("known", 1.0)
    assert knows.propose(0, torch.tensor([4, 4]), 10).tolist() == []  # not a prefix of any text it knows


def test_always_right_proposes_the_text_and_every_draft_is_kept(bench, tiny_lm):
    model, tok = tiny_lm
    ids = torch.tensor([tok.encode("The list is: apple, pear, plum. Again: apple,")])
    kw = {"max_new_tokens": 12, "chain": bench._chain("sampling"), "seed": 3, "pad_token_id": 0}
    reference = generate(model, tok, input_ids=ids, **kw)
    text = torch.cat([ids[0], reference.sequences[0, ids.shape[1] :]])
    for copying in (False, True):
        out = generate(model, tok, input_ids=ids, draft={"use": bench.Knows([text], copying)}, **kw)
        assert out.sequences.tolist() == reference.sequences.tolist()
        assert int(out.kept[0]) == int(out.drafted[0])  # a draft of the text itself is kept whole
        if not copying:
            assert int(out.drafted[0]) > 0


@pytest.fixture
def chat_tok(tiny_lm):
    """The tiny model's tokenizer with a chat template that joins the messages' texts, and a pad id."""
    import copy

    tok = copy.deepcopy(tiny_lm[1])
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    tok.pad_token_id = 0
    return tok


def test_section_one_runs_prompt_lookup_with_each_occurrence_side_by_side(bench, tiny_lm, chat_tok):
    model, tok = tiny_lm[0], chat_tok
    plan = bench.Plan(max_new_tokens=6, reps=1, prompts=1)
    table = bench.section1({"transformers": (model, tok)}, ["list"], [1], plan, ["switch", "follow"])
    assert table.header[4] == "occurrence"
    assert [(r[3], r[4]) for r in table.rows] == [
        (setting, o) for setting in ("greedy", "sampling") for o in ("switch", "follow")
    ]
    assert all(r[-1].startswith("yes") for r in table.rows)  # mode `match`: the tokens of the run without a drafter


def test_section_one_under_guidance_runs_cfg_with_and_without_the_drafter(bench, tiny_lm, chat_tok):
    model, tok = tiny_lm[0], chat_tok
    plan = bench.Plan(max_new_tokens=6, reps=1, prompts=1, guidance=2.0)
    kw = bench._settings("greedy", 6, plan.guidance)
    assert kw["chain"]["samplers"][0] == {"use": "cfg", "scale": 2.0} and kw["negative_prompt"]
    table = bench.section1({"transformers": (model, tok)}, ["list"], [1], plan, [])
    assert [r[3] for r in table.rows] == ["greedy", "sampling"]
    assert all(r[-1].startswith("yes") for r in table.rows)  # mode `match`: the tokens of the run without a drafter


def test_an_unknown_occurrence_is_refused_before_any_model_loads(bench, capsys):
    with pytest.raises(SystemExit):
        bench.main(["--sections", "1", "--occurrence", "switch,latest"])
    assert "--occurrence: unknown latest (known: follow, switch, first, last)" in capsys.readouterr().err


def test_a_warning_is_listed_once_under_the_table_and_marked_in_its_rows(bench):
    table = bench.Table("t", ["a", "same tokens"], [])
    warned = bench.Measured(None, [], note="llama.cpp decodes the file on 2 threads with a float KV cache: past 256")
    for m in (warned, bench.Measured(None, []), warned):
        table.add(["x", "yes" + table.noted(m)])
    assert [r[1] for r in table.rows] == ["yes [1]", "yes", "yes [1]"]
    assert table.markdown().endswith("\n\n[1] warning: " + warned.note)
    assert table.records()["warnings"] == [warned.note]


def test_section_four_runs_the_model_drafters_with_each_p_min_side_by_side(bench, chat_tok):
    from samplechain.tools.tiny_models import tiny_llama

    plan = bench.Plan(max_new_tokens=6, reps=1, prompts=1)
    table = bench.section4(tiny_llama(), chat_tok, ["list"], [1], plan, 1, [0.5])
    drafters = [r[4] for r in table.rows if r[3] == "greedy"]
    assert drafters == [
        "early_exit",
        "early_exit, own cache",
        "draft_model",
        "early_exit, p_min 0.5",
        "draft_model, p_min 0.5",
    ]
    assert all(r[-1].startswith("yes") for r in table.rows)  # mode `match`: the tokens of the run without a drafter
