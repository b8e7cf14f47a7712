"""scripts/gpu_check.py, the project's GPU check, without a GPU: its CPU dry run (every part on tiny sizes, the reports
it writes, the summary it prints last), a rerun of one part, how it reads pytest's results, which test files it runs,
and its errors. Never how fast anything is."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.py"

spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
assert spec is not None and spec.loader is not None
gpu_check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_check)


def _run(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=ROOT, timeout=timeout, check=False
    )


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_check")
    return _run("--out", str(out), "--dry-run"), out


@pytest.mark.slow
def test_dry_run_runs_every_part_and_writes_both_reports(dry_run):
    done, out = dry_run
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["dry_run"] is True and list(report["parts"]) == ["tests", "kernels", "e2e"]
    tests, kernels, e2e = (report["parts"][p] for p in ("tests", "kernels", "e2e"))
    assert all(p["status"] == "ok" for p in (tests, kernels, e2e))
    # without a CUDA device every gpu test is collected and skipped, none fails
    assert tests["skipped"] > 0 and tests["failed"] == tests["errors"] == 0
    assert set(tests["files"]) == set(gpu_check.gpu_test_files())
    assert {(r["dtype"], r["batch"]) for r in kernels["rows"]} == {
        ("float32", 1),
        ("float32", 2),
        ("bf16", 1),
        ("bf16", 2),
    }
    assert kernels["verdict"]["cells"] == len(kernels["rows"])
    assert {(r["setting"], r["batch"]) for r in e2e["rows"]} == {("greedy", 1), ("sampling", 1)}
    assert all(r["same_tokens"] for r in e2e["rows"] if r["setting"] == "greedy")
    md = (out / "report.md").read_text()
    for heading in (
        "## gpu-marked tests",
        "## One sampling step",
        "## generate() against model.generate",
        "## Summary",
    ):
        assert heading in md
    assert "| chain | logits | B |" in md and "| setting | B |" in md


@pytest.mark.slow
def test_the_summary_comes_last(dry_run):
    done, out = dry_run
    lines = done.stdout.strip().splitlines()
    assert lines[0].startswith("gpu_check on a CPU (dry run)")
    parts = [line.split()[0] for line in lines[1:] if line.startswith("  ") and not line.startswith("   ")]
    assert parts == ["tests", "kernels", "e2e", "report"]  # each part's line (details indented below it)
    assert lines[-1] == f"  report   {out / 'report.md'} and {out / 'report.json'}"
    assert json.loads((out / "report.json").read_text())["summary"] == lines


@pytest.mark.slow
def test_a_rerun_of_one_part_runs_only_that_part(tmp_path):
    done = _run("--out", str(tmp_path), "--dry-run", "--only", "e2e")
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert list(report["parts"]) == ["e2e"]
    assert not (tmp_path / "tests.log").exists() and not (tmp_path / "kernels-float32.log").exists()


def test_a_part_past_its_budget_is_reported_timed_out(tmp_path):
    result = gpu_check.run([sys.executable, "-c", "import time; time.sleep(30)"], tmp_path / "x.log", timeout=1)
    assert result["status"] == "timed out" and result["exit"] is None
    assert (tmp_path / "x.log").read_text().startswith("$ ")


def test_every_module_with_gpu_tests_is_run():
    files = gpu_check.gpu_test_files()
    for expected in (
        "plugins/cuda/tests/test_cuda_catalogue.py",
        "plugins/cuda/tests/test_sync_free.py",
        "tests/test_graphs.py",
        "tests/test_bench_gpu.py",
    ):
        assert expected in files
    assert "tests/test_chain.py" not in files


def test_junit_results_are_counted_with_the_failures_named(tmp_path):
    xml = tmp_path / "r.xml"
    xml.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.test_a" name="test_ok"/>'
        '<testcase classname="tests.test_a" name="test_bad"><failure message="AssertionError: 1 != 2">x</failure>'
        "</testcase>"
        '<testcase classname="tests.test_b" name="test_gpu"><skipped message="needs a CUDA device"/></testcase>'
        '<testcase classname="tests.test_b" name="test_err"><error message="fixture failed"/></testcase>'
        "</testsuite></testsuites>"
    )
    counts = gpu_check.junit_counts(xml)
    assert (counts["passed"], counts["failed"], counts["errors"], counts["skipped"]) == (1, 1, 1, 1)
    assert counts["failures"] == [
        {"test": "tests.test_a::test_bad", "message": "AssertionError: 1 != 2"},
        {"test": "tests.test_b::test_err", "message": "fixture failed"},
    ]
    assert gpu_check.junit_counts(tmp_path / "missing.xml")["passed"] == 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_without_a_gpu_it_says_so_and_points_to_the_dry_run(tmp_path):
    done = _run("--out", str(tmp_path), "--only", "e2e", timeout=120)
    assert done.returncode == 2
    assert "no CUDA device" in done.stderr and "--dry-run" in done.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["--only", "kernel"], "--only kernel: choose from tests, kernels, e2e"),
        (["--budget", "0"], "--budget 0: give a positive number of seconds"),
    ],
)
def test_bad_arguments_name_the_option_and_the_choices(tmp_path, args, message):
    done = _run("--out", str(tmp_path), *args, timeout=60)
    assert done.returncode == 2 and message in done.stderr
