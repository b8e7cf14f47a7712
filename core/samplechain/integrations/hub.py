"""custom_generate repositories: transformers' Hub-shared decoding methods, opened offline by samplechain.

    from samplechain.integrations.hub import load_custom_generate

    repo = load_custom_generate("path/to/repo", trust_remote_code=True)          # a local folder
    repo = load_custom_generate("org/name", revision="<commit>", trust_remote_code=True)  # the HF cache, offline
    out = repo.generate(model, input_ids=ids, max_new_tokens=20)                 # the repo's generate(model, ...)

A repository holds `custom_generate/generate.py` (a `generate(model, ...)` function), optionally
`custom_generate/requirements.txt`, and — beyond transformers — `custom_generate/chain.toml` (a samplechain chain)
and sampler / stopping-criterion modules (any `custom_generate/*.py` defining the `register_samplers` or
`register_stopping_criteria` hook, as in any plugin), registered on the plugin host for the repository's run only.
Keeping them next to generate.py, imported relatively, lets transformers' own loader copy them too.

What happens, in order (nothing of the repository is imported before step 3):
1. Resolve the folder: an existing directory, or a repo id in the local Hugging Face cache (never a download; a
   revision that is not a 40-hex commit is warned about: a branch or tag can move).
2. `custom_generate/generate.py` must exist, and `trust_remote_code=True` must be given — local folders included,
   as transformers requires since it stopped trusting local paths.
3. `requirements.txt` is parsed with `packaging` (every specifier, extras, environment markers); all missing or
   mismatched packages are listed with their installed versions in one error, as transformers does.
4. `custom_generate/` is imported as a package of its own (so `from .utils import x` works), its plugin modules are
   registered for the run, and `chain.toml` is loaded with them.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata as md
import importlib.util
import re
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, cast

from packaging.markers import default_environment
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from ..engine.chain import Chain
from ..engine.discovery import PluginHost, get_host
from ..errors import ConfigError

__all__ = [
    "CustomGenerateRepo",
    "load_custom_generate",
    "check_requirements",
    "UnpinnedRevisionWarning",
    "resolve_repo",
    "plugin_registered",
]

_COMMIT = re.compile(r"[0-9a-f]{40}")


class UnpinnedRevisionWarning(UserWarning):
    """A custom_generate repo was opened by a branch, tag or no revision: its code may change under that name."""


def resolve_repo(source: str | Path, revision: str | None = None, cache_dir: str | Path | None = None) -> Path:
    """The local folder of a repo: `source` itself when it is a directory, else its snapshot in the local Hugging
    Face cache (offline). Warns when the revision is not pinned to a commit."""
    path = Path(source).expanduser()
    if path.is_dir():
        return path.resolve()
    text = str(source)
    if text.count("/") != 1 or text.startswith((".", "/")):
        raise ConfigError(f"custom_generate repo {text!r}: no such folder, and not a Hub repo id (owner/name)")
    if revision is None or not _COMMIT.fullmatch(revision):
        warnings.warn(
            f"custom_generate repo {text!r} opened at {'its default branch' if revision is None else repr(revision)}: "
            "the code behind a branch or tag can change; pin revision= to a commit hash",
            UnpinnedRevisionWarning,
            stacklevel=3,
        )
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        folder = snapshot_download(text, revision=revision, cache_dir=cache_dir, local_files_only=True)
    except (LocalEntryNotFoundError, FileNotFoundError, OSError) as exc:
        raise ConfigError(
            f"custom_generate repo {text!r}{'' if revision is None else f' at {revision!r}'} is not in the local "
            "Hugging Face cache and samplechain never downloads code: fetch it first (huggingface-cli download "
            f"{text}) or give a local folder ({type(exc).__name__}: {exc})"
        ) from None
    return Path(folder)


def _check_one(req: Requirement, env: dict[str, str], seen: set[str], failed: list[str]) -> None:
    key = canonicalize_name(req.name) + "".join(sorted(req.extras))
    if key in seen:
        return
    seen.add(key)
    try:
        installed = md.version(req.name)
    except md.PackageNotFoundError:
        failed.append(f"{req} (installed: None)")
        return
    if req.specifier and not req.specifier.contains(installed, prereleases=True):
        failed.append(f"{req} (installed: {installed})")
        return
    provided = {canonicalize_name(e) for e in (md.metadata(req.name).get_all("Provides-Extra") or [])}
    missing = sorted(e for e in req.extras if canonicalize_name(e) not in provided)
    if missing:
        failed.append(f"{req} (installed: {installed}, without the extra {', '.join(map(repr, missing))})")
        return
    for extra in sorted(req.extras):  # what the extra pulls in must be there too
        for line in md.requires(req.name) or []:
            dep = Requirement(line)
            if (
                dep.marker is not None
                and dep.marker.evaluate({**env, "extra": extra})
                and not dep.marker.evaluate({**env, "extra": ""})
            ):
                dep.marker = None
                _check_one(dep, env, seen, failed)


def check_requirements(path: Path, *, label: str | None = None) -> None:
    """Check a requirements.txt against the environment; raise one ImportError listing every failure."""
    if not path.is_file():
        return
    env = cast(dict[str, str], default_environment())  # a TypedDict whose fields are all str
    failed: list[str] = []
    seen: set[str] = set()
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("-"):
            raise ConfigError(
                f"{path}:{number}: {line!r}: pip options are not supported in a custom_generate "
                "requirements.txt (list requirements only)"
            )
        try:
            req = Requirement(line)
        except InvalidRequirement as exc:
            raise ConfigError(f"{path}:{number}: {line!r} is not a valid requirement: {exc}") from None
        if req.marker is not None and not req.marker.evaluate({**env, "extra": ""}):
            continue  # not for this environment
        _check_one(req, env, seen, failed)
    if failed:
        raise ImportError(
            f"Missing requirements in your local environment for `{label or path.parent.parent}`:\n"
            + "\n".join(failed)
            + f"\ninstall or upgrade them (pip install -r {path}) and load the repository again"
        )


def _import_package(folder: Path, label: str) -> tuple[str, ModuleType]:
    """Import custom_generate/ as a package with a unique name; returns (package name, its generate module)."""
    digest = hashlib.sha1(str(folder).encode()).hexdigest()[:12]
    package = f"samplechain_custom_generate_{digest}"
    if package not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            package, folder / "__init__.py", submodule_search_locations=[str(folder)]
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[package] = module
        if (folder / "__init__.py").is_file():
            try:
                spec.loader.exec_module(module)
            except BaseException:
                del sys.modules[package]
                raise
    try:
        generate = importlib.import_module(f"{package}.generate")
    except SyntaxError as exc:
        raise ConfigError(
            f"{label}: custom_generate/generate.py has a syntax error at line {exc.lineno}: {exc.msg}"
        ) from None
    if not callable(getattr(generate, "generate", None)):
        raise ConfigError(f"{label}: custom_generate/generate.py defines no generate(model, ...) function")
    return package, generate


@contextlib.contextmanager
def plugin_registered(module: ModuleType, name: str, host: PluginHost | None = None) -> Iterator[None]:
    """Register a plugin module for the duration, unless what it registers is already there (a repo's generate.py
    uses this for its own samplers, so it runs both under `load_custom_generate` and under transformers)."""
    host = host or get_host()
    names: list[str] = []
    hook = getattr(module, "register_samplers", None)
    if hook is not None:
        hook(lambda cls: names.append(cls.name))
    known = host.registered("sampler")
    if names and all(n in known for n in names):
        yield
        return
    host.register_plugin(module, name=name)
    try:
        yield
    finally:
        host.unregister_plugin(name)


class CustomGenerateRepo:
    """An opened custom_generate repository. `generate(model, ...)` runs the repo's own `generate`."""

    def __init__(
        self,
        root: Path,
        label: str,
        package: str,
        module: ModuleType,
        plugins: dict[str, ModuleType],
        chain: Chain | None,
        host: PluginHost,
    ) -> None:
        self.root, self.label, self.package, self.module = root, label, package, module
        self.plugins, self.chain, self.host = plugins, chain, host

    @contextlib.contextmanager
    def registered(self) -> Iterator[None]:
        """The repo's sampler / criterion modules registered on the host, for the duration only."""
        done = []
        try:
            for name, module in self.plugins.items():
                self.host.register_plugin(module, name=name)
                done.append(name)
            yield
        finally:
            for name in done:
                self.host.unregister_plugin(name)

    def generate(self, model: Any, *args: Any, **kwargs: Any) -> Any:
        """Call the repo's `generate(model, *args, **kwargs)`; a repo with chain.toml gets it as `chain=` unless
        the caller gives one."""
        if self.chain is not None and "chain" not in kwargs:
            kwargs["chain"] = self.chain
        with self.registered():
            return self.module.generate(model, *args, **kwargs)

    def __repr__(self) -> str:
        extra = f", chain={self.chain!r}" if self.chain is not None else ""
        return f"CustomGenerateRepo({self.label!r}, plugins={list(self.plugins)}{extra})"


def load_custom_generate(
    source: str | Path,
    *,
    revision: str | None = None,
    trust_remote_code: bool = False,
    cache_dir: str | Path | None = None,
    host: PluginHost | None = None,
) -> CustomGenerateRepo:
    """Open a custom_generate repository (a local folder or a repo id in the HF cache); see the module docstring."""
    host = host or get_host()
    root = resolve_repo(source, revision, cache_dir)
    label = str(source) if revision is None else f"{source}@{revision}"
    folder = root / "custom_generate"
    if not (folder / "generate.py").is_file():
        raise ConfigError(
            f"`{label}` does not contain a `custom_generate` subdirectory with a `generate.py` file, "
            "so it is not a custom_generate repository"
        )
    if trust_remote_code is not True:
        files = sorted(str(p.relative_to(root)) for p in folder.rglob("*.py"))
        raise ConfigError(
            f"the repository `{label}` contains custom generation code ({', '.join(files)}) that would run on this "
            "machine: read it, then pass trust_remote_code=True to run it"
        )
    check_requirements(folder / "requirements.txt", label=label)
    package, module = _import_package(folder, label)
    plugins: dict[str, ModuleType] = {}
    for path in sorted(folder.glob("*.py")):
        if path.stem in ("generate", "__init__"):
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        if "def register_samplers" in text or "def register_stopping_criteria" in text:
            plugins[f"repo:{label}:{path.stem}"] = importlib.import_module(f"{package}.{path.stem}")
    chain = None
    if (folder / "chain.toml").is_file():
        repo = CustomGenerateRepo(root, label, package, module, plugins, None, host)
        with repo.registered():
            chain = Chain.load(folder / "chain.toml", host=host)
    return CustomGenerateRepo(root, label, package, module, plugins, chain, host)
