"""The import paths the core had before its layered layout (docs/architecture.md), kept working until they are
removed in 0.3.0 (CHANGELOG.md, "Deprecated").

`import samplechain.state` (or `from samplechain.plugins import get_host`) gives the module at its new place,
`samplechain.engine.store`, the same module object, with a DeprecationWarning naming the new path. Nothing is
copied: a monkeypatch through either name patches the one module.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

MOVED = {
    "samplechain.backends": "samplechain.engine.backends",
    "samplechain.chain": "samplechain.engine.chain",
    "samplechain.config": "samplechain.engine.config",
    "samplechain.graphs": "samplechain.engine.graphs",
    "samplechain.mixed": "samplechain.engine.mixed",
    "samplechain.plugins": "samplechain.engine.discovery",
    "samplechain.registry": "samplechain.engine.registry",
    "samplechain.state": "samplechain.engine.store",
    "samplechain.stopping": "samplechain.engine.stopping",
    "samplechain.convert": "samplechain.integrations.convert",
    "samplechain.hub": "samplechain.integrations.hub",
    "samplechain.bench": "samplechain.tools.bench",
    "samplechain.demo": "samplechain.tools.demo",
    "samplechain.plugin_tools": "samplechain.tools.plugin_tools",
    "samplechain.progress": "samplechain.tools.progress",
    "samplechain.templates": "samplechain.tools.templates",
    "samplechain.testing": "samplechain.tools.testing",
    "samplechain.trace": "samplechain.tools.trace",
    "samplechain.cli_bench": "samplechain.cli.bench",
    "samplechain.cli_convert": "samplechain.cli.convert",
    "samplechain.cli_generate": "samplechain.cli.generate",
    "samplechain.cli_trace": "samplechain.cli.trace",
}


class _Alias(importlib.abc.Loader):
    def __init__(self, new: str) -> None:
        self.new = new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(
            f"{spec.name} is now {self.new} (docs/architecture.md); import it from there",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module(self.new)  # the one module: its __name__ and __spec__ stay the new ones

    def exec_module(self, module: ModuleType) -> None:
        pass  # already executed under its new name


class _MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        new = MOVED.get(fullname)
        if new is None and fullname.startswith("samplechain.templates."):
            new = "samplechain.tools.templates." + fullname.rpartition(".")[2]
        return None if new is None else importlib.machinery.ModuleSpec(fullname, _Alias(new))


def install() -> None:
    if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
        sys.meta_path.append(_MovedFinder())
