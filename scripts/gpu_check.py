"""The project's GPU check: on a CUDA machine, in one command and a fixed time budget (9 minutes by default), in order

    tests     the `gpu`-marked tests (sync debug mode "error", CUDA-graph capture and replay, the cuda backend's tokens
              against the cpu backend's for every preset and sampler on float32 and bf16-tied logits, the Triton
              kernels against their reference)
    kernels   benchmarks/bench_gpu.py's sampling step, float32 then bf16 logits, against FlashInfer, vLLM's torch
              sampler and one logits.max(-1), at V = 128256 and B = 1 to 512; the eager step of cells that miss their
              target is profiled (kernels, host waits and reads, the slowest kernels)
    e2e       generate() against model.generate per step, greedy and sampling, on a Llama-3.2-1B-shaped model

and writes report.md and report.json to the folder it is given, then prints a short summary as its last lines.

    python3 scripts/gpu_check.py --out gpu-report                  # everything (make gpu-check OUT=gpu-report)
    python3 scripts/gpu_check.py --out gpu-report --only kernels   # a rerun of one part (tests, kernels, e2e)
    python3 scripts/gpu_check.py --out dry --dry-run               # on a CPU: every part on tiny sizes

A part that runs past its share of the budget is stopped and reported as timed out; the next part still runs. The
exit status is 1 when a test failed or a part could not finish, else 0 (a missed speed target is reported, not an
error). On a machine without network access, install the project and FlashInfer from wheels first (docs/backends.md,
"On your own GPU").
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks" / "bench_gpu.py"
PARTS = ("tests", "kernels", "e2e")
# of the budget; time a part leaves goes to the next ones. On a fresh machine the tests first compile the Triton
# kernels, which takes minutes, so they take the largest share.
SHARE = {"tests": 0.55, "kernels": 0.28, "e2e": 0.17}
TEST_DIRS = ("tests", "plugins", "integrations", "contrib")
GPU_MARK = re.compile(r"pytest\.mark\.gpu\b|\bgpu_test\b")
# bench_gpu.py's sizes: on a GPU sized to fit the budget, in a dry run its tiny sizes
KERNEL_SIZES = ["--repeats", "30", "--warmup", "5", "--profile", "4"]
E2E_SIZES = ["--e2e-repeats", "3", "--new-tokens", "48"]
DRY_SIZES = ["--tiny", "--vocab", "1000", "--batch", "1,2", "--repeats", "2", "--warmup", "1", "--profile", "2"]
DRY_E2E = ["--tiny", "--e2e-batch", "1", "--new-tokens", "4", "--prompt-len", "4"]


def gpu_test_files(root: Path = ROOT) -> list[str]:
    """The test modules holding `gpu`-marked tests, relative to root (found by their marker, so a new one is run)."""
    found = []
    for top in TEST_DIRS:
        for path in sorted((root / top).rglob("test_*.py")):
            if ".venv" in path.parts or "site-packages" in path.parts:
                continue
            if GPU_MARK.search(path.read_text(encoding="utf-8", errors="replace")):
                found.append(str(path.relative_to(root)))
    return found


def run(cmd: Sequence[str], log: Path, timeout: float, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run cmd from the project root with its output in `log`: status "ok", "failed" (exit status) or "timed out"."""
    t0 = time.monotonic()
    with open(log, "w") as fh:
        fh.write(f"$ {shlex.join(cmd)}\n")
        fh.flush()
        try:
            done = subprocess.run(
                cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT, timeout=max(timeout, 1), env=env, check=False
            )
            status, code = ("ok" if done.returncode == 0 else "failed"), done.returncode
        except subprocess.TimeoutExpired:
            status, code = "timed out", None
    return {"status": status, "exit": code, "seconds": round(time.monotonic() - t0, 1), "log": log.name}


def tail(path: Path, lines: int = 15) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""


# --------------------------------------------------------------------------- parts
def part_tests(out: Path, timeout: float, python: str) -> dict[str, Any]:
    files = gpu_test_files()
    xml = out / "tests.xml"
    cmd = [python, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", f"--junitxml={xml}", *files]
    result = run(cmd, out / "tests.log", timeout)
    result["files"] = files
    result.update(junit_counts(xml))
    if result["status"] == "failed" and result["failed"] == 0 and result["errors"] == 0:
        result["problem"] = tail(out / "tests.log")
    return result


def junit_counts(xml: Path) -> dict[str, Any]:
    """passed / failed / errors / skipped and the failures' names and first message lines, from pytest's junit XML."""
    counts: dict[str, Any] = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0, "failures": []}
    if not xml.exists():
        return counts
    for case in ET.parse(xml).getroot().iter("testcase"):
        outcome = next((child for child in case if child.tag in ("failure", "error", "skipped")), None)
        if outcome is None:
            counts["passed"] += 1
            continue
        key = {"failure": "failed", "error": "errors", "skipped": "skipped"}[outcome.tag]
        counts[key] += 1
        if key != "skipped":
            message = (outcome.get("message") or outcome.text or "").strip().splitlines()
            name = f"{case.get('classname', '')}::{case.get('name', '')}"
            counts["failures"].append({"test": name, "message": (message[0] if message else "")[:300]})
    return counts


def part_kernels(out: Path, timeout: float, python: str, dry: bool) -> dict[str, Any]:
    """bench_gpu.py's step benchmark, one run per dtype (a run stopped by the budget keeps the other's rows)."""
    result: dict[str, Any] = {"status": "ok", "seconds": 0.0, "rows": [], "pipelines": {}, "runs": []}
    deadline = time.monotonic() + timeout
    for i, dtype in enumerate(("float32", "bf16")):
        left = (deadline - time.monotonic()) / (2 - i)
        js = out / f"kernels-{dtype}.json"
        sizes = ["--device", "cpu", *DRY_SIZES] if dry else KERNEL_SIZES
        cmd = [python, str(BENCH), "--parts", "kernels", "--dtypes", dtype, *sizes, "--json", str(js), "--quiet"]
        run_result = run(cmd, out / f"kernels-{dtype}.log", left)
        result["runs"].append({"dtype": dtype, **run_result})
        result["seconds"] += run_result["seconds"]
        if run_result["status"] == "ok" and js.exists():
            data = json.loads(js.read_text())
            result["rows"] += data["kernels"]
            result["pipelines"].update(data["pipelines"])
            result.setdefault("env", data["env"])
        else:
            result["status"] = run_result["status"]
            result["problem"] = tail(out / f"kernels-{dtype}.log")
    return result


def part_e2e(out: Path, timeout: float, python: str, dry: bool) -> dict[str, Any]:
    js = out / "e2e.json"
    sizes = ["--device", "cpu", *DRY_E2E] if dry else E2E_SIZES
    cmd = [python, str(BENCH), "--parts", "e2e", *sizes, "--json", str(js), "--quiet"]
    result = run(cmd, out / "e2e.log", timeout)
    result["rows"] = json.loads(js.read_text())["e2e"] if result["status"] == "ok" and js.exists() else []
    if result["status"] != "ok":
        result["problem"] = tail(out / "e2e.log")
    return result


# --------------------------------------------------------------------------- report
def environment(python: str) -> dict[str, Any]:
    """The device and the versions, as the interpreter that runs the parts sees them."""
    probe = (
        "import json, importlib, torch\n"
        "def v(m):\n"
        "    try:\n"
        "        return importlib.import_module(m).__version__\n"
        "    except Exception as e:\n"
        "        return None\n"
        "cuda = torch.cuda.is_available()\n"
        "print(json.dumps({'cuda': cuda, 'device': torch.cuda.get_device_name(0) if cuda else None,\n"
        "  'torch': torch.__version__, 'cuda_version': torch.version.cuda, 'triton': v('triton'),\n"
        "  'flashinfer': v('flashinfer'), 'transformers': v('transformers'), 'samplechain': v('samplechain')}))\n"
    )
    done = subprocess.run([python, "-c", probe], capture_output=True, text=True, cwd=ROOT, check=False)
    env: dict[str, Any] = json.loads(done.stdout) if done.returncode == 0 else {"probe_error": done.stderr[-500:]}
    env.update(
        date=datetime.datetime.now().isoformat(timespec="seconds"),
        host=platform.node(),
        cpu=platform.processor() or platform.machine(),
        python=platform.python_version(),
        command=shlex.join([os.path.basename(sys.executable), *sys.argv]),
    )
    return env


def kernel_verdict(rows: Sequence[dict[str, Any]], bench: Any) -> dict[str, Any]:
    met = [r for r in rows if r.get("met") is True]
    missed = [r for r in rows if r.get("met") is False]
    worst = sorted(missed, key=lambda r: _miss(r, bench), reverse=True)[:5]
    return {
        "cells": len(rows),
        "met": len(met),
        "missed": len(missed),
        "unjudged": len(rows) - len(met) - len(missed),
        "worst": [f"{r['chain']} {r['dtype']} B={r['batch']} ({_miss(r, bench):.2f}x its target)" for r in worst],
    }


def _miss(row: dict[str, Any], bench: Any) -> float:
    """How far a cell is from bench_gpu.py's target, as a factor (the better of the eager step and its replay)."""
    best = min(v for v in (row["samplechain_ms"], row.get("graph_ms")) if v is not None)
    if row["batch"] == 1:
        return best / bench.TARGET_B1_MS
    fi = row.get("flashinfer_ms")
    return best / fi / bench.TARGET_VS_FI if fi else 0.0


def e2e_verdict(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    missed = [r for r in rows if not r["met"]]
    return {
        "rows": len(rows),
        "met": len(rows) - len(missed),
        "missed": len(missed),
        "worst": [
            f"{r['setting']} B={r['batch']} ({r['samplechain_over_model_generate']:.2f}x model.generate)"
            for r in sorted(missed, key=lambda r: r["samplechain_over_model_generate"], reverse=True)
        ],
        "different_greedy_tokens": [r["batch"] for r in rows if r.get("same_tokens") is False],
    }


def markdown(report: dict[str, Any], out: Path, bench: Any) -> str:
    env, parts = report["env"], report["parts"]
    lines = [
        "# samplechain GPU check" + (" (dry run on a CPU)" if report["dry_run"] else ""),
        "",
        f"- device: {env.get('device') or 'no CUDA device'}; host {env.get('host')}, {env.get('cpu')}",
        f"- torch {env.get('torch')} (CUDA {env.get('cuda_version')}), triton {env.get('triton')}, FlashInfer "
        f"{env.get('flashinfer') or 'not importable'}, transformers {env.get('transformers')}, samplechain "
        f"{env.get('samplechain')}, python {env.get('python')}",
        f"- command: `{env['command']}`; date {env['date']}; budget {report['budget_s']:g} s, used "
        f"{report['seconds']:g} s",
    ]
    if "tests" in parts:
        t = parts["tests"]
        lines += [
            "",
            "## gpu-marked tests",
            "",
            f"{t['status']} in {t['seconds']:g} s: {t['passed']} passed, {t['failed']} failed, {t['errors']} errors, "
            f"{t['skipped']} skipped ({len(t['files'])} files; log {t['log']})",
        ]
        lines += [f"- FAILED `{f['test']}`: {f['message']}" for f in t["failures"]]
        if t.get("problem"):
            lines += ["", "```", t["problem"], "```"]
    if "kernels" in parts:
        k = parts["kernels"]
        head = f"{k['status']} in {k['seconds']:g} s"
        if k["rows"]:
            v = k["verdict"]
            head += f"; targets met in {v['met']} of {v['cells']} cells, missed in {v['missed']}"
            head += f" (worst: {', '.join(v['worst'])})." if v["worst"] else "."
        lines += ["", "## One sampling step", "", head]
        if k["rows"]:
            lines += [
                "",
                bench.kernel_table(k["rows"]),
                *bench.profile_section(k["rows"], "cuda" if not report["dry_run"] else "cpu"),
            ]
        if k.get("problem"):
            lines += ["", "```", k["problem"], "```"]
    if "e2e" in parts:
        e = parts["e2e"]
        lines += ["", "## generate() against model.generate", "", f"{e['status']} in {e['seconds']:g} s"]
        if e["rows"]:
            lines += ["", bench.e2e_table(e["rows"])]
        if e.get("problem"):
            lines += ["", "```", e["problem"], "```"]
    lines += ["", "## Summary", "", "```", *report["summary"], "```"]
    return "\n".join(lines) + "\n"


def summary_lines(report: dict[str, Any], out: Path) -> list[str]:
    env, parts = report["env"], report["parts"]
    lines = [
        f"gpu_check on {env.get('device') or 'a CPU (dry run)'}: {report['seconds']:g} s of {report['budget_s']:g}"
    ]
    if "tests" in parts:
        t = parts["tests"]
        lines.append(
            f"  tests    {t['status']}: {t['passed']} passed, {t['failed']} failed, {t['errors']} errors, "
            f"{t['skipped']} skipped ({t['seconds']:g} s)"
        )
        lines += [f"    FAILED {f['test']}: {f['message'][:150]}" for f in t["failures"][:10]]
    if "kernels" in parts:
        k = parts["kernels"]
        v = k.get("verdict")
        got = f"{v['met']}/{v['cells']} cells met their target" if v and v["cells"] else "no rows"
        lines.append(f"  kernels  {k['status']}: {got} ({k['seconds']:g} s)")
        if v and v["worst"]:
            lines.append(f"    worst: {'; '.join(v['worst'][:3])}")
    if "e2e" in parts:
        e = parts["e2e"]
        v = e.get("verdict")
        got = f"{v['met']}/{v['rows']} rows met their target" if v and v["rows"] else "no rows"
        lines.append(f"  e2e      {e['status']}: {got} ({e['seconds']:g} s)")
        if v and v["worst"]:
            lines.append(f"    missed: {'; '.join(v['worst'])}")
        if v and v["different_greedy_tokens"]:
            lines.append(f"    greedy tokens differ from model.generate at B = {v['different_greedy_tokens']}")
    lines.append(f"  report   {out / 'report.md'} and {out / 'report.json'}")
    return lines


def load_bench() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_gpu", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --------------------------------------------------------------------------- main
def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", required=True, help="folder for report.md, report.json and each part's log")
    ap.add_argument("--only", default=",".join(PARTS), help=f"comma-separated parts to run (default all: {PARTS})")
    ap.add_argument("--budget", type=float, default=540.0, help="seconds for all parts together (default 540)")
    ap.add_argument("--dry-run", action="store_true", help="on a CPU: every part on tiny sizes (what a test runs)")
    ap.add_argument("--python", default=sys.executable, help="the interpreter that runs the parts (default: this one)")
    args = ap.parse_args(argv)
    args.only = [p.strip() for p in args.only.split(",") if p.strip()]
    bad = [p for p in args.only if p not in PARTS]
    if bad or not args.only:
        ap.error(f"--only {','.join(bad) or '(empty)'}: choose from {', '.join(PARTS)}")
    if args.budget <= 0:
        ap.error(f"--budget {args.budget:g}: give a positive number of seconds")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    env = environment(args.python)
    if not args.dry_run and not env.get("cuda"):
        why = env.get("probe_error") or "torch.cuda.is_available() is False"
        print(
            f"gpu_check: no CUDA device for {args.python} ({why}); --dry-run runs every part on a CPU", file=sys.stderr
        )
        return 2
    bench = load_bench()
    t0 = time.monotonic()
    parts: dict[str, Any] = {}
    for i, part in enumerate(args.only):
        left = args.budget - (time.monotonic() - t0)
        share = sum(SHARE[p] for p in args.only[i:])
        timeout = left * SHARE[part] / share
        print(f"gpu_check: {part} (up to {timeout:.0f} s)", file=sys.stderr, flush=True)
        if part == "tests":
            parts[part] = part_tests(out, timeout, args.python)
        elif part == "kernels":
            parts[part] = part_kernels(out, timeout, args.python, args.dry_run)
            parts[part]["verdict"] = kernel_verdict(parts[part]["rows"], bench)
        else:
            parts[part] = part_e2e(out, timeout, args.python, args.dry_run)
            parts[part]["verdict"] = e2e_verdict(parts[part]["rows"])
    report: dict[str, Any] = {
        "env": env,
        "dry_run": args.dry_run,
        "budget_s": args.budget,
        "seconds": round(time.monotonic() - t0, 1),
        "parts": parts,
    }
    report["summary"] = summary_lines(report, out)
    (out / "report.md").write_text(markdown(report, out, bench))
    (out / "report.json").write_text(json.dumps(report, indent=2))
    print("\n".join(report["summary"]))
    tests = parts.get("tests")
    failed = tests is not None and (tests["failed"] or tests["errors"] or tests["status"] != "ok")
    unfinished = any(p["status"] != "ok" for p in parts.values())
    return 1 if failed or unfinished else 0


if __name__ == "__main__":
    sys.exit(main())
