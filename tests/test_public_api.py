"""The public surface is explicit and pinned: changing it is a deliberate act."""

import samplechain

EXPECTED = {
    "ALL_DEVICES",
    "Backend",
    "BackendError",
    "ChainWarning",
    "Candidates",
    "Chain",
    "ChainConfig",
    "ConfigError",
    "EntrySpec",
    "FUSED_SAMPLE",
    "FusedPart",
    "EosIds",
    "SamplerSetup",
    "MixedChains",
    "MixedStore",
    "token_ids_field",
    "NoParams",
    "PluginError",
    "PluginHost",
    "PluginInfo",
    "PluginLoadError",
    "PluginWarning",
    "Registry",
    "RequestError",
    "RequestStore",
    "SampleOutput",
    "Sampler",
    "SamplechainError",
    "SamplingError",
    "Stage",
    "StepContext",
    "StopContext",
    "StopMatch",
    "StopResult",
    "StopSetup",
    "Stopping",
    "StoppingCriterion",
    "UnknownPluginError",
    "__version__",
    "finite",
    "get_host",
    "hookimpl",
    "in_range",
    "load_config",
    "load_registry",
    "one_of",
    "reset_host",
    "seed_field",
    "select_backend",
    "token_id_list",
    "max_positions",
}


def test_all_is_pinned():
    assert set(samplechain.__all__) == EXPECTED


def test_every_exported_name_exists():
    for name in samplechain.__all__:
        assert hasattr(samplechain, name), name


def test_package_is_typed():
    from importlib import resources

    assert (resources.files("samplechain") / "py.typed").is_file()


# ----------------------------------------------------------------- the contract: what a plugin may import
# The modules at the top of the package that plugins import (docs/architecture.md, "The contract"); everything else
# (engine, generation, integrations, tools, cli) is the library's own and may change.
CONTRACT_MODULES = {
    "candidates",
    "contracts",
    "drafters",
    "guards",
    "errors",
    "filters",
    "hookspecs",
    "params",
    "rng",
    "strings",
    "tokens",
}
# the top-level names that belong to the contract (the rest of samplechain.__all__ is the engine's: Chain, ...)
CONTRACT_NAMES = {
    "ALL_DEVICES",
    "Backend",
    "BackendError",
    "Candidates",
    "ChainWarning",
    "ConfigError",
    "EosIds",
    "FUSED_SAMPLE",
    "FusedPart",
    "NoParams",
    "PluginError",
    "PluginLoadError",
    "RequestError",
    "Sampler",
    "SamplerSetup",
    "SamplechainError",
    "SamplingError",
    "Stage",
    "StepContext",
    "StopContext",
    "StopMatch",
    "StopSetup",
    "StoppingCriterion",
    "UnknownPluginError",
    "finite",
    "hookimpl",
    "in_range",
    "max_positions",
    "one_of",
    "seed_field",
    "token_id_list",
    "token_ids_field",
}


def test_the_contract_names_come_from_the_contract_modules():
    import importlib

    for name in CONTRACT_NAMES:
        obj = getattr(samplechain, name)
        homes = [m for m in CONTRACT_MODULES if getattr(importlib.import_module(f"samplechain.{m}"), name, None) is obj]
        assert homes, f"samplechain.{name} is not defined in a contract module"


def _plugin_sources() -> list:
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    return sorted(
        p
        for p in [
            *root.glob("plugins/*/samplechain_*.py"),
            *root.glob("plugins/*/samplechain_*/*.py"),
            *root.glob("contrib/samplechain-*/samplechain_*.py"),
        ]
    )


def test_plugins_import_only_the_contract():
    import ast

    sources = _plugin_sources()
    assert len(sources) > 40
    outside = []
    for path in sources:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == "samplechain":
                outside += [
                    f"{path.name}: samplechain.{a.name}"
                    for a in node.names
                    if a.name not in CONTRACT_NAMES | CONTRACT_MODULES
                ]
            elif (
                isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("samplechain.")
            ):
                if node.module.split(".")[1] not in CONTRACT_MODULES:
                    outside.append(f"{path.name}: {node.module}")
            elif isinstance(node, ast.Import):
                outside += [
                    f"{path.name}: {a.name}"
                    for a in node.names
                    if a.name.startswith("samplechain.") and a.name.split(".")[1] not in CONTRACT_MODULES
                ]
    assert not outside, "plugins import more than the contract:\n" + "\n".join(outside)


def test_the_old_module_paths_still_import_the_moved_modules():
    """Before the layered layout (docs/architecture.md) these modules stood at the top of the package: a third-party
    plugin or script importing them keeps working, with a DeprecationWarning naming the new path."""
    import importlib
    import subprocess
    import sys

    from samplechain._moved import MOVED

    for _old, new in MOVED.items():
        assert importlib.import_module(new).__name__ == new
    # a fresh interpreter: the old names are not imported yet
    code = (
        "import warnings, importlib\n"
        "warnings.simplefilter('error', DeprecationWarning)\n"
        "import samplechain.engine.store as store\n"
        "try:\n"
        "    import samplechain.state\n"
        "except DeprecationWarning as w:\n"
        "    assert 'samplechain.engine.store' in str(w), w\n"
        "else:\n"
        "    raise SystemExit('no warning')\n"
        "warnings.simplefilter('ignore', DeprecationWarning)\n"
        "import samplechain.state as old\n"
        "assert old is store\n"
        "from samplechain.plugins import get_host\n"
        "from samplechain.testing import host_with\n"
        "import samplechain.templates.common as common, samplechain.tools.templates.common as new_common\n"
        "assert common is new_common\n"
        "from samplechain.contracts import settle_ties, ranked_topk, Candidates, StepContext, Sampler\n"
        "import samplechain\n"
        "assert samplechain.state is store\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
