"""benchmarks/bench_gpu.py: its cpu dry run on tiny sizes (what it prints and writes, never how fast anything is), its
FlashInfer column with a stand-in for flashinfer.sampling, and the torch (vLLM fallback) peers' candidate sets."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from samplechain import Chain
from samplechain.tools.bench import make_logits

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "bench_gpu.py"
TINY = [
    "--tiny",
    "--vocab",
    "1000",
    "--batch",
    "1,2",
    "--repeats",
    "2",
    "--warmup",
    "1",
    "--e2e-batch",
    "1",
    "--new-tokens",
    "4",
    "--prompt-len",
    "4",
    "--quiet",
]

spec = importlib.util.spec_from_file_location("bench_gpu", SCRIPT)
bench_gpu = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench_gpu)


def _table(text: str, first_header: str) -> tuple[list[str], list[list[str]]]:
    """The header cells and body rows of the markdown table whose first header cell is `first_header`."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first_header} |"))
    cells = [[c.strip() for c in line.strip().strip("|").split("|")] for line in lines[start:] if line.startswith("|")]
    rows = []
    for row in cells[2:]:
        if len(row) != len(cells[0]):
            break
        rows.append(row)
    return cells[0], rows


def _positive(cell: str, unit: str) -> float:
    match = re.fullmatch(rf"(\d+\.\d+){re.escape(unit)}", cell)
    assert match, f"{cell!r} is not a number with unit {unit!r}"
    value = float(match.group(1))
    assert value > 0, cell
    return value


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench_gpu")
    done = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--device",
            "cpu",
            *TINY,
            "--out",
            str(out / "gpu.md"),
            "--json",
            str(out / "gpu.json"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout, (out / "gpu.md").read_text(), json.loads((out / "gpu.json").read_text())


@pytest.mark.slow
def test_dry_run_prints_and_writes_both_tables_with_every_row(dry_run):
    stdout, written, _ = dry_run
    assert written == stdout
    assert "(dry run)" in stdout and "backend 'cpu'" in stdout and "command: `" in stdout
    for part in ("torch ", "triton ", "FlashInfer ", "transformers "):
        assert part in stdout

    headers, rows = _table(stdout, "chain")
    assert headers == [
        "chain",
        "logits",
        "B",
        "samplechain ms",
        "graph replay ms",
        "FlashInfer ms",
        "torch sort ms",
        "max(-1) ms",
        "samplechain / FlashInfer",
        "replay / FlashInfer",
        "samplechain / max",
        "samplechain / torch",
        "torch / FlashInfer",
        "target",
        "met",
    ]
    assert {(r[0], r[1], r[2]) for r in rows} == {
        (c, d, b) for c in bench_gpu.CHAINS for d in ("float32", "bf16") for b in ("1", "2")
    }
    assert len(rows) == len(bench_gpu.CHAINS) * 2 * 2
    for r in rows:
        for cell in (r[3], r[6], r[7]):
            _positive(cell, "")
        for cell in (r[10], r[11]):
            _positive(cell, "x")
        assert r[4] == r[9] == "n/a"  # no CUDA graph on the cpu
        assert r[5] == "n/a" and r[8] == "n/a" and r[12] == "n/a"  # no FlashInfer on the cpu
        assert r[13] == ("<= 0.15 ms" if r[2] == "1" else "<= 1.5x FlashInfer")
        assert r[14] in ("yes", "NO") if r[2] == "1" else r[14] == "n/a"

    headers, rows = _table(stdout, "setting")
    assert headers[:5] == [
        "setting",
        "B",
        "samplechain generate() ms/step",
        "model.generate ms/step",
        "samplechain / model.generate",
    ]
    assert [(r[0], r[1]) for r in rows] == [("greedy", "1"), ("sampling", "1")]
    for r in rows:
        _positive(r[2], ""), _positive(r[3], ""), _positive(r[4], "x")
        assert r[6] in ("yes", "NO")
    assert rows[0][7] in ("yes", "no") and rows[1][7] == "n/a (sampling)"


@pytest.mark.slow
def test_dry_run_json_has_the_environment_and_consistent_ratios(dry_run):
    _, _, data = dry_run
    env = data["env"]
    assert env["device_type"] == "cpu" and env["backend"] == "cpu" and env["flashinfer"] is None
    assert "bench_gpu.py" in env["command"] and env["torch"] == torch.__version__
    for row in data["kernels"]:
        assert row["samplechain_over_max"] == pytest.approx(row["samplechain_ms"] / row["max_ms"])
        assert row["samplechain_over_torch"] == pytest.approx(row["samplechain_ms"] / row["torch_ms"])
        assert row["flashinfer_ms"] is None and row["errors"] == {}
    for row in data["e2e"]:
        assert row["new_tokens"] == 4 and row["samplechain_over_model_generate"] == pytest.approx(
            row["samplechain_ms_per_step"] / row["model_generate_ms_per_step"]
        )


def _fake_flashinfer() -> SimpleNamespace:
    """flashinfer.sampling's entry points, in torch (int32 tokens, as FlashInfer returns)."""

    def draw(probs):
        return torch.multinomial(probs / probs.sum(-1, keepdim=True), 1).squeeze(1).int()

    def top_k_top_p_sampling_from_logits(logits, k, p):
        return draw(torch.softmax(bench_gpu._top_k_top_p(logits, k, p), dim=-1))

    def top_k_sampling_from_probs(probs, k):
        return draw(torch.softmax(bench_gpu._top_k_top_p(probs.log(), k, None), dim=-1))

    def top_p_sampling_from_probs(probs, p):
        return draw(torch.softmax(bench_gpu._top_k_top_p(probs.log(), None, p), dim=-1))

    def min_p_sampling_from_probs(probs, m):
        return draw(probs * (probs >= m[:, None] * probs.amax(-1, keepdim=True)))

    return SimpleNamespace(
        top_k_top_p_sampling_from_logits=top_k_top_p_sampling_from_logits,
        top_k_sampling_from_probs=top_k_sampling_from_probs,
        top_p_sampling_from_probs=top_p_sampling_from_probs,
        min_p_sampling_from_probs=min_p_sampling_from_probs,
        sampling_from_logits=lambda logits: draw(torch.softmax(logits, dim=-1)),
    )


def test_flashinfer_column_and_ratios_with_a_stand_in_for_flashinfer():
    chains = ["preset:llama.cpp", "preset:transformers", "top_p 0.9", "min_p 0.05", "dist"]
    rows, peers = bench_gpu.run_kernels(
        torch.device("cpu"), "cpu", chains, ["bf16"], [1, 2], 500, "peaked", repeats=2, warmup=1, fi=_fake_flashinfer()
    )
    assert len(rows) == len(chains) * 2
    for row in rows:
        assert row["errors"] == {}
        for key in ("samplechain_over_flashinfer", "samplechain_over_max", "torch_over_flashinfer"):
            assert isinstance(row[key], float) and row[key] > 0, (key, row)
        assert row["met"] in (True, False)
    text = bench_gpu.kernel_table(rows)
    assert "| <= 1.5x FlashInfer |" in text
    for line in text.splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert "n/a" not in cells[5:9:3] + cells[10:], line  # FlashInfer and its ratios (the cpu has no graph)
    assert peers["preset:llama.cpp"]["flashinfer"] == "/ t -> min_p mask -> top_k_top_p_sampling_from_logits"
    assert peers["preset:transformers"]["flashinfer"] == "softmax -> top_k_sampling_from_probs"
    assert peers["top_p 0.9"]["flashinfer"] == "softmax -> top_p_sampling_from_probs"
    assert peers["min_p 0.05"]["flashinfer"] == "softmax -> min_p_sampling_from_probs"
    assert peers["dist"]["flashinfer"] == "sampling_from_logits"


def test_a_failing_peer_is_reported_and_the_row_kept():
    fi = _fake_flashinfer()
    fi.sampling_from_logits = lambda logits: (_ for _ in ()).throw(RuntimeError("no kernel image"))
    rows, _ = bench_gpu.run_kernels(
        torch.device("cpu"), "cpu", ["dist"], ["float32"], [2], 500, "randn", repeats=1, warmup=0, fi=fi
    )
    assert rows[0]["flashinfer_ms"] is None and "no kernel image" in rows[0]["errors"]["flashinfer"]
    assert rows[0]["met"] is None and rows[0]["torch_ms"] > 0


@pytest.mark.parametrize("name", ["top_k 50 + top_p 0.9", "top_p 0.9", "min_p 0.05", "preset:transformers"])
def test_the_torch_fallback_keeps_the_chains_candidates(name):
    """vLLM's sort-based masks (the torch column) keep the same tokens as the chain (float32 logits, no ties)."""
    logits = make_logits("randn", 4, 3000, seed=1)
    prm = bench_gpu.chain_params(bench_gpu.chain_samplers(bench_gpu.CHAINS[name]))
    source = bench_gpu.CHAINS[name]
    chain = Chain.load(
        source if isinstance(source, str) else {"chain": {"name": name, "samplers": source}}, backend="cpu"
    )
    ours = torch.isfinite(chain.process(logits))
    x = bench_gpu._temperature(logits, prm["t"])
    full = lambda v, dt: torch.full((4,), v, dtype=dt)  # noqa: E731
    if prm["m"] > 0:
        x = bench_gpu._min_p_mask(x, full(prm["m"], torch.float32))
    x = bench_gpu._top_k_top_p(
        x, full(prm["k"], torch.int64) if prm["k"] else None, full(prm["p"], torch.float32) if prm["p"] < 1 else None
    )
    assert torch.equal(torch.isfinite(x), ours)
    step, _ = bench_gpu.torch_step(logits, prm)
    tokens = step()
    assert ours.gather(1, tokens[:, None]).all()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_run_on_tiny_sizes():
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cuda", *TINY], capture_output=True, text=True, cwd=ROOT, timeout=600
    )
    assert done.returncode == 0, done.stderr
    headers, rows = _table(done.stdout, "chain")
    assert len(rows) == len(bench_gpu.CHAINS) * 2 * 2 and "backend 'cuda'" in done.stdout
    assert all(r[14] in ("yes", "NO", "n/a") for r in rows)
    assert all(r[4] != "n/a" for r in rows)  # every chain replayed from a CUDA graph
