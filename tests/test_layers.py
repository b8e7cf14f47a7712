"""The core's imports point one way: down its layers (docs/architecture.md), no import cycle between its modules, no
plugin imported, nothing below the command line imports it; no module much over 600 lines.

Every import counts, a module-level one and one inside a function alike (a function-level import only hides a
cycle until the function runs): the graph is read from the source with `ast`, nothing is imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

import samplechain

CORE = Path(samplechain.__file__).parent


def _module_name(path: Path) -> str:
    parts = ["samplechain", *path.relative_to(CORE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(CORE.rglob("*.py"))}


def _is_package(module: str) -> bool:
    return MODULES[module].name == "__init__.py"


def _imported(module: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The absolute names an import statement of `module` brings in: `from . import x` names the submodule x when
    there is one, else the package it comes from."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level == 0:
        base = node.module or ""
    else:
        package = module if _is_package(module) else module.rpartition(".")[0]
        parts = package.split(".")
        parts = parts[: len(parts) - (node.level - 1)]
        base = ".".join([*parts, node.module] if node.module else parts)
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]


def _core_module(name: str) -> str | None:
    """The core module `name` loads (the longest prefix that is one: samplechain.engine.chain.Chain -> samplechain.engine.chain)."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def _typing_only(tree: ast.Module) -> set[int]:
    """The ids of the import statements under `if TYPE_CHECKING:`: they never run (annotations only)."""
    return {
        id(n)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and isinstance(block.test, ast.Name) and block.test.id == "TYPE_CHECKING"
        for stmt in block.body
        for n in ast.walk(stmt)
    }


def _imports() -> dict[str, list[tuple[str, int]]]:
    """module -> [(imported name, line)], every import statement of the module wherever it stands (but for the
    annotations-only ones under `if TYPE_CHECKING:`)."""
    found: dict[str, list[tuple[str, int]]] = {}
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        skip = _typing_only(tree)
        found[module] = [
            (name, node.lineno)
            for node in ast.walk(tree)
            if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in skip
            for name in _imported(module, node)
        ]
    return found


def _graph() -> dict[str, dict[str, int]]:
    """module -> {core module it imports: the line of the first such import}."""
    graph: dict[str, dict[str, int]] = {m: {} for m in MODULES}
    for module, names in _imports().items():
        for name, line in names:
            target = _core_module(name)
            if target is not None and target != module:
                graph[module].setdefault(target, line)
    return graph


def _path(graph: dict[str, dict[str, int]], start: str, goal: str) -> list[str] | None:
    """A shortest import path start -> ... -> goal (breadth first), or None."""
    previous: dict[str, str | None] = {start: None}
    queue = [start]
    for v in queue:
        if v == goal:
            path = [v]
            while previous[path[-1]] is not None:
                path.append(previous[path[-1]])  # type: ignore[arg-type]
            return path[::-1]
        for w in sorted(graph[v]):
            if w not in previous:
                previous[w] = v
                queue.append(w)
    return None


def _cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Every import a -> b that lies on a cycle, closed by the shortest way back from b to a; each cycle once, as a
    path that starts at its smallest module and returns to it."""
    cycles: set[tuple[str, ...]] = set()
    for a in graph:
        for b in graph[a]:
            back = _path(graph, b, a)
            if back is not None:
                cycle = [a, *back[:-1]]
                i = cycle.index(min(cycle))
                cycles.add(tuple(cycle[i:] + cycle[:i]))
    return [[*c, c[0]] for c in sorted(cycles)]


def _describe(path: list[str], graph: dict[str, dict[str, int]]) -> str:
    steps = [f"{a} (line {graph[a][b]})" for a, b in zip(path, path[1:])]
    return " -> ".join([*steps, path[-1]])


# The layers, bottom up (docs/architecture.md): a module may import its own layer and those below. The package's
# __init__ (the top-level names) sits with the engine it re-exports; the modules at the top of the package are the
# contract plugins import (the runner contract among them); models (finding and loading models, through the runner
# plugins) sits with generation.
LAYERS = ["contract", "engine", "generation", "integrations", "tools", "cli"]
CONTRACT = {
    "samplechain.candidates",
    "samplechain.contracts",
    "samplechain.errors",
    "samplechain.filters",
    "samplechain.hookspecs",
    "samplechain.params",
    "samplechain.rng",
    "samplechain.strings",
    "samplechain.tokens",
    "samplechain.runners",
    "samplechain.drafters",
    "samplechain.guards",
}


def _layer(module: str) -> int:
    if module in CONTRACT:
        return LAYERS.index("contract")
    if module in ("samplechain", "samplechain._moved"):
        return LAYERS.index("engine")
    if module == "samplechain.__main__":
        return LAYERS.index("cli")
    if module == "samplechain.models":
        return LAYERS.index("generation")
    part = module.split(".")[1]
    assert part in LAYERS, (
        f"{module} is in no layer: put it in one of the layers' folders ({', '.join(LAYERS[1:])}) "
        "or, if plugins import it, add it to the contract here and in docs/architecture.md"
    )
    return LAYERS.index(part)


def test_the_graph_sees_every_kind_of_import():
    graph = _graph()
    assert "samplechain.engine.chain" in graph["samplechain.cli.validate"]  # from ..engine.chain import Chain
    assert "samplechain.tools.demo" in graph["samplechain.cli.demo"]  # from ..tools.demo import run_demo, in a function
    assert "samplechain.engine.chain" in graph["samplechain.generation.session"]  # two levels up, then down
    assert "samplechain.generation.from_config" in graph["samplechain.tools.trace"]  # inside a function
    assert "samplechain.engine.chain" in graph["samplechain"]  # the package's __init__
    assert "samplechain.contracts" not in graph["samplechain.candidates"]  # under `if TYPE_CHECKING:`: never runs


def test_every_module_is_in_a_layer():
    for module in MODULES:
        _layer(module)


def test_imports_only_point_down_the_layers():
    graph = _graph()
    upward = [
        f"{module} ({LAYERS[_layer(module)]}) imports {target} ({LAYERS[_layer(target)]}), line {line}"
        for module, targets in graph.items()
        for target, line in targets.items()
        if _layer(target) > _layer(module)
    ]
    assert not upward, "imports that run up the layers (docs/architecture.md):\n" + "\n".join(upward)


def test_the_contract_imports_nothing_but_the_contract():
    graph = _graph()
    out = [
        f"{module} imports {target}, line {line}"
        for module in sorted(CONTRACT)
        for target, line in graph[module].items()
        if target not in CONTRACT
    ]
    assert not out, "\n".join(out)


def test_no_module_is_much_over_600_lines():
    long = {m: n for m, p in MODULES.items() if (n := len(p.read_text(encoding="utf-8").splitlines())) > 650}
    assert not long, f"split these modules (docs/architecture.md: about 600 lines at most): {long}"


def test_a_cycle_is_found_and_named():
    graph = {"a": {"b": 3}, "b": {"c": 7}, "c": {"a": 12}, "d": {"a": 1}}
    (cycle,) = _cycles(graph)
    assert _describe(cycle, graph) == "a (line 3) -> b (line 7) -> c (line 12) -> a"
    assert _cycles({"a": {"b": 1}, "b": {}}) == []
    two = {"a": {"b": 1}, "b": {"a": 2, "c": 3}, "c": {"b": 4}}  # two cycles through b: both are named
    assert _cycles(two) == [["a", "b", "a"], ["b", "c", "b"]]


def test_the_core_has_no_import_cycle():
    graph = _graph()
    cycles = [_describe(c, graph) for c in _cycles(graph)]
    assert not cycles, "import cycles in the core (a function-level import counts):\n" + "\n".join(cycles)


def test_the_core_never_imports_a_plugin():
    plugins = [
        f"{module}: line {line} imports {name}"
        for module, names in _imports().items()
        for name, line in names
        if name.split(".")[0].startswith("samplechain_")
    ]
    assert not plugins, "the core imports plugins (it must find them through entry points):\n" + "\n".join(plugins)


def test_nothing_below_the_command_line_imports_it():
    def is_cli(m: str) -> bool:
        return m == "samplechain.__main__" or m.split(".")[:2] == ["samplechain", "cli"]

    upward = [
        f"{module} imports {target} (line {line})"
        for module, targets in _graph().items()
        if not is_cli(module)
        for target, line in targets.items()
        if is_cli(target)
    ]
    assert not upward, "\n".join(upward)


# ----------------------------------------------------------------- plugins and integrations, and function sizes
REPO = Path(__file__).resolve().parents[1]


def _outside_modules() -> dict[str, Path]:
    """The modules of the plugins (each a top-level `samplechain_<name>*.py`) and of the integrations' packages, by
    the name they are imported as."""
    found = {p.stem: p for p in sorted(REPO.glob("plugins/*/samplechain_*.py"))}
    for package in sorted(REPO.glob("integrations/*/samplechain_*/__init__.py")):
        root = package.parent
        for p in sorted(root.rglob("*.py")):
            parts = [root.name, *p.relative_to(root).with_suffix("").parts]
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return found


OUTSIDE = _outside_modules()


def _outside_graph() -> dict[str, dict[str, int]]:
    """plugin or integration module -> {module of the same kind it imports: the line of the first such import}."""
    graph: dict[str, dict[str, int]] = {m: {} for m in OUTSIDE}
    for module, path in OUTSIDE.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        skip = _typing_only(tree)
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)) or id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - (node.level - 1)])
                base = ".".join(filter(None, [base, node.module]))
                names = [f"{base}.{a.name}" for a in node.names] + [base]
            else:
                names = [f"{node.module}.{a.name}" for a in node.names] + [node.module or ""]
            for name in names:
                while name and name not in OUTSIDE:
                    name = name.rpartition(".")[0]
                if name and name != module:
                    graph[module].setdefault(name, node.lineno)
    return graph


def test_the_plugins_graph_sees_their_imports():
    graph = _outside_graph()
    assert "samplechain_cuda_triton" in graph["samplechain_cuda_truncate"]
    assert "samplechain_cuda_kernels" in graph["samplechain_cuda"]  # inside a function
    assert any(target.startswith("samplechain_vllm.") for target in graph["samplechain_vllm.processor"])


def test_plugins_and_integrations_have_no_import_cycle():
    graph = _outside_graph()
    cycles = [_describe(c, graph) for c in _cycles(graph)]
    assert not cycles, "import cycles in plugins/ or integrations/ (a function-level import counts):\n" + "\n".join(
        cycles
    )


def test_no_plugin_or_integration_module_is_much_over_600_lines():
    long = {m: n for m, p in OUTSIDE.items() if (n := len(p.read_text(encoding="utf-8").splitlines())) > 650}
    assert not long, f"split these modules (docs/architecture.md: about 600 lines at most): {long}"


KERNEL_MARK = "# kernel:"  # the comment block right above a long kernel (or its decorators) says why it is one function


def _long_functions(path: Path, limit: int = 80) -> list[str]:
    """The functions of `path` over `limit` lines, but for kernels marked as such with a reason."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found = []
    for node in ast.walk(ast.parse("\n".join(lines), filename=str(path))):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        size = (node.end_lineno or node.lineno) - node.lineno + 1
        if size <= limit:
            continue
        start = min([node.lineno, *(d.lineno for d in node.decorator_list)]) - 1  # 0-based
        while start > 0 and lines[start - 1].strip().startswith("#"):  # the comment block right above
            start -= 1
        reason = " ".join(
            line.strip().lstrip("#").strip() for line in lines[start : node.lineno - 1] if line.strip().startswith("#")
        )
        if lines[start].strip().startswith(KERNEL_MARK) and len(reason) > len(KERNEL_MARK) + 10:
            continue
        found.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({size} lines)")
    return found


def test_no_function_is_over_80_lines_but_kernels_that_say_why():
    paths = [*MODULES.values(), *OUTSIDE.values()]
    long = [f for p in paths for f in _long_functions(p)]
    assert not long, (
        f"split these functions into helpers of at most ~80 lines (a kernel may be longer with a `{KERNEL_MARK} why` "
        "comment right above it):\n" + "\n".join(long)
    )


def test_a_long_kernel_needs_its_reason(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(90))
    plain = tmp_path / "plain.py"
    plain.write_text(f"def f():\n{body}\n")
    marked = tmp_path / "marked.py"
    marked.write_text(f"{KERNEL_MARK} one pass per row keeps the running sums in registers\n@deco\ndef f():\n{body}\n")
    two_lines = tmp_path / "two_lines.py"
    two_lines.write_text(
        f"{KERNEL_MARK} one pass per row keeps the running\n# sums in registers\n@deco\ndef f():\n{body}\n"
    )
    bare = tmp_path / "bare.py"
    bare.write_text(f"{KERNEL_MARK}\ndef f():\n{body}\n")
    global REPO
    saved, REPO = REPO, tmp_path
    try:
        assert _long_functions(plain) == ["plain.py:1 f (91 lines)"]
        assert _long_functions(marked) == []
        assert _long_functions(two_lines) == []
        assert _long_functions(bare) == ["bare.py:2 f (91 lines)"]
    finally:
        REPO = saved
