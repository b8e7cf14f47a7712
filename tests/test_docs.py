"""The documentation covers the contract it describes."""

from __future__ import annotations

import inspect
from pathlib import Path

from samplechain import hookspecs

ROOT = Path(__file__).resolve().parents[1]


def test_plugin_docs_cover_every_hookspec_with_its_exact_signature():
    text = (ROOT / "docs" / "plugins.md").read_text()
    specs = [name for name, fn in vars(hookspecs).items()
             if callable(fn) and hasattr(fn, "samplechain_spec")]
    assert specs, "no hookspecs found"
    for name in specs:
        signature = f"{name}{inspect.signature(getattr(hookspecs, name))}".replace("'", "")
        assert signature in text, f"docs/plugins.md lacks `{signature}`"


def test_readme_states_the_two_commands_and_ci_runs_the_test_one():
    readme = (ROOT / "README.md").read_text()
    assert "`make run`" in readme and "`make test`" in readme
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_sampler_catalogue_is_current_and_every_sampler_has_a_page():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "sampler_catalogue.py"), "--check"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    rows = [line for line in (ROOT / "docs" / "samplers" / "README.md").read_text().splitlines()
            if line.startswith("| `")]
    assert len(rows) >= 39
    for row in rows:
        assert row.rstrip().endswith(".md) |") or "semantics.md#" in row, f"no documentation page: {row[:60]}"
