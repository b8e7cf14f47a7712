"""The samplechain command, run as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest


def cli(*args: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "samplechain.cli", *args], capture_output=True, text=True, env=env)


def test_plugins_json_lists_every_installed_plugin_with_its_status():
    done = cli("plugins", "--json")
    assert done.returncode == 0, done.stderr
    rows = {r["name"]: r for r in json.loads(done.stdout)}
    for name in ("cpu", "greedy", "dist", "temperature", "top_k", "top_p", "min_p"):
        assert rows[name]["status"] == "loaded"
        assert rows[name]["distribution"].startswith("samplechain-")
        assert rows[name]["version"]
    assert rows["cpu"]["kind"] == "backend" and rows["top_p"]["kind"] == "sampler"
    assert rows["top_p"]["provides"] == ["top_p.v1"]


def test_plugins_available_shows_what_could_be_installed_and_how():
    done = cli("plugins", "--available", "--json")
    rows = {r["name"]: r for r in json.loads(done.stdout)}
    example = rows["example_softcap"]
    if example["status"] == "not installed":
        assert example["install"].startswith("pip install samplechain-example-softcap")


def test_validate_accepts_a_good_chain(tmp_path):
    path = tmp_path / "ok.toml"
    path.write_text('[chain]\nsamplers = [{ use = "top_k", k = 40 }, { use = "dist", seed = 1 }]\n')
    done = cli("validate", str(path))
    assert done.returncode == 0, done.stderr
    assert "top_k.v1" in done.stdout and "valid" in done.stdout


def test_validate_shows_a_chains_drafter_and_guards(tmp_path):
    path = tmp_path / "guarded.toml"
    path.write_text(
        '[chain]\nsamplers = [{ use = "greedy" }]\n'
        'guards = [{ use = "banned_strings", phrases = ["a testament to"], ignore_case = true }]\n'
        '[chain.draft]\nuse = "prompt_lookup"\nnum_tokens = 6\n'
    )
    done = cli("validate", str(path))
    assert done.returncode == 0, done.stderr
    assert "draft: prompt_lookup (num_tokens=6)" in done.stdout
    assert "guard: banned_strings (phrases=['a testament to'], ignore_case=True)" in done.stdout


def test_validate_reports_the_key_path_and_exits_non_zero(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('[chain]\nsamplers = [{ use = "top_p", p = 1.5 }, { use = "dist" }]\n')
    done = cli("validate", str(path))
    assert done.returncode == 1
    assert "bad.toml: chain.samplers[0].p = 1.5: must be in [0, 1]" in " ".join(done.stderr.split())


def test_presets_lists_the_engine_defaults():
    done = cli("presets", "--json")
    presets = json.loads(done.stdout)
    assert {"llama.cpp", "transformers", "vllm", "text-generation-webui"} <= set(presets)


@pytest.mark.slow
def test_demo_generates_with_a_real_transformers_model():
    done = cli("demo", "--max-new-tokens", "8", "--seed", "1")
    assert done.returncode == 0, done.stderr
    assert "ms/step" in done.stdout


@pytest.mark.parametrize(
    "args, code, begins",
    [
        (["--help"], 0, "usage: samplechain "),
        (["presets", "--json"], 0, "{"),
        (["validate", "preset:no-such-preset"], 1, "error: registry.toml: presets.no-such-preset: no such preset"),
        ([], 2, "usage: samplechain "),  # argparse: the subcommand is required
    ],
    ids=["help", "presets", "error", "usage"],
)
def test_python_m_samplechain_is_the_samplechain_command(args, code, begins):
    script = Path(sysconfig.get_path("scripts")) / "samplechain"
    assert script.exists(), f"{script}: the console script is missing; install the core (pip install -e .)"
    module = subprocess.run([sys.executable, "-m", "samplechain", *args], capture_output=True, text=True)
    command = subprocess.run([str(script), *args], capture_output=True, text=True)
    assert (module.returncode, module.stdout, module.stderr) == (command.returncode, command.stdout, command.stderr)
    assert module.returncode == code, module.stderr
    assert (module.stdout + module.stderr).startswith(begins)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["demo", "--max-new-tokens", "0"], "error: --max-new-tokens 0: must be an integer >= 1"),
        (["demo", "--seed", "-1"], "error: --seed = -1: an integer in [0, 2**63)"),
        (["trace", "x", "--max-new-tokens", "0"], "error: --max-new-tokens 0: must be an integer >= 1"),
        (["trace", "x", "--max-rows", "-1"], "error: --max-rows -1: must be an integer >= 0"),
        (
            ["validate", "greedy"],
            "error: greedy: chain file not found; for the preset of that name give 'preset:greedy'",
        ),
    ],
    ids=["demo-tokens", "demo-seed", "trace-tokens", "trace-rows", "validate-preset-name"],
)
def test_run_arguments_are_refused_before_any_model_loads(argv, message, capsys, monkeypatch):
    from samplechain.cli import main

    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded for arguments that cannot run")

    monkeypatch.setattr("samplechain.cli.generate.load_cli_model", no_model)
    monkeypatch.setattr("samplechain.tools.demo.tiny_model", no_model)
    assert main(argv) == 1
    assert message in capsys.readouterr().err
