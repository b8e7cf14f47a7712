"""The third-party plugin workflow: `samplechain new-plugin` (scaffold a package) and `samplechain install`
(pip-install a plugin into the running environment and remember that it was added).

    from samplechain.tools.plugin_tools import new_plugin, install, installed_records
    new_plugin("my-filter", "work/")             # -> work/samplechain-my-filter/
    install("work/samplechain-my-filter")         # pip install into sys.executable's environment, recorded
    installed_records()                           # what `samplechain install` added to this environment

Records live in `installed.json` in the user's data folder: $SAMPLECHAIN_HOME, else $XDG_DATA_HOME/samplechain,
else ~/.local/share/samplechain (%LOCALAPPDATA%/samplechain on Windows). One file serves every environment; each
record names the environment (sys.prefix) it was installed into.
"""

from __future__ import annotations

import difflib
import json
import keyword
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import attrs

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

try:
    from importlib import metadata as _md
except ImportError:  # pragma: no cover
    import importlib_metadata as _md  # type: ignore[no-redef]

from ..engine.registry import PluginEntry, Registry, load_registry
from ..errors import SamplechainError
from ..models import write_json

__all__ = [
    "PluginToolError",
    "PluginNames",
    "plugin_names",
    "new_plugin",
    "InstallTarget",
    "resolve_target",
    "install",
    "data_dir",
    "records_path",
    "installed_records",
    "installed_index",
    "normalize_distribution",
    "KINDS",
]

KINDS = ("sampler", "criterion")
GROUP = "samplechain"
RECORDS_FILE = "installed.json"
PIP_TAIL_LINES = 15


class PluginToolError(SamplechainError):
    """`new-plugin` or `install` cannot do what was asked (bad name, existing folder, pip failed, unknown plugin)."""


def normalize_distribution(name: str) -> str:
    """PEP 503 normalisation: `Samplechain_Min.P` -> `samplechain-min-p`."""
    return re.sub(r"[-_.]+", "-", name).lower()


# ===================================================================== new-plugin


@attrs.frozen
class PluginNames:
    """Every name a generated plugin uses, derived from the one the author gave."""

    plugin: str  # entry-point name = sampler / criterion name: my_filter
    module: str  # samplechain_my_filter
    distribution: str  # samplechain-my-filter
    class_name: str  # MyFilter

    @property
    def directory(self) -> str:
        return self.distribution


def plugin_names(name: str) -> PluginNames:
    """Validate a plugin name and derive the others. Dashes become underscores; the result must be a lowercase
    Python identifier (it names the module, the entry point and the sampler in chain files)."""
    given = name
    if not name or not name.strip():
        raise PluginToolError("plugin name is empty: give a lowercase name such as 'my_filter' or 'my-filter'")
    plugin = name.strip().replace("-", "_")
    if plugin.lower().startswith("samplechain_"):
        rest = plugin[len("samplechain_") :]
        raise PluginToolError(
            f"plugin name {given!r}: leave out the 'samplechain' prefix, it is added to the distribution and "
            f"module names (try {rest.replace('_', '-')!r})"
        )
    if not plugin.isidentifier() or not plugin.isascii():
        raise PluginToolError(
            f"plugin name {given!r}: after '-' -> '_' it must be a Python identifier: ASCII letters, digits and "
            f"underscores, not starting with a digit (e.g. 'my_filter', 'top-q2')"
        )
    if plugin != plugin.lower():
        raise PluginToolError(f"plugin name {given!r}: must be lowercase (try {given.lower()!r})")
    if keyword.iskeyword(plugin) or plugin.startswith("_") or plugin.endswith("_") or "__" in plugin:
        raise PluginToolError(
            f"plugin name {given!r}: must not be a Python keyword, nor start, end or double an underscore / dash"
        )
    class_name = "".join(part.capitalize() for part in plugin.split("_"))
    if class_name[0].isdigit():  # pragma: no cover - isidentifier() already refuses a leading digit
        class_name = "P" + class_name
    return PluginNames(
        plugin=plugin,
        module=f"samplechain_{plugin}",
        distribution=f"samplechain-{plugin.replace('_', '-')}",
        class_name=class_name,
    )


def _taken_names(registry: Registry | None) -> dict[str, str]:
    """Names a new plugin must not reuse (a second plugin registering a name is reported broken): name -> who."""
    taken: dict[str, str] = {}
    if registry is not None:
        for entry in registry.plugins.values():
            taken.setdefault(entry.name, f"registry.toml plugin {entry.name!r} ({entry.distribution})")
            for provided in entry.provides:
                base = provided.split(".v")[0]
                taken.setdefault(base, f"{entry.name!r} from registry.toml ({entry.distribution})")
    for ep in _md.entry_points(group=GROUP):
        dist = getattr(ep, "dist", None)
        taken.setdefault(ep.name, f"the installed plugin {ep.name!r}" + (f" ({dist.metadata['Name']})" if dist else ""))
    return taken


def _core_requirement() -> str:
    from .. import __version__

    parts = [int(p) for p in re.findall(r"\d+", __version__)[:2]] + [0, 0]
    major, minor = parts[0], parts[1]
    if major == 0:
        return f"samplechain>={major}.{minor},<{major}.{minor + 1}"
    return f"samplechain>={major}.{minor},<{major + 1}"


def new_plugin(
    name: str,
    directory: str | os.PathLike[str] = ".",
    kind: str = "sampler",
    *,
    registry: Registry | None = None,
    check_taken: bool = True,
) -> Path:
    """Write a ready plugin package `samplechain-NAME/` into `directory` and return its path.

    kind: "sampler" (an example filter) or "criterion" (an example stopping criterion). Refuses a name another
    known plugin uses (registry.toml, installed entry points) and an existing non-empty target folder."""
    if kind not in KINDS:
        raise PluginToolError(f"kind {kind!r}: must be one of {', '.join(KINDS)}")
    names = plugin_names(name)
    if check_taken:
        if registry is None:
            try:
                registry = load_registry()
            except SamplechainError:  # no registry.toml here: installed entry points are still checked
                registry = None
        who = _taken_names(registry).get(names.plugin)
        if who is not None:
            raise PluginToolError(
                f"plugin name {name!r}: {names.plugin!r} is already used by {who}; a second plugin registering the "
                f"same name is reported broken, so pick another name (e.g. {names.plugin + '_ext'!r})"
            )
    base = Path(directory)
    if base.exists() and not base.is_dir():
        raise PluginToolError(f"--dir {str(base)!r} is a file, not a folder")
    target = base / names.directory
    if target.exists():
        if not target.is_dir():
            raise PluginToolError(f"{target} exists and is a file: remove it or choose another --dir")
        if any(target.iterdir()):
            raise PluginToolError(
                f"{target} already exists and is not empty: choose another --dir or name, or remove the folder"
            )
    from . import templates

    files = templates.render(
        kind,
        {
            "plugin": names.plugin,
            "module": names.module,
            "distribution": names.distribution,
            "Class": names.class_name,
            "requirement": _core_requirement(),
        },
    )
    for relative, text in files.items():
        path = target / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return target


# ===================================================================== install


@attrs.frozen
class InstallTarget:
    """What `install` hands to pip, and what it knows about it beforehand."""

    requirement: str  # the argument pip gets: a path or a distribution name
    source: str  # what to record: "path:/abs/dir", "registry:min_p -> path:...", "index:dist"
    distribution: str | None = None  # when known before installing
    name: str | None = None  # the plugin name asked for (registry) or declared (pyproject entry point)
    is_path: bool = False


def _looks_like_path(target: str) -> bool:
    return (
        target in (".", "..")
        or os.sep in target
        or (os.altsep is not None and os.altsep in target)
        or target.endswith((".whl", ".tar.gz", ".zip"))
        or Path(target).exists()
    )


def _project_table(folder: Path) -> Mapping[str, Any]:
    pyproject = folder / "pyproject.toml"
    try:
        return tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project", {})
    except tomllib.TOMLDecodeError as exc:  # pip would stop on it too, with a traceback of its own
        raise PluginToolError(f"{pyproject}: not valid TOML: {exc}; fix it before installing") from None
    except OSError:
        return {}


def _path_target(raw: str) -> InstallTarget:
    path = Path(raw).expanduser()
    if not path.exists():
        raise PluginToolError(
            f"{raw}: no such file or folder (a plugin folder with pyproject.toml, a wheel, or a "
            f"plugin name from registry.toml)"
        )
    path = path.resolve()
    distribution = name = None
    if path.is_dir():
        if not (path / "pyproject.toml").exists() and not (path / "setup.py").exists():
            raise PluginToolError(
                f"{path}: not a Python project (no pyproject.toml or setup.py); `samplechain new-plugin` creates one"
            )
        project = _project_table(path)
        distribution = project.get("name")
        eps = project.get("entry-points", {}).get(GROUP, {})
        if isinstance(eps, Mapping) and eps:
            name = next(iter(eps))
    elif path.name.endswith(".whl"):
        distribution = path.name.split("-")[0]
    return InstallTarget(
        requirement=str(path), source=f"path:{path}", distribution=distribution, name=name, is_path=True
    )


def _registry_entry(name: str, registry: Registry) -> PluginEntry | None:
    plugins = registry.plugins
    if name in plugins:
        return plugins[name]
    key = name.replace("-", "_")
    if key in plugins:
        return plugins[key]
    wanted = normalize_distribution(name)
    for entry in plugins.values():
        if normalize_distribution(entry.distribution) == wanted:
            return entry
    return None


def _did_you_mean(name: str, registry: Registry) -> str:
    candidates: dict[str, str] = {}
    for entry in registry.plugins.values():
        candidates[entry.name] = entry.name
        candidates[entry.distribution] = entry.name
        for provided in entry.provides:
            candidates.setdefault(provided.split(".v")[0], entry.name)
    close = difflib.get_close_matches(name.replace("-", "_"), list(candidates), n=6, cutoff=0.6)
    close += difflib.get_close_matches(name, list(candidates), n=6, cutoff=0.6)
    seen: list[str] = []
    for c in close:
        if candidates[c] not in seen:
            seen.append(candidates[c])
    return ", ".join(seen[:3])


def resolve_target(target: str, registry: Registry | None = None) -> InstallTarget:
    """A path (folder, wheel) is installed as is; a bare name must be a plugin of registry.toml (by plugin name or
    distribution): from its folder `plugins/...` when that exists next to registry.toml, else by distribution."""
    if not target.strip():  # Path("") is the working folder: an empty argument must not install it
        raise PluginToolError(
            "the plugin to install is empty: give a registry plugin name (min_p), a folder (./samplechain-mine; "
            "'.' for the working folder) or a wheel"
        )
    if _looks_like_path(target):
        return _path_target(target)
    if registry is None:
        from ..engine.discovery import get_host

        registry = get_host().registry
    entry = _registry_entry(target, registry)
    if entry is None:
        hint = _did_you_mean(target, registry)
        message = f"unknown plugin {target!r}: not in {registry.source}"
        if hint:
            message += f"; did you mean {hint}?"
        message += (
            " (`samplechain plugins --available` lists them; a plugin folder or wheel is installed by its "
            "path, e.g. `samplechain install ./samplechain-mine`)"
        )
        raise PluginToolError(message)
    local = registry.root / entry.path
    if (local / "pyproject.toml").exists():
        local = local.resolve()
        return InstallTarget(
            requirement=str(local),
            source=f"registry:{entry.name} path:{local}",
            distribution=entry.distribution,
            name=entry.name,
            is_path=True,
        )
    return InstallTarget(
        requirement=entry.distribution,
        source=f"registry:{entry.name} index:{entry.distribution}",
        distribution=entry.distribution,
        name=entry.name,
    )


_PROBE = textwrap.dedent("""\
    import json, sys
    try:
        from importlib import metadata as md
    except ImportError:
        import importlib_metadata as md
    out = {}
    for dist in md.distributions():
        eps = [ep.name for ep in dist.entry_points if ep.group == "samplechain"]
        name = dist.metadata["Name"]
        if name and (eps or name.lower().replace("_", "-").startswith("samplechain")):
            out.setdefault(name, {"version": dist.version, "plugins": eps})
    print(json.dumps({"prefix": sys.prefix, "dists": out}))
""")


def _probe(python: str) -> dict[str, Any]:
    """Distributions of `python`'s environment that provide samplechain plugins (name -> version, plugins)."""
    done = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise PluginToolError(
            f"{python}: could not read the environment's installed distributions:\n" + _tail(done.stdout + done.stderr)
        )
    return json.loads(done.stdout)


def _tail(text: str, lines: int = PIP_TAIL_LINES) -> str:
    kept = [line for line in text.strip().splitlines() if line.strip()][-lines:]
    return "\n".join("  " + line for line in kept)


def install(
    target: str,
    pip_args: Sequence[str] = (),
    *,
    editable: bool = False,
    python: str | None = None,
    registry: Registry | None = None,
) -> dict[str, Any]:
    """pip-install a plugin (registry name, folder or wheel) into `python`'s environment (default: the running
    interpreter's) and record it. Returns the record. A pip failure raises one PluginToolError with pip's last
    lines."""
    python = python or sys.executable
    resolved = resolve_target(target, registry)
    if editable and not resolved.is_path:
        raise PluginToolError(f"--editable needs a plugin folder; {target!r} resolves to {resolved.requirement!r}")
    before = _probe(python)["dists"]
    command = [python, "-m", "pip", "install", *(("-e",) if editable else ()), resolved.requirement, *pip_args]
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise PluginToolError(
            f"pip could not install {resolved.requirement} (`python {' '.join(command[1:])}` exited "
            f"{done.returncode}); "
            f"pip's last lines:\n{_tail(done.stdout + done.stderr)}"
        )
    probe = _probe(python)
    after = probe["dists"]
    by_norm = {normalize_distribution(k): k for k in after}
    distribution = by_norm.get(normalize_distribution(resolved.distribution)) if resolved.distribution else None
    if distribution is None:  # not known beforehand (a setup.py project, an sdist): what pip added or changed
        changed = [k for k, v in after.items() if before.get(k) != v and v["plugins"]]
        distribution = changed[0] if len(changed) == 1 else resolved.distribution
    info = after.get(distribution or "", {"version": None, "plugins": []})
    if not info["plugins"] and distribution is not None:
        print(
            f"warning: {distribution} declares no entry point in group 'samplechain': samplechain will not find "
            f"a plugin in it",
            file=sys.stderr,
        )
    record = {
        "name": resolved.name or (info["plugins"][0] if info["plugins"] else None) or distribution,
        "plugins": info["plugins"],
        "distribution": distribution,
        "version": info["version"],
        "source": resolved.source,
        "editable": editable,
        "installed_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "environment": probe["prefix"],
        "pip_args": list(pip_args),
    }
    _save_record(record)
    return record


# ===================================================================== records


def data_dir() -> Path:
    """Where samplechain keeps per-user data: $SAMPLECHAIN_HOME, $XDG_DATA_HOME/samplechain,
    %LOCALAPPDATA%/samplechain (Windows), else ~/.local/share/samplechain."""
    home = os.environ.get("SAMPLECHAIN_HOME")
    if home:
        return Path(home).expanduser()
    xdg = os.environ.get("XDG_DATA_HOME")
    if xdg:
        return Path(xdg).expanduser() / "samplechain"
    if sys.platform == "win32" and os.environ.get("LOCALAPPDATA"):
        return Path(os.environ["LOCALAPPDATA"]) / "samplechain"
    return Path.home() / ".local" / "share" / "samplechain"


def records_path() -> Path:
    return data_dir() / RECORDS_FILE


def _load_records() -> list[dict[str, Any]]:
    path = records_path()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return []
    except (OSError, json.JSONDecodeError) as exc:
        raise PluginToolError(f"{path}: unreadable install records ({exc}); delete the file to start afresh") from None
    records = data.get("records", []) if isinstance(data, dict) else []
    return [r for r in records if isinstance(r, dict)]


def _save_record(record: dict[str, Any]) -> None:
    records = [
        r
        for r in _load_records()
        if not (
            r.get("environment") == record["environment"]
            and r.get("distribution") is not None
            and normalize_distribution(r["distribution"]) == normalize_distribution(record["distribution"] or "")
        )
    ]
    records.append(record)
    write_json(records_path(), {"format": 1, "records": records})


def installed_records(all_environments: bool = False) -> list[dict[str, Any]]:
    """What `samplechain install` added, oldest first: dicts with name, plugins, distribution, version, source,
    editable, installed_at (ISO 8601, UTC), environment (sys.prefix), pip_args.

    By default only the records of the running environment, each with `present`: whether that distribution is
    still installed here at the recorded version (False after `pip uninstall` or an upgrade by other means)."""
    records = _load_records()
    if all_environments:
        return records
    here = [dict(r) for r in records if r.get("environment") == sys.prefix]
    for r in here:
        try:
            r["present"] = r.get("distribution") is not None and _md.version(r["distribution"]) == r.get("version")
        except _md.PackageNotFoundError:
            r["present"] = False
    return here


def installed_index() -> dict[str, dict[str, Any]]:
    """installed_records() of this environment keyed by normalised distribution name (for joining with the rows
    of `samplechain plugins`, whose `distribution` column holds the same names)."""
    return {normalize_distribution(r["distribution"]): r for r in installed_records() if r.get("distribution")}
