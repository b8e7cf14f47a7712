"""`samplechain bench` and the benchmark scripts, run on tiny matrices: what they print and write, never how fast
anything is (no timed assertions)."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from samplechain.cli import main
from samplechain.tools import bench

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--vocab", "2000", "--batch", "1,2", "--reps", "2", "--rounds", "1", "--kinds", "randn", "--no-progress"]


def _medians(row: dict) -> list[float]:
    return [row[k]["median"] for k in ("ours", "transformers", "read", "baseline") if row[k] is not None]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """One run of the whole tiny matrix (every config, every dtype) with --json and --plot."""
    out = tmp_path_factory.mktemp("bench")
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = main(["bench", *TINY, "--json", str(out / "rows.json"), "--plot", str(out / "plot.png")])
    return code, stdout.getvalue(), out


def test_bench_exits_zero_and_its_table_names_every_config(tiny_run):
    code, text, _ = tiny_run
    assert code == 0
    for name in bench.CONFIGS:
        assert name in text, f"the table does not name {name!r}"
    assert "target" in text and "targets:" in text


def test_bench_json_has_a_row_per_cell_with_numeric_medians(tiny_run):
    _, _, out = tiny_run
    data = json.loads((out / "rows.json").read_text())
    rows = data["rows"]
    cells = {(r["config"], r["dtype"], r["batch"]) for r in rows}
    assert cells == {(c, d, b) for c in bench.CONFIGS for d in bench.DTYPES for b in (1, 2)}
    for r in rows:
        assert r["vocab"] == 2000 and r["kind"] == "randn"
        assert all(isinstance(m, float) and m > 0 for m in _medians(r)), r
        assert r["ours"]["p10"] <= r["ours"]["median"] <= r["ours"]["p90"]
        assert r["ours_over_read"] == pytest.approx(r["ours"]["median"] / r["read"]["median"])
        assert r["met"] in (True, False, None) and r["target"]
    by = {(r["config"], r["dtype"], r["batch"]): r for r in rows}
    # transformers runs beside every float32 row; the other dtypes are held to our own float32 time instead
    assert by[("llama.cpp", "float32", 2)]["transformers"] is not None
    assert by[("llama.cpp", "float16", 2)]["transformers"] is None
    assert by[("llama.cpp", "bfloat16", 1)]["baseline_label"] == "float32 input"
    assert by[("seeded", "float32", 1)]["baseline_label"] == "unseeded"
    assert "B=1" in by[("top-p", "float32", 1)]["target"] and "B=1" not in by[("top-p", "float32", 2)]["target"]
    assert data["environment"]["torch_threads"] == 2


def test_bench_plot_is_a_png_with_content(tiny_run):
    import matplotlib.image

    _, _, out = tiny_run
    png = out / "plot.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    image = matplotlib.image.imread(png)
    height, width = image.shape[:2]
    assert 300 <= height <= 4000 and 600 <= width <= 6000, image.shape
    assert float(image.var()) > 0, "the plot is blank"


def test_bench_markdown_prints_one_table_row_per_cell(capsys):
    code = main(["bench", *TINY, "--batch", "1", "--configs", "min-p,seeded", "--dtypes", "float32", "--markdown"])
    text = capsys.readouterr().out
    assert code == 0
    rows = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(rows) == 1 + 2, text  # the header and one row per (config, B)
    assert rows[0].startswith("| config | logits | dtype | B | ours ms")
    assert any(r.startswith("| seeded | randn | float32 | 1 |") for r in rows)


def test_bench_unknown_config_fails_naming_it_and_the_nearest_choice(capsys):
    code = main(["bench", *TINY, "--configs", "top_p"])
    assert code == 1
    err = " ".join(capsys.readouterr().err.split())
    assert "unknown configuration 'top_p'; did you mean 'top-p'?" in err


def test_without_transformers_its_columns_are_not_available(monkeypatch):
    monkeypatch.setattr(bench, "transformers_available", lambda: False)
    (row,) = bench.run_matrix([1], 2000, ["randn"], ["float32"], 1, 1, False, configs=["top-p"], warmup=1)
    assert row["transformers"] is None and row["transformers_over_ours"] is None
    assert row["read"]["median"] > 0 and row["ours"]["median"] > 0
    assert next(t for t in row["targets"] if "transformers" in t["text"])["met"] is None


def _row(config: str, dtype: str = "float32", batch: int = 8, **ms: float) -> dict:
    return bench._row((config, "randn", dtype, batch), {k: [v] for k, v in ms.items()}, 2000, 1)


def test_a_row_meets_its_targets_only_when_every_applicable_one_holds():
    assert _row("llama.cpp", ours=1.0, transformers=60.0, read=0.5)["met"] is True
    assert _row("llama.cpp", ours=1.0, transformers=40.0, read=0.5)["met"] is False  # 40x < 50x
    assert _row("llama.cpp", ours=3.0, transformers=600.0, read=0.5)["met"] is False  # 6x read > 5x
    assert _row("llama.cpp", ours=1.0, read=0.5)["met"] is None  # transformers n/a, the rest holds
    assert _row("llama.cpp", ours=3.0, read=0.5)["met"] is False  # a miss outweighs an n/a


def test_the_b1_target_allows_three_reads_plus_fifty_microseconds():
    assert _row("min-p", batch=1, ours=0.11, read=0.03, transformers=1.0)["met"] is True  # 0.11 <= 0.09 + 0.05
    assert _row("min-p", batch=1, ours=0.12, read=0.02, transformers=1.0)["met"] is False  # 0.12 > 0.06 + 0.05
    assert "B=1" not in _row("min-p", batch=2, ours=0.12, read=0.02)["target"]


def test_seeded_and_dtype_rows_compare_with_their_baseline():
    assert _row("seeded", ours=1.2, read=0.1, baseline=1.0)["met"] is True
    assert _row("seeded", ours=1.3, read=0.1, baseline=1.0)["met"] is False
    half = _row("top-p", dtype="float16", ours=1.1, read=0.1, baseline=1.0)
    assert half["target"] == "no slower than float32 input" and half["met"] is False
    assert _row("top-p", dtype="bfloat16", ours=0.9, read=0.1, baseline=1.0)["met"] is True


def _script(name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / name), *args], capture_output=True, text=True, cwd=ROOT, timeout=600
    )


def test_bench_chain_script_still_runs_on_a_tiny_grid():
    done = _script(
        "bench_chain.py",
        "--batch",
        "1",
        "--vocab",
        "1000",
        "--reps",
        "2",
        "--rounds",
        "1",
        "--kinds",
        "randn",
        "--markdown",
        "--no-progress",
    )
    assert done.returncode == 0, done.stderr
    assert "| randn | 1 | 1000 |" in done.stdout
    assert "candidate sets: identical in every checked row" in done.stdout


def test_bench_presets_script_still_runs_with_few_reps():
    # it has no batch or vocabulary options: B = 32, V = 128256 always
    done = _script(
        "bench_presets.py",
        "--reps",
        "2",
        "--rounds",
        "1",
        "--warmup",
        "1",
        "--kinds",
        "randn",
        "--markdown",
        "--no-progress",
    )
    assert done.returncode == 0, done.stderr
    for config in ("llama.cpp: pen+DRY", "llama.cpp: pen", "llama.cpp: off", "transformers"):
        assert f"| randn | {config} |" in done.stdout


def test_bench_targets_script_passes_options_through_to_samplechain_bench():
    done = _script("bench_targets.py", *TINY, "--batch", "1", "--configs", "min-p", "--dtypes", "float32", "--markdown")
    assert done.returncode == 0, done.stderr
    assert "| min-p | randn | float32 | 1 |" in done.stdout


def test_llamacpp_comparison_runs_and_keeps_the_same_sets_when_llama_cpp_is_installed():
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is built from source by hand (docs/performance.md)")
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_llamacpp", ROOT / "benchmarks" / "bench_llamacpp.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rows = bench.run([1, 2], 5000, ["peaked"], reps=2, rounds=1, progress=False)
    assert [r["batch"] for r in rows] == [1, 2]
    assert all(r["check"] == "same sets, 4/4 rows" for r in rows), [r["check"] for r in rows]
    assert all(r["samplechain"]["median"] > 0 and r["llama.cpp"]["median"] > 0 for r in rows)


def test_every_sampler_benchmark_runs_on_a_tiny_matrix(capsys):
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_samplers", ROOT / "benchmarks" / "bench_samplers.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--batch", "2", "--vocab", "3000", "--reps", "2", "--no-progress"]) == 0
    table = capsys.readouterr().out
    for name in [*bench.CASES, *bench.SELECTORS]:
        assert f"| {name} |" in table
