"""Chain traces (`samplechain.tools.trace`, `samplechain trace`) on the embedded model."""

from __future__ import annotations

import base64
import html
import io
import math
import re

import pytest
import torch

pytest.importorskip("matplotlib")

from samplechain import Chain, ConfigError
from samplechain.cli import main
from samplechain.generation import generate
from samplechain.models import TINY_MODEL
from samplechain.tools.trace import Trace, TracedSampler, distribution_stats, trace_generation

PROMPT = "The module"
STEPS = 12


@pytest.fixture(scope="module")
def lm():
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from samplechain.models import tiny_model_path

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    path = tiny_model_path()
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


@pytest.fixture(scope="module")
def traced(lm):
    model, tok = lm
    chain = Chain.load("preset:llama.cpp")
    trace = trace_generation(model, tok, PROMPT, chain=chain, max_new_tokens=STEPS, seed=1)
    return chain, trace


def _image(path):
    import matplotlib.image as mpimg

    return mpimg.imread(str(path))


def test_tracing_does_not_change_tokens_and_leaves_the_given_chain_alone(lm, traced):
    model, tok = lm
    chain, trace = traced
    plain = generate(model, tok, PROMPT, chain=chain, max_new_tokens=STEPS, seed=1)
    assert torch.equal(trace.output.sequences, plain.sequences)
    assert torch.equal(trace.output.logprobs, plain.logprobs)
    assert trace.texts == plain.texts and trace.num_generated == [STEPS]
    assert not any(isinstance(s, TracedSampler) for s in chain.samplers)
    # and a different seed does change them (the comparison above is not vacuous)
    other = generate(model, tok, PROMPT, chain=chain, max_new_tokens=STEPS, seed=2)
    assert not torch.equal(other.sequences, plain.sequences)


@pytest.mark.slow
def test_stateful_and_history_reading_samplers_trace_identically(lm):
    model, tok = lm
    # mirostat keeps per-request state (accept); penalties reads the token history
    for source, params in (("preset:llama.cpp-mirostat", {}), ("preset:llama.cpp", {"repeat_penalty": 1.5})):
        plain = generate(model, tok, PROMPT, chain=source, params=params, max_new_tokens=8, seed=3)
        trace = trace_generation(model, tok, PROMPT, chain=source, params=params, max_new_tokens=8, seed=3)
        assert torch.equal(trace.output.sequences, plain.sequences), source
    # the last run has the penalty on: the penalties stage (right after the input) changes the entropy somewhere
    ents = trace.entropies()
    assert trace.labels[1] == "penalties" and not torch.allclose(ents[:, 1], ents[:, 0])


def test_recorded_statistics_are_consistent(lm, traced):
    model, _ = lm
    _, trace = traced
    labels = [
        "logits",
        "penalties",
        "dry",
        "top_n_sigma",
        "top_k",
        "typical",
        "top_p",
        "min_p",
        "xtc",
        "temp_ext",
        "dist",
    ]
    assert trace.labels == labels
    assert trace.kinds[0] == "input" and trace.kinds[-1] == "select"
    widths, ents, probs = trace.widths(), trace.entropies(), trace.chosen_probs()
    assert widths.shape == ents.shape == probs.shape == (STEPS, len(labels))
    assert bool((widths[:, 0] == model.config.vocab_size).all())
    assert bool((widths[:, 1:] <= widths[:, :-1]).all()), "a stage added candidates"
    assert bool((widths[:, labels.index("top_k")] <= 40).all())
    assert bool((widths[:, -1] >= 1).all())
    assert bool(torch.isfinite(ents).all()) and bool((ents >= 0).all())
    assert bool((ents[:, labels.index("top_k")] <= ents[:, 0] + 1e-9).all())  # truncation to the top can't spread
    assert bool((probs > 0).all()) and bool((probs <= 1 + 1e-12).all())
    # the selector's stage is the distribution the chain sampled from: its p is exp(logprob) of the step
    assert torch.allclose(probs[:, -1], trace.output.logprobs[0].double().exp(), atol=1e-5)
    # a width-1 distribution has entropy 0 and gives the chosen token probability 1
    one = widths[:, -1] == 1
    assert torch.allclose(probs[:, -1][one], torch.ones(int(one.sum()), dtype=torch.float64))


def test_distribution_stats_match_a_direct_computation():
    logits = torch.tensor([[1.0, 2.0, float("-inf"), 0.5], [0.0, float("-inf"), float("-inf"), float("-inf")]])
    width, entropy, lse = distribution_stats(logits)
    assert width.tolist() == [3, 1]
    p = torch.softmax(torch.tensor([1.0, 2.0, 0.5], dtype=torch.float64), 0)
    assert math.isclose(float(entropy[0]), float(-(p * p.log()).sum()), rel_tol=1e-12)
    assert float(entropy[1]) == 0.0
    assert math.isclose(float(lse[0]), float(torch.logsumexp(torch.tensor([1.0, 2.0, 0.5]), 0)), rel_tol=1e-6)


def test_rows_carry_text_token_and_every_stage(traced, lm):
    _, tok = lm
    _, trace = traced
    rows = trace.rows()
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert "".join(r["text"] for r in rows) == trace.texts[0]
    assert [r["token_id"] for r in rows] == trace.output.sequences[0, -STEPS:].tolist()
    assert rows[0]["token"] == tok.convert_ids_to_tokens(rows[0]["token_id"])
    assert [s["stage"] for s in rows[0]["stages"]] == trace.labels
    assert set(rows[0]["stages"][0]) == {"stage", "kind", "width", "entropy", "chosen_prob"}
    # disabled samplers (penalties at 1.0, typical at 1.0, xtc at 0 ...) are recognised as having no effect
    shown = [trace.labels[s] for s in trace.effective_stages()]
    assert shown[0] == "logits" and shown[-1] == "dist" and "top_k" in shown
    assert not {"penalties", "dry", "typical", "xtc"} & set(shown)


def test_png_is_a_real_plot(traced, tmp_path):
    _, trace = traced
    path = trace.to_png(tmp_path / "t.png")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 40_000  # ~170 KB for 12 steps; the same three panels empty are ~22 KB
    img = _image(path)
    assert img.ndim == 3 and img.shape[0] > 600 and img.shape[1] > 700
    gray = img[..., :3].mean(axis=-1)
    assert float(gray.std()) > 0.05  # not blank
    assert float((gray < 0.5).mean()) > 0.005  # some ink: lines, labels


def test_html_is_self_contained_with_text_rows_and_image(traced, tmp_path):
    _, trace = traced
    page = trace.to_html(tmp_path / "t.html").read_text(encoding="utf-8")
    assert html.escape(trace.texts[0]) in page and html.escape(PROMPT) in page
    assert page.count('<tr class="step">') == STEPS
    for label in trace.labels:
        assert f"<th>{label}<br>" in page
    found = re.search(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert found and base64.b64decode(found.group(1))[:4] == b"\x89PNG"
    assert "http://" not in page and "https://" not in page and "<script" not in page and "<link" not in page


def test_rich_table_lists_every_step(traced):
    from rich.console import Console

    _, trace = traced
    console = Console(file=io.StringIO(), width=160)
    console.print(trace.rich_table())
    text = console.file.getvalue()
    assert "top_k" in text and "min_p" in text and "no effect" in text
    assert len([line for line in text.splitlines() if re.match(r"\s*\d+\s", line)]) == STEPS


def test_dollar_signs_and_newlines_in_tokens_do_not_break_the_plot(traced, tmp_path):
    _, trace = traced
    odd = Trace(
        ["cost: $x$"],
        trace.labels,
        trace.kinds,
        trace.steps[:2],
        [2],
        [[1, 2], [3, 4]],
        [["$", "\n"]],
        [["$a$", "\n\t"]],
        ["$a$\n\t"],
    )
    assert odd.tick_labels() == ["$a$", "\\n\\t"]
    assert odd.to_png(tmp_path / "odd.png").stat().st_size > 10_000


def test_beam_search_and_mixed_chains_are_refused(lm):
    model, tok = lm
    with pytest.raises(ConfigError, match="beam"):
        trace_generation(model, tok, PROMPT, chain="preset:llama.cpp", num_beams=2, max_new_tokens=2)
    with pytest.raises(ConfigError, match="one chain"):
        trace_generation(model, tok, [PROMPT, PROMPT], chain=["preset:llama.cpp", "preset:greedy"])


@pytest.mark.slow
def test_cli_writes_png_and_html_and_prints_a_table(tmp_path, capsys):
    out = tmp_path / "sub" / "trace"
    code = main(
        [
            "trace",
            PROMPT,
            "--model",
            str(TINY_MODEL),
            "--preset",
            "llama.cpp",
            "--max-new-tokens",
            str(STEPS),
            "--seed",
            "1",
            "--out",
            str(out),
        ]
    )
    captured = capsys.readouterr()
    assert code == 0
    png, page = out.with_suffix(".png"), out.with_suffix(".html")
    assert png.stat().st_size > 40_000 and _image(png).shape[0] > 600
    text = page.read_text(encoding="utf-8")
    assert text.count('<tr class="step">') == STEPS
    assert "chain trace (12 steps)" in captured.out and "top_k" in captured.out
    assert captured.out.count(PROMPT) >= 1 and "wrote" in captured.err
