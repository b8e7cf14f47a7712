"""The documentation covers the contract it describes."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from samplechain import hookspecs

ROOT = Path(__file__).resolve().parents[1]


def test_plugin_docs_cover_every_hookspec_with_its_exact_signature():
    text = (ROOT / "docs" / "plugins.md").read_text()
    specs = [name for name, fn in vars(hookspecs).items() if callable(fn) and hasattr(fn, "samplechain_spec")]
    assert specs, "no hookspecs found"
    for name in specs:
        signature = f"{name}{inspect.signature(getattr(hookspecs, name))}".replace("'", "")
        assert signature in text, f"docs/plugins.md lacks `{signature}`"


def test_readme_states_the_two_commands_and_ci_runs_the_test_one():
    readme = (ROOT / "README.md").read_text()
    assert "`make run`" in readme and "`make test`" in readme
    assert "make test" in (ROOT / ".ci" / "run").read_text()


GENERATOR = ROOT / "scripts" / "sampler_catalogue.py"
GENERATED = ("docs/samplers/README.md", "docs/reference.md", "docs/presets.md")


def _generator():
    """scripts/sampler_catalogue.py as a module (scripts/ is not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("sampler_catalogue", GENERATOR)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _sections(text: str, level: str) -> dict[str, str]:
    """Backticked name of each heading at `level` ("###") -> its text up to the next heading of any level."""
    parts = re.split(rf"^{level} `([^`]+)`\n", text, flags=re.M)
    return {name: re.split(r"^#+ ", body, flags=re.M)[0] for name, body in zip(parts[1::2], parts[2::2])}


def _table_names(section: str) -> list[str]:
    """The first cells (`name`) of the parameter table in a section."""
    return re.findall(r"^\| `(\w+)` \|", section, flags=re.M)


def _ours(kind: str) -> dict[str, type]:
    """Newest class of every name the plugins of this checkout's plugins/ register."""
    from samplechain import get_host

    host = get_host()
    host.load_all()
    entries = [e for e in host.registry.plugins.values() if e.kind == kind and e.path.startswith("plugins/")]
    provided = {n for e in entries for n in (e.name, *e.provides)}
    return {n: v[max(v)] for n, v in host.registered(kind).items() if n in provided}


def test_generated_docs_are_current():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, str(GENERATOR), "--check"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_check_covers_every_generated_file(tmp_path, capsys):
    gen = _generator()
    assert sorted(str(p.relative_to(ROOT)) for p in gen.OUTPUTS) == sorted(GENERATED)
    texts = {rel: gen.OUTPUTS[ROOT / rel]() for rel in GENERATED}  # render once
    # copies of the three files, each made stale in turn: --check must name exactly that one
    for stale in GENERATED:
        outputs = {}
        for rel, text in texts.items():
            copy = tmp_path / rel.replace("/", "_")
            copy.write_text(text + ("edited by hand\n" if rel == stale else ""))
            outputs[copy] = lambda text=text: text
        gen.OUTPUTS = outputs
        assert gen.main(["--check"]) == 1
        err = capsys.readouterr().err
        assert stale.replace("/", "_") in err and err.count("out of date") == 1, err


def test_every_sampler_has_a_catalogue_row_and_a_page():
    rows = [
        line for line in (ROOT / "docs" / "samplers" / "README.md").read_text().splitlines() if line.startswith("| `")
    ]
    assert len(rows) >= 39
    for row in rows:
        assert row.rstrip().endswith(".md) |") or "semantics.md#" in row, f"no documentation page: {row[:60]}"


def test_reference_documents_every_sampler_and_criterion_with_each_field():
    import attrs

    text = (ROOT / "docs" / "reference.md").read_text()
    samplers_part, rest = text.split("\n## Stopping criteria\n")
    criteria_part = rest.split("\n## Backends\n")[0]
    for kind, part in (("sampler", samplers_part), ("stopping_criterion", criteria_part)):
        sections = _sections(part, "###")
        registered = _ours(kind)
        assert registered, f"no {kind} registered"
        for name, cls in registered.items():
            assert name in sections, f"docs/reference.md has no section for {kind} {name!r}"
            fields = [f.name for f in attrs.fields(cls.Params)]
            documented = _table_names(sections[name])
            assert documented == fields, f"{kind} {name!r}: reference lists {documented}, Params has {fields}"
            assert fields or "No parameters." in sections[name]


def test_reference_shows_ranges_and_per_request_names_from_the_schemas():
    sections = _sections((ROOT / "docs" / "reference.md").read_text(), "###")
    top_p = {row.split(" | ")[0]: row for row in sections["top_p"].splitlines() if row.startswith("| `")}
    # from TopPParams: validator in_range(0.0, 1.0, hint="1 disables"); request_aliases {"top_p": "p"}
    assert "[0, 1] (1 disables)" in top_p["| `p`"] and "`top_p`, `top_p.p`" in top_p["| `p`"]
    assert "| required |" in top_p["| `p`"]
    penalties = sections["penalties"]
    assert 'one of "llama.cpp", "transformers", "vllm"' in penalties and "chain only" in penalties


def test_reference_lists_the_chain_keys_the_loader_accepts_and_every_backend():
    from samplechain.engine.config import _CHAIN_KEYS

    text = (ROOT / "docs" / "reference.md").read_text()
    chain_part = text.split("\n## The chain file\n")[1].split("\n## ")[0]
    assert set(re.findall(r"^\| `(\w+)` \| (?:array|string)", chain_part, flags=re.M)) == set(_CHAIN_KEYS)
    backends = text.split("\n## Backends\n")[1]
    for name, cls in _ours("backend").items():
        assert f"| `{name}.v{cls.version}` | `{cls.device_type}` |" in backends, f"backend {name!r} missing"


def test_presets_page_holds_every_preset_as_a_chain_that_loads():
    import tomllib

    from samplechain import Chain, get_host

    presets = get_host().registry.presets
    text = (ROOT / "docs" / "presets.md").read_text()
    sections = dict(re.findall(r"^## (\S+)\n(.*?)(?=^## |\Z)", text, flags=re.M | re.S))
    assert set(sections) == set(presets)
    for name, table in presets.items():
        blocks = re.findall(r"```toml\n(.*?)\n```", sections[name], flags=re.S)
        assert len(blocks) == 1, f"preset {name!r}: expected one TOML block, found {len(blocks)}"
        chain = tomllib.loads(blocks[0])["chain"]
        assert chain["name"] == name
        assert chain["samplers"] == table["samplers"], f"preset {name!r}: the TOML differs from registry.toml"
        assert [s.cls.name for s in Chain.load({"chain": chain}).config.samplers] == [
            s["use"] for s in table["samplers"]
        ]
        assert re.search(r"^Engine: .+\. Order: .+\.$", sections[name], flags=re.M), f"{name}: no origin note"


def test_readme_links_every_docs_page():
    readme = (ROOT / "README.md").read_text()
    pages = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md"))
    missing = [p for p in pages if f"({p})" not in readme]
    assert not missing, f"README.md does not link {missing}: add them to its Documentation table"


def test_guarantees_name_only_tests_that_exist():
    """docs/guarantees.md pairs each promise with the tests that hold it: every `path::test_name` it names is a
    test function in that file, and every path it names exists."""
    import ast
    import re

    text = (ROOT / "docs" / "guarantees.md").read_text()
    named = re.findall(r"`((?:tests|plugins)/[\w/]+\.py)(?:::(\w+))?`", text)
    assert len(named) >= 30, "guarantees.md should name the tests behind its promises"
    for path, test in named:
        source = ROOT / path
        assert source.is_file(), f"guarantees.md names {path}, which does not exist"
        if test:
            functions = {n.name for n in ast.walk(ast.parse(source.read_text())) if isinstance(n, ast.FunctionDef)}
            assert test in functions, f"guarantees.md names {path}::{test}, which is not a test there"
