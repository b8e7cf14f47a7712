"""samplechain.integrations.convert and `samplechain convert`: importers, exporters, round trips, errors."""

from __future__ import annotations

import json
import math
import warnings

import pytest
import torch

from samplechain import Chain
from samplechain.cli import main
from samplechain.errors import ChainWarning, ConfigError
from samplechain.integrations.convert import (
    ConvertWarning,
    chain_to_dict,
    from_llama_cpp,
    from_transformers,
    from_vllm,
    normalized,
    to_llama_cpp,
    to_toml,
    to_transformers,
    to_vllm,
)

transformers = pytest.importorskip("transformers")


def uses(chain: dict) -> list[str]:
    return [e["use"] for e in chain["samplers"]]


def entry(chain: dict, use: str) -> dict:
    return next(e for e in chain["samplers"] if e["use"] == use)


def same(a, b) -> bool:
    return normalized(a) == normalized(b)


# ------------------------------------------------------------------------------------------------ transformers
def test_generation_config_saved_by_transformers_loads_in_processor_order(tmp_path):
    config = transformers.GenerationConfig(
        do_sample=True,
        temperature=0.7,
        top_k=20,
        top_p=0.9,
        min_p=0.05,
        repetition_penalty=1.3,
        no_repeat_ngram_size=3,
        max_new_tokens=32,
        stop_strings=["\n\n"],
        eos_token_id=2,
    )
    config.save_pretrained(tmp_path)
    for source in (tmp_path, tmp_path / "generation_config.json", config):
        chain = from_transformers(source)
        assert uses(chain) == ["penalties", "no_repeat_ngram", "temperature", "top_k", "top_p", "min_p", "dist"]
        assert entry(chain, "penalties") == {"use": "penalties", "repeat": 1.3, "scope": "transformers"}
        assert entry(chain, "temperature")["t"] == 0.7 and entry(chain, "top_k")["k"] == 20
        assert chain["stop"] == [{"use": "max_new_tokens", "n": 32}, {"use": "stop_strings", "strings": ["\n\n"]}]
    Chain.load(to_toml(chain))  # the TOML loads


def test_unset_top_k_takes_generates_default_50_and_greedy_without_do_sample(tmp_path):
    chain = from_transformers(transformers.GenerationConfig(do_sample=True))
    assert uses(chain) == ["top_k", "dist"] and entry(chain, "top_k")["k"] == 50
    assert uses(from_transformers({"temperature": 0.5})) == ["greedy"]  # do_sample False: warpers skipped


def test_malformed_generation_config_is_one_clear_error_naming_the_file(tmp_path):
    bad = tmp_path / "generation_config.json"
    bad.write_text('{"do_sample": true, "top_k": 5,,}')
    with pytest.raises(ConfigError, match=r"generation_config.json: not valid JSON: .* line 1"):
        from_transformers(bad)
    bad.write_text("[1, 2]")
    with pytest.raises(ConfigError, match=r"generation_config.json: expected a JSON object"):
        from_transformers(bad)
    bad.write_text('{"do_sample": true, "top_k": "many"}')
    with pytest.raises(ConfigError, match=r"generation_config.json: not a valid GenerationConfig: .*'many'"):
        from_transformers(bad)
    bad.write_text('{"do_sample": true, "temperature": -1.0}')
    with pytest.raises(ConfigError, match=r"generation_config.json: .*samplers\[0\]\.t = -1.0"):
        from_transformers(bad)
    with pytest.raises(ConfigError, match=r"missing.json: file not found"):
        from_transformers(tmp_path / "missing.json")


def test_unmapped_generation_setting_is_a_convert_warning():
    with pytest.warns(ConvertWarning, match="diversity_penalty"):
        from_transformers({"do_sample": True, "diversity_penalty": 0.5})


def test_transformers_export_round_trip_and_generationconfig_accepts_it():
    config = transformers.GenerationConfig(
        do_sample=True,
        temperature=0.6,
        top_k=0,
        top_p=0.8,
        typical_p=0.9,
        epsilon_cutoff=3e-4,
        repetition_penalty=1.1,
        max_new_tokens=8,
        bad_words_ids=[[5, 6]],
        eos_token_id=[2, 3],
    )
    chain = from_transformers(config)
    kwargs = to_transformers(chain)
    assert kwargs["top_k"] == 0 and kwargs["do_sample"] is True and kwargs["eos_token_id"] == [2, 3]
    rebuilt = transformers.GenerationConfig(**kwargs)
    assert same(from_transformers(rebuilt), chain)
    assert same(from_transformers(kwargs), chain)


def test_transformers_export_refuses_what_it_cannot_express():
    with pytest.raises(ConfigError, match=r"samplers\[5\] \(top_p\) runs before samplers\[8\] \(temp_ext\).*order"):
        to_transformers("preset:llama.cpp")
    with pytest.raises(ConfigError, match=r"samplers\[0\] \(typical\): semantics = 'llama.cpp'"):
        to_transformers({"samplers": [{"use": "typical", "p": 0.5}, {"use": "dist"}]})
    with pytest.raises(ConfigError, match=r"samplers\[0\] \(penalties\).*scope = 'llama.cpp'"):
        to_transformers({"samplers": [{"use": "penalties", "repeat": 1.2}, {"use": "dist"}]})
    with pytest.raises(ConfigError, match=r"transformers has no xtc processor"):
        to_transformers({"samplers": [{"use": "xtc", "probability": 0.5}, {"use": "dist"}]})
    with pytest.raises(ConfigError, match=r"seed = 3"):
        to_transformers({"samplers": [{"use": "dist", "seed": 3}]})
    with pytest.raises(ConfigError, match="skips the warpers"):
        to_transformers({"samplers": [{"use": "top_k", "k": 3}, {"use": "greedy"}]})
    # temperature and top_k commute (top_k ranks), so llama.cpp's top_k -> temperature is expressible
    kwargs = to_transformers(
        {"samplers": [{"use": "top_k", "k": 3}, {"use": "temperature", "t": 0.5}, {"use": "dist"}]}
    )
    assert kwargs == {"top_k": 3, "temperature": 0.5, "do_sample": True}


# --------------------------------------------------------------------------------------------------- llama.cpp
def test_llama_cpp_defaults_are_the_llama_cpp_preset():
    chain = from_llama_cpp([])
    assert normalized(chain)["samplers"] == normalized("preset:llama.cpp")["samplers"]
    assert to_llama_cpp("preset:llama.cpp") == []  # everything at llama.cpp's defaults


def test_llama_cpp_flags_change_values():
    chain = from_llama_cpp(
        [
            "--top-k",
            "20",
            "--top-p=0.8",
            "--min-p",
            "0.1",
            "--typical",
            "0.7",
            "--temp",
            "0.5",
            "--dynatemp-range",
            "0.2",
            "--dynatemp-exp",
            "1.5",
            "--repeat-last-n",
            "128",
            "--repeat-penalty",
            "1.1",
            "--presence-penalty",
            "0.3",
            "--frequency-penalty",
            "0.2",
            "--dry-multiplier",
            "0.8",
            "--dry-base",
            "2",
            "--dry-allowed-length",
            "3",
            "--dry-penalty-last-n",
            "256",
            "--dry-sequence-breaker",
            "\n",
            "--dry-sequence-breaker",
            "|",
            "--xtc-probability",
            "0.5",
            "--xtc-threshold",
            "0.2",
            "--top-n-sigma",
            "1.5",
            "--seed",
            "42",
        ]
    )
    assert entry(chain, "top_k")["k"] == 20 and entry(chain, "top_p")["p"] == 0.8
    assert entry(chain, "min_p")["p"] == 0.1 and entry(chain, "typical")["p"] == 0.7
    assert entry(chain, "temp_ext") == {"use": "temp_ext", "t": 0.5, "delta": 0.2, "exponent": 1.5}
    assert entry(chain, "penalties") == {
        "use": "penalties",
        "repeat": 1.1,
        "frequency": 0.2,
        "presence": 0.3,
        "last_n": 128,
        "scope": "llama.cpp",
    }
    assert entry(chain, "dry") == {
        "use": "dry",
        "multiplier": 0.8,
        "base": 2.0,
        "allowed_length": 3,
        "penalty_last_n": 256,
        "breakers": ["\n", "|"],
    }
    assert entry(chain, "xtc") == {"use": "xtc", "probability": 0.5, "threshold": 0.2, "seed": 42}
    assert entry(chain, "top_n_sigma")["n"] == 1.5 and entry(chain, "dist") == {"use": "dist", "seed": 42}
    assert same(from_llama_cpp(to_llama_cpp(chain)), chain)  # round trip
    # -1 is LLAMA_DEFAULT_SEED (fresh random), a dry base below 1 is ignored, --temp is clamped at 0
    chain = from_llama_cpp("--seed -1 --dry-base 0.5 --temp -2")
    assert entry(chain, "dist") == {"use": "dist"} and entry(chain, "dry")["base"] == 1.75
    assert entry(chain, "temp_ext")["t"] == 0.0


def test_samplers_and_sampling_seq_give_the_order_with_aliases():
    with pytest.warns(ChainWarning, match="penalty placed after the truncation 'min_p'"):
        by_names = from_llama_cpp(["--samplers", "min_p;temp;top-k;nucleus;typical;penalties"])
    with pytest.warns(ChainWarning):
        by_chars = from_llama_cpp(["--sampling-seq", "mtkpye"])
    want = ["min_p", "temp_ext", "top_k", "top_p", "typical", "penalties", "dist"]
    assert uses(by_names) == uses(by_chars) == want
    assert same(by_names, by_chars)
    assert uses(from_llama_cpp(["--sampler-seq", "edskypmxt"])) == uses(from_llama_cpp([]))
    # export keeps the order through --samplers (free in llama.cpp)
    flags = to_llama_cpp(by_names)
    assert flags[:2] == ["--samplers", "min_p;temperature;top_k;top_p;typ_p;penalties"]
    with pytest.warns(ChainWarning):
        assert same(from_llama_cpp(flags), by_names)
    # an empty list leaves only dist (llama.cpp skips the empty name)
    assert uses(from_llama_cpp(["--samplers", ""])) == ["dist"]
    assert to_llama_cpp({"samplers": [{"use": "dist", "seed": 1}]}) == ["--samplers", "", "--seed", "1"]
    # infill and adaptive_p (which takes dist's place at the end, wherever it is listed)
    chain = from_llama_cpp(["--samplers", "adaptive_p;top_k;infill", "--adaptive-target", "0.4"])
    assert uses(chain) == ["top_k", "infill", "adaptive_p"] and entry(chain, "adaptive_p")["target"] == 0.4
    assert same(from_llama_cpp(to_llama_cpp(chain)), chain)


def test_mirostat_gives_the_llama_cpp_mirostat_shapes():
    m1 = from_llama_cpp(["--mirostat", "1"])
    assert normalized(m1)["samplers"] == normalized("preset:llama.cpp-mirostat")["samplers"]
    m2 = from_llama_cpp(["--mirostat", "2", "--mirostat-lr", "0.2", "--mirostat-ent", "3", "--temp", "0.9"])
    assert uses(m2) == ["temp_ext", "mirostat_v2"]
    assert entry(m2, "mirostat_v2") == {"use": "mirostat_v2", "tau": 3.0, "eta": 0.2}
    assert same(from_llama_cpp(to_llama_cpp(m2)), m2)
    assert (
        normalized(from_llama_cpp(to_llama_cpp("preset:llama.cpp-mirostat")))["samplers"]
        == normalized("preset:llama.cpp-mirostat")["samplers"]
    )
    with pytest.raises(ConfigError, match=r"with mirostat llama.cpp runs only temperature.*top_k"):
        to_llama_cpp({"samplers": [{"use": "top_k", "k": 5}, {"use": "mirostat"}]})


def test_front_samplers_logit_bias_ignore_eos_grammar():
    chain = from_llama_cpp(["-l", "15043+1", "--logit-bias", "7-inf", "--ignore-eos", "--grammar", 'root ::= "a"'])
    assert uses(chain)[:3] == ["grammar", "min_new_tokens", "logit_bias"]
    assert entry(chain, "logit_bias")["bias"] == [[15043, 1.0], [7, -math.inf]]
    assert "bias = [[15043, 1.0], [7, -inf]]" in to_toml(chain)
    assert same(Chain.load(to_toml(chain)), chain)
    assert same(from_llama_cpp(to_llama_cpp(chain)), chain)
    assert entry(from_llama_cpp(["-j", "{}"]), "grammar") == {"use": "grammar", "json_schema": "{}"}
    with pytest.raises(ConfigError, match=r"samplers\[1\] \(logit_bias\) runs after a sampler"):
        to_llama_cpp(
            {"samplers": [{"use": "top_k", "k": 5}, {"use": "logit_bias", "bias": {"3": 1.0}}, {"use": "dist"}]}
        )


def test_ignore_eos_bans_the_eos_tokens_for_the_whole_generation():
    chain = from_llama_cpp(["--ignore-eos", "--samplers", "top_k"])
    assert chain["samplers"][0] == {"use": "min_new_tokens", "id": "ignore_eos", "n": 2**31 - 1}
    assert to_llama_cpp(chain) == ["--samplers", "top_k", "--ignore-eos"]
    run = Chain.load(chain)
    run.prepare(eos_token_ids=[3])
    logits = torch.zeros(2, 6)
    logits[:, 3] = 5.0  # eos would win
    history = torch.tensor([[1, 2, 4, 4, 4, 4, 4, 4], [1, 2, 3, 4, 5, 0, 1, 2]])
    scores = run.process(logits, history=history, prompt_lengths=torch.tensor([2, 2]))
    assert torch.isinf(scores[:, 3]).all() and torch.isfinite(scores[:, [0, 1, 2, 4, 5]]).all()


def test_unknown_llama_cpp_flag_or_sampler_is_one_error_with_a_suggestion():
    with pytest.raises(ConfigError, match=r"unknown sampling flag '--top-kk'; did you mean '--top-k'\?"):
        from_llama_cpp(["--top-kk", "3"])
    with pytest.raises(ConfigError, match=r"unknown sampler name 'top_kk'; did you mean 'top_k'\?"):
        from_llama_cpp(["--samplers", "top_kk;temperature"])
    with pytest.raises(ConfigError, match=r"unknown sampler letter 'z'"):
        from_llama_cpp(["--sampling-seq", "kzt"])
    with pytest.raises(ConfigError, match=r"--top-k 'x': expected an integer"):
        from_llama_cpp(["--top-k", "x"])
    with pytest.raises(ConfigError, match=r"--logit-bias '15043': expected TOKEN_ID\(\+/-\)BIAS"):
        from_llama_cpp(["--logit-bias", "15043"])
    with pytest.raises(ConfigError, match=r"--temp needs a value"):
        from_llama_cpp(["--temp"])


def test_llama_cpp_export_refusals():
    with pytest.raises(ConfigError, match=r"llama.cpp has no quadratic sampler"):
        to_llama_cpp({"samplers": [{"use": "quadratic", "factor": 0.3}, {"use": "dist"}]})
    with pytest.raises(ConfigError, match=r"one top_k for every sampler"):
        to_llama_cpp({"samplers": [{"use": "top_k", "k": 5}, {"use": "top_k", "id": "k2", "k": 9}, {"use": "dist"}]})
    with pytest.raises(ConfigError, match=r"scope = 'transformers' cannot be expressed in llama.cpp"):
        to_llama_cpp({"samplers": [{"use": "penalties", "repeat": 1.2, "scope": "transformers"}, {"use": "dist"}]})
    with pytest.raises(ConfigError, match=r"ends its chain with dist"):
        to_llama_cpp({"samplers": [{"use": "greedy"}]})
    with pytest.raises(ConfigError, match=r"one --seed"):
        to_llama_cpp({"samplers": [{"use": "xtc", "probability": 0.1, "seed": 1}, {"use": "dist", "seed": 2}]})


# -------------------------------------------------------------------------------------------------------- vLLM
def test_vllm_defaults_are_the_vllm_preset_and_params_fill_it_in_vllms_order():
    assert normalized(from_vllm({}))["samplers"] == normalized("preset:vllm")["samplers"]
    chain = from_vllm(
        {
            "temperature": 0.7,
            "top_p": 0.9,
            "top_k": -1,
            "min_p": 0.1,
            "repetition_penalty": 1.2,
            "frequency_penalty": 0.5,
            "presence_penalty": 0.25,
            "seed": 11,
            "logit_bias": {"50256": -100},
            "allowed_token_ids": [1, 2, 3],
            "bad_words": ["foo"],
            "min_tokens": 4,
            "stop": ["\n\n"],
            "stop_token_ids": [7],
            "max_tokens": 64,
        }
    )
    assert uses(chain) == [
        "allowed_tokens",
        "bad_words",
        "min_new_tokens",
        "logit_bias",
        "penalties",
        "temperature",
        "min_p",
        "top_k",
        "top_p",
        "dist",
    ]
    assert entry(chain, "penalties") == {
        "use": "penalties",
        "repeat": 1.2,
        "frequency": 0.5,
        "presence": 0.25,
        "scope": "vllm",
    }
    assert entry(chain, "top_k")["k"] == 0 and entry(chain, "dist")["seed"] == 11
    assert chain["stop"] == [
        {"use": "max_new_tokens", "n": 64},
        {"use": "stop_strings", "strings": ["\n\n"]},
        {"use": "stop_sequences", "sequences": [[7]]},
    ]
    Chain.load(to_toml(chain))
    assert same(from_vllm(to_vllm(chain)), chain)


def test_vllm_temperature_zero_is_greedy_and_round_trips():
    chain = from_vllm({"temperature": 0, "repetition_penalty": 1.1, "top_p": 0.5})
    assert uses(chain)[-2:] == ["penalties", "greedy"]
    assert to_vllm(chain)["temperature"] == 0.0
    assert same(from_vllm(to_vllm(chain)), chain)


def test_vllm_request_keys_warn_and_unknown_keys_fail(tmp_path):
    with pytest.warns(ConvertWarning, match=r"n = 4 is a request setting"):
        from_vllm({"n": 4, "temperature": 0.5})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        from_vllm({"n": 1})  # at its default: silent
    with pytest.raises(ConfigError, match=r"unknown key 'top_pp'; did you mean 'top_p'\?"):
        from_vllm({"top_pp": 0.5})
    path = tmp_path / "params.json"
    path.write_text("{not json")
    with pytest.raises(ConfigError, match=r"params.json: not valid JSON"):
        from_vllm(path)


def test_vllm_export_refusals():
    order = r"samplers\[0\] \(top_p\) runs before samplers\[1\] \(temperature\).*vLLM's sampler runs"
    with pytest.raises(ConfigError, match=order):
        to_vllm({"samplers": [{"use": "top_p", "p": 0.9}, {"use": "temperature", "t": 0.5}, {"use": "dist"}]})
    with pytest.raises(ConfigError, match=r"vLLM's sampler has no dry step"):
        to_vllm({"samplers": [{"use": "dry", "multiplier": 0.8}, {"use": "dist"}]})
    with pytest.raises(ConfigError, match=r"scope = 'llama.cpp' cannot be expressed in vLLM"):
        to_vllm({"samplers": [{"use": "penalties", "repeat": 1.1}, {"use": "dist"}]})
    with pytest.raises(ConfigError, match=r"delta = 0.5 \(dynamic temperature\)"):
        to_vllm({"samplers": [{"use": "temp_ext", "t": 1.0, "delta": 0.5}, {"use": "dist"}]})
    with pytest.raises(ConfigError, match=r"stopping criterion stop_sequences"):
        to_vllm(
            {
                "samplers": [{"use": "dist"}],
                "stop": [{"use": "stop_sequences", "sequences": [[1, 2]]}, {"use": "max_new_tokens", "n": 3}],
            }
        )


def test_cross_engine_conversions():
    # a vLLM request in llama.cpp: vLLM's order (temperature before truncation) is free in llama.cpp
    chain = from_vllm({"temperature": 0.7, "top_p": 0.9, "min_p": 0.05, "seed": 5})
    flags = to_llama_cpp(chain)  # vLLM's no-op entries (allowed_tokens = [], vllm-scope penalties off) drop out
    assert flags == [
        "--samplers",
        "temperature;min_p;top_k;top_p",
        "--top-k",
        "0",
        "--top-p",
        "0.9",
        "--temp",
        "0.7",
        "--seed",
        "5",
    ]  # min_p 0.05 is llama.cpp's default
    back = from_llama_cpp(flags)
    assert uses(back) == ["temp_ext", "min_p", "top_k", "top_p", "dist"]
    assert to_vllm(back) == {"temperature": 0.7, "min_p": 0.05, "top_p": 0.9, "seed": 5}  # top_k 0: off
    with pytest.raises(ConfigError, match=r"scope = 'vllm' cannot be expressed in llama.cpp"):
        to_llama_cpp(from_vllm({"frequency_penalty": 0.5}))  # vLLM counts output tokens only


def test_converted_chains_sample_like_the_original():
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    original = Chain.load(
        {
            "samplers": [
                {"use": "temperature", "t": 0.7},
                {"use": "top_k", "k": 7},
                {"use": "top_p", "p": 0.8},
                {"use": "dist"},
            ]
        }
    )
    converted = Chain.load(from_transformers(to_transformers(original)))
    assert torch.equal(original.process(logits), converted.process(logits))


# -------------------------------------------------------------------------------------------------------- TOML
def test_toml_writer_escapes_and_round_trips_every_value_type():
    data = {
        "name": 'q"uote\\',
        "samplers": [
            {"use": "dry", "multiplier": 0.5, "breakers": ["\n", "\t", '"', "\\", "\x01", "é"]},
            {"use": "logit_bias", "bias": {"7": -math.inf, "12": 1e-05}},
            {"use": "sequence_bias", "bias": [[[1, 2], -1.5]]},
            {"use": "xtc", "probability": 0.2, "keep_special": True, "seed": 2**40},
            {"use": "dist"},
        ],
        "stop": [{"use": "max_new_tokens", "n": 5}],
    }
    text = to_toml(data)
    assert same(Chain.load(text), data)
    assert Chain.load(text).config.name == 'q"uote\\'
    assert chain_to_dict(Chain.load(text)) == data


# --------------------------------------------------------------------------------------------------------- CLI
def test_cli_llama_cpp_flags_after_double_dash_to_toml(capsys):
    rc = main(
        [
            "convert",
            "--from",
            "llama.cpp",
            "--to",
            "toml",
            "--",
            "--top-k",
            "20",
            "--temp",
            "0.5",
            "--samplers",
            "top_k;temperature",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    chain = Chain.load(out)
    assert [s["name"] for s in chain.describe()] == ["top_k.v1", "temp_ext.v1", "dist.v1"]
    assert '{ use = "top_k", k = 20 }' in out


def test_cli_transformers_file_to_llama_cpp_and_vllm_json(tmp_path, capsys):
    transformers.GenerationConfig(do_sample=True, top_k=30, temperature=0.9).save_pretrained(tmp_path)
    path = str(tmp_path / "generation_config.json")
    assert main(["convert", "--from", "transformers", "--to", "llama.cpp", path]) == 0
    assert capsys.readouterr().out.strip() == "--samplers 'temperature;top_k' --top-k 30 --temp 0.9"
    assert main(["convert", "--from", "transformers", "--to", "vllm", path]) == 0
    assert json.loads(capsys.readouterr().out) == {"temperature": 0.9, "top_k": 30}
    params = tmp_path / "params.json"
    params.write_text(json.dumps({"temperature": 0.5, "top_k": 8}))
    out_file = tmp_path / "chain.toml"
    assert main(["convert", "--from", "vllm", "--to", "toml", "-o", str(out_file), str(params)]) == 0
    assert same(Chain.load(out_file), from_vllm({"temperature": 0.5, "top_k": 8}))


def test_cli_errors_are_one_line_and_exit_1(tmp_path, capsys):
    assert main(["convert", "--from", "llama.cpp", "--to", "toml", "--", "--topk", "3"]) == 1
    assert "did you mean '--top-k'?" in capsys.readouterr().err
    bad = tmp_path / "generation_config.json"
    bad.write_text("{")
    assert main(["convert", "--from", "transformers", "--to", "toml", str(bad)]) == 1
    assert "generation_config.json: not valid JSON" in capsys.readouterr().err
    assert main(["convert", "--from", "toml", "--to", "vllm", "preset:llama.cpp"]) == 1
    assert "which vLLM cannot express" in capsys.readouterr().err
    missing = tmp_path / "no-such-folder" / "chain.toml"
    assert main(["convert", "--from", "toml", "-o", str(missing), "preset:greedy"]) == 1
    assert capsys.readouterr().err.strip() == f"error: {missing}: No such file or directory"


def test_every_preset_writes_as_toml_and_exports_or_says_why():
    from samplechain.engine.discovery import get_host

    for name in get_host().registry.presets:
        preset = f"preset:{name}"
        assert same(Chain.load(to_toml(preset)), preset), name
        for export, back in (
            (to_transformers, from_transformers),
            (to_llama_cpp, from_llama_cpp),
            (to_vllm, from_vllm),
        ):
            try:
                settings = export(preset)
            except ConfigError as exc:
                assert "samplers[" in str(exc), (name, export.__name__, str(exc))
                continue
            again = back(settings)  # what the engine runs: the preset's active samplers, same values
            assert same(again, back(export(again))), (name, export.__name__)


def test_guards_survive_toml_and_are_refused_by_engine_targets():
    chain = {
        "samplers": [{"use": "min_p", "p": 0.05}, {"use": "dist"}],
        "guards": [{"use": "banned_strings", "phrases": ["a testament to"], "ignore_case": True}],
        "draft": {"use": "prompt_lookup", "num_tokens": 8},
    }
    back = Chain.load(to_toml(chain))
    assert back.config.guards == Chain.load(chain).config.guards and back.config.draft is not None
    for export in (to_transformers, to_llama_cpp, to_vllm):
        with pytest.raises(ConfigError, match=r"guards \(banned_strings\) take text back, which .* cannot express"):
            export(chain)


@pytest.mark.parametrize(
    ("convert_", "source", "message"),
    [
        (from_vllm, {"min_tokens": "2"}, r"vLLM params: min_tokens = '2': expected an integer >= 0"),
        (from_vllm, {"stop": 3}, r"vLLM params: stop = 3: expected a string or a list of strings"),
        (from_vllm, {"stop_token_ids": 2}, r"vLLM params: stop_token_ids = 2: expected a list of token ids"),
        (from_vllm, {"allowed_token_ids": 1.5}, r"allowed_token_ids = 1.5: expected a list of token ids"),
        (from_vllm, {"logit_bias": {"5": "up"}}, r"vLLM params: logit_bias\['5'\] = 'up': expected a number"),
        (from_vllm, None, r"None: expected a dict of vLLM sampling parameters or the path of a JSON file"),
        (from_transformers, {"max_new_tokens": math.inf}, r"stop\[0\]\.n = inf: expected an integer"),
        (from_transformers, {"stop_strings": 3}, r"stop_strings = 3: expected a string or a list of strings"),
        (
            from_transformers,
            {"do_sample": True, "top_k": math.inf},
            r"GenerationConfig: top_k = inf \(expected int, e.g. 50\)",
        ),
        (from_llama_cpp, None, r"llama.cpp flags = None: expected the flags as one string"),
        (from_llama_cpp, "--top-k '20", r"llama.cpp flags: \"--top-k '20\": No closing quotation"),
    ],
)
def test_settings_of_the_wrong_kind_are_one_config_error_naming_the_setting(convert_, source, message):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ConfigError, match=message):
            convert_(source)


def test_a_settings_file_that_cannot_be_read_is_one_config_error_naming_it(tmp_path):
    (tmp_path / "latin1.json").write_bytes(b'{"temperature": 0.5, "x": "caf\xe9"}')
    with pytest.raises(ConfigError, match=r"latin1.json: not a JSON file \(not UTF-8 text"):
        from_vllm(tmp_path / "latin1.json")
    with pytest.raises(ConfigError, match=r"cannot read the file: Is a directory"):
        from_vllm(tmp_path)
