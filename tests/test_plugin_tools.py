"""`samplechain new-plugin` and `samplechain install` (samplechain.tools.plugin_tools), for real and offline.

Fast tests: name validation, the generated files, target resolution through registry.toml (did-you-mean), the
install records, pip failures (a stand-in interpreter whose pip fails).

Slow tests (one fresh virtual environment per module, nothing mocked): the generated package is pip-installed
(`--no-build-isolation --no-deps --no-index`) into a fresh venv, its own generated tests pass with that venv's
pytest, and that venv's `samplechain plugins --json` lists it loaded; `samplechain install PATH` and `samplechain
install NAME` (a registry plugin, from its folder in this checkout) install into the fresh venv and record it;
a failing pip is one clear error with pip's last lines.

The fresh venv sees this environment's dependencies (torch, pluggy, attrs, pytest, pip, hatchling ...) and the
core from this checkout through a `.pth` file pointing at a folder of links to this environment's site-packages
minus every samplechain plugin, as tests/test_third_party_install.py does (`venv --system-site-packages` would
expose the base interpreter's site-packages, not this .venv's). So the fresh venv sees exactly the plugins
installed into it, and pip installs into the fresh venv, never into this environment.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import samplechain
from samplechain import cli
from samplechain.engine.registry import load_registry
from samplechain.tools import plugin_tools
from samplechain.tools.plugin_tools import PluginToolError, install, installed_records, new_plugin, plugin_names

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
CORE = Path(samplechain.__file__).resolve().parents[1]
OFFLINE = "--no-build-isolation --no-deps --no-index"


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch) -> Path:
    """Install records go to a temporary SAMPLECHAIN_HOME, never the user's."""
    folder = tmp_path / "home"
    monkeypatch.setenv("SAMPLECHAIN_HOME", str(folder))
    return folder


# ===================================================================== names


def test_names_derived_from_a_dashed_name():
    names = plugin_names("my-filter2")
    assert (names.plugin, names.module, names.distribution, names.class_name, names.directory) == (
        "my_filter2",
        "samplechain_my_filter2",
        "samplechain-my-filter2",
        "MyFilter2",
        "samplechain-my-filter2",
    )


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("", "plugin name is empty"),
        ("My-Filter", "must be lowercase (try 'my-filter')"),
        ("2fast", "must be a Python identifier"),
        ("my.filter", "must be a Python identifier"),
        ("my filter", "must be a Python identifier"),
        ("café", "must be a Python identifier"),
        ("samplechain-foo", "leave out the 'samplechain' prefix"),
        ("class", "must not be a Python keyword"),
        ("_private", "must not be a Python keyword, nor start"),
        ("a--b", "nor start, end or double an underscore / dash"),
    ],
)
def test_bad_names_are_refused_with_the_rule(name, message):
    with pytest.raises(PluginToolError) as info:
        plugin_names(name)
    assert message in str(info.value)
    assert repr(name) in str(info.value) or not name


def test_a_name_another_plugin_uses_is_refused(tmp_path):
    with pytest.raises(
        PluginToolError,
        match=r"'top_p' is already used by registry.toml plugin 'top_p' "
        r"\(samplechain-top-p\).*pick another name",
    ):
        new_plugin("top-p", tmp_path)
    with pytest.raises(PluginToolError, match=r"'softcap' is already used by 'example_softcap'"):
        new_plugin("softcap", tmp_path)  # a sampler name registry.toml says another plugin provides
    assert not any(tmp_path.iterdir()), "nothing is written for a refused name"


def test_an_existing_non_empty_folder_is_refused_an_empty_one_is_used(tmp_path):
    (tmp_path / "samplechain-taken" / "sub").mkdir(parents=True)
    with pytest.raises(PluginToolError, match="samplechain-taken already exists and is not empty"):
        new_plugin("taken", tmp_path)
    (tmp_path / "samplechain-empty").mkdir()
    assert new_plugin("empty", tmp_path) == tmp_path / "samplechain-empty"
    assert (tmp_path / "samplechain-empty" / "samplechain_empty.py").is_file()


def test_an_unknown_kind_is_refused(tmp_path):
    with pytest.raises(PluginToolError, match="kind 'backend': must be one of sampler, criterion"):
        new_plugin("mine", tmp_path, kind="backend")


# ===================================================================== generated files


@pytest.mark.parametrize(
    ("kind", "hook"), [("sampler", "register_samplers"), ("criterion", "register_stopping_criteria")]
)
def test_the_generated_package(tmp_path, kind, hook):
    target = new_plugin("gen-demo", tmp_path, kind=kind)
    assert target == tmp_path / "samplechain-gen-demo"
    files = sorted(str(p.relative_to(target)) for p in target.rglob("*") if p.is_file())
    assert files == [
        ".gitignore",
        "README.md",
        "pyproject.toml",
        "samplechain_gen_demo.py",
        "tests/conftest.py",
        "tests/test_gen_demo.py",
    ]
    pyproject = tomllib.loads((target / "pyproject.toml").read_text())
    assert pyproject["build-system"]["build-backend"] == "hatchling.build"
    project = pyproject["project"]
    assert project["name"] == "samplechain-gen-demo"
    assert project["entry-points"]["samplechain"] == {"gen_demo": "samplechain_gen_demo"}
    assert project["dependencies"] == ["samplechain>=0.1,<0.2"]
    assert pyproject["tool"]["hatch"]["build"]["targets"]["wheel"]["only-include"] == ["samplechain_gen_demo.py"]
    for py in target.rglob("*.py"):
        ast.parse(py.read_text(), filename=str(py))  # valid Python, no placeholder left behind
    text = "\n".join(p.read_text() for p in target.rglob("*") if p.is_file())
    assert "${" not in text and "$" not in text
    module = (target / "samplechain_gen_demo.py").read_text()
    assert f"def {hook}(register)" in module and 'name = "gen_demo"' in module
    readme = (target / "README.md").read_text()
    assert "samplechain install ." in readme and "pip install samplechain-gen-demo" in readme


def test_the_generated_sampler_works_in_process(tmp_path, monkeypatch):
    """Import the generated module and run it through Chain.load, in this process (the generated tests do more)."""
    import torch

    from samplechain.tools.testing import host_with

    target = new_plugin("inproc-margin", tmp_path)
    monkeypatch.syspath_prepend(str(target))
    import samplechain_inproc_margin as module

    chain = samplechain.Chain.load(
        {"samplers": [{"use": "inproc_margin", "margin": 1.0}, {"use": "test_argmax"}]},
        host=host_with(module.InprocMargin),
        backend="recording",
    )
    logits = torch.randn(4, 100, generator=torch.Generator().manual_seed(0)) * 3
    scores = chain.sample(logits, return_scores=True).scores
    keep = logits >= logits.amax(dim=-1, keepdim=True) - 1.0
    assert torch.equal(scores, torch.where(keep, logits, float("-inf")))
    with pytest.raises(samplechain.ConfigError, match=r"samplers\[0\]\.margin = -1\.0: must be in \[0, inf\)"):
        samplechain.Chain.load(
            {"samplers": [{"use": "inproc_margin", "margin": -1.0}, {"use": "test_argmax"}]},
            host=host_with(module.InprocMargin),
            backend="recording",
        )


def test_cli_new_plugin(tmp_path, capsys):
    assert cli.main(["new-plugin", "cli-made", "--dir", str(tmp_path), "--kind", "criterion"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "criterion cli_made" in out and "samplechain install ." in out
    assert (tmp_path / "samplechain-cli-made" / "tests" / "test_cli_made.py").is_file()
    assert cli.main(["new-plugin", "cli-made", "--dir", str(tmp_path)]) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert "error:" in err and "already exists and is not empty" in err and "Traceback" not in err


def test_cli_install_of_an_unknown_name(capsys):
    assert cli.main(["install", "top-pp", "--pip-args=--no-index"]) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert err.startswith("error: unknown plugin 'top-pp'") and "did you mean top_p" in err


# ===================================================================== resolving install targets


def test_a_registry_name_resolves_to_its_folder_in_this_checkout():
    for name in ("min_p", "min-p", "samplechain-min-p"):
        target = plugin_tools.resolve_target(name)
        assert target.requirement == str((ROOT / "plugins" / "min_p").resolve()), name
        assert (target.distribution, target.name, target.is_path) == ("samplechain-min-p", "min_p", True)
        assert target.source.startswith("registry:min_p path:")


def test_a_registry_name_without_a_folder_resolves_to_its_distribution(tmp_path):
    (tmp_path / "registry.toml").write_text(
        '[plugins.far_away]\nkind = "sampler"\ndistribution = "samplechain-far-away"\npath = "plugins/far_away"\n'
        'summary = "not in this checkout"\n'
    )
    target = plugin_tools.resolve_target("far_away", load_registry(tmp_path / "registry.toml"))
    assert (target.requirement, target.distribution, target.is_path) == (
        "samplechain-far-away",
        "samplechain-far-away",
        False,
    )
    assert target.source == "registry:far_away index:samplechain-far-away"


@pytest.mark.parametrize(
    ("name", "suggestion"), [("top_pp", "top_p"), ("mirostat2", "mirostat"), ("tempreature", "temperature")]
)
def test_an_unknown_name_suggests_registry_plugins(name, suggestion):
    with pytest.raises(PluginToolError) as info:
        plugin_tools.resolve_target(name)
    message = str(info.value)
    assert message.startswith(f"unknown plugin {name!r}: not in ")
    assert "did you mean" in message and suggestion in message.split("did you mean", 1)[1]


def test_an_unknown_name_without_a_close_match_says_how_to_list_them():
    with pytest.raises(PluginToolError) as info:
        plugin_tools.resolve_target("zzzqqq")
    assert "did you mean" not in str(info.value) and "samplechain plugins --available" in str(info.value)


def test_a_path_target_reads_its_pyproject(tmp_path):
    target = plugin_tools.resolve_target(str(new_plugin("path-read", tmp_path)))
    assert (target.distribution, target.name, target.is_path) == ("samplechain-path-read", "path_read", True)
    assert target.source == f"path:{(tmp_path / 'samplechain-path-read').resolve()}"
    with pytest.raises(PluginToolError, match="no such file or folder"):
        plugin_tools.resolve_target(str(tmp_path / "missing"))
    (tmp_path / "not-a-project").mkdir()
    with pytest.raises(PluginToolError, match="not a Python project"):
        plugin_tools.resolve_target(str(tmp_path / "not-a-project"))


def test_an_empty_target_or_a_broken_pyproject_is_refused_before_pip_runs(tmp_path):
    for empty in ("", "  "):  # Path("") is the working folder: it would install whatever project is there
        with pytest.raises(PluginToolError, match="the plugin to install is empty"):
            plugin_tools.resolve_target(empty)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "pyproject.toml").write_text("[project\nname = 'x'\n")
    with pytest.raises(PluginToolError, match=r"broken/pyproject.toml: not valid TOML: .*fix it before installing"):
        plugin_tools.resolve_target(str(broken))


# ===================================================================== install records and pip failures

FAKE_PYTHON = """\
#!{python}
# A stand-in interpreter: answers the environment probe, and its `-m pip` prints PIP_LINES and exits PIP_RC.
import json, os, sys
if sys.argv[1] == "-c":
    dists = json.loads(os.environ["FAKE_DISTS"])
    print(json.dumps({{"prefix": os.environ["FAKE_PREFIX"], "dists": dists}}))
    sys.exit(0)
print(os.environ["PIP_LINES"])
sys.exit(int(os.environ["PIP_RC"]))
"""


@pytest.fixture
def fake_python(tmp_path, monkeypatch) -> str:
    path = tmp_path / "fake-python"
    path.write_text(FAKE_PYTHON.format(python=sys.executable))
    path.chmod(0o755)
    monkeypatch.setenv("FAKE_PREFIX", sys.prefix)
    monkeypatch.setenv(
        "FAKE_DISTS", json.dumps({"samplechain-fake-one": {"version": "1.2.3", "plugins": ["fake_one"]}})
    )
    monkeypatch.setenv("PIP_LINES", "Processing ./x\nSuccessfully installed samplechain-fake-one-1.2.3")
    monkeypatch.setenv("PIP_RC", "0")
    return str(path)


def test_a_pip_failure_is_one_error_with_pips_last_lines(tmp_path, fake_python, monkeypatch, home):
    lines = [f"line {i}" for i in range(40)] + ["ERROR: No matching distribution found for samplechain-x"]
    monkeypatch.setenv("PIP_LINES", "\n".join(lines))
    monkeypatch.setenv("PIP_RC", "1")
    target = new_plugin("fails", tmp_path)
    with pytest.raises(PluginToolError) as info:
        install(str(target), ["--no-index"], python=fake_python)
    message = str(info.value)
    assert message.startswith(
        f"pip could not install {target.resolve()} (`python -m pip install {target.resolve()} "
        f"--no-index` exited 1); pip's last lines:"
    )
    assert "ERROR: No matching distribution found for samplechain-x" in message
    assert "line 39" in message and "line 5\n" not in message, "only the last lines"
    assert not (home / "installed.json").exists(), "a failed install is not recorded"


def test_a_successful_install_is_recorded_and_replaces_the_previous_record(tmp_path, fake_python, monkeypatch, home):
    monkeypatch.setenv(
        "FAKE_DISTS", json.dumps({"samplechain-fake-one": {"version": "1.2.3", "plugins": ["fake_one"]}})
    )
    (tmp_path / "samplechain-fake-one").mkdir()
    (tmp_path / "samplechain-fake-one" / "pyproject.toml").write_text(
        '[project]\nname = "samplechain-fake-one"\nversion = "1.2.3"\n'
        '[project.entry-points.samplechain]\nfake_one = "samplechain_fake_one"\n'
    )
    record = install(str(tmp_path / "samplechain-fake-one"), ["--no-deps"], python=fake_python)
    assert {k: record[k] for k in ("name", "plugins", "distribution", "version", "environment", "pip_args")} == {
        "name": "fake_one",
        "plugins": ["fake_one"],
        "distribution": "samplechain-fake-one",
        "version": "1.2.3",
        "environment": sys.prefix,
        "pip_args": ["--no-deps"],
    }
    assert record["source"] == f"path:{(tmp_path / 'samplechain-fake-one').resolve()}"
    assert record["installed_at"].endswith("+00:00")
    assert plugin_tools.records_path() == home / "installed.json"

    monkeypatch.setenv(
        "FAKE_DISTS", json.dumps({"samplechain-fake-one": {"version": "1.2.4", "plugins": ["fake_one"]}})
    )
    install(str(tmp_path / "samplechain-fake-one"), python=fake_python)
    records = installed_records()
    assert [(r["distribution"], r["version"], r["present"]) for r in records] == [
        ("samplechain-fake-one", "1.2.4", False)
    ], "one record per distribution; not installed here for real"
    assert list(plugin_tools.installed_index()) == ["samplechain-fake-one"]

    monkeypatch.setenv("FAKE_PREFIX", "/some/other/env")
    install(str(tmp_path / "samplechain-fake-one"), python=fake_python)
    assert len(installed_records()) == 1, "only this environment's records by default"
    assert len(installed_records(all_environments=True)) == 2


def test_the_data_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("SAMPLECHAIN_HOME", str(tmp_path / "h"))
    assert plugin_tools.data_dir() == tmp_path / "h"
    monkeypatch.delenv("SAMPLECHAIN_HOME")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert plugin_tools.records_path() == tmp_path / "xdg" / "samplechain" / "installed.json"
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    assert plugin_tools.data_dir() == tmp_path / "user" / ".local" / "share" / "samplechain"
    assert installed_records() == [], "no file yet: no records"


def test_an_unreadable_records_file_is_a_clear_error(home):
    home.mkdir()
    (home / "installed.json").write_text("{not json")
    with pytest.raises(PluginToolError, match="unreadable install records.*delete the file"):
        installed_records()


# ===================================================================== a real fresh environment (slow)

NOT_LINKED = ("samplechain_", "_editable_impl_", "__editable__", "editables", "__pycache__")


def clean_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("SAMPLECHAIN_") and k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")
    }
    env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1", **extra)
    return env


def run(cmd: list, *, env: dict[str, str] | None = None, check: bool = True, **kw) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [str(c) for c in cmd], env=env or clean_env(), capture_output=True, text=True, timeout=300, **kw
    )
    if check and done.returncode != 0:
        raise AssertionError(
            f"`{' '.join(map(str, cmd))}` exited {done.returncode}\n--- stdout\n{done.stdout}\n"
            f"--- stderr\n{done.stderr}"
        )
    return done


class FreshEnv:
    """A venv whose own site-packages holds only what pip installs into it; it sees this environment's
    dependencies and the core of this checkout through a .pth file."""

    def __init__(self, root: Path, home: Path) -> None:
        self.root, self.home = root, home
        self.python = root / "bin" / "python"
        self.site = Path(
            run([self.python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]).stdout.strip()
        )

    def env(self) -> dict[str, str]:
        return clean_env(SAMPLECHAIN_HOME=str(self.home))

    def samplechain(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return run([self.python, "-m", "samplechain.cli", *args], env=self.env(), check=check)

    def plugins(self) -> dict[str, dict]:
        return {r["name"]: r for r in json.loads(self.samplechain("plugins", "--json").stdout)}


@pytest.fixture(scope="module")
def fresh(tmp_path_factory) -> FreshEnv:
    base = tmp_path_factory.mktemp("plugin_tools_env")
    run([sys.executable, "-m", "venv", "--without-pip", base / "venv"])
    links = base / "deps"
    links.mkdir()
    for site in {Path(sysconfig.get_path("purelib")), Path(sysconfig.get_path("platlib"))}:
        for entry in site.iterdir():
            name = entry.name.lower()
            if name.startswith(NOT_LINKED) or name.endswith(".pth") or (links / entry.name).exists():
                continue
            (links / entry.name).symlink_to(entry)
    venv = FreshEnv(base / "venv", base / "home")
    (venv.site / "zz_samplechain_test_deps.pth").write_text(f"{links}\n{CORE}\n")
    return venv


@pytest.fixture(scope="module")
def generated(fresh, tmp_path_factory) -> Path:
    """A generated sampler plugin, pip-installed into the fresh venv (a built wheel, not editable)."""
    target = new_plugin("fresh-margin", tmp_path_factory.mktemp("gen"))
    run([fresh.python, "-m", "pip", "install", "-q", *OFFLINE.split(), target], env=fresh.env())
    return target


@pytest.fixture(scope="module")
def loop_guard(fresh, tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """A generated criterion plugin; its generated tests run from its folder first (nothing installed: the tests
    find the module through tests/conftest.py), then `samplechain install PATH` installs it into the fresh venv."""
    target = new_plugin("fresh-loop", tmp_path_factory.mktemp("gen"), kind="criterion")
    tests = run([fresh.python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], env=fresh.env(), cwd=target)
    assert "passed" in tests.stdout and "failed" not in tests.stdout, tests.stdout
    return target, fresh.samplechain("install", str(target), f"--pip-args={OFFLINE}")


LISTING = """import json, sys, torch
import samplechain, samplechain.tools.testing
from samplechain import cli
from samplechain.tools.plugin_tools import installed_records

# a chain naming the installed sampler: found through its entry point, never registered by hand
chain = samplechain.Chain.load({"samplers": [{"use": "fresh_margin", "margin": 2.0}, {"use": "test_argmax"}]},
                               host=samplechain.tools.testing.host_with(), backend="recording")
logits = torch.randn(3, 64, generator=torch.Generator().manual_seed(1)) * 3
scores = chain.sample(logits, return_scores=True).scores
keep = logits >= logits.amax(dim=-1, keepdim=True) - 2.0
chain_ok = torch.equal(scores, torch.where(keep, logits, float("-inf")))
print(json.dumps({
    "prefix": sys.prefix,
    "core": samplechain.__file__,
    "chain_ok": chain_ok,
    "module": sys.modules["samplechain_fresh_margin"].__file__,
    "records": installed_records(),
}))
print("=== samplechain plugins --json")
sys.exit(cli.main(["plugins", "--json"]))
"""


@pytest.fixture(scope="module")
def listing(fresh, generated, loop_guard, tmp_path_factory) -> dict:
    """One interpreter of the fresh venv, after the installs: `samplechain plugins --json`, installed_records(),
    and a chain naming the installed sampler (one torch import for all of them)."""
    folder = tmp_path_factory.mktemp("listing")
    (folder / "listing.py").write_text(LISTING)
    out = run([fresh.python, folder / "listing.py"], env=fresh.env(), cwd=folder).stdout
    head, rows = out.split("=== samplechain plugins --json\n")
    return {**json.loads(head), "rows": {r["name"]: r for r in json.loads(rows)}}


@pytest.mark.slow
def test_the_fresh_env_is_separate_and_uses_this_core(fresh, listing):
    assert listing["prefix"] == str(fresh.root)
    assert Path(listing["core"]).is_relative_to(CORE), "the core of this checkout"
    assert set(listing["rows"]) == {"fresh_margin", "fresh_loop"}, "only what was installed into it"


@pytest.mark.slow
def test_the_generated_package_installs_and_its_tests_pass(fresh, generated, listing):
    assert Path(listing["module"]).is_relative_to(fresh.site), "imported from the fresh venv's site-packages"
    done = run([fresh.python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], env=fresh.env(), cwd=generated)
    assert "passed" in done.stdout and "failed" not in done.stdout and "error" not in done.stdout, done.stdout
    row = listing["rows"]["fresh_margin"]
    assert (row["status"], row["kind"], row["distribution"], row["version"], row["provides"]) == (
        "loaded",
        "sampler",
        "samplechain-fresh-margin",
        "0.1.0",
        ["fresh_margin.v1"],
    )


@pytest.mark.slow
def test_a_chain_names_the_installed_plugin(listing):
    assert listing["chain_ok"], "Chain.load({'use': 'fresh_margin'}) runs the installed filter"


@pytest.mark.slow
def test_samplechain_install_path_installs_and_records(fresh, loop_guard, listing):
    target, done = loop_guard
    out = " ".join(done.stdout.split())
    assert "installed samplechain-fresh-loop 0.1.0 (fresh_loop)" in out and "recorded in" in out
    records = json.loads((fresh.home / "installed.json").read_text())["records"]
    assert [r["distribution"] for r in records] == ["samplechain-fresh-loop"], "the pip-installed one is not recorded"
    record = records[0]
    assert (record["name"], record["plugins"], record["version"], record["source"], record["environment"]) == (
        "fresh_loop",
        ["fresh_loop"],
        "0.1.0",
        f"path:{target.resolve()}",
        str(fresh.root),
    )
    assert [(r["name"], r["present"]) for r in listing["records"]] == [("fresh_loop", True)]
    row = listing["rows"]["fresh_loop"]
    assert (row["status"], row["kind"], row["distribution"], row["provides"]) == (
        "loaded",
        "stopping_criterion",
        "samplechain-fresh-loop",
        ["fresh_loop.v1"],
    )


@pytest.mark.slow
def test_install_name_uses_the_registry_folder(fresh, listing, home):
    """`install("min-p")` resolves through registry.toml to plugins/min_p of this checkout, pip-installs it into
    the fresh venv (python=), and records it (in this test's SAMPLECHAIN_HOME)."""
    record = install("min-p", OFFLINE.split(), python=str(fresh.python))
    assert (record["name"], record["distribution"], record["version"], record["environment"]) == (
        "min_p",
        "samplechain-min-p",
        "0.1.0",
        str(fresh.root),
    )
    assert record["source"] == f"registry:min_p path:{(ROOT / 'plugins' / 'min_p').resolve()}"
    saved = json.loads((home / "installed.json").read_text())["records"]
    assert [r["distribution"] for r in saved] == ["samplechain-min-p"]
    done = run([fresh.python, "-m", "pip", "show", "samplechain-min-p"], env=fresh.env())
    assert f"Location: {fresh.site}" in done.stdout


@pytest.mark.slow
def test_a_real_pip_failure_is_one_clear_error(fresh, tmp_path, home):
    broken = tmp_path / "samplechain-broken"
    broken.mkdir()
    (broken / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["hatchling"]\nbuild-backend = "hatchling.build"\n'
        '[project]\nname = "samplechain-broken"\nversion = "not a version"\n'
    )
    with pytest.raises(PluginToolError) as info:
        install(str(broken), OFFLINE.split(), python=str(fresh.python))
    message = str(info.value)
    assert message.startswith(
        f"pip could not install {broken.resolve()} (`python -m pip install {broken.resolve()} "
        f"{OFFLINE}` exited 1); pip's last lines:"
    ), message
    assert "Invalid version `not a version`" in message, "pip's (here: the build backend's) own explanation"
    assert not (home / "installed.json").exists(), "a failed install records nothing"
