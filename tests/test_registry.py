"""registry.toml lists every plugin the project ships, with the distribution and entry point it really has."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from samplechain import load_registry

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
REGISTRY = load_registry(ROOT / "registry.toml")
PACKAGES = sorted(p.parent for p in (ROOT / "plugins").glob("*/pyproject.toml")) + sorted(
    p.parent for p in (ROOT / "contrib").glob("samplechain-*/pyproject.toml") if "broken" not in p.parent.name
)


def test_every_plugin_folder_is_in_the_registry():
    listed = {(ROOT / e.path).resolve() for e in REGISTRY.plugins.values()}
    missing = [str(p.relative_to(ROOT)) for p in PACKAGES if p.resolve() not in listed]
    assert not missing, f"add these to registry.toml: {missing}"


@pytest.mark.parametrize("entry", list(REGISTRY.plugins.values()), ids=lambda e: e.name)
def test_registry_entry_matches_the_package(entry):
    pyproject = ROOT / entry.path / "pyproject.toml"
    assert pyproject.exists(), f"{entry.name}: path {entry.path} has no pyproject.toml"
    project = tomllib.loads(pyproject.read_text())["project"]
    assert project["name"] == entry.distribution
    assert entry.name in project["entry-points"]["samplechain"], "entry point name must equal the plugin name"
    assert entry.summary and entry.provides


def test_the_packaged_registry_is_the_checkout_registry():
    from samplechain.engine.registry import registry_path

    assert registry_path().read_text() == (ROOT / "registry.toml").read_text()
