"""Requests per second through the OpenAI-compatible vLLM server on the embedded model, with and without
samplechain choosing the tokens: 64 concurrent completions of 32 tokens each (eos ignored, so every run produces
the same number of tokens), after one warm-up round per mode.

    .venv-vllm/bin/python integrations/vllm/benchmarks/bench_serve.py [--requests 64] [--tokens 32] [--rounds 5]

Modes (--modes), all on one server:
    vllm                 no samplechain in the request: vLLM's own seeded sampling, temperature 1.0; with the plugin
                         installed the processor is idle (one empty-dict check per step); uninstall samplechain-vllm
                         from .venv-vllm to measure vLLM without it (then only this mode runs)
    greedy               vllm_xargs {"samplechain": "greedy"}
    llama.cpp            vllm_xargs {"samplechain": "llama.cpp"}, seeded (10 samplers, history-reading)
Prints a markdown table: median and best of --rounds rounds per mode, the modes interleaved round by round, and
the median over rounds of each mode's rate against the first mode's in the same round (robust to the machine's drift
between rounds); each round's rates go to stderr."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import requests

from samplechain.models import tiny_model_path

MODES: dict[str, tuple[str, dict[str, Any] | None]] = {
    "vllm": ("vllm sampling", None),
    "greedy": ("samplechain greedy", {"samplechain": "greedy"}),
    "llama.cpp": ("samplechain llama.cpp (seeded)", {"samplechain": "llama.cpp"}),
}


def start(port: int, max_num_seqs: int, log: Any) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(tiny_model_path()),
        "--served-model-name",
        "docs-gpt2",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--enforce-eager",
        "--max-model-len",
        "256",
        "--max-num-seqs",
        str(max_num_seqs),
        "--disable-log-stats",
    ]
    env = {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
        "VLLM_USE_V2_MODEL_RUNNER": "0",
    }
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def wait_ready(url: str, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with {proc.returncode}")
        try:
            if requests.get(url + "/health", timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(1)
    raise SystemExit("the server was not ready in time")


def round_trip(url: str, n: int, tokens: int, xargs: dict[str, Any] | None) -> float:
    def one(i: int) -> None:
        body: dict[str, Any] = {
            "model": "docs-gpt2",
            "prompt": f"Example {i}: in Python, a list is",
            "max_tokens": tokens,
            "ignore_eos": True,
            "temperature": 1.0,
            "seed": i,
        }
        if xargs:
            body["vllm_xargs"] = xargs
        r = requests.post(url + "/v1/completions", json=body, timeout=600)
        r.raise_for_status()
        assert r.json()["usage"]["completion_tokens"] == tokens

    start_t = time.perf_counter()
    with ThreadPoolExecutor(max_workers=n) as pool:
        list(pool.map(one, range(n)))
    return n / (time.perf_counter() - start_t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma list of {', '.join(MODES)}")
    args = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    with tempfile.NamedTemporaryFile("wb", suffix=".log", delete=False) as log:
        proc = start(port, args.requests, log)
    try:
        wait_ready(url, proc)
        modes = args.modes.split(",")
        try:
            from samplechain_vllm import SamplechainLogitsProcessor  # noqa: F401

            plugin = "plugin installed, idle"
        except ImportError:  # samplechain requests would silently run vLLM's sampling: measure vLLM alone
            plugin, modes = "plugin not installed", ["vllm"]
        names = []
        for key in modes:
            name, xargs = MODES[key]
            names.append(f"{name} ({plugin})" if xargs is None else name)
            round_trip(url, args.requests, args.tokens, xargs)  # warm-up
        runs: list[list[float]] = [[] for _ in modes]
        for _ in range(args.rounds):  # modes interleaved: drift in the machine's load hits every mode alike
            for k, key in enumerate(modes):
                runs[k].append(round_trip(url, args.requests, args.tokens, MODES[key][1]))
        medians = [statistics.median(r) for r in runs]
        print(
            f"| mode ({args.requests} concurrent requests, {args.tokens} tokens each) | requests/s, median | "
            f"best | tokens/s, median | vs first | vs first, round by round (median) |"
        )
        print("| --- | ---: | ---: | ---: | ---: | ---: |")
        for name, run, med in zip(names, runs, medians):
            paired = statistics.median(a / b for a, b in zip(run, runs[0]))  # each round against the first mode's
            print(
                f"| {name} | {med:.1f} | {max(run):.1f} | {med * args.tokens:.0f} | {med / medians[0]:.2f}x | "
                f"{paired:.2f}x |"
            )
        for name, run in zip(names, runs):
            print(f"{name}: " + " ".join(f"{v:.1f}" for v in run), file=sys.stderr)
        print(f"\nserver log: {log.name}", file=sys.stderr)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)


if __name__ == "__main__":
    main()
