"""Security: nothing we ship unpickles, custom code never runs without trust, plugin allow/block lists hold.

1. A scanner (Python's `ast`, not grep: aliases such as `import torch as t; t.load(f)` are resolved, `model.eval()`
   is not `eval`) walks every Python file we ship and every file in the repository: no pickle-family imports,
   `torch.load` only with `weights_only=True`, no `numpy.load(allow_pickle=True)`, no `eval`/`exec` of non-literal
   input, no unsafe `yaml.load`, no hard-coded `trust_remote_code=True` in library code, weights in safetensors
   only. The scanner is itself tested on small bad snippets, so it cannot pass by seeing nothing.
2. custom_generate repositories whose every module leaves a marker file when imported: refused without
   `trust_remote_code=True` (samplechain's loader, a Hub-cache id, transformers' `model.generate`) and no marker
   appears; requirements are checked, never pip-installed. A model folder with remote code behind
   `samplechain generate --model` does not run either.
3. `SAMPLECHAIN_PLUGINS` / `SAMPLECHAIN_BLOCK_PLUGINS` set on a real shell command line (`bash -c`) in front of the
   real `samplechain` command: a plugin whose module leaves a marker when imported, and the deliberately broken
   `contrib/samplechain-broken-example` (as a dist-info in a scratch site folder, the way pip lays it out: no venv).
"""

from __future__ import annotations

import ast
import json
import os
import shlex
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from samplechain import ConfigError
from samplechain.integrations.hub import load_custom_generate

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
SHIPPED = ("core/samplechain", "plugins", "integrations", "contrib", "scripts", "benchmarks")  # what is scanned

# ------------------------------------------------------------------------------------------------ the scanner
PICKLE_MODULES = {"pickle", "cPickle", "_pickle", "cloudpickle", "dill", "joblib", "shelve", "marshal"}
PICKLE_CALLS = {"pandas.read_pickle", "torch.save"}  # they write or read pickles themselves
SAFE_YAML_LOADERS = {"SafeLoader", "CSafeLoader", "BaseLoader", "CBaseLoader"}
WEIGHT_SUFFIXES = {".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt", ".joblib", ".dill"}


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    rule: str
    detail: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: [{self.rule}] {self.detail}"


def _aliases(tree: ast.AST) -> dict[str, str]:
    """Local name -> the dotted name it stands for (`np` -> `numpy`, `load` -> `torch.load`), over the whole file:
    scope-blind on purpose, a scanner should err towards seeing too much."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                names[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for a in node.names:
                names[a.asname or a.name] = f"{node.module}.{a.name}"
    return names


def _dotted(node: ast.AST, aliases: dict[str, str]) -> str | None:
    if isinstance(node, ast.Name):
        return aliases.get(node.id, node.id)
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value, aliases)
        return f"{base}.{node.attr}" if base is not None else None
    return None


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _is_const(node: ast.AST | None, value: object) -> bool:
    return isinstance(node, ast.Constant) and node.value is value


def scan_source(source: str, path: str = "<snippet>", *, library: bool = True) -> list[Finding]:
    """Every unsafe pattern in one Python source. `library=False` (tests) allows `trust_remote_code=True`, which
    tests need to exercise the trusted path."""
    tree = ast.parse(source, filename=path)
    aliases = _aliases(tree)
    found: list[Finding] = []

    def add(node: ast.AST, rule: str, detail: str) -> None:
        found.append(Finding(path, getattr(node, "lineno", 0), rule, detail))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            modules = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if node.level == 0
                else []
            )
            for module in modules:
                if module.split(".")[0] in PICKLE_MODULES:
                    add(
                        node,
                        "pickle-import",
                        f"imports {module}: unpickling runs arbitrary code; use safetensors, JSON or TOML",
                    )
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) and library:
            args = node.args
            positional = args.posonlyargs + args.args
            pairs = list(zip(positional[len(positional) - len(args.defaults) :], args.defaults)) + [
                (a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None
            ]
            for arg, default in pairs:
                if arg.arg == "trust_remote_code" and _is_const(default, True):
                    add(default, "trust-default", "trust_remote_code defaults to True: trust must be asked for")
        elif isinstance(node, ast.Call):
            _check_call(node, _dotted(node.func, aliases), library, add)
    return sorted(found, key=lambda f: (f.line, f.rule))


def _check_call(call: ast.Call, name: str | None, library: bool, add: Callable[[ast.AST, str, str], None]) -> None:
    """The call-level rules; `name` is the callee's dotted name with import aliases resolved."""
    if library and _is_const(_keyword(call, "trust_remote_code"), True):
        add(
            call,
            "trust-hardcoded",
            f"{name or 'a call'}(trust_remote_code=True) hard-coded in library code: let the caller decide",
        )
    if name is None:
        return
    root, last = name.split(".")[0], name.rsplit(".", 1)[-1]
    first = call.args[0] if call.args else None
    if (
        name in ("__import__", "importlib.import_module")
        and isinstance(first, ast.Constant)
        and str(first.value).split(".")[0] in PICKLE_MODULES
    ):
        add(call, "pickle-import", f"{name}({first.value!r}): unpickling runs arbitrary code")
    elif root in PICKLE_MODULES or name in PICKLE_CALLS:
        add(call, "pickle-call", f"{name}(...) reads or writes a pickle; use safetensors")
    elif name in ("torch.load", "torch.serialization.load"):
        if not _is_const(_keyword(call, "weights_only"), True):
            add(call, "torch-load", f"{name} without weights_only=True unpickles arbitrary objects")
    elif name in ("numpy.load", "numpy.lib.npyio.load"):
        flag = _keyword(call, "allow_pickle")
        if flag is not None and not _is_const(flag, False):
            add(call, "numpy-pickle", f"{name}(allow_pickle=...) may unpickle object arrays")
    elif name in ("eval", "exec", "builtins.eval", "builtins.exec"):
        if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
            add(
                call,
                "eval-exec",
                f"{name}() of non-literal input runs arbitrary code; parse it (ast.literal_eval, json, tomllib)",
            )
    elif name in ("yaml.unsafe_load", "yaml.unsafe_load_all", "yaml.full_load", "yaml.full_load_all"):
        add(call, "yaml-load", f"{name} constructs arbitrary Python objects; use yaml.safe_load")
    elif name in ("yaml.load", "yaml.load_all"):
        loader = _keyword(call, "Loader") or (call.args[1] if len(call.args) > 1 else None)
        loader_name = _dotted(loader, {}) if loader is not None else None
        if loader_name is None or loader_name.rsplit(".", 1)[-1] not in SAFE_YAML_LOADERS:
            add(call, "yaml-load", f"{name} without Loader=yaml.SafeLoader; use yaml.safe_load")
    elif last == "save_pretrained" and _is_const(_keyword(call, "safe_serialization"), False):
        add(call, "pickle-call", "save_pretrained(safe_serialization=False) writes pickled weights")


def _repo_files(*roots: str) -> list[Path]:
    """Tracked and untracked-but-not-ignored files (what a commit would ship) under `roots`, that exist."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-co", "--exclude-standard", "-z", "--", *roots],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"not a git checkout ({exc}): the file list comes from git ls-files")
    venvs = {d.name for d in ROOT.iterdir() if (d / "pyvenv.cfg").is_file()}  # environments, never shipped
    return sorted({ROOT / p for p in out.split("\0") if p and p.split("/", 1)[0] not in venvs and (ROOT / p).is_file()})


def _is_test_file(rel: Path) -> bool:
    return "tests" in rel.parts or rel.name.startswith("test_") or rel.name == "conftest.py"


def scan_tree() -> tuple[list[Finding], int]:
    findings: list[Finding] = []
    files = [p for p in _repo_files(*SHIPPED) if p.suffix == ".py"]
    for path in files:
        rel = path.relative_to(ROOT)
        try:
            findings += scan_source(path.read_text(encoding="utf-8"), str(rel), library=not _is_test_file(rel))
        except SyntaxError as exc:  # a file the scanner cannot read is a file it did not check
            findings.append(Finding(str(rel), exc.lineno or 0, "unparsable", f"cannot be scanned: {exc.msg}"))
    return findings, len(files)


def _pickle_like(path: Path) -> str | None:
    """Why a file's bytes look like a pickle (any name), a torch.save archive, or a safetensors file that is not."""
    with path.open("rb") as f:
        head = f.read(16)
        if path.suffix == ".safetensors":  # u64 little-endian header length, then a JSON header
            size = int.from_bytes(head[:8], "little")
            f.seek(8)
            try:
                json.loads(f.read(min(size, 100_000_000)))
            except ValueError:
                return "named .safetensors but has no safetensors JSON header"
            return None
        if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
            f.seek(-1, os.SEEK_END)
            if f.read(1) == b".":  # PROTO n ... STOP
                return "pickle stream"
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as z:
            if any(n.endswith(".pkl") for n in z.namelist()):
                return "zip archive holding a .pkl (torch.save format)"
    return None


# One bad snippet per rule: the scanner must flag each, so an empty finding list means something.
BAD = {
    "import pickle": "pickle-import",
    "from cPickle import loads": "pickle-import",
    "import dill as d": "pickle-import",
    "import joblib": "pickle-import",
    "import shelve": "pickle-import",
    "from marshal import loads": "pickle-import",
    "import cloudpickle": "pickle-import",
    "__import__('pickle')": "pickle-import",
    "import importlib\nimportlib.import_module('dill')": "pickle-import",
    "import pickle as p\np.loads(b)": "pickle-call",
    "import pandas as pd\npd.read_pickle(f)": "pickle-call",
    "import torch\ntorch.save(sd, f)": "pickle-call",
    "import torch\ntorch.load(f)": "torch-load",
    "import torch\ntorch.load(f, weights_only=False)": "torch-load",
    "import torch as t\nt.load(f, map_location='cpu')": "torch-load",
    "from torch import load\nload(f)": "torch-load",
    "import torch.serialization\ntorch.serialization.load(f)": "torch-load",
    "import torch\ntorch.load(f, **kw)": "torch-load",
    "import numpy as np\nnp.load(f, allow_pickle=True)": "numpy-pickle",
    "import numpy\nnumpy.load(f, allow_pickle=flag)": "numpy-pickle",
    "eval(text)": "eval-exec",
    "exec(compile(src, 'x', 'exec'))": "eval-exec",
    "import builtins\nbuiltins.eval(user)": "eval-exec",
    "eval(f'{a}+1')": "eval-exec",
    "import yaml\nyaml.load(s)": "yaml-load",
    "import yaml\nyaml.load(s, Loader=yaml.Loader)": "yaml-load",
    "import yaml\nyaml.load(s, yaml.UnsafeLoader)": "yaml-load",
    "import yaml\nyaml.unsafe_load(s)": "yaml-load",
    "import yaml\nyaml.full_load(s)": "yaml-load",
    "from transformers import AutoModel\nAutoModel.from_pretrained(p, trust_remote_code=True)": "trust-hardcoded",
    "load_custom_generate(repo, trust_remote_code=True)": "trust-hardcoded",
    "def open_repo(path, trust_remote_code=True): ...": "trust-default",
    "def open_repo(path, *, trust_remote_code: bool = True): ...": "trust-default",
    "model.save_pretrained(out, safe_serialization=False)": "pickle-call",
}
GOOD = [
    "model.eval()",  # torch's Module.eval, not the builtin
    "import ast\nast.literal_eval(text)",
    "eval('1 + 1')",
    "import torch\ntorch.load(f, weights_only=True, map_location='cpu')",
    "import numpy as np\nnp.load(f)\nnp.load(f, allow_pickle=False)",
    "import yaml\nyaml.safe_load(s)\nyaml.load(s, Loader=yaml.SafeLoader)\nyaml.load(s, Loader=CSafeLoader)",
    "load_custom_generate(repo, trust_remote_code=trust_remote_code)",
    "def open_repo(path, trust_remote_code=False): ...",
    "model.save_pretrained(out, safe_serialization=True)",
    "from safetensors.torch import load_file\nload_file(f)",
    "spec.loader.exec_module(module)",  # importlib's loader, reached only after the trust check (hub.py)
]


@pytest.mark.parametrize("snippet, rule", list(BAD.items()), ids=list(BAD))
def test_the_scanner_flags_each_unsafe_pattern(snippet, rule):
    assert rule in {f.rule for f in scan_source(snippet)}, f"the scanner missed {snippet!r}"


def test_the_scanner_leaves_safe_code_alone():
    for snippet in GOOD:
        assert scan_source(snippet) == [], snippet


def test_tests_may_pass_trust_remote_code_but_not_unpickle():
    """Tests exercise the trusted path explicitly; the pickle rules hold for them too."""
    assert scan_source("load_custom_generate(r, trust_remote_code=True)", library=False) == []
    assert [f.rule for f in scan_source("import pickle", library=False)] == ["pickle-import"]


def test_no_shipped_python_file_unpickles_evals_or_trusts_remote_code():
    findings, scanned = scan_tree()
    assert scanned > 100, f"only {scanned} Python files found under {SHIPPED}: the file list is wrong"
    assert not findings, "unsafe code (fix it, or say why it is safe and teach the scanner):\n" + "\n".join(
        map(str, findings)
    )


def test_weights_ship_as_safetensors_only():
    files = _repo_files()
    assert any(p.suffix == ".safetensors" for p in files), "the embedded model's safetensors file is not listed"
    named = [str(p.relative_to(ROOT)) for p in files if p.suffix.lower() in WEIGHT_SUFFIXES]
    assert not named, f"pickle-format weight files in the repository (convert them to safetensors): {named}"
    sniffed = [f"{p.relative_to(ROOT)}: {why}" for p in files if (why := _pickle_like(p))]
    assert not sniffed, "files whose bytes are pickles:\n" + "\n".join(sniffed)


def test_the_byte_sniffer_recognises_pickles_and_torch_archives(tmp_path):
    import pickle  # noqa: S403 -- writes a test pickle; this file is a test, scanned with the pickle rules off

    import torch

    (tmp_path / "weights.txt").write_bytes(pickle.dumps({"w": [1.0]}, protocol=4))
    torch.save({"w": torch.zeros(2)}, tmp_path / "state.dat")
    (tmp_path / "fake.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!")
    assert _pickle_like(tmp_path / "weights.txt") == "pickle stream"
    assert "torch.save" in (_pickle_like(tmp_path / "state.dat") or "")
    assert "no safetensors JSON header" in (_pickle_like(tmp_path / "fake.safetensors") or "")
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(2)}, tmp_path / "real.safetensors")
    assert _pickle_like(tmp_path / "real.safetensors") is None


def test_the_custom_generate_loader_never_installs_anything():
    """Requirements are checked with packaging and reported; hub.py has no way to run pip (or anything else)."""
    tree = ast.parse((ROOT / "core" / "samplechain" / "integrations" / "hub.py").read_text(encoding="utf-8"))
    aliases = _aliases(tree)
    imported = set(aliases.values())
    assert not {m for m in imported if m.split(".")[0] in {"subprocess", "pip", "runpy", "ensurepip"}}, imported
    calls = {_dotted(n.func, aliases) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    assert not {c for c in calls if c and c.startswith(("os.system", "os.popen", "os.exec", "os.spawn"))}, calls


# ------------------------------------------------------------------------------------------------ custom code trust
def _trap(marker: Path, module: str) -> str:
    """Source whose first effect, at import, is to append its name to `marker`."""
    return f"import pathlib\nwith pathlib.Path({str(marker)!r}).open('a') as _f:\n    _f.write({module!r} + '\\n')\n"


def _trapped_repo(root: Path, marker: Path, requirements: str | None = None) -> Path:
    """A custom_generate repo where every module, generate.py included, leaves a marker when imported."""
    folder = root / "custom_generate"
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text(_trap(marker, "__init__"))
    (folder / "generate.py").write_text(_trap(marker, "generate") + "def generate(model, **kw):\n    return 'ran'\n")
    (folder / "helper.py").write_text(_trap(marker, "helper") + "def register_samplers(register):\n    pass\n")
    if requirements is not None:
        (folder / "requirements.txt").write_text(requirements)
    return root


@pytest.fixture
def repo_modules() -> Iterator[None]:
    """sys.modules as it was: the trusted control imports the repo as a package."""
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if name.startswith("samplechain_custom_generate_"):
            del sys.modules[name]


def test_an_untrusted_repo_is_refused_before_any_of_its_code_runs(tmp_path, repo_modules):
    marker = tmp_path / "imported.txt"
    repo = _trapped_repo(tmp_path / "repo", marker)
    for trust in ({}, {"trust_remote_code": False}, {"trust_remote_code": "yes"}, {"trust_remote_code": 1}):
        with pytest.raises(ConfigError, match=r"trust_remote_code=True") as err:
            load_custom_generate(repo, **trust)
        assert "custom_generate/generate.py" in str(err.value) and "custom_generate/helper.py" in str(err.value)
        assert not marker.exists(), f"repo code ran with {trust}: {marker.read_text()}"
    # the control: with trust the same repo's modules do run, so the marker's absence above means something
    assert load_custom_generate(repo, trust_remote_code=True).generate(None) == "ran"
    assert set(marker.read_text().split()) == {"__init__", "generate", "helper"}


def test_an_untrusted_repo_from_the_hub_cache_is_refused_before_any_of_its_code_runs(tmp_path):
    marker = tmp_path / "imported.txt"
    commit = "89abcdef0123456789abcdef0123456789abcdef"
    snapshot = tmp_path / "cache" / "models--someone--trapped"
    (snapshot / "refs").mkdir(parents=True)
    (snapshot / "refs" / "main").write_text(commit)
    _trapped_repo(snapshot / "snapshots" / commit, marker)
    with pytest.raises(ConfigError, match=r"someone/trapped@89abcdef.*trust_remote_code=True"):
        load_custom_generate("someone/trapped", revision=commit, cache_dir=tmp_path / "cache")
    assert not marker.exists()


def test_requirements_are_checked_and_reported_never_pip_installed(tmp_path, monkeypatch, repo_modules):
    marker = tmp_path / "imported.txt"
    repo = _trapped_repo(tmp_path / "repo", marker, requirements="samplechain-no-such-package-anywhere==1.0\n")
    spawned: list[object] = []

    def refuse(*args, **kwargs):
        spawned.append(args)
        raise AssertionError(f"loading a custom_generate repo started a process: {args}")

    for target in ("subprocess.Popen", "os.system", "os.posix_spawn", "os.execv", "os.execve"):
        monkeypatch.setattr(target, refuse, raising=False)
    pip_before = {m for m in sys.modules if m == "pip" or m.startswith("pip.")}
    with pytest.raises(ConfigError, match="trust_remote_code"):
        load_custom_generate(repo)
    with pytest.raises(ImportError, match=r"samplechain-no-such-package-anywhere==1.0 \(installed: None\)"):
        load_custom_generate(repo, trust_remote_code=True)  # trusted, yet only checked: the user installs
    assert not spawned and not marker.exists()  # requirements fail before any module of the repo is imported
    assert {m for m in sys.modules if m == "pip" or m.startswith("pip.")} == pip_before


@pytest.mark.slow
def test_transformers_generate_refuses_the_repo_without_running_it(tmp_path):
    """Duplicates nothing of test_custom_generate_repo.py (which checks the error): here, that nothing ran."""
    import torch

    from samplechain.tools.testing import tiny_gpt2

    marker = tmp_path / "imported.txt"
    repo = _trapped_repo(tmp_path / "repo", marker)
    model = tiny_gpt2(300)
    with pytest.raises(ValueError, match="trust_remote_code"):
        model.generate(
            input_ids=torch.tensor([[1, 2, 3]]), custom_generate=str(repo), trust_remote_code=False, max_new_tokens=2
        )
    assert not marker.exists()


def _clean_env(**extra: str) -> dict[str, str]:
    """The caller's environment minus anything that selects plugins (the outer SAMPLECHAIN_STRICT=1 included)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAMPLECHAIN_") and k != "PYTHONPATH"}
    env.update(PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", **extra)
    return env


def _sh(script: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """`script` through a real shell, stdin closed: nobody is there to answer a prompt."""
    return subprocess.run(
        ["bash", "-c", script], env=env, cwd=cwd, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL
    )


@pytest.mark.slow
def test_a_model_folder_with_remote_code_does_not_run_through_samplechain_generate(tmp_path):
    """`samplechain generate --model FOLDER` passes trust_remote_code=False: the folder's own modules never run,
    and the refusal is one clear error (no terminal prompt, no traceback)."""
    marker = tmp_path / "imported.txt"
    folder = tmp_path / "model"
    folder.mkdir()
    auto_map = {
        "AutoConfig": "configuration_canary.CanaryConfig",
        "AutoModelForCausalLM": "modeling_canary.CanaryForCausalLM",
        "AutoTokenizer": ["tokenization_canary.CanaryTokenizer", None],
    }
    (folder / "config.json").write_text(json.dumps({"model_type": "samplechain_canary", "auto_map": auto_map}))
    tokenizer_map = {"AutoTokenizer": auto_map["AutoTokenizer"]}
    (folder / "tokenizer_config.json").write_text(json.dumps({"auto_map": tokenizer_map}))
    for module in ("configuration_canary", "modeling_canary", "tokenization_canary"):
        (folder / f"{module}.py").write_text(_trap(marker, module))
    done = _sh(
        f"samplechain generate --model {shlex.quote(str(folder))} --max-new-tokens 2 hello", _clean_env(), tmp_path
    )
    assert done.returncode != 0
    assert "needs its own Python code (auto_map), which samplechain never runs" in done.stderr
    assert "Traceback" not in done.stderr  # one clear error, not a crash
    assert not marker.exists(), marker.read_text()


# ------------------------------------------------------------------------------------------------ allow / block lists
CANARY = '''
import pathlib
with pathlib.Path({marker!r}).open("a") as _f:
    _f.write("canary imported\\n")

import samplechain as sc


class CanaryProbe(sc.Sampler):
    """Passes logits through; its module's import is what the tests watch."""
    name = "canary_probe"
    stage = sc.Stage.TRANSFORM

    def apply(self, cand, ctx):
        return cand


@sc.hookimpl
def register_samplers(register):
    register(CanaryProbe)
'''
BROKEN = ROOT / "contrib" / "samplechain-broken-example"


def _dist_info(site: Path, dist: str, entry_point: str, module: str) -> None:
    """What pip leaves in site-packages for a plugin distribution: METADATA and entry_points.txt."""
    info = site / f"{dist.replace('-', '_')}-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(f"[samplechain]\n{entry_point} = {module}\n")


@dataclass
class Shell:
    """A scratch site folder on PYTHONPATH with the canary plugin and the broken example, and chain files."""

    root: Path
    marker: Path

    def run(self, assignments: str, command: str) -> subprocess.CompletedProcess[str]:
        """`VAR=value ... samplechain ...` typed into bash, as a user would."""
        return _sh(f"{assignments} {command}", _clean_env(PYTHONPATH=str(self.root / "site")), self.root)

    def plugins(self, assignments: str) -> dict[str, dict]:
        """`samplechain plugins --json` (which loads every plugin it may) by entry-point name."""
        done = self.run(assignments, "samplechain plugins --json")
        assert done.returncode == 0, done.stderr
        return {p["name"]: p for p in json.loads(done.stdout)}


@pytest.fixture
def shell(tmp_path) -> Shell:
    site = tmp_path / "site"
    site.mkdir()
    marker = tmp_path / "canary-imported.txt"
    (site / "samplechain_canary_probe.py").write_text(CANARY.format(marker=str(marker)))
    _dist_info(site, "samplechain-canary-probe", "canary_probe", "samplechain_canary_probe")
    shutil.copy(BROKEN / "samplechain_broken_example.py", site / "samplechain_broken_example.py")
    _dist_info(site, "samplechain-broken-example", "broken_example", "samplechain_broken_example")
    (tmp_path / "canary.toml").write_text('[chain]\nsamplers = [{ use = "canary_probe" }, { use = "greedy" }]\n')
    return Shell(tmp_path, marker)


@pytest.mark.slow
def test_shell_block_list_keeps_a_plugin_unimported_and_a_chain_naming_it_fails_clearly(shell):
    found = shell.plugins("SAMPLECHAIN_STRICT=1 SAMPLECHAIN_BLOCK_PLUGINS=canary_probe,broken_example")
    assert found["canary_probe"]["status"] == "blocked" and found["broken_example"]["status"] == "blocked"
    assert found["greedy"]["status"] == "loaded"  # blocking two plugins leaves the others alone
    done = shell.run("SAMPLECHAIN_BLOCK_PLUGINS=canary_probe", "samplechain validate canary.toml")
    assert done.returncode != 0
    assert "canary.toml: chain.samplers[0].use = 'canary_probe'" in done.stderr
    assert "is blocked: in SAMPLECHAIN_BLOCK_PLUGINS" in done.stderr
    assert not shell.marker.exists()


@pytest.mark.slow
def test_shell_allow_list_excludes_everything_else(shell):
    found = shell.plugins("SAMPLECHAIN_PLUGINS=greedy,cpu")
    assert {n for n, p in found.items() if p["status"] == "loaded"} == {"greedy", "cpu"}
    assert {p["status"] for n, p in found.items() if n not in ("greedy", "cpu")} == {"disabled"}
    done = shell.run("SAMPLECHAIN_PLUGINS=greedy,cpu", "samplechain validate canary.toml")
    assert done.returncode != 0 and "is disabled: not in SAMPLECHAIN_PLUGINS" in done.stderr
    found = shell.plugins("SAMPLECHAIN_PLUGINS=")  # empty: none at all
    assert {p["status"] for p in found.values()} == {"disabled"}
    assert not shell.marker.exists()


@pytest.mark.slow
def test_shell_block_list_wins_over_the_allow_list(shell):
    both = "SAMPLECHAIN_PLUGINS=canary_probe,greedy,cpu SAMPLECHAIN_BLOCK_PLUGINS=canary_probe"
    found = shell.plugins(both)
    assert found["canary_probe"]["status"] == "blocked" and found["greedy"]["status"] == "loaded"
    # the library path this time: a Python one-liner in the same shell
    done = shell.run(both, "python -c 'import samplechain; samplechain.Chain.load(\"canary.toml\")'")
    assert done.returncode != 0
    assert "is blocked: in SAMPLECHAIN_BLOCK_PLUGINS" in done.stderr.strip().splitlines()[-1]
    assert not shell.marker.exists()


@pytest.mark.slow
def test_shell_without_lists_the_canary_runs_and_the_broken_plugin_is_isolated(shell):
    """The control for the tests above (the canary's import is visible), and the broken example end to end:
    listed as broken, the rest working; fatal in strict mode, whose error names the block-list way out."""
    found = shell.plugins("SAMPLECHAIN_STRICT=0")
    assert shell.marker.read_text() == "canary imported\n"  # listing everything imports everything
    broken = found["broken_example"]
    assert broken["status"] == "broken" and broken["distribution"] == "samplechain-broken-example"
    assert "samplechain_missing_dependency" in broken["error"]
    assert found["greedy"]["status"] == "loaded" and found["canary_probe"]["status"] == "loaded"
    done = shell.run("SAMPLECHAIN_STRICT=1", "samplechain plugins --json")
    assert done.returncode != 0
    assert "plugin 'broken_example' (samplechain-broken-example 0.1.0)" in done.stderr
    assert "SAMPLECHAIN_BLOCK_PLUGINS=broken_example" in done.stderr
