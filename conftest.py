"""Suite-wide pytest hooks (tests/, plugins/*/tests/, contrib/).

The `transformers_parity` marker: the tests that hold samplechain against transformers itself (its processors,
warpers, stopping criteria, watermark detector, generation config, `model.generate`). `make test` runs them a
second time in `.venv-tf-min`, under the lowest transformers the project supports (`make test-transformers-min`,
README "Supported versions"). A test carries it when

- its name mentions transformers or model_generate (`test_matches_transformers`,
  `test_embedded_model_beam_search_equals_model_generate`, ...), or
- its module holds a processor, warper, stopping criterion or the watermark detector of transformers (or their
  module, `transformers.generation.logits_process` ...), imported to compare with: every test of that module, or
- its module is one of PARITY_MODULES below, whose tests drive transformers' own generation (our loop against
  `model.generate`, `custom_generate` folders run by transformers) without importing from it, or
- it is marked explicitly (`@pytest.mark.transformers_parity`, `pytestmark`).

tests/test_supported_versions.py fails for a test whose code calls transformers' processors, criteria, detector or
`model.generate` without carrying the marker.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# the transformers runner's timed layouts stay in each test's process: a layouts file kept from one run (or from the
# developer's own generations) would skip the timings the tests count (tests of the file name one of their own)
os.environ.setdefault("SAMPLECHAIN_LAYOUTS", "off")

PARITY = "transformers_parity"
ROOT = Path(__file__).resolve().parent
PARITY_MODULES = (
    "tests/test_beam.py",
    "tests/test_generation.py",
    "tests/test_custom_generate_repo.py",
    "tests/test_hub.py",
)
PARITY_NAMES = ("transformers", "model_generate")
COLLECTED = pytest.StashKey[list]()  # every collected test, before -k / -m deselect (for the marker's guard)


def pytest_configure(config):
    missing = [m for m in PARITY_MODULES if not (ROOT / m).is_file()]
    if missing:
        raise pytest.UsageError(f"conftest.py: PARITY_MODULES names {missing}, which do not exist (renamed?)")


# where transformers keeps the implementations the tests compare with (not its configuration classes)
REFERENCES = tuple(f"transformers.generation.{m}" for m in ("logits_process", "stopping_criteria", "watermarking"))


def _holds_a_reference(module) -> bool:
    for value in vars(module).values():
        origin = getattr(value, "__module__", None) or getattr(value, "__name__", None)
        if isinstance(origin, str) and origin.startswith(REFERENCES):
            return True
    return False


def _parity_module(module) -> bool:
    path = Path(getattr(module, "__file__", "") or "").resolve()
    return any(path == ROOT / m for m in PARITY_MODULES) or _holds_a_reference(module)


@pytest.hookimpl(tryfirst=True)  # before -m deselects
def pytest_collection_modifyitems(config, items):
    config.stash[COLLECTED] = list(items)
    modules: dict[str, bool] = {}
    for item in items:
        module = getattr(item, "module", None)
        if module is None:
            continue
        if module.__name__ not in modules:
            modules[module.__name__] = _parity_module(module)
        name = getattr(item, "originalname", item.name).lower()
        if modules[module.__name__] or any(word in name for word in PARITY_NAMES):
            item.add_marker(PARITY)


@pytest.fixture(scope="session")
def open_gguf():
    """open_gguf(**load_gguf's keywords) -> (model, tokenizer): the default model (SmolLM2) on llama.cpp; the test
    is skipped where llama-cpp-python or the model is missing. Every model opened is closed when the session ends."""
    opened = []

    def open_model(**kwargs):
        pytest.importorskip("llama_cpp")
        from samplechain.errors import ConfigError
        from samplechain.models import default_gguf_path
        from samplechain_llama_cpp import load_gguf

        try:
            path = default_gguf_path()
        except ConfigError as exc:
            pytest.skip(str(exc))
        model, tokenizer = load_gguf(path, **kwargs)
        opened.append(model)
        return model, tokenizer

    yield open_model
    for model in opened:
        model.close()


@pytest.fixture(scope="session")
def tiny_lm():
    """(model, tokenizer): the repository's tiny GPT-2-style model (transformers), loaded once per session; tests
    use it read-only."""
    transformers = pytest.importorskip("transformers")
    from samplechain.models import tiny_model_path

    path = tiny_model_path()
    model = transformers.AutoModelForCausalLM.from_pretrained(path, local_files_only=True).eval()
    return model, transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
