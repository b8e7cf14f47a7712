"""`samplechain generate` on a real saved model folder (save_pretrained of a tiny GPT-2 and a BPE tokenizer)."""

from __future__ import annotations

import json

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from samplechain.cli import main
from samplechain.cli.generate import parse_sets, unescape
from samplechain.generation import generate
from samplechain.tools.testing import byte_bpe_tokenizer, tiny_gpt2


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("model")
    tiny_gpt2(300, seed=3).save_pretrained(path)
    byte_bpe_tokenizer(300).save_pretrained(path)
    return path


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_streams_the_prompt_and_the_continuation(folder, capsys):
    code, out, err = run(
        capsys, "generate", "The quick", "--model", str(folder), "--max-new-tokens", "12", "--seed", "5"
    )
    assert code == 0
    assert out.startswith("The quick") and out.endswith("\n")
    assert "12 tokens" in err and "finish: max_new_tokens" in err


def test_json_output_matches_the_streamed_text(folder, capsys):
    args = ("generate", "The quick", "--model", str(folder), "--max-new-tokens", "10", "--seed", "5")
    _, streamed, _ = run(capsys, *args)
    code, out, _ = run(capsys, *args, "--json", "--top-logprobs", "2")
    data = json.loads(out)
    row = data["outputs"][0]
    assert code == 0 and streamed == "The quick" + row["text"] + "\n"
    assert len(row["token_ids"]) == len(row["logprobs"]) == len(row["top_logprobs"]) == 10
    assert row["finish_reason"] == "max_new_tokens" and data["seed"] == 5
    assert [s["name"] for s in data["chain"]] == [
        "penalties.v1",
        "dry.v1",
        "top_n_sigma.v1",
        "top_k.v1",
        "typical.v1",
        "top_p.v1",
        "min_p.v1",
        "xtc.v1",
        "temp_ext.v1",
        "dist.v1",
    ]


def test_set_preset_and_batch(folder, capsys):
    code, out, _ = run(
        capsys,
        "generate",
        "-p",
        "The",
        "-p",
        "A list",
        "--model",
        str(folder),
        "--preset",
        "greedy",
        "--max-new-tokens",
        "4",
        "--json",
    )
    data = json.loads(out)
    assert code == 0 and [o["prompt"] for o in data["outputs"]] == ["The", "A list"]
    code, out, _ = run(
        capsys, "generate", "The", "--model", str(folder), "--set", "temperature=0", "--json", "--max-new-tokens", "6"
    )
    greedy = run(
        capsys, "generate", "The", "--model", str(folder), "--preset", "greedy", "--json", "--max-new-tokens", "6"
    )[1]
    assert json.loads(out)["outputs"][0]["token_ids"] == json.loads(greedy)["outputs"][0]["token_ids"]


def test_stop_regex_and_include_stop_str_from_the_command_line(folder, capsys):
    args = ("generate", "The quick", "--model", str(folder), "--preset", "greedy", "--max-new-tokens", "16")
    free = json.loads(run(capsys, *args, "--json")[1])["outputs"][0]["text"]
    stop = next(free[i : i + 2] for i in range(1, len(free)) if free[i : i + 2].isalnum())
    pattern = "".join(f"[{c}]" for c in stop)
    for extra, want in (((), free[: free.find(stop)]), (("--include-stop-str",), free[: free.find(stop) + 2])):
        code, out, _ = run(capsys, *args, "--json", "--stop-regex", pattern, *extra)
        row = json.loads(out)["outputs"][0]
        assert code == 0 and row["text"] == want and row["finish_reason"] == f"stop_regex:{pattern}"
        code, streamed, err = run(capsys, *args, "--stop-regex", pattern, *extra)
        assert streamed == "The quick" + want + "\n" and f"finish: stop_regex:{pattern}" in err


def test_beam_search_from_the_command_line(folder, capsys):
    code, out, _ = run(
        capsys,
        "generate",
        "The",
        "--model",
        str(folder),
        "--preset",
        "greedy",
        "--num-beams",
        "3",
        "--max-new-tokens",
        "5",
        "--json",
    )
    assert code == 0 and "sequence_score" in json.loads(out)["outputs"][0]


def test_cfg_scale_and_negative_prompt_guide_as_generate_does(folder, capsys):
    model, tok = AutoModelForCausalLM.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)

    def expected(samplers, **kw):
        out = generate(model, tok, ["The quick"], chain={"samplers": samplers}, max_new_tokens=10, **kw)
        return out.sequences[0, -10:].tolist()

    guided = [{"use": "cfg", "scale": 2.5}, {"use": "greedy"}]
    want, other = expected(guided, negative_prompt="A list"), expected(guided, negative_prompt="Keys")
    assert want != expected(guided[1:]) and want != other  # guidance, and which negative prompt, change this text

    def tokens(*extra):
        code, out, _ = run(
            capsys, "generate", "The quick", "--model", str(folder), "--preset", "greedy", "--cfg-scale", "2.5",
            "--max-new-tokens", "10", "--json", *extra,
        )  # fmt: skip
        assert code == 0
        return json.loads(out)["outputs"][0]["token_ids"]

    assert tokens("--negative-prompt", "A list") == want
    assert tokens("--negative-prompt", "A list", "--draft", '{"use": "prompt_lookup", "num_tokens": 3}') == want
    assert tokens("--negative-prompt", "Keys") == other


def test_errors_are_one_clear_line(folder, capsys):
    code, _, err = run(capsys, "generate", "x", "--model", str(folder / "nope"))
    assert code == 1 and "no such folder" in err
    code, _, err = run(capsys, "generate", "x", "--model", str(folder), "--set", "top_q=0.5")
    assert code == 1 and "unknown parameter 'top_q'" in err and "did you mean" in err
    code, _, err = run(capsys, "generate", "x", "--model", str(folder), "--set", "oops")
    assert code == 1 and "expected KEY=VALUE" in err
    # refused before the model loads, or by stream()'s call before the prompt is echoed: nothing on stdout
    code, out, err = run(capsys, "generate", "x", "--model", str(folder), "--seed", "-5")
    assert code == 1 and out == "" and "--seed = -5: an integer in [0, 2**63)" in err
    code, out, err = run(capsys, "generate", "x", "--model", str(folder), "--max-new-tokens", "0")
    assert code == 1 and out == "" and "--max-new-tokens 0: must be an integer >= 1" in err
    code, out, err = run(capsys, "generate", "x", "--model", str(folder), "--stop-regex", "(")
    assert code == 1 and out == "" and "pattern 0 ('(') is not a valid regular expression" in err
    code, _, err = run(capsys, "generate", "x", "--model", str(folder), "--top-logprobs", "-1")
    assert code == 1 and "--top-logprobs -1: must be an integer >= 0" in err
    code, out, err = run(capsys, "generate", "x", "--model", str(folder), "--negative-prompt", "y")
    assert code == 1 and out == "" and "--negative-prompt: the chain has no guidance sampler" in err
    assert "--cfg-scale 1.5" in err
    code, out, err = run(capsys, "generate", "x", "--model", str(folder), "--cfg-scale", "-1")
    assert (
        code == 1 and out == "" and "--cfg-scale -1:" in err and "samplers[0].scale = -1.0: must be in [0, inf)" in err
    )
    code, out, err = run(capsys, "generate", "x", "--model", str(folder), "--preset", "greedy", "--cfg-scale", "2")
    assert code == 0
    guided = folder.parent / "guided.toml"
    guided.write_text('[chain]\nsamplers = [{ use = "cfg", scale = 2.0 }, { use = "greedy" }]\n')
    code, out, err = run(capsys, "generate", "x", "--model", str(folder), "--chain", str(guided), "--cfg-scale", "2")
    assert code == 1 and out == "" and "--cfg-scale 2: the chain already has a guidance sampler" in err
    assert "--set cfg.scale=2" in err


def test_set_values_are_toml_and_stop_strings_unescape():
    assert parse_sets(["temperature=0.7", "top_k.k=20", "flag=true", "word=abc", 'q="x y"']) == {
        "temperature": 0.7,
        "top_k.k": 20,
        "flag": True,
        "word": "abc",
        "q": "x y",
    }
    assert unescape(r"\n\n") == "\n\n" and unescape(r"a\\n") == "a\\n" and unescape(r"\x") == "\\x"
