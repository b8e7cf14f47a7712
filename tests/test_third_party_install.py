"""A real third-party install: wheels built from this checkout, pip-installed into a fresh virtual environment.

Nothing is mocked. Once per module:

1. `pip wheel --no-deps --no-build-isolation` builds the core, the cpu backend, greedy, dist, the eos and
   max_new_tokens criteria, the example plugins `contrib/samplechain-example-softcap` (a sampler) and
   `contrib/samplechain-example-suffix` (a drafter) and the deliberately broken `contrib/samplechain-broken-example`.
2. `python -m venv` creates a fresh environment (no system site-packages).
3. The heavy dependencies (torch, transformers, pluggy, attrs ...) are not downloaded again: a `.pth` file in the
   fresh environment points at a folder of links to this environment's site-packages, *minus* every samplechain
   distribution and editable hook, so the fresh environment sees only what pip installs into it.
4. `pip install --no-index --no-deps --find-links WHEELS samplechain-example-softcap ...` installs the wheels
   offline (--no-deps: pip would otherwise re-resolve torch's own requirements); `pip check` then confirms that
   every samplechain distribution's requirements, `samplechain>=0.1,<0.2` included, are met.

Then the fresh environment's own `samplechain` command and interpreter must show: the example plugin loaded, the
broken one reported (name, distribution, version, error) while the others keep working, strict mode fatal, a
TOML chain naming `softcap` runs without any code change, and `generate(..., draft="suffix")` drafts with the
installed drafter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
SOURCES = {  # distribution -> source folder
    "samplechain": ROOT,
    "samplechain-cpu": ROOT / "plugins" / "cpu",
    "samplechain-dist": ROOT / "plugins" / "dist",
    "samplechain-greedy": ROOT / "plugins" / "greedy",
    "samplechain-eos": ROOT / "plugins" / "eos",  # generate()'s stopping criteria
    "samplechain-max-new-tokens": ROOT / "plugins" / "max_new_tokens",
    "samplechain-example-softcap": ROOT / "contrib" / "samplechain-example-softcap",
    "samplechain-example-suffix": ROOT / "contrib" / "samplechain-example-suffix",
    "samplechain-broken-example": ROOT / "contrib" / "samplechain-broken-example",
}
INSTALLED = {
    "cpu",
    "dist",
    "greedy",
    "eos",
    "max_new_tokens",
    "example_softcap",
    "example_suffix",
    "broken_example",
}  # entry points the fresh env must show
# What the fresh environment must not inherit from this one: our own distributions (editable or not), their
# import hooks, and the packaging tools the venv brings itself.
NOT_LINKED = (
    "samplechain",
    "_editable_impl_",
    "__editable__",
    "editables",
    "pip",
    "setuptools",
    "_distutils_hack",
    "pkg_resources",
    "__pycache__",
)


def run(cmd: list[str], *, env: dict[str, str], check: bool = True, **kw) -> subprocess.CompletedProcess:
    done = subprocess.run([str(c) for c in cmd], env=env, capture_output=True, text=True, timeout=300, **kw)
    if check and done.returncode != 0:
        raise AssertionError(
            f"`{' '.join(map(str, cmd))}` exited {done.returncode}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
        )
    return done


def clean_env() -> dict[str, str]:
    """The caller's environment without anything that selects plugins or leaks this environment's sys.path."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("SAMPLECHAIN_") and k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")
    }
    env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    return env


def link_dependencies(into: Path) -> Path:
    """A folder of symlinks to every entry of this interpreter's site-packages except those in NOT_LINKED."""
    into.mkdir()
    sites = {Path(sysconfig.get_path("purelib")), Path(sysconfig.get_path("platlib"))}
    for site in sites:
        for entry in site.iterdir():
            name = entry.name.lower()
            if name.startswith(NOT_LINKED) or name.endswith(".pth") or (into / entry.name).exists():
                continue
            (into / entry.name).symlink_to(entry)
    return into


class FreshEnv:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.bin = root / "bin"
        self.python = self.bin / "python"
        self.samplechain = self.bin / "samplechain"
        self.site = Path(
            run(
                [self.python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], env=clean_env()
            ).stdout.strip()
        )


@pytest.fixture(scope="module")
def fresh(tmp_path_factory) -> FreshEnv:
    try:
        import hatchling  # noqa: F401
    except ImportError:
        pytest.fail(f"hatchling is needed to build the wheels; install it into {sys.prefix} (scripts/setup.sh does)")
    base = tmp_path_factory.mktemp("third_party")
    env = clean_env()
    wheels = base / "wheels"
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-w",
            wheels,
            *SOURCES.values(),
        ],
        env=env,
    )
    run([sys.executable, "-m", "venv", base / "venv"], env=env)
    venv = FreshEnv(base / "venv")
    deps = link_dependencies(base / "deps")
    (venv.site / "zz_samplechain_test_deps.pth").write_text(f"{deps}\n")
    run(
        [venv.python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--find-links", wheels, *SOURCES],
        env=env,
    )
    return venv


def plugin_rows(fresh: FreshEnv, **extra_env: str) -> subprocess.CompletedProcess:
    return run([fresh.samplechain, "plugins", "--json"], env={**clean_env(), **extra_env}, check=False)


def test_pip_installed_the_wheels_not_the_checkout(fresh):
    done = run([fresh.python, "-m", "pip", "list", "--format=json", "--path", fresh.site], env=clean_env())
    installed = {p["name"].lower(): p["version"] for p in json.loads(done.stdout)}
    assert {d: installed.get(d) for d in SOURCES} == dict.fromkeys(SOURCES, "0.1.0")
    assert fresh.samplechain.exists(), "the core wheel must install the `samplechain` console script"


def test_every_samplechain_requirement_is_met(fresh):
    """pip check over the fresh environment; lines about the linked dependencies themselves (torch wants a newer
    setuptools than the venv's own, say) are not ours to judge."""
    done = run([fresh.python, "-m", "pip", "check"], env=clean_env(), check=False)
    ours = [line for line in done.stdout.splitlines() if line.lower().startswith("samplechain")]
    assert not ours, "\n".join(ours)


def test_plugins_lists_the_example_loaded_and_the_broken_one_broken(fresh):
    done = plugin_rows(fresh)
    assert done.returncode == 0, done.stderr
    rows = {r["name"]: r for r in json.loads(done.stdout)}
    assert set(rows) == INSTALLED, "the fresh environment sees exactly the plugins installed into it"
    for row in rows.values():
        assert set(row) >= {"name", "kind", "version", "distribution", "status", "error", "provides"}
        assert row["status"] in {"loaded", "broken", "available", "disabled", "blocked"}

    softcap = rows["example_softcap"]
    assert softcap["status"] == "loaded" and softcap["error"] is None
    assert (softcap["distribution"], softcap["version"]) == ("samplechain-example-softcap", "0.1.0")
    assert softcap["kind"] == "sampler"
    assert softcap["provides"] == ["softcap.v1"]

    suffix = rows["example_suffix"]
    assert suffix["status"] == "loaded" and suffix["kind"] == "drafter"
    assert (suffix["distribution"], suffix["provides"]) == ("samplechain-example-suffix", ["suffix.v1"])

    broken = rows["broken_example"]
    assert broken["status"] == "broken"
    assert (broken["distribution"], broken["version"]) == ("samplechain-broken-example", "0.1.0")
    assert "ModuleNotFoundError" in broken["error"] and "samplechain_missing_dependency" in broken["error"]
    assert broken["provides"] == []

    for name, provides in (("cpu", ["cpu.v1"]), ("dist", ["dist.v1"]), ("greedy", ["greedy.v1"])):
        assert rows[name]["status"] == "loaded", f"{name} must keep working next to a broken plugin"
        assert rows[name]["provides"] == provides
        assert rows[name]["distribution"] == f"samplechain-{name}"


def test_strict_mode_makes_the_broken_plugin_fatal(fresh):
    done = plugin_rows(fresh, SAMPLECHAIN_STRICT="1")
    assert done.returncode != 0
    assert done.stdout.strip() == "", "no partial listing in strict mode"
    message = " ".join(done.stderr.split())  # the terminal may wrap
    assert "broken_example" in message
    assert "samplechain-broken-example" in message
    assert "ModuleNotFoundError" in message
    assert "Traceback" not in done.stderr, "a clear error, not a traceback"


CHAIN_TOML = """\
[chain]
samplers = [{ use = "softcap", cap = 5.0 }, { use = "greedy" }]
"""

SCRIPT = """\
import json, sys, warnings

import torch

import samplechain

warnings.simplefilter("error", samplechain.PluginWarning)  # the chain must not even import the broken plugin
chain = samplechain.Chain.load(sys.argv[1])
logits = torch.randn(4, 1000, generator=torch.Generator().manual_seed(0)) * 3.0
out = chain.sample(logits, return_scores=True)
host = samplechain.get_host()
status = {name: info.status for name, info in host.plugins.items()}
broken_imported = "samplechain_broken_example" in sys.modules

with warnings.catch_warnings(record=True) as caught:  # listing everything imports it: a warning, no exception
    warnings.simplefilter("always")
    host.load_all()

print(json.dumps({
    "steps": [step["name"] for step in chain.describe()],
    "tokens": out.token_ids.tolist(),
    "argmax": logits.argmax(dim=-1).tolist(),
    "scores_are_the_formula": torch.equal(out.scores, 5.0 * torch.tanh(logits / 5.0)),
    "files": {m: sys.modules[m].__file__ for m in ("samplechain", "samplechain_example_softcap", "samplechain_greedy")},
    "status_after_sampling": status,
    "broken_imported_by_the_chain": broken_imported,
    "warnings": [(w.category.__name__, str(w.message)) for w in caught],
}))
"""


@pytest.fixture(scope="module")
def sampled(fresh, tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("chain")
    (folder / "chain.toml").write_text(CHAIN_TOML)
    (folder / "use_softcap.py").write_text(SCRIPT)
    done = run([fresh.python, folder / "use_softcap.py", folder / "chain.toml"], env=clean_env(), cwd=folder)
    return json.loads(done.stdout)


def test_a_toml_chain_uses_the_installed_plugin_by_name(sampled):
    assert sampled["steps"] == ["softcap.v1", "greedy.v1"]
    assert sampled["tokens"] == sampled["argmax"], "softcap is argmax invariant: greedy picks the argmax"
    assert sampled["scores_are_the_formula"]


def test_the_chain_runs_the_installed_code(sampled, fresh):
    for module, file in sampled["files"].items():
        assert Path(file).resolve().is_relative_to(fresh.site.resolve()), f"{module} imported from {file}"


def test_plugins_are_imported_only_when_a_chain_needs_them(sampled):
    status = sampled["status_after_sampling"]
    assert status["example_softcap"] == status["greedy"] == status["cpu"] == "loaded"
    assert status["broken_example"] == status["dist"] == "available"
    assert not sampled["broken_imported_by_the_chain"]


def test_a_broken_plugin_is_a_warning_naming_plugin_distribution_version_and_error(sampled):
    assert len(sampled["warnings"]) == 1, sampled["warnings"]
    category, message = sampled["warnings"][0]
    assert category == "PluginWarning"
    for part in (
        "'broken_example'",
        "samplechain-broken-example 0.1.0",
        "ModuleNotFoundError",
        "samplechain_missing_dependency",
    ):
        assert part in message


DRAFTING = """\
import json, sys, warnings

import transformers

import samplechain
from samplechain.generation import generate
from samplechain.models import tiny_model_path

path = tiny_model_path()
model = transformers.AutoModelForCausalLM.from_pretrained(path, local_files_only=True).eval()
tok = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
settings = dict(chain={"samplers": [{"use": "greedy"}]}, max_new_tokens=32)
with warnings.catch_warnings():
    warnings.simplefilter("ignore", samplechain.PluginWarning)  # the broken example, listed elsewhere
    plain = generate(model, tok, ["a b c d a b c d a b"], **settings)
    runs = [generate(model, tok, ["a b c d a b c d a b"], draft="suffix", **settings) for _ in range(2)]
    try:
        generate(model, tok, ["a b"], draft={"use": "suffix", "max_depth": 1}, **settings)
        refused = None
    except samplechain.ConfigError as exc:
        refused = str(exc)
print(json.dumps({
    "same": [run.sequences.tolist() == plain.sequences.tolist() for run in runs],
    "kept": [int(run.kept.sum()) for run in runs],
    "drafter": sys.modules["samplechain_example_suffix"].__file__,
    "refused": refused,
}))
"""


def test_an_installed_drafter_drafts_by_name_and_leaves_the_tokens_alone(fresh, tmp_path):
    """The example drafter (Suffix Decoding) found through its entry point in the fresh environment: `draft="suffix"`
    gives the tokens of generation without a drafter, its second generation drafts from the first's answer, and a
    bad parameter is one error naming it."""
    (tmp_path / "draft.py").write_text(DRAFTING)
    done = run([fresh.python, tmp_path / "draft.py"], env=clean_env(), cwd=tmp_path)
    result = json.loads(done.stdout)
    assert result["same"] == [True, True]
    assert result["kept"][1] > result["kept"][0]
    assert Path(result["drafter"]).resolve().is_relative_to(fresh.site.resolve())
    assert "draft[suffix].max_depth = 1" in result["refused"]
