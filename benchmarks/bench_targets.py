"""Benchmark: the CPU speed targets, i.e. `samplechain bench` with the settings docs/performance.md reports.

V = 128256, peaked logits, B in {1, 8, 32}, float32 / float16 / bfloat16 input, 2 torch threads, every
configuration of samplechain.tools.bench.CONFIGS (llama.cpp preset, top-p, min-p, seeded dist), medians over
3 rounds x 20 calls. The numbers of docs/performance.md ("samplechain bench") come from

    python benchmarks/bench_targets.py --markdown [--json targets.json --plot targets.png]

Any option of `samplechain bench` may follow and overrides the setting here (argparse keeps the last value).
"""

from __future__ import annotations

import sys

from samplechain.cli import main

TARGET_SETTINGS = [
    "--vocab",
    "128256",
    "--kinds",
    "peaked",
    "--batch",
    "1,8,32",
    "--dtypes",
    "float32,float16,bfloat16",
    "--threads",
    "2",
    "--reps",
    "20",
    "--rounds",
    "3",
]

if __name__ == "__main__":
    sys.exit(main(["bench", *TARGET_SETTINGS, *sys.argv[1:]]))
