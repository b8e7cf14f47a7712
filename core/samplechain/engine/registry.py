"""registry.toml: every plugin the project knows (installed or not) and the named preset chains."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import attrs

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from ..errors import ConfigError

__all__ = ["PluginEntry", "Registry", "load_registry", "registry_path"]

KINDS = ("sampler", "stopping_criterion", "backend", "runner", "drafter", "guard")


@attrs.frozen
class PluginEntry:
    name: str
    kind: str
    distribution: str
    path: str
    summary: str
    provides: tuple[str, ...]

    def install_hint(self, root: Path | None = None) -> str:
        local = root / self.path if root is not None else None
        if local is not None and (local / "pyproject.toml").exists():
            return f"pip install {self.distribution}  (from this checkout: pip install -e {self.path})"
        return f"pip install {self.distribution}"


@attrs.frozen
class Registry:
    plugins: Mapping[str, PluginEntry]
    presets: Mapping[str, Mapping[str, Any]]
    source: Path

    @property
    def root(self) -> Path:
        return self.source.parent

    def provider_of(self, name: str, kind: str | None = None) -> PluginEntry | None:
        """The registry entry whose plugin provides `name` (a sampler, criterion or backend name)."""
        for entry in self.plugins.values():
            if name in entry.provides and (kind is None or entry.kind == kind):
                return entry
        return None

    def names(self, kind: str | None = None) -> list[str]:
        return sorted({n for e in self.plugins.values() if kind in (None, e.kind) for n in e.provides})


def registry_path() -> Path:
    """SAMPLECHAIN_REGISTRY, else the copy inside the installed package, else the checkout's root file."""
    env = os.environ.get("SAMPLECHAIN_REGISTRY")
    if env:
        return Path(env)
    packaged = resources.files("samplechain") / "registry.toml"
    if packaged.is_file():
        return Path(str(packaged))
    return Path(__file__).resolve().parents[3] / "registry.toml"


def _parse(path: Path) -> Registry:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: registry file not found; set SAMPLECHAIN_REGISTRY to its path") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    plugins: dict[str, PluginEntry] = {}
    for name, table in data.get("plugins", {}).items():
        where = f"{path.name}: plugins.{name}"
        missing = [k for k in ("kind", "distribution", "path", "summary") if k not in table]
        if missing:
            raise ConfigError(f"{where}: missing key(s) {', '.join(missing)}")
        extra = set(table) - {"kind", "distribution", "path", "summary", "provides"}
        if extra:
            raise ConfigError(f"{where}: unknown key(s) {', '.join(sorted(extra))}")
        if table["kind"] not in KINDS:
            raise ConfigError(f"{where}.kind = {table['kind']!r}: must be one of {', '.join(KINDS)}")
        plugins[name] = PluginEntry(
            name=name,
            kind=table["kind"],
            distribution=table["distribution"],
            path=table["path"],
            summary=table["summary"],
            provides=tuple(table.get("provides", [name])),
        )
    return Registry(plugins=plugins, presets=dict(data.get("presets", {})), source=path)


@lru_cache(maxsize=8)
def _cached(path: str, mtime: float) -> Registry:
    return _parse(Path(path))


def load_registry(path: str | os.PathLike[str] | None = None) -> Registry:
    p = Path(path) if path is not None else registry_path()
    try:
        mtime = p.stat().st_mtime
    except OSError:
        return _parse(p)  # raises the not-found ConfigError
    return _cached(str(p), mtime)
