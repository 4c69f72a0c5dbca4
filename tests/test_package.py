"""The package's import graph, read from the AST (every import statement, those inside functions too):
no cycle, and no module imports a layer above its own (GUIDE: modules -> functional -> ops -> kernels | ref)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "src" / "nvfp4lab"

# Highest first. A module may import its own layer or any layer below it. Entries are module names or
# packages (a package covers its submodules); every module of the package must be listed.
LAYERS = (
    ("top", ("nvfp4lab", "nvfp4lab.__main__", "nvfp4lab.cli", "nvfp4lab.demo", "nvfp4lab.conformance",
             "nvfp4lab.dist_harness", "nvfp4lab.checkpoint", "nvfp4lab.lab")),
    ("modules", ("nvfp4lab.modules",)),
    ("functional", ("nvfp4lab.functional", "nvfp4lab.fsdp", "nvfp4lab.distributed")),
    ("ops", ("nvfp4lab.ops",)),
    ("kernels and ref", ("nvfp4lab.kernels", "nvfp4lab.ref", "nvfp4lab.moe")),
    ("low", ("nvfp4lab.tensors", "nvfp4lab.config", "nvfp4lab.recipes", "nvfp4lab.te_recipes", "nvfp4lab.autocasting",
             "nvfp4lab.rht", "nvfp4lab.layout", "nvfp4lab.checks", "nvfp4lab.runtime", "nvfp4lab.version")),
)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def imports_of(name: str) -> set:
    """Package modules that ``name`` imports anywhere in its file. ``from P import x`` names the
    submodule P.x when there is one, else P itself."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join(parts + ([base] if base else []))
            subs = [f"{base}.{alias.name}" for alias in node.names]
            targets = [s for s in subs if s in MODULES]
            if len(targets) < len(subs):
                targets.append(base)
        else:
            continue
        for target in targets:
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


GRAPH = {name: imports_of(name) for name in MODULES}


def layer_of(name: str):
    best = None
    for rank, (_, entries) in enumerate(LAYERS):
        for entry in entries:
            exact = entry == "nvfp4lab"  # the root package covers only its __init__
            if name == entry or (not exact and name.startswith(entry + ".")):
                if best is None or len(entry) > best[1]:
                    best = (rank, len(entry))
    return None if best is None else best[0]


def test_every_module_has_a_layer():
    assert "nvfp4lab.ops" in MODULES and "nvfp4lab.kernels" in MODULES
    missing = [name for name in MODULES if layer_of(name) is None]
    assert not missing, f"place these modules in LAYERS: {missing}"


def test_no_module_imports_a_higher_layer():
    bad = []
    for name, targets in GRAPH.items():
        for target in targets:
            if layer_of(target) < layer_of(name):  # a smaller rank is a higher layer
                bad.append(f"{name} ({LAYERS[layer_of(name)][0]}) imports {target} ({LAYERS[layer_of(target)][0]})")
    assert not bad, "\n".join(bad)


def cycles(graph: dict) -> list:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles():
    # a package's __init__ only re-exports: an arrow from a submodule into its own package is not a cycle
    graph = {name: {t for t in targets if not name.startswith(t + ".")} for name, targets in GRAPH.items()}
    assert cycles(graph) == []


@pytest.mark.parametrize("graph, expected", [
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
    ({"a": {"b"}, "b": set()}, []),
])
def test_cycle_finder(graph, expected):
    assert cycles(graph) == expected


def test_function_level_imports_are_read():
    """The graph sees an import inside a function body (how the old cycles hid)."""
    assert "nvfp4lab.lab.report" in GRAPH["nvfp4lab.lab.runner"]  # runner imports report inside run_lab
