"""Progress bars (`samplechain.tools.progress`): drawn only where asked, never touching stdout or the generated tokens."""

from __future__ import annotations

import io

import pytest
import torch
from rich.console import Console

from samplechain import Chain, ConfigError
from samplechain.cli import main
from samplechain.generation import generate, stream
from samplechain.models import TINY_MODEL
from samplechain.tools.progress import progress_bar
from samplechain.tools.testing import byte_bpe_tokenizer, tiny_gpt2


def _console(terminal: bool) -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, force_terminal=terminal, width=120), buf


# --------------------------------------------------------------------------- the helper
def test_off_when_the_console_is_not_a_terminal():
    console, buf = _console(False)
    with progress_bar(4, "crunching", console=console) as bar:
        for _ in range(4):
            bar.advance(status="x")
    assert not bar.enabled and bar.completed == 4 and buf.getvalue() == ""


def test_off_when_disabled_even_on_a_terminal():
    console, buf = _console(True)
    with progress_bar(4, "crunching", False, console=console) as bar:
        bar.advance(4)
    assert not bar.enabled and buf.getvalue() == ""


@pytest.mark.parametrize("enabled", [True, None])  # forced, or found on by the terminal check
@pytest.mark.parametrize("auto_refresh", [True, False])
def test_on_a_terminal_it_draws_the_description_status_and_final_count(enabled, auto_refresh):
    console, buf = _console(True)
    with progress_bar(5, "crunching", enabled, console=console, auto_refresh=auto_refresh, transient=False) as bar:
        for i in range(5):
            bar.advance(status=f"loss {2.5 - i / 10:.2f}")
    out = buf.getvalue()
    assert bar.enabled and bar.completed == 5
    assert "crunching" in out and "5/5" in out and "loss 2.10" in out


def test_update_sets_count_and_total():
    console, buf = _console(True)
    with progress_bar(None, "steps", True, console=console, auto_refresh=False) as bar:
        bar.update(completed=3, total=7)
    assert bar.completed == 3 and "3/7" in buf.getvalue()


# --------------------------------------------------------------------------- generate()'s progress callback
@pytest.fixture(scope="module")
def tiny():
    return tiny_gpt2(300, seed=3).eval(), byte_bpe_tokenizer(300)


def test_generate_reports_every_step_once_and_changes_nothing(tiny):
    model, tok = tiny
    calls: list[tuple[int, int | None]] = []
    kw = dict(chain="preset:llama.cpp", max_new_tokens=8, seed=4, ignore_eos=True, pad_token_id=0)
    plain = generate(model, tok, ["The", "A list"], **kw)
    seen = generate(model, tok, ["The", "A list"], progress=lambda s, t: calls.append((s, t)), **kw)
    assert calls == [(step, 8) for step in range(1, 9)]
    assert torch.equal(plain.sequences, seen.sequences) and plain.texts == seen.texts


def test_the_total_is_the_chain_s_own_length_limit(tiny):
    model, tok = tiny
    chain = Chain.load({"chain": {"samplers": [{"use": "greedy"}], "stop": [{"use": "max_new_tokens", "n": 5}]}})
    calls: list[tuple[int, int | None]] = []
    generate(model, tok, "The", chain=chain, ignore_eos=True, progress=lambda s, t: calls.append((s, t)))
    assert calls == [(step, 5) for step in range(1, 6)]


def test_stream_reports_after_each_step_s_events(tiny):
    model, tok = tiny
    log: list[object] = []
    for _event in stream(
        model,
        tok,
        "The",
        chain="preset:greedy",
        max_new_tokens=6,
        ignore_eos=True,
        progress=lambda s, t: log.append((s, t)),
    ):
        log.append("event")
    steps = [x for x in log if x != "event"]
    assert steps == [(step, 6) for step in range(1, 7)]
    assert log[-1] == (6, 6) and log[0] == "event"  # a step's events come before its report


def test_beam_search_refuses_a_progress_callback(tiny):
    model, tok = tiny
    with pytest.raises(ConfigError, match="beam search"):
        generate(model, tok, "The", num_beams=2, max_new_tokens=3, progress=lambda s, t: None)


# --------------------------------------------------------------------------- the CLIs: stdout unchanged
def _run(capsys, *argv: str) -> tuple[str, str]:
    assert main(list(argv)) == 0
    out = capsys.readouterr()
    return out.out, out.err


@pytest.fixture
def tty_stderr(monkeypatch):
    """rich treats every console as a terminal (TTY_COMPATIBLE=1): the bar really draws, on the captured stderr."""
    monkeypatch.setenv("TTY_COMPATIBLE", "1")


@pytest.mark.slow
@pytest.mark.parametrize("prompts", [["The module"], ["-p", "The module", "-p", "A list"]], ids=["stream", "batch"])
def test_generate_cli_stdout_is_identical_with_and_without_the_bar(capsys, tty_stderr, prompts):
    argv = ["generate", *prompts, "--model", str(TINY_MODEL), "--max-new-tokens", "8", "--seed", "7"]
    with_bar, err = _run(capsys, *argv, "--progress")
    without, err_off = _run(capsys, *argv, "--no-progress")
    assert with_bar == without and with_bar.count("The module") == 1
    assert "generating" in err and "8/8" in err and "generating" not in err_off


@pytest.mark.slow
def test_trace_cli_stdout_is_identical_with_and_without_the_bar(capsys, tty_stderr, tmp_path):
    argv = ["trace", "The module", "--model", str(TINY_MODEL), "--max-new-tokens", "8", "--seed", "7"]
    argv += ["--out", str(tmp_path / "t")]
    with_bar, err = _run(capsys, *argv, "--progress")
    without, err_off = _run(capsys, *argv, "--no-progress")
    assert with_bar == without and "The module" in with_bar
    assert "tracing" in err and "8/8" in err and "tracing" not in err_off
