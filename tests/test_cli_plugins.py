"""`samplechain plugins` says whether the cpu backend's compiled path is on, and why not when it is off
(samplechain_cpu.compiled_path): numba missing, too old, failing to import, or turned off by SAMPLECHAIN_CPU_NUMBA."""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

import samplechain_cpu as cpu
from samplechain.cli.plugins import cmd_plugins

SLOWER = "sampling takes the torch paths, several times slower"


def plugins_output(*, as_json: bool = False) -> str:
    out = io.StringIO()
    code = cmd_plugins(argparse.Namespace(json=as_json, available=False), Console(file=out, width=300))
    assert code == 0
    return out.getvalue()


@pytest.fixture
def numba_on(monkeypatch):
    monkeypatch.delenv("SAMPLECHAIN_CPU_NUMBA", raising=False)
    if not cpu.numba_enabled():
        pytest.skip("numba is not installed here (the cpu plugin's dependency where numba has wheels)")
    return monkeypatch


def test_on_with_numbas_version(numba_on):
    import numba

    assert cpu.compiled_path() == (True, f"numba {numba.__version__}")
    assert f"cpu backend: compiled path on (numba {numba.__version__})\n" in plugins_output()


def test_the_json_rows_carry_it_on_the_cpu_row_only(numba_on, capsys):
    plugins_output(as_json=True)  # printed, not through the console
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["cpu"]["compiled"] == {"on": True, "reason": cpu.compiled_path()[1]}
    assert rows["top_p"]["compiled"] is None


def test_off_when_the_environment_turns_it_off(numba_on):
    numba_on.setenv("SAMPLECHAIN_CPU_NUMBA", "0")
    assert cpu.compiled_path() == (False, f"turned off by SAMPLECHAIN_CPU_NUMBA=0; {SLOWER}")
    assert f"cpu backend: compiled path OFF: turned off by SAMPLECHAIN_CPU_NUMBA=0; {SLOWER}\n" in plugins_output()


def test_a_value_neither_on_nor_off_is_named(numba_on):
    numba_on.setenv("SAMPLECHAIN_CPU_NUMBA", "fast")
    on, reason = cpu.compiled_path()
    assert not on and reason.startswith("SAMPLECHAIN_CPU_NUMBA='fast' is neither 1 nor 0; wide rows raise BackendError")


def test_off_when_numba_is_not_installed(numba_on):
    numba_on.setitem(sys.modules, "numba", None)  # importlib.util.find_spec("numba") is None: nothing to import
    assert cpu.compiled_path() == (False, f"numba is not installed (pip install numba); {SLOWER}")
    assert "cpu backend: compiled path OFF: numba is not installed (pip install numba)" in plugins_output()


def test_off_when_numba_is_older_than_the_oldest_supported(numba_on):
    import numba

    numba_on.setattr(cpu, "_NUMBA_MIN", (99, 0))
    cpu._numba_installed.cache_clear()
    try:
        assert cpu.compiled_path() == (
            False,
            f"numba {numba.__version__} is older than 99.0 (pip install -U numba); {SLOWER}",
        )
    finally:
        numba_on.undo()
        cpu._numba_installed.cache_clear()
    assert cpu.compiled_path()[0]


def test_off_when_numba_fails_to_import(tmp_path):
    """A numba whose import raises (built for another numpy, say), found ahead of the real one: the command still
    lists the plugins and names the error."""
    fake = tmp_path / "numba"
    fake.mkdir()
    (fake / "__init__.py").write_text('raise ImportError("Numba needs NumPy 2.5 or less")\n')
    info = tmp_path / "numba-0.68.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: numba\nVersion: 0.68.1\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAMPLECHAIN_")}
    env.update(PYTHONPATH=str(tmp_path), COLUMNS="300")
    script = Path(sys.executable).parent / "samplechain"
    done = subprocess.run([str(script), "plugins"], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert (
        "cpu backend: compiled path OFF: numba does not import (ImportError: Numba needs NumPy 2.5 or less); wide "
        "rows fail until it does, or until SAMPLECHAIN_CPU_NUMBA=0 selects the torch paths"
    ) in " ".join(done.stdout.split())
