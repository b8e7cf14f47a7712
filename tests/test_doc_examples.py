"""Every code example in the docs runs. A page's blocks run in document order in one scratch folder that holds the
repo's contrib/ and the TOML blocks whose first line names a file (`# chain.toml`), so a file one block writes is
there for the next:

- ```python blocks are executed in a namespace shared by the page, with the embedded model as `model` / `tok` /
  `tokenizer`, `inputs` for "In Python, a list is", `logits` (2, V);
- ```sh / ```bash / ```console / ```shell blocks: each line that starts with `samplechain ` (after an optional
  `$ ` prompt; in a block that uses prompts only the prompted lines are commands; a line ending in a backslash
  continues) runs through bash with this interpreter's bin folder first on PATH and must exit 0. Other lines
  (pip, make, git, python ...) are not run, except `cd DIR`, which moves the block's later commands into DIR
  (each block starts in the scratch folder). HOME and SAMPLECHAIN_HOME point into the scratch folder, the Hub
  is offline;
- a page whose shell commands install something (`samplechain install`) gets a fresh venv of its own, first on
  PATH, so nothing is installed into the environment the tests run in (see `FreshVenv`). Until a page's first
  `samplechain install`, a command that is a plain word list (no pipe, redirection, variable or glob) runs in
  this process, through `samplechain.cli.main` with the command's environment, folder and an empty stdin: a new
  process would spend most of its time importing torch and transformers again (tests/test_cli.py runs the
  installed command);
- ```toml blocks that declare a chain load with Chain.load.

A block preceded by `<!-- doc-test: skip REASON -->` is skipped, and the reason must be given (e.g. it needs a Hub
download)."""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import warnings
from pathlib import Path
from unittest import mock

import pytest
import tomllib
import torch

from samplechain import Chain
from samplechain.models import cache_dir

ROOT = Path(__file__).resolve().parents[1]
FILES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "contrib").glob("*/README.md")])
PYTHON = {"python", "py"}
SHELL = {"sh", "bash", "console", "shell"}
BLOCK = re.compile(
    r"(?:<!-- doc-test: (?P<skip>skip[^>]*)-->\s*\n)?(?P<indent>[ ]*)```"
    r"(?P<lang>python|py|toml|sh|bash|console|shell)\n(?P<code>.*?)\n[ ]*```",
    re.S,
)
COMMAND_TIMEOUT_S = 300
INSTALL = re.compile(r"samplechain install\b")


def blocks(path: Path) -> list[tuple[str, str, str | None, int]]:
    text = path.read_text(encoding="utf-8")
    return [
        (m["lang"], textwrap.dedent(m["code"]), m["skip"], text.count("\n", 0, m.start()) + 1)
        for m in BLOCK.finditer(text)
    ]


def with_blocks(lang: set[str]) -> list[Path]:
    return [p for p in FILES if any(b[0] in lang for b in blocks(p))]


def runnable(block: tuple[str, str, str | None, int]) -> bool:
    """A python block, or a shell block with at least one `samplechain` command."""
    lang, code = block[0], block[1]
    return lang in PYTHON or (lang in SHELL and any(c.startswith("samplechain ") for c in shell_lines(code)))


def shell_lines(code: str) -> list[str]:
    """The lines of a shell block that the test acts on: `samplechain ...` commands and `cd DIR`, prompts removed,
    backslash-continued lines joined."""
    joined: list[str] = []
    for line in code.splitlines():
        if joined and joined[-1].endswith("\\"):
            joined[-1] = joined[-1][:-1].rstrip() + " " + line.strip()
        else:
            joined.append(line.rstrip())
    prompted = any(line.startswith("$ ") for line in joined)
    out = []
    for line in joined:
        if prompted:
            if not line.startswith("$ "):
                continue  # output of the command above
            line = line[2:]
        line = line.strip()
        if line.startswith("samplechain ") or re.fullmatch(r"cd \S+", line):
            out.append(line)
    return out


def installs(path: Path) -> bool:
    return any(
        lang in SHELL and skip is None and any(INSTALL.match(c) for c in shell_lines(code))
        for lang, code, skip, _line in blocks(path)
    )


class FreshVenv:
    """A venv in the scratch folder for pages whose commands install plugins: `samplechain install` pip-installs
    into the environment samplechain runs in, and must not add to the one the tests run in. It sees this
    environment (torch, the core, every plugin, pip, hatchling) through a .pth file that adds this site-packages
    after its own (a plain `venv --system-site-packages` would expose the base interpreter's, not this venv's), so
    what pip installs into it comes first; pip leaves distributions outside the venv alone. Its bin/ holds a
    `samplechain` of its own. pip runs offline and without build isolation (PIP_NO_BUILD_ISOLATION=0 means
    "--no-build-isolation", pip's naming)."""

    def __init__(self, root: Path) -> None:
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
        self.bin = root / "bin"
        python = self.bin / "python"
        site = subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        ours = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
        (Path(site) / "zz_samplechain_doc_test.pth").write_text(
            "import site; " + "; ".join(f"site.addsitedir({p!r})" for p in sorted(ours)) + "\n"
        )
        launcher = self.bin / "samplechain"
        launcher.write_text(f"#!{python}\nimport sys\nfrom samplechain.cli import main\nsys.exit(main())\n")
        launcher.chmod(0o755)
        self.env = {
            "PIP_NO_BUILD_ISOLATION": "0",
            "PIP_NO_INDEX": "1",
            "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "PIP_NO_INPUT": "1",
        }


def word_list(command: str) -> list[str] | None:
    """The command's words as bash would pass them, or None where bash would do more than split and unquote (a
    pipe, redirection, variable, glob, `~`)."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        words = list(lexer)
    except ValueError:
        return None
    unquoted = re.sub(r"'[^']*'|\"(?:[^\"\\]|\\.)*\"", "", command.split(" #")[0])
    if any(set(w) <= set(lexer.punctuation_chars) for w in words) or re.search(r"[$`*?~\[\\]", unquoted):
        return None
    return words  # shell_lines keeps only the lines that start with `samplechain `


def run_in_process(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`samplechain ARGV` through the CLI's main in this process, with the command's environment, folder and an
    empty stdin; everything it changes for the process (environment, folder, torch's threads) is put back."""
    from samplechain.cli import main

    out, err = io.StringIO(), io.StringIO()
    before, threads = Path.cwd(), torch.get_num_threads()
    with mock.patch.dict(os.environ, env, clear=True), mock.patch.object(sys, "stdin", io.StringIO("")):
        os.chdir(cwd)
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
                warnings.simplefilter("default")
                try:
                    code = main(argv)
                except SystemExit as exc:  # argparse's errors and --help
                    code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
        finally:
            os.chdir(before)
            torch.set_num_threads(threads)
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


class Shell:
    """Runs a page's shell blocks in its scratch folder with its environment. A command runs in this process (see
    `word_list`, `run_in_process`) until the page's first `samplechain install`: from there on the page's
    environment differs from this one, so every command runs through bash."""

    def __init__(self, scratch: Path, env: dict[str, str]) -> None:
        self.scratch, self.env, self.in_process = scratch, env, True

    def run_block(self, code: str, where: str) -> int:
        """Run the block's `samplechain` commands; an AssertionError names the page, line and command that
        failed."""
        cwd, ran = self.scratch, 0
        for command in shell_lines(code):
            if command.startswith("cd "):
                folder = command[3:]
                target = Path(self.env["HOME"] + folder[1:]) if folder.startswith("~") else cwd / folder
                assert target.is_dir(), f"{where}: `{command}`: no such folder {target}"
                cwd = target
                continue
            self.in_process &= not INSTALL.match(command)
            words = word_list(command) if self.in_process else None
            if words is not None:
                done = run_in_process(words[1:], cwd, self.env)
            else:
                done = subprocess.run(
                    [shutil.which("bash") or "sh", "-c", command],
                    cwd=cwd,
                    env=self.env,
                    capture_output=True,
                    text=True,
                    timeout=COMMAND_TIMEOUT_S,
                )
            if done.returncode != 0:
                raise AssertionError(
                    f"{where}: `{command}` exited {done.returncode}\n--- stdout\n{done.stdout[-3000:]}"
                    f"\n--- stderr\n{done.stderr[-3000:]}"
                )
            ran += 1
        return ran


@pytest.fixture(scope="module")
def namespace():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from samplechain.models import tiny_model_path

    path = tiny_model_path()
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    tok = AutoTokenizer.from_pretrained(path)
    return {
        "model": model,
        "tok": tok,
        "tokenizer": tok,
        "inputs": tok("In Python, a list is", return_tensors="pt"),
        "torch": torch,
        "logits": torch.randn(2, len(tok), generator=torch.Generator().manual_seed(0)),
    }


@pytest.mark.slow
@pytest.mark.parametrize(
    "path", [p for p in FILES if any(map(runnable, blocks(p)))], ids=lambda p: str(p.relative_to(ROOT))
)
def test_examples_run(path, namespace, tmp_path, monkeypatch):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    (scratch / "contrib").symlink_to(ROOT / "contrib")
    for lang, code, _skip, _line in blocks(path):
        first = code.splitlines()[0] if code else ""
        if lang == "toml" and re.fullmatch(r"# [\w.-]+\.toml", first):
            (scratch / first[2:]).write_text(code)
    monkeypatch.chdir(scratch)
    env = {
        **os.environ,
        "HOME": str(tmp_path / "home"),
        "SAMPLECHAIN_HOME": str(tmp_path / "samplechain-home"),
        # the default model's conversion is the user's cache, kept across examples (a fresh HOME would redo it)
        "SAMPLECHAIN_CACHE": str(cache_dir()),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    (tmp_path / "home").mkdir()
    bins = [str(Path(sys.executable).parent)]
    if installs(path):
        venv = FreshVenv(tmp_path / "venv")
        bins.insert(0, str(venv.bin))
        env.update(venv.env)
    env["PATH"] = os.pathsep.join([*bins, env.get("PATH", "")])
    shell = Shell(scratch, env)
    scope = dict(namespace)
    ran = 0
    for lang, code, skip, line in filter(runnable, blocks(path)):
        where = f"{path.relative_to(ROOT)}:{line}"
        if skip is not None:
            assert len(skip.strip()) > len("skip") + 3, f"{where}: a skipped example needs a reason"
            continue
        if lang in SHELL:
            ran += shell.run_block(code, where)
            continue
        try:
            exec(compile(code, f"{path.name}:{line}", "exec"), scope)
        except Exception as exc:  # noqa: BLE001 - the report names the block
            raise AssertionError(f"{where}: example fails: {type(exc).__name__}: {exc}") from exc
        ran += 1
    assert ran or all(b[2] for b in blocks(path) if runnable(b)), f"{path.name}: no example ran"


@pytest.mark.parametrize("path", with_blocks({"toml"}), ids=lambda p: str(p.relative_to(ROOT)))
def test_toml_examples_parse_and_chains_load(path):
    for lang, code, skip, _line in blocks(path):
        if lang != "toml" or skip is not None:
            continue
        data = tomllib.loads(code)
        if "samplers" in data.get("chain", data):
            Chain.load(data)
