"""The files `samplechain new-plugin` writes, as string.Template texts (Python modules, so no package data).

Placeholders: ${plugin} (entry point and sampler name), ${module}, ${distribution}, ${Class}, ${requirement}
(the samplechain requirement), ${kind_title}, ${summary}.
"""

from __future__ import annotations

from collections.abc import Mapping
from string import Template

from . import common, criterion, sampler

__all__ = ["render"]

_KINDS = {"sampler": sampler, "criterion": criterion}


def render(kind: str, values: Mapping[str, str]) -> dict[str, str]:
    """Relative path -> file text for a plugin of `kind` ("sampler" or "criterion")."""
    module = _KINDS[kind]
    values = {**values, "kind_title": module.KIND_TITLE, "summary": Template(module.SUMMARY).substitute(values)}
    files = {
        "pyproject.toml": common.PYPROJECT,
        "README.md": common.README_HEAD + module.README_BODY + common.README_TAIL,
        ".gitignore": common.GITIGNORE,
        "${module}.py": module.MODULE,
        "tests/conftest.py": common.CONFTEST,
        "tests/test_${plugin}.py": module.TESTS,
    }
    return {Template(path).substitute(values): Template(text).substitute(values) for path, text in files.items()}
