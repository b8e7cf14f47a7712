"""Plugin discovery and the plugin manager.

The core walks the `samplechain` entry-point group itself (not pluggy's `load_setuptools_entrypoints`) so that
one broken plugin is isolated: it is reported with its name, distribution, version and error, listed as broken,
and the rest keep working; strict mode (SAMPLECHAIN_STRICT=1 or strict=True) makes it fatal. A plugin's module
is imported only when a chain needs one of its names (or when everything is listed).

Environment:
    SAMPLECHAIN_PLUGINS        allow-list: unset = all, empty = none, "a,b" = only these entry points
    SAMPLECHAIN_BLOCK_PLUGINS  block-list: "a,b" = never load these
    SAMPLECHAIN_STRICT         "1": a plugin that fails to import or register raises instead of warning
"""

from __future__ import annotations

import difflib
import os
import re
import warnings
from collections.abc import Iterable, Sequence
from typing import Any, cast

import attrs
import pluggy

try:  # the backport carries entry-point fixes newer than some stdlib versions
    import importlib_metadata as metadata
except ImportError:  # pragma: no cover
    from importlib import metadata  # type: ignore[no-redef]

from .. import hookspecs
from ..contracts import Backend, Sampler, Stage, StoppingCriterion
from ..drafters import Drafter
from ..errors import PluginError, PluginLoadError, UnknownPluginError
from ..guards import Guard
from ..runners import ModelRunner
from .registry import Registry, load_registry

__all__ = [
    "PluginHost",
    "PluginInfo",
    "PluginWarning",
    "get_host",
    "reset_host",
    "KIND_BASES",
    "split_versioned",
]

GROUP = "samplechain"
KIND_BASES: dict[str, type[Any]] = {
    "sampler": Sampler,
    "stopping_criterion": StoppingCriterion,
    "backend": Backend,
    "runner": ModelRunner,
    "drafter": Drafter,
    "guard": Guard,
}
_HOOKS = {
    "sampler": "register_samplers",
    "stopping_criterion": "register_stopping_criteria",
    "backend": "register_backends",
    "runner": "register_runners",
    "drafter": "register_drafters",
    "guard": "register_guards",
}
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_VERSIONED = re.compile(r"^(?P<base>[a-z][a-z0-9_]*)(?:\.v(?P<version>[0-9]+))?$")


class PluginWarning(UserWarning):
    """A plugin failed to import or register and was disabled; the others keep working."""


_EXAMPLES = {
    "sampler": "top_p",
    "stopping_criterion": "max_new_tokens",
    "backend": "cpu",
    "runner": "llama_cpp",
    "drafter": "prompt_lookup",
    "guard": "banned_strings",
}


def split_versioned(name: str, kind: str = "sampler") -> tuple[str, int | None]:
    """'top_p.v1' -> ('top_p', 1); 'top_p' -> ('top_p', None) meaning the newest version."""
    m = _VERSIONED.match(name)
    if not m:
        example = _EXAMPLES.get(kind, "top_p")
        raise UnknownPluginError(
            f"{name!r} is not a valid {kind.replace('_', ' ')} name: expected lowercase `name` or `name.vN`, "
            f"e.g. {example} or {example}.v1"
        )
    return m["base"], int(m["version"]) if m["version"] else None


@attrs.define
class PluginInfo:
    """One entry point of the `samplechain` group, and what became of it."""

    name: str
    distribution: str | None
    version: str | None
    value: str
    status: str = "available"  # available (not imported yet) | loaded | broken | disabled | blocked
    error: str | None = None
    provides: list[str] = attrs.field(factory=list)  # qualified names it registered: top_p.v1 ...
    kinds: list[str] = attrs.field(factory=list)  # sampler / stopping_criterion / backend / runner / drafter / guard
    entry_point: Any = attrs.field(default=None, repr=False, eq=False)

    def describe(self) -> str:
        dist = f"{self.distribution} {self.version}" if self.distribution else "no distribution"
        return f"plugin {self.name!r} ({dist})"


def _env_list(var: str) -> set[str] | None:
    raw = os.environ.get(var)
    if raw is None:
        return None
    return {part.strip() for part in raw.split(",") if part.strip()}


def _truthy(var: str) -> bool:
    return os.environ.get(var, "").strip().lower() in {"1", "true", "yes", "on"}


class PluginHost:
    """Owns the pluggy manager, the discovered entry points and everything registered through them."""

    def __init__(
        self,
        *,
        strict: bool | None = None,
        allow: Iterable[str] | None = None,
        block: Iterable[str] | None = None,
        entry_points: Sequence[Any] | None = None,
        registry: Registry | None = None,
        use_env: bool = True,
    ) -> None:
        self.strict = strict if strict is not None else (use_env and _truthy("SAMPLECHAIN_STRICT"))
        self.allow = set(allow) if allow is not None else (_env_list("SAMPLECHAIN_PLUGINS") if use_env else None)
        self.block = set(block or ()) | ((_env_list("SAMPLECHAIN_BLOCK_PLUGINS") or set()) if use_env else set())
        self._registry = registry
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        for name in self.block:
            self.pm.set_blocked(name)
        # kind -> base name -> version -> (class, plugin name)
        self._registered: dict[str, dict[str, dict[int, tuple[type[Any], str]]]] = {k: {} for k in KIND_BASES}
        self.plugins: dict[str, PluginInfo] = {}
        self._discover(entry_points)

    # ----------------------------------------------------------------- discovery
    @property
    def registry(self) -> Registry:
        if self._registry is None:
            self._registry = load_registry()
        return self._registry

    def _discover(self, entry_points: Sequence[Any] | None) -> None:
        eps = list(entry_points) if entry_points is not None else list(metadata.entry_points(group=GROUP))
        for ep in eps:
            dist = getattr(ep, "dist", None)
            info = PluginInfo(
                name=ep.name,
                distribution=dist.metadata["Name"] if dist is not None else None,
                version=dist.version if dist is not None else None,
                value=ep.value,
                entry_point=ep,
            )
            if ep.name in self.plugins:
                first = self.plugins[ep.name]
                if (first.distribution, first.value) == (info.distribution, info.value):
                    continue  # the same distribution seen twice on sys.path
                info.status, info.error = "broken", f"entry point name {ep.name!r} is also used by {first.describe()}"
                self._report(info)
                self.plugins[f"{ep.name}@{info.distribution}"] = info
                continue
            if ep.name in self.block:
                info.status = "blocked"
            elif self.allow is not None and ep.name not in self.allow:
                info.status = "disabled"
            self.plugins[ep.name] = info

    def _report(self, info: PluginInfo, strict: bool | None = None) -> None:
        message = f"{info.describe()} failed to load: {info.error}"
        if self.strict if strict is None else strict:
            raise PluginLoadError(
                message + " (strict mode: fix or uninstall the plugin, block it with "
                f"SAMPLECHAIN_BLOCK_PLUGINS={info.name}, or unset SAMPLECHAIN_STRICT)"
            )
        warnings.warn(
            message + f"; it is disabled and the other plugins keep working (uninstall it or set "
            f"SAMPLECHAIN_BLOCK_PLUGINS={info.name} to silence this)",
            PluginWarning,
            stacklevel=4,
        )

    # ----------------------------------------------------------------- loading
    def load(self, name: str, *, strict: bool | None = None) -> PluginInfo:
        """Import and register one discovered plugin (idempotent). A failure marks it broken.

        `strict` overrides the host's strict mode for this call (None = the host's setting)."""
        info = self.plugins[name]
        if info.status != "available":
            return info
        staged: list[tuple[str, type[Any]]] = []
        module = None
        try:
            module = info.entry_point.load()
            self.pm.register(module, name=info.name)
            self.pm.check_pending()
            self._collect(module, info.name, staged)
            self._commit(info.name, staged)
        except Exception as exc:  # a broken plugin must never take the host down
            if module is not None and self.pm.is_registered(module):
                self.pm.unregister(module)
            info.status, info.error = "broken", f"{type(exc).__name__}: {exc}"
            self._report(info, strict)
            return info
        info.status = "loaded"
        info.provides = [f"{cls.name}.v{cls.version}" for _, cls in staged]
        info.kinds = sorted({kind for kind, _ in staged})
        return info

    def load_all(self) -> list[PluginInfo]:
        for name in list(self.plugins):
            self.load(name)
        return list(self.plugins.values())

    def register_plugin(self, plugin: object, name: str) -> list[str]:
        """Register an in-process plugin object or module (tests, custom_generate repos). Errors raise."""
        staged: list[tuple[str, type[Any]]] = []
        self.pm.register(plugin, name=name)
        try:
            self.pm.check_pending()
            self._collect(plugin, name, staged)
            self._commit(name, staged)
        except Exception:
            self.pm.unregister(plugin)
            raise
        provided = [f"{cls.name}.v{cls.version}" for _, cls in staged]
        kinds = sorted({kind for kind, _ in staged})
        self.plugins[name] = PluginInfo(name, None, None, repr(plugin), "loaded", None, provided, kinds)
        return provided

    def unregister_plugin(self, name: str) -> None:
        plugin = self.pm.get_plugin(name)
        if plugin is not None:
            self.pm.unregister(plugin)
        for by_name in self._registered.values():
            for base in list(by_name):
                by_name[base] = {v: e for v, e in by_name[base].items() if e[1] != name}
                if not by_name[base]:
                    del by_name[base]
        self.plugins.pop(name, None)

    def _collect(self, plugin: object, plugin_name: str, staged: list[tuple[str, type[Any]]]) -> None:
        others = [p for p in self.pm.get_plugins() if p is not plugin]
        for kind, hook in _HOOKS.items():
            caller = self.pm.subset_hook_caller(hook, remove_plugins=others)

            def register(cls: type[Any], _kind: str = kind) -> None:
                self._validate(_kind, cls, plugin_name)
                staged.append((_kind, cls))

            caller(register=register)

    def _validate(self, kind: str, cls: Any, plugin_name: str) -> None:
        base = KIND_BASES[kind]
        where = f"plugin {plugin_name!r}"
        if not (isinstance(cls, type) and issubclass(cls, base)):
            raise PluginError(f"{where} registered {cls!r} as a {kind}: it must be a subclass of {base.__name__}")
        name = getattr(cls, "name", None)
        if not isinstance(name, str) or not _NAME.match(name):
            raise PluginError(f"{where}: {cls.__name__}.name = {name!r}: must be a lowercase identifier like 'top_p'")
        version = getattr(cls, "version", None)
        if not isinstance(version, int) or version < 1:
            raise PluginError(f"{where}: {cls.__name__}.version = {version!r}: must be an integer >= 1")
        if kind == "sampler" and not isinstance(getattr(cls, "stage", None), Stage):
            raise PluginError(f"{where}: {cls.__name__}.stage must be a samplechain.Stage (transform/filter/select)")
        if not attrs.has(cast("type[Any]", cls).Params):
            raise PluginError(f"{where}: {cls.__name__}.Params must be an attrs class (use samplechain.NoParams)")
        if kind == "drafter" and cast("type[Drafter]", cls).propose is Drafter.propose:
            raise PluginError(f"{where}: {cls.__name__} must implement propose(row, tokens, limit)")
        if kind == "guard" and (
            cast("type[Guard]", cls).check is Guard.check or cast("type[Guard]", cls).hold is Guard.hold
        ):
            raise PluginError(f"{where}: {cls.__name__} must implement check(row, tokens, final) and hold(row, tokens)")
        if kind == "backend" and not isinstance(getattr(cls, "device_type", None), str):
            raise PluginError(f"{where}: {cls.__name__}.device_type must be a torch device type such as 'cpu'")

    def _commit(self, plugin_name: str, staged: list[tuple[str, type[Any]]]) -> None:
        for kind, cls in staged:
            existing = self._registered[kind].get(cls.name, {}).get(cls.version)
            if existing is not None and existing[0] is not cls:
                raise PluginError(
                    f"{kind} {cls.name}.v{cls.version} is registered by both plugin {existing[1]!r} and plugin "
                    f"{plugin_name!r}; uninstall one, or block the one you do not want with "
                    f"SAMPLECHAIN_BLOCK_PLUGINS={existing[1]} or SAMPLECHAIN_BLOCK_PLUGINS={plugin_name} (the first "
                    "loaded is kept)"
                )
        for kind, cls in staged:
            self._registered[kind].setdefault(cls.name, {})[cls.version] = (cls, plugin_name)

    # ----------------------------------------------------------------- lookup
    def get(self, kind: str, name: str) -> type[Any]:
        """The class registered as `name` (`top_p` = newest version, `top_p.v1` = pinned), loading lazily."""
        if not isinstance(name, str) or not name:
            raise UnknownPluginError(
                f"{kind} name = {name!r}: expected a name as a string, such as 'eos' or 'top_p.v1' (`samplechain "
                "plugins` lists them)"
            )
        base, version = split_versioned(name, kind)
        found = self._lookup(kind, base, version)
        if found is None:
            for candidate in self._candidate_plugins(kind, base):
                self.load(candidate)
            found = self._lookup(kind, base, version)
        if found is None:  # maybe a plugin registers it under a name the registry does not list
            # Unrelated plugins are loaded only to search them: one of them being broken must not hide the
            # answer (strict mode still fails on the plugins this chain names, above).
            for other in list(self.plugins):
                self.load(other, strict=False)
            found = self._lookup(kind, base, version)
        if found is None:
            message = self._unknown_message(kind, base, version)
            broken = [i for i in self.plugins.values() if i.status == "broken" and repr(i.name) not in message]
            if broken:
                message += " (note: " + "; ".join(f"{i.describe()} is broken: {i.error}" for i in broken) + ")"
            raise UnknownPluginError(message)
        return found

    def _lookup(self, kind: str, base: str, version: int | None) -> type[Any] | None:
        versions = self._registered[kind].get(base)
        if not versions:
            return None
        if version is None:
            return versions[max(versions)][0]
        entry = versions.get(version)
        return entry[0] if entry else None

    def _candidate_plugins(self, kind: str, base: str) -> list[str]:
        names = [base] if base in self.plugins else []
        try:
            entry = self.registry.provider_of(base, kind)
        except Exception:  # a broken registry file must not hide installed plugins
            entry = None
        if entry is not None and entry.name in self.plugins and entry.name not in names:
            names.append(entry.name)
        return names

    def provider(self, kind: str, cls: type[Any]) -> PluginInfo | None:
        entry = self._registered[kind].get(cls.name, {}).get(cls.version)
        return self.plugins.get(entry[1]) if entry else None

    def registered(self, kind: str) -> dict[str, dict[int, type[Any]]]:
        return {b: {v: e[0] for v, e in vs.items()} for b, vs in self._registered[kind].items()}

    def _unknown_message(self, kind: str, base: str, version: int | None) -> str:
        label = kind.replace("_", " ")
        versions = self._registered[kind].get(base)
        if versions and version is not None:
            have = ", ".join(f"{base}.v{v}" for v in sorted(versions))
            return f"{label} {base}.v{version} is not installed; installed versions: {have}"
        try:
            registry = self.registry
            known = set(registry.names(kind))
        except Exception:
            registry, known = None, set()
        known |= set(self._registered[kind])
        text = f"unknown {label} {base!r}"
        entry = registry.provider_of(base, kind) if registry is not None else None
        info = self.plugins.get(entry.name if entry is not None else base)
        if info is not None and info.status in {"broken", "disabled", "blocked"}:
            why = info.error or (
                "not in SAMPLECHAIN_PLUGINS" if info.status == "disabled" else "in SAMPLECHAIN_BLOCK_PLUGINS"
            )
            return f"{text}: its {info.describe()} is {info.status}: {why}"
        if entry is not None:
            assert registry is not None  # the entry came from it
            return f"{text}: it is provided by distribution {entry.distribution}, which is not installed; " + (
                entry.install_hint(registry.root)
            )
        close = difflib.get_close_matches(base, sorted(known), n=3, cutoff=0.6)
        if close:
            hints = []
            for c in close:
                e = registry.provider_of(c, kind) if registry is not None else None
                hints.append(f"{c!r} (from {e.distribution})" if e is not None else repr(c))
            return f"{text}; did you mean {' or '.join(hints)}?"
        return f"{text}; run `samplechain plugins --available` to see what exists"


_default: PluginHost | None = None


def get_host() -> PluginHost:
    """The process-wide plugin host (created on first use from the environment)."""
    global _default
    if _default is None:
        _default = PluginHost()
    return _default


def reset_host(host: PluginHost | None = None) -> None:
    """Forget the process-wide host (tests, or after installing a plugin at run time)."""
    global _default
    _default = host
