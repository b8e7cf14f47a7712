"""Every code example in the docs runs: ```python blocks are executed (a shared namespace per file, in order, with
the embedded model as `model` / `tok` / `tokenizer`, `inputs` for "In Python, a list is", `logits` (2, V)) in a
scratch folder holding contrib/ and the TOML blocks whose first line names a file (`# chain.toml`); ```toml blocks that
declare a chain load with Chain.load. A block preceded by `<!-- doc-test: skip REASON -->` is skipped, and the
reason must be given (e.g. it needs a Hub download)."""

from __future__ import annotations

import re
import textwrap
import tomllib
from pathlib import Path

import pytest
import torch

from samplechain import Chain

ROOT = Path(__file__).resolve().parents[1]
FILES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "contrib").glob("*/README.md")])
BLOCK = re.compile(r"(?:<!-- doc-test: (?P<skip>skip[^>]*)-->\s*\n)?(?P<indent>[ ]*)```(?P<lang>python|py|toml)\n"
                   r"(?P<code>.*?)\n[ ]*```", re.S)


def blocks(path: Path) -> list[tuple[str, str, str | None, int]]:
    text = path.read_text(encoding="utf-8")
    return [(m["lang"], textwrap.dedent(m["code"]), m["skip"], text.count("\n", 0, m.start()) + 1)
            for m in BLOCK.finditer(text)]


def with_blocks(lang: set[str]) -> list[Path]:
    return [p for p in FILES if any(b[0] in lang for b in blocks(p))]


@pytest.fixture(scope="module")
def namespace():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from samplechain.models import default_model_path

    path = default_model_path()
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    tok = AutoTokenizer.from_pretrained(path)
    return {"model": model, "tok": tok, "tokenizer": tok, "inputs": tok("In Python, a list is", return_tensors="pt"),
            "torch": torch, "logits": torch.randn(2, len(tok), generator=torch.Generator().manual_seed(0))}


@pytest.mark.slow
@pytest.mark.parametrize("path", with_blocks({"python", "py"}), ids=lambda p: str(p.relative_to(ROOT)))
def test_python_examples_run(path, namespace, tmp_path, monkeypatch):
    # the examples run in a scratch folder that has the repo's contrib/ and the files the page's TOML blocks name
    # on their first line (`# chain.toml`)
    (tmp_path / "contrib").symlink_to(ROOT / "contrib")
    for lang, code, _skip, _line in blocks(path):
        first = code.splitlines()[0] if code else ""
        if lang == "toml" and re.fullmatch(r"# [\w.-]+\.toml", first):
            (tmp_path / first[2:]).write_text(code)
    monkeypatch.chdir(tmp_path)
    scope = dict(namespace)
    ran = 0
    for lang, code, skip, line in blocks(path):
        if lang not in ("python", "py"):
            continue
        if skip is not None:
            assert len(skip.strip()) > len("skip") + 3, f"{path.name}:{line}: a skipped example needs a reason"
            continue
        try:
            exec(compile(code, f"{path.name}:{line}", "exec"), scope)
        except Exception as exc:  # noqa: BLE001 - the report names the block
            raise AssertionError(f"{path.relative_to(ROOT)}:{line}: example fails: {type(exc).__name__}: {exc}") from exc
        ran += 1
    assert ran or all(b[2] for b in blocks(path) if b[0] in ("python", "py"))


@pytest.mark.parametrize("path", with_blocks({"toml"}), ids=lambda p: str(p.relative_to(ROOT)))
def test_toml_examples_parse_and_chains_load(path):
    for lang, code, skip, line in blocks(path):
        if lang != "toml" or skip is not None:
            continue
        data = tomllib.loads(code)
        if "samplers" in data.get("chain", data):
            Chain.load(data)
