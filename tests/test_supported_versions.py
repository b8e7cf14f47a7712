"""The declared torch / transformers ranges are the tested ones (README "Supported versions"): the installed
versions lie in pyproject.toml's ranges, the README states those ranges, `.venv-tf-min` installs exactly the lower
bound, and every test that compares with transformers carries the `transformers_parity` marker that runs it there."""

from __future__ import annotations

import functools
import importlib.metadata
import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]


def declared(name: str) -> Requirement:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return next(r for r in map(Requirement, deps) if r.name == name)


def lower_bound(req: Requirement) -> Version:
    return next(Version(s.version) for s in req.specifier if s.operator == ">=")


@pytest.mark.transformers_parity  # in .venv-tf-min too: the lowest end is inside the range
@pytest.mark.parametrize("name", ("torch", "transformers"))
def test_the_installed_version_is_in_the_declared_range(name):
    installed = Version(importlib.metadata.version(name))
    assert declared(name).specifier.contains(Version(installed.base_version), prereleases=True), (
        f"{name} {installed} is outside pyproject.toml's {declared(name)}"
    )


def test_the_readme_states_the_declared_ranges():
    readme = (ROOT / "README.md").read_text()
    for name in ("torch", "transformers"):
        req = declared(name)
        bounds = sorted(
            f"{s.operator} {Version(s.version).major}.{Version(s.version).minor}"
            if s.operator == ">="
            else f"{s.operator} {s.version}"
            for s in req.specifier
        )
        row = re.search(rf"^\| {name} \| ([^|]*) \|", readme, re.M)
        assert row, f"README: no row for {name} under Supported versions"
        assert sorted(b.strip() for b in row.group(1).split(",")) == bounds, (row.group(0), str(req))


def test_the_min_environment_installs_the_lower_bound():
    script = ROOT / "scripts" / "setup_transformers_min.sh"
    out = subprocess.run(["bash", str(script), "--version"], capture_output=True, text=True, check=True).stdout
    assert Version(out.strip()) == lower_bound(declared("transformers"))
    assert ".venv-tf-min/" in (ROOT / ".gitignore").read_text().split()


# code that calls one of transformers' references (what the parity tests compare with); samplechain's own
# processors (SamplechainLogitsProcessor of the vLLM and llama.cpp integrations) are not references
_REFERENCE = re.compile(
    r"transformers\.generation|\bmodel\.generate\(|(?<!Samplechain)LogitsProcessor|Warper\(|StoppingCriteria"
    r"|WatermarkDetector"
)


@functools.cache
def _calls_a_reference(function) -> bool:
    try:
        return bool(_REFERENCE.search(inspect.getsource(function)))
    except (OSError, TypeError):
        return False


def test_every_test_that_compares_with_transformers_carries_the_parity_marker(request):
    """Every test collected in this session (-k / -m deselection aside) whose own code calls a reference."""
    root_conftest = next(
        p
        for p in request.config.pluginmanager.get_plugins()
        if getattr(p, "__file__", None) == str(ROOT / "conftest.py")
    )
    unmarked = sorted(
        {
            item.nodeid.split("[")[0]
            for item in request.config.stash[root_conftest.COLLECTED]
            if getattr(item, "function", None) is not None
            and _calls_a_reference(item.function)
            and item.get_closest_marker("transformers_parity") is None
        }
    )
    assert not unmarked, (
        "compare with transformers but lack the transformers_parity marker (see conftest.py): " + ", ".join(unmarked)
    )
