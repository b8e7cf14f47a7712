"""benchmarks/bench_vllm_cpu.py (samplechain against vLLM's CPU sampler) runs end to end on tiny sizes in
.venv-vllm and prints one row per configuration and batch size with both samplers' times."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="needs vLLM: run `make test-vllm` (scripts/setup_vllm.sh builds .venv-vllm)")

pytestmark = pytest.mark.vllm
SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "bench_vllm_cpu.py"


def test_the_benchmark_runs_on_tiny_sizes():
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--vocab", "2000", "--batch", "1", "3", "--reps", "2"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ") and "configuration" not in line]
    assert len(rows) == 5 * 2
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        peerless = "vLLM has none" in cells[0]  # typical: samplechain and the read only
        assert all(
            (c == "—") if peerless and i in (1, 3) else float(c.rstrip("x")) > 0 for i, c in enumerate(cells[2:])
        ), row


def test_the_matrix_runs_on_tiny_sizes():
    """--matrix: every configuration of `samplechain bench` on both logits kinds, with vLLM-cpu and transformers."""
    from samplechain.tools.bench import CONFIGS

    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--matrix", "--vocab", "2000", "--batch", "2", "--reps", "2"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ") and "configuration" not in line]
    assert [row.split("|")[1].strip() for row in rows] == [name for name in CONFIGS for _ in range(2)]
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert all(float(c.rstrip("x")) > 0 for c in cells[3:]), row
